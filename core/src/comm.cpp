#include "tally/core/comm.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "tally/core/model.hpp"
#include "tally/core/parallel_groups.hpp"

namespace tally {

namespace {

constexpr std::array<std::pair<Collective, std::string_view>, kCollectiveKinds> kCollectives{{
    {Collective::all_reduce, "all-reduce"},
    {Collective::reduce_scatter, "reduce-scatter"},
    {Collective::all_gather, "all-gather"},
    {Collective::broadcast, "broadcast"},
    {Collective::send_recv, "p2p"},
    {Collective::all_to_all, "all-to-all"}}};

}  // namespace

std::string_view to_string(Collective c) {
  for (const auto& [k, v] : kCollectives)
    if (k == c) return v;
  TALLY_INVARIANT(false && "collective without a name");
  return {};
}

std::optional<Collective> parse_collective(std::string_view s) {
  if (s == "allreduce") return Collective::all_reduce;
  if (s == "reducescatter") return Collective::reduce_scatter;
  if (s == "allgather") return Collective::all_gather;
  if (s == "send-recv" || s == "sendrecv") return Collective::send_recv;
  if (s == "alltoall") return Collective::all_to_all;
  for (const auto& [k, v] : kCollectives)
    if (v == s) return k;
  return std::nullopt;
}

const std::vector<std::string>& allowed_collectives() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> out;
    for (const auto& kv : kCollectives) out.emplace_back(kv.second);
    return out;
  }();
  return v;
}

// Ring algorithms (Patarasuk & Yuan 2009; seed §A2): each of the k−1 (reduce-scatter, all-gather)
// or 2(k−1) (all-reduce) steps moves one S/k chunk per rank.
double collective_bytes_per_rank(Collective c, double S, int k) {
  if (k <= 1) return 0.0;
  const double frac = double(k - 1) / double(k);
  switch (c) {
    case Collective::all_reduce: return 2.0 * S * frac;
    case Collective::reduce_scatter:
    case Collective::all_gather:
    case Collective::all_to_all: return S * frac;
    case Collective::broadcast:
    case Collective::send_recv: return S;
  }
  TALLY_INVARIANT(false && "unknown collective");
  return 0.0;
}

int collective_steps(Collective c, int k) {
  if (k <= 1) return 0;
  switch (c) {
    case Collective::all_reduce: return 2 * (k - 1);
    case Collective::reduce_scatter:
    case Collective::all_gather:
    case Collective::all_to_all:  // pairwise exchange: one peer per step
    case Collective::broadcast: return k - 1;  // broadcast: chain of k−1 hops, pipelined
    case Collective::send_recv: return 1;
  }
  TALLY_INVARIANT(false && "unknown collective");
  return 0;
}

// α–β model (Hockney 1994; Thakur, Rabenseifner & Gropp 2005): t = α·steps + bytes/β.
CollectiveCost collective_cost(Collective c, double size_bytes, int ranks, const LinkSpec& link) {
  require_real(std::isfinite(size_bytes) && size_bytes >= 0, "size_bytes", size_bytes,
               "must be finite and >= 0");
  require_int(ranks >= 1, "ranks", ranks, "must be >= 1");
  require_real(std::isfinite(link.bandwidth_bps) && link.bandwidth_bps > 0, "link bandwidth_bps",
               link.bandwidth_bps, "must be > 0 bytes/s");
  require_real(std::isfinite(link.latency_s) && link.latency_s >= 0, "link latency_s",
               link.latency_s, "must be >= 0 s");
  CollectiveCost r;
  r.collective = c;
  r.size_bytes = size_bytes;
  r.ranks = ranks;
  r.link = link;
  r.bytes_per_rank = collective_bytes_per_rank(c, size_bytes, ranks);
  r.steps = collective_steps(c, ranks);
  r.latency_s = link.latency_s * r.steps;
  r.transfer_s = r.bytes_per_rank / link.bandwidth_bps;
  r.seconds = r.latency_s + r.transfer_s;
  return r;
}

double CollectiveCost::algbw_bps() const { return seconds > 0 ? size_bytes / seconds : 0.0; }

double CollectiveCost::busbw_bps() const { return bus_bandwidth(collective, algbw_bps(), ranks); }

std::string CollectiveCost::convention() const {
  const char* bytes = "";
  const char* steps_f = "";
  switch (collective) {
    case Collective::all_reduce: bytes = "2S(k-1)/k"; steps_f = "2(k-1)"; break;
    case Collective::reduce_scatter:
    case Collective::all_gather: bytes = "S(k-1)/k"; steps_f = "k-1"; break;
    case Collective::broadcast: bytes = "S (pipelined chain)"; steps_f = "k-1"; break;
    case Collective::send_recv: bytes = "S"; steps_f = "1"; break;
    case Collective::all_to_all: bytes = "S(k-1)/k"; steps_f = "k-1"; break;
  }
  const bool ring = collective != Collective::send_recv && collective != Collective::all_to_all;
  return std::string(ring ? "ring " : collective == Collective::all_to_all ? "pairwise " : "") +
         std::string(to_string(collective)) + ", k=" + std::to_string(ranks) +
         ", bytes per rank = " + bytes + ", steps = " + steps_f +
         ", t = alpha*steps + bytes/beta (alpha " + format_number(link.latency_s) + " s, beta " +
         format_number(link.bandwidth_bps) + " B/s)";
}

// nccl-tests doc/PERFORMANCE.md: busbw = algbw · factor, the factor that makes busbw comparable to
// the hardware link speed whatever the rank count (alltoall: (n−1)/n, src/alltoall.cu).
double bus_bandwidth(Collective c, double algbw_bps, int ranks) {
  require_int(ranks >= 1, "ranks", ranks, "must be >= 1");
  const double n = double(ranks);
  switch (c) {
    case Collective::all_reduce: return algbw_bps * 2.0 * (n - 1.0) / n;
    case Collective::reduce_scatter:
    case Collective::all_gather:
    case Collective::all_to_all: return algbw_bps * (n - 1.0) / n;
    case Collective::broadcast:
    case Collective::send_recv: return algbw_bps;
  }
  TALLY_INVARIANT(false && "unknown collective");
  return 0.0;
}

LinkSpec link_for_group(const ClusterSpec& cluster, int group_size, int stride) {
  require_int(group_size >= 1, "group_size", group_size, "must be >= 1");
  require_int(stride >= 1, "stride", stride, "must be >= 1");
  require_int(cluster.gpus_per_node >= 1, "gpus_per_node", cluster.gpus_per_node, "must be >= 1");
  // A group of one rank sends nothing; report the node-local link rather than a spurious IB hop.
  if (group_size == 1) return cluster.intra_node;
  const std::int64_t span = std::int64_t(group_size) * stride;
  return span <= cluster.nvlink_domain_size() ? cluster.intra_node : cluster.inter_node;
}

// ---- Per-step traffic ------------------------------------------------------------------------

std::string_view to_string(TrafficKind k) {
  switch (k) {
    case TrafficKind::dp_grad: return "dp-grad";
    case TrafficKind::zero_param_gather: return "zero-param-gather";
    case TrafficKind::tp: return "tp";
    case TrafficKind::tp_regather: return "tp-sp-regather";
    case TrafficKind::pp: return "pp";
    case TrafficKind::pp_gather: return "pp-gather";
    case TrafficKind::pp_embedding: return "pp-tied-embedding";
    case TrafficKind::cp: return "cp";
    case TrafficKind::ep: return "ep-all-to-all";
    case TrafficKind::expert_tp: return "expert-tp";
    case TrafficKind::expert_grad: return "expert-grad";
    case TrafficKind::expert_param_gather: return "expert-param-gather";
  }
  TALLY_INVARIANT(false && "unknown traffic kind");
  return {};
}

void StepTrafficSetup::validate() const {
  require_real(std::isfinite(params) && params > 0, "params", params, "must be > 0");
  require_real(param_bytes > 0, "param_bytes", param_bytes, "must be > 0 (2 bf16, 4 fp32)");
  require_real(grad_bytes > 0, "grad_bytes", grad_bytes, "must be > 0 (2 bf16, 4 fp32)");
  require_real(act_bytes > 0, "act_bytes", act_bytes, "must be > 0 (2 bf16, 4 fp32)");
  require_real(std::isfinite(tied_embedding_elements) && tied_embedding_elements >= 0,
               "tied_embedding_elements", tied_embedding_elements, "must be finite and >= 0");
  require_int(dp >= 1, "dp", dp, "must be >= 1");
  require_int(tp >= 1, "tp", tp, "must be >= 1");
  require_int(pp >= 1, "pp", pp, "must be >= 1");
  require_int(interleave >= 1, "interleave", interleave, "must be >= 1");
  require_int(interleave == 1 || pp > 1, "interleave", interleave, "needs pp > 1");
  require_int(cp >= 1, "cp", cp, "must be >= 1");
  const std::int64_t gpus = std::int64_t(dp) * tp * pp * cp;  // int products would overflow
  require_int(gpus <= kMaxGpus, "--dp x --tp x --pp x --cp", gpus,
              "must be at most " + std::to_string(kMaxGpus) + " GPUs");
  require_int(zero_stage >= 0 && zero_stage <= 3, "zero", zero_stage, "allowed 0, 1, 2, 3");
  require_int(micro_batch >= 1, "micro_batch", micro_batch, "must be >= 1");
  require_int(micro_batches >= 1, "micro_batches", micro_batches, "must be >= 1");
  const bool needs_shape = tp > 1 || pp > 1 || cp > 1;
  const char* why = "must be > 0 when tp, pp or cp > 1";
  require_int(!needs_shape || hidden > 0, "hidden", hidden, why);
  require_int(!needs_shape || layers > 0, "layers", layers, why);
  require_int(!needs_shape || seq_len > 0, "seq_len", seq_len, why);
  require_int(pp == 1 || layers >= pp, "layers", layers, "must be >= pp (one layer per stage)");
  require_int(cp == 1 || kv_hidden > 0, "kv_hidden", kv_hidden,
              "must be > 0 when cp > 1 (kv_heads x head_dim)");
  require_int(ep >= 1, "ep", ep, "must be >= 1");
  require_int(ep == 1 || (expert_share > 0 && moe_layers > 0), "ep", ep,
              "needs a mixture-of-experts model (routed experts to shard)");
  require_int(expert_tp() == tp || (expert_share > 0 && moe_layers > 0), "etp", expert_tp(),
              "an expert TP other than tp needs a mixture-of-experts model");
  (void)expert_layout(ParallelLayout{.dp = dp, .tp = tp, .pp = pp, .cp = cp}, etp, ep);
  require_expert_tp(tp, expert_tp(), sequence_parallel);
  require_real(expert_share >= 0 && expert_share < 1, "expert_share", expert_share,
               "must be in [0, 1)");
  require_int(moe_layers >= 0 && (layers == 0 || moe_layers <= layers), "moe_layers", moe_layers,
              "must be in [0, layers]");
  require_int(experts_per_token >= 1, "experts_per_token", experts_per_token, "must be >= 1");
  require_real(std::isfinite(capacity_factor) && capacity_factor >= 1 && capacity_factor <= 64,
               "capacity_factor", capacity_factor, "must be in [1, 64]");
  require_int((ep == 1 && expert_tp() == 1) || (hidden > 0 && seq_len > 0 && layers > 0), "ep", ep,
              "needs hidden, seq_len and layers");
  require_int(mtp_layers >= 0 && (layers == 0 || mtp_layers <= layers), "mtp_layers", mtp_layers,
              "must be in [0, layers]");
  require_int(mtp_layers == 0 || busiest_stage_layers == 0, "mtp_layers", mtp_layers,
              "needs busiest_stage_layers = 0 (a given busiest stage counts the modules itself)");
  require_int(max_route_nodes >= 0, "--max-route-nodes", max_route_nodes,
              "must be >= 0 (0 = no node limit)");
  require_int(max_route_nodes == 0 || (expert_share > 0 && moe_layers > 0), "--max-route-nodes",
              max_route_nodes, "needs a mixture-of-experts model (routed tokens)");
  require_real(std::isfinite(fp8_gather_share) && fp8_gather_share >= 0 &&
                   fp8_gather_share <= 1 - expert_share,
               "fp8_gather_share", fp8_gather_share,
               [&] {
                 return "must be in [0, 1 - expert_share = " + format_number(1 - expert_share) +
                        "] (torchao gathers Float8Linear weights in fp8, not the routed experts)";
               });
  require_int((fp8_gather_share == 0 && !fp8_gather_experts) || zero_stage >= 1, "zero",
              zero_stage, "a float8 parameter all-gather needs ZeRO >= 1 (no gather at ZeRO-0)");
}

// Rules and sources (DESIGN.md §1, errata 2 and 4):
//  DP/ZeRO (Rajbhandari et al. 2020 "ZeRO" §7; seed §A2): S_grad = grad_bytes·N/(tp·pp), the model
//   shard a data-parallel rank holds; the group is dp·cp ranks (context-parallel ranks hold the same
//   weights, so Megatron-LM reduces gradients over dp×cp). ZeRO-0: one all-reduce 2S(k−1)/k per step
//   (gradients accumulate locally under no-sync). ZeRO-1: reduce-scatter S(k−1)/k + all-gather of the
//   updated parameters S_param(k−1)/k, once per step. ZeRO-2: the same, but gradients are sharded,
//   so they cannot accumulate unsharded: one reduce-scatter per micro-batch (DeepSpeed's stage 2).
//   ZeRO-3: parameters all-gathered for each micro-batch's forward and again for its backward,
//   gradients reduce-scattered per micro-batch: 3S(k−1)/k per micro-batch, 1.5× DP at m = 1.
//   Under PP both change (Note [sharded data parallelism under PP]). ZeRO-3's gather of float8
//   weights: Note [fp8 all-gather].
//  TP (Shoeybi et al. 2019 §3; Korthikanti et al. 2022 §4): per layer per micro-batch 2 all-reduces
//   forward (attention out-projection, MLP W2) and 2 backward (their conjugates f) of
//   S_act = b·(s/cp)·h·act_bytes; full recompute replays the forward 2. Sequence parallel turns each
//   all-reduce into all-gather + reduce-scatter: same bytes, twice the calls. (Megatron also
//   re-all-gathers the SP input in backward for the weight gradient, overlapped; not counted here.)
//  PP (Narayanan et al. 2021 §2.2): per micro-batch an interior stage sends one activation forward
//   and one gradient backward, b·s·h·act_bytes/(tp if SP)/cp each; Megatron-LM's scatter/gather
//   sends 1/tp of it and all-gathers the rest over the TP group (Note [PP scatter/gather]).
//  EP: Note [expert parallelism] below.
//  CP (ring attention, Liu et al. 2023; Megatron-LM context parallel): per layer per micro-batch the
//   c ranks pass their K and V blocks around the ring, c−1 sends of 2·b·(s/c)·(kv_hidden/tp)·
//   act_bytes forward; backward sends K,V again and dK,dV (2(c−1) sends); full recompute replays
//   the forward ring. dK,dV of a block start on the first rank after its owner and travel with
//   it, arriving home after c−1 hops (tally run cp, engine/runtime/ring_attention.cpp). Causal
//   masking with Transformer Engine's zigzag split (Note [causal load balancing],
//   context_parallel.hpp) changes the work per rank, not these bytes.
// Note [sharded data parallelism under PP]
// DeepSpeed's pipeline engine refuses ZeRO-2 and ZeRO-3 ("ZeRO-2 and ZeRO-3 are incompatible with
// pipeline parallelism", deepspeed/runtime/pipe/engine.py); the framework that runs sharded data
// parallelism under PP is torchtitan, FSDP2 under torch.distributed.pipelining, and there every
// micro-batch's backward runs with set_requires_gradient_sync(False) and
// set_reshard_after_backward(False) and the schedule's _post_backward reduce-scatters once after
// the last one (torch/distributed/pipelining/stage.py, backward_maybe_with_nosync and
// _post_backward, pytorch/pytorch at 0138610331c9), for any FSDP module, whatever its
// reshard_after_forward. So under PP the stage's gradients accumulate unsharded (fp32, FSDP2's
// reduce dtype) and are reduce-scattered once per step for ZeRO-2 and ZeRO-3 alike; ZeRO-3's
// stage is gathered once per step (torchtitan sets reshard_after_forward = False under PP), ZeRO-2
// all-gathers its updated parameters once per step as ZeRO-1 does. The planner holds the unsharded
// pieces as buffers (planner.hpp buffer_bytes); `tally run 3d` executes both.
// Note [fp8 all-gather]
// torchao's Float8 training under FSDP2 can all-gather the weights already in float8
// (Float8LinearConfig.enable_fsdp_float8_all_gather; torchtitan --float8.enable_fsdp_float8_all_
// gather): each Float8Linear weight is a WeightWithDynamicFloat8CastTensor whose
// fsdp_pre_all_gather casts the rank's shard to e4m3 and hands FSDP the fp8 data alone, its
// scale travelling as metadata, and fsdp_post_all_gather wraps the gathered bytes as the
// Float8Tensor the GEMM takes (torchao eab345c, float8/fsdp_utils.py). The scale comes from the
// weight's amax all-reduced over the shard group: one small all-reduce per weight in every
// pre-all-gather, or, with precompute_float8_dynamic_scale_for_fsdp, one all-reduce of all the
// weights' amaxes per step after the optimizer (4 B per weight tensor: 224 tensors, under 1 kB,
// for Llama 3 8B's 7.0e9 linear weights; not counted). So the all-gather carries 1 B per
// Float8Linear weight element where FSDP's mixed precision would gather param_dtype (bf16, 2 B)
// and cast after — half; the norms, embeddings and the output layer (torchtitan leaves `output`
// in bf16) stay at param_bytes, and so do MoE's grouped experts (no Float8Linear; torchao's
// float8 MoE training is rowwise, and config.py allows the fp8 all-gather with tensorwise scaling
// only). The gradients are unchanged: the weight's gradient is the high-precision parameter's,
// reduce-scattered by FSDP in its reduce dtype (grad_bytes). Only FSDP (ZeRO-3) gathers this way,
// S_param = N/(tp·pp)·((1 − f')·param_bytes + f'·1), f' = f/(1 − e) the fp8 share of the dense
// item when the routed experts are apart (ep > 1 or e_t ≠ t), f otherwise. Off by default, as in
// torchao (Float8LinearConfig.enable_fsdp_float8_all_gather = False, config.py at eab345c) and
// torchtitan (config_manager.py at 9dec370: a store_true flag). torchtitan's published Float8 runs
// turn it on: its llama3_405b.toml at 9dec370 (the Dec 2024 benchmark's commit) sets it and
// precompute_float8_dynamic_scale_for_fsdp, the June 2025 H200 runs pass both on the command line
// (benchmarks/llama3_8b_h200_2025-06_torchtitan.md at bcdeaa3), and docs/float8.md at 9dec370
// gives the Float8 launch line with both. Later torchtitan (commit 6348d93, 2026) dropped
// tensorwise scaling and with it the fp8 all-gather: rowwise float8 communicates in high
// precision.
// Megatron-Core gathers in float8 too, with its fp8 parameters (--fp8-param-gather, Note [fp8
// parameters] in model_states.cpp): the distributed optimizer (ZeRO-1/2) or Megatron-FSDP (ZeRO-3)
// quantizes each updated shard and all-gathers the per-tensor fp8 bytes into the parameter buffer
// the weights live in, every TE linear's weight at 1 B, the routed experts' grouped linears
// included (fp8_gather_experts); MXFP8 parameters are gathered in bf16 and cast after, so nothing
// changes on the wire for mxfp8 (fp8_gather() returns 0 for it).
// Note [expert parallelism]
// Megatron-Core's MoE layout ("MoE parallel folding", Liu et al. 2025; megatron/core/
// parallel_state.py): attention runs on TP × CP × DP × PP, the MoE layers on ETP × EP × EDP × PP
// with ETP × EP × EDP = TP × CP × DP (Note [expert rank groups], parallel_groups.hpp: ETP groups
// adjacent, EP groups e_t apart, expert-DP groups e_t·ep apart). Expert TP e_t defaults to TP, as
// Megatron-Core's --expert-tensor-parallel-size does; e_t·ep must divide tp·cp·dp.
//   states:  the routed experts (routed_expert_share of N) are split over e_t·ep, their gradients
//            and ZeRO shards over the expert-data-parallel group tp·cp·dp/(e_t·ep); everything
//            else (attention, shared experts, router, dense layers, embeddings) as without EP.
//   traffic: per MoE layer and micro-batch, the token dispatch all-to-all and the combine
//            all-to-all forward, and both again for the gradients backward (4; full recompute
//            replays the forward pair: 6). Each rank scatters its tokens' top-k copies,
//            S = T_r·k·c_f·h·act_bytes with T_r = b·s/cp tokens (/tp with SP, where each TP rank
//            dispatches its sequence shard), and keeps 1/ep of them: S(ep−1)/ep sent, the
//            balanced-routing expectation; c_f (capacity factor, 1 = dropless and balanced)
//            scales the slots sent. With g = e_t > 1 ETP ranks holding different tokens (Note
//            [expert tensor parallelism]) the ETP group all-gathers the dispatched copies and
//            reduce-scatters the expert outputs, forward, and the reverse pair backward (4 calls,
//            6 with full recompute), S(e_t−1)/e_t each of S = e_t·T_r·k·c_f·h·act_bytes; a MoE
//            layer without shared experts then has no MLP-side TP pair under SP (the attention
//            pair stays in the TP item; shared experts keep theirs). The expert gradients'
//            reduction and ZeRO gathers run over tp·cp·dp/(e_t·ep) ranks on S = N·e/(e_t·pp·ep).
//   Not modelled: routing imbalance beyond c_f; the routing probabilities that travel with the
//   tokens (k fp32 values per token against k·h activations).
StepTraffic step_traffic(const StepTrafficSetup& st) {
  st.validate();
  return step_traffic_unchecked(st);
}

StepTraffic step_traffic_unchecked(const StepTrafficSetup& st) {
  StepTraffic r;
  r.setup = st;
  const double m = double(st.micro_batches);
  const double b = double(st.micro_batch);
  const double h = double(st.hidden);
  const double s_local = double(st.seq_len) / st.cp;  // sequence a CP rank holds
  double layers_stage = st.busiest_stage_layers > 0
                            ? double(st.busiest_stage_layers)
                            : std::ceil(double(st.layers) / st.pp);  // busiest stage
  const double moe_share = double(st.moe_layers) / double(std::max<std::int64_t>(st.layers, 1));
  double moe_stage = layers_stage * moe_share;  // the busiest stage's share of the MoE layers
  // Note [MTP in the ledger]
  // DeepSeek-V3's multi-token-prediction modules run on the last stage, each one layer of the
  // model's last kind (a MoE layer in a model with any) with that layer's TP, CP, EP and expert-TP
  // collectives (Note [multi-token prediction], model.cpp). Under the ledger's ⌈L/p⌉ stages the
  // last one holds L − (p − 1)⌈L/p⌉ layers; with the D modules it is the busiest stage when it
  // then holds more — always at p = 1, where the stage is the whole model: 4 all-to-alls per MoE
  // layer and micro-batch over 58 + 1 layers for DeepSeek-V3, not 58. (The module's projection and
  // its pass through the shared head add no collective at TP 1; under TP the head's edges are the
  // planner's, as the model's own head's are.)
  const bool mtp_busiest = [&] {
    if (st.mtp_layers == 0) return false;
    const double last = std::max(0.0, double(st.layers) - (st.pp - 1) * layers_stage);
    if (last + st.mtp_layers <= layers_stage) return false;
    moe_stage = last * moe_share + (st.moe_layers > 0 ? st.mtp_layers : 0);
    layers_stage = last + st.mtp_layers;
    return true;
  }();
  const std::string mtp_note =
      mtp_busiest ? "; layers: the last stage's, with its MTP modules" : "";
  const bool full = st.recompute == Recompute::full;

  // DP / ZeRO, over the data-parallel group; with ep > 1 the routed experts apart, over the
  // expert-data-parallel group (Note [expert parallelism]).
  const int k = st.dp * st.cp;
  const ExpertLayout ex = expert_layout(ParallelLayout{.dp = st.dp, .tp = st.tp, .pp = st.pp,
                                                       .cp = st.cp}, st.etp, st.ep);
  const bool experts_apart = st.ep > 1 || ex.etp != st.tp;  // their own data-parallel group
  const double dense_share = experts_apart ? 1.0 - st.expert_share : 1.0;
  // fp8: the share of `params` all-gathered in float8 (Note [fp8 all-gather]).
  auto data_parallel = [&](TrafficItem& g, TrafficItem& z, double params, double fp8, int ranks,
                           int stride, const char* what) {
    const double s_grad = st.grad_bytes * params;
    const double s_param =
        (st.param_bytes * (1 - fp8) + quantized_element_bytes(Precision::fp8) * fp8) * params;
    g.group = z.group = ranks;
    g.stride = z.stride = stride;
    z.collective = Collective::all_gather;
    if (ranks <= 1) return;
    const std::string S = st.formulas ? std::string(what) : std::string();
    const std::string S_param =
        !st.formulas ? std::string()
        : fp8 > 0    ? "(param_bytes*(1-f) + 1 B*f)*" + S + ", f = " + format_number(fp8) +
                        " gathered in float8"
                     : "param_bytes*" + S;
    if (st.zero_stage == 0) {
      g.collective = Collective::all_reduce;
      g.calls = 1;
      if (st.formulas) g.formula = "all-reduce 2S(k-1)/k once per step, S = grad_bytes*" + S;
    } else {
      g.collective = Collective::reduce_scatter;
      // Under PP every stage reduce-scatters once per step (Note [sharded data parallelism under
      // PP]).
      g.calls = st.zero_stage == 1 || st.pp > 1 ? 1 : m;
      z.calls = st.zero_stage == 3 && st.pp == 1 ? 2 * m : 1;
      z.bytes_per_call = collective_bytes_per_rank(Collective::all_gather, s_param, ranks);
      if (st.formulas) {
        g.formula = g.calls == 1 ? "reduce-scatter S(k-1)/k once per step, S = grad_bytes*" + S
                                 : "reduce-scatter S(k-1)/k per micro-batch, S = grad_bytes*" + S;
        z.formula = st.zero_stage == 3 && st.pp > 1
                        ? "all-gather S(k-1)/k once per step (the stage stays unsharded under "
                          "PP), S = " + S_param
                    : st.zero_stage == 3
                        ? "all-gather S(k-1)/k for forward and backward of each micro-batch, "
                          "S = " + S_param
                        : "all-gather of updated params S(k-1)/k once per step, S = " + S_param;
      }
    }
    g.bytes_per_call = collective_bytes_per_rank(g.collective, s_grad, ranks);
  };
  const double shard = double(st.tp) * st.pp;
  r.dp_grad.kind = TrafficKind::dp_grad;
  r.zero_param_gather.kind = TrafficKind::zero_param_gather;
  // Routed experts not apart are in the dense item: gathered in float8 with it when asked.
  const double fp8_dense =
      st.fp8_gather_share + (st.fp8_gather_experts && !experts_apart ? st.expert_share : 0.0);
  data_parallel(r.dp_grad, r.zero_param_gather, st.params * dense_share / shard,
                fp8_dense / dense_share, k, st.tp,
                experts_apart ? "N(1-e)/(tp*pp), e = routed experts' share" : "N/(tp*pp)");
  r.reduce_scatter_only_bytes = collective_bytes_per_rank(
      Collective::reduce_scatter, st.grad_bytes * st.params * dense_share / shard, k);
  r.expert_grad.kind = TrafficKind::expert_grad;
  r.expert_param_gather.kind = TrafficKind::expert_param_gather;
  if (experts_apart)
    data_parallel(r.expert_grad, r.expert_param_gather,
                  st.params * st.expert_share / (double(ex.etp) * st.pp * st.ep),
                  st.fp8_gather_experts ? 1.0 : 0.0, ex.edp,
                  ex.stride(ExpertGroupKind::edp),
                  "N*e/(etp*pp*ep), over tp*cp*dp/(etp*ep) ranks");
  auto& g = r.dp_grad;
  auto& z = r.zero_param_gather;

  // TP.
  auto& t = r.tp;
  t.kind = TrafficKind::tp;
  t.group = st.tp;
  t.stride = 1;
  if (st.tp > 1) {
    const double s_act = b * s_local * h * st.act_bytes;
    // Per layer 2 of the 4 (6) are the attention block's, 2 the MLP's; under SP a MoE layer
    // without shared experts has no MLP-side pair (Note [expert parallelism]).
    const double mlp_layers =
        layers_stage - (st.sequence_parallel && !st.shared_experts ? moe_stage : 0.0);
    const double ar_calls = (full ? 3.0 : 2.0) * (layers_stage + mlp_layers) * m;
    r.tp_input_grad_calls = (layers_stage + mlp_layers) * m;
    if (st.sequence_parallel) {
      t.collective = Collective::all_gather;
      t.paired_with = Collective::reduce_scatter;
      t.calls = 2 * ar_calls;
      t.bytes_per_call = collective_bytes_per_rank(Collective::all_gather, s_act, st.tp);
      if (st.formulas)
        t.formula = std::string(full ? "6" : "4") +
                    " (all-gather + reduce-scatter) pairs x S(t-1)/t each per layer per "
                    "micro-batch, S = b*(s/cp)*h*act_bytes" + mtp_note;
    } else {
      t.collective = Collective::all_reduce;
      t.calls = ar_calls;
      t.bytes_per_call = collective_bytes_per_rank(Collective::all_reduce, s_act, st.tp);
      if (st.formulas)
        t.formula = std::string(full ? "6" : "4") +
                    " all-reduces x 2S(t-1)/t per layer per micro-batch, S = b*(s/cp)*h*act_bytes" +
                    mtp_note;
    }
    // Note [SP re-gather]
    // Under SP a column-parallel linear (QKV; the MLP's first, gate and up fused) keeps only its
    // input's shard b·(s/t)·h — the 34/t·sbh of Korthikanti 2022 §4.2.2 and of core's activation
    // ledger — and all-gathers it again in backward for the weight gradient (Megatron-LM
    // LinearWithGradAccumulationAndAsyncCommunication, sequence_parallel=True; TE's LayerNormLinear
    // alike). One all-gather of S per such linear per micro-batch in backward, whatever the
    // recompute policy: a full-recompute replay keeps the shard too, and torchtitan's op-level SAC
    // (which saves no all-gather output) gathers each input once in backward for both its replayed
    // matmul and the weight gradient. Megatron issues it asynchronously beside the input-gradient
    // GEMM, so the time model keeps it off the critical path but for what the GEMM beside it
    // loses to it (planner.cpp, Note [overlap contention]); the bytes are sent all the same.
    if (st.sequence_parallel) {
      auto& rg = r.tp_regather;
      rg.collective = Collective::all_gather;
      rg.calls = (layers_stage + mlp_layers) * m;
      rg.bytes_per_call = collective_bytes_per_rank(Collective::all_gather, s_act, st.tp);
      if (st.formulas)
        rg.formula = "2 all-gathers x S(t-1)/t per layer per micro-batch in backward (the column-"
                     "parallel inputs' shards, re-gathered for the weight gradients; overlapped), "
                     "S = b*(s/cp)*h*act_bytes" + mtp_note;
    }
  }
  r.tp_regather.kind = TrafficKind::tp_regather;
  r.tp_regather.group = st.tp;
  r.tp_regather.stride = 1;

  // PP.
  auto& p = r.pp;
  p.kind = TrafficKind::pp;
  p.collective = Collective::send_recv;
  p.group = 2;
  p.stride = st.tp * st.cp * st.dp;
  auto& pg = r.pp_gather;
  pg.kind = TrafficKind::pp_gather;
  pg.collective = Collective::all_gather;
  pg.group = st.tp;
  pg.stride = 1;
  if (st.pp > 1) {
    // A middle stage's sends; with v chunks per stage each micro-batch passes every stage v times
    // (the end stages send half: the first sends no gradient, the last no activation).
    const double s_act = b * s_local * h * st.act_bytes;
    p.calls = 2.0 * m * st.interleave;
    // Note [PP scatter/gather]
    // Without SP every TP rank of a stage holds the whole activation b·(s/c)·h, and by default each
    // sends all of it to its peer in the next stage, t copies of one tensor over t NICs. Megatron-
    // LM's scatter/gather (Narayanan et al. 2021 §4.1, "scatter/gather communication
    // optimization"; 27fc468964, on by default since 72e4230bb5, 2021-02-16) splits it into t
    // equal 1-D chunks, each TP rank sends its chunk, and the receiving stage all-gathers the
    // chunks over its TP group (NVLink) before using it: p2p_communication.py `_communicate`,
    // split_tensor_into_1d_equal_chunks / gather_split_1d_tensor, after a
    // torch.cuda.synchronize(), so the gather is on the critical path with the send. Megatron-LM
    // 2022 (cfd2e21607) skips it under SP (the tensor is already a 1/t shard) and when t does not
    // divide the element count; Megatron-Core's pipeline code (3c92fa93b5, 2023-03-23) dropped it.
    const bool scatter = st.pp_scatter_gather && st.tp > 1 && !st.sequence_parallel &&
                         std::fmod(b * s_local * h, double(st.tp)) == 0;
    p.bytes_per_call = s_act / (st.sequence_parallel || scatter ? double(st.tp) : 1.0);
    if (st.formulas)
      p.formula = std::string("2") + (st.interleave > 1 ? "v" : "") +
                  " sends (activation fwd, gradient bwd) per micro-batch of b*(s/cp)*h*act_bytes" +
                  (st.sequence_parallel ? "/tp" : scatter ? "/tp (scatter/gather)" : "");
    if (scatter) {
      pg.calls = p.calls;
      pg.bytes_per_call = collective_bytes_per_rank(Collective::all_gather, s_act, st.tp);
      if (st.formulas)
        pg.formula = "each received PP tensor all-gathered over TP: S(t-1)/t, "
                     "S = b*(s/cp)*h*act_bytes";
    }
  }

  // Note [tied embedding under PP]
  // A model whose output layer is its word embedding (GPT-2/3, the dev set's GPT; Llama's are
  // untied) keeps a copy of that matrix on the last stage when pp > 1, and the two copies must see
  // the sum of both stages' gradients before the optimizer step: Megatron-LM all-reduces the word
  // embedding's (main) gradient over its embedding group, the first and the last stage, once per
  // step after the schedule (de7dc40f88 training.py; Megatron-Core finalize_model_grads.py
  // _allreduce_word_embedding_grads), not overlapped; tally's engine exchanges the two gradients
  // (PpStage::reduce_tied_embedding). An all-reduce of two ranks sends S = elements · grad_bytes
  // per rank; the group spans the whole pipeline (stride (p−1)·t·c·d in tp-cp-dp-pp rank order).
  auto& pe = r.pp_embedding;
  pe.kind = TrafficKind::pp_embedding;
  pe.collective = Collective::all_reduce;
  pe.group = 2;
  pe.stride = std::max(1, (st.pp - 1) * st.tp * st.cp * st.dp);
  if (st.pp > 1 && st.tied_embedding_elements > 0) {
    pe.calls = 1;
    pe.bytes_per_call = collective_bytes_per_rank(
        Collective::all_reduce, st.tied_embedding_elements * st.grad_bytes, 2);
    if (st.formulas)
      pe.formula = "the tied word embedding's gradient all-reduced between the first and the last "
                   "stage once per step: S = its elements on a rank x grad_bytes (end stages only)";
  }

  // CP.
  auto& c = r.cp;
  c.kind = TrafficKind::cp;
  c.collective = Collective::send_recv;
  c.group = st.cp;
  c.stride = st.tp;
  if (st.cp > 1) {
    const double sends_per_layer = (full ? 4.0 : 3.0) * (st.cp - 1);
    c.calls = sends_per_layer * layers_stage * m;
    c.bytes_per_call = 2.0 * b * s_local * (double(st.kv_hidden) / st.tp) * st.act_bytes;
    if (st.formulas)
      c.formula = std::string(full ? "4" : "3") +
                  "(c-1) ring sends per layer per micro-batch (fwd K,V; bwd K,V + dK,dV" +
                  (full ? "; recompute fwd" : "") + ") of 2*b*(s/c)*(kv_hidden/tp)*act_bytes" +
                  mtp_note;
  }

  // EP: dispatch and combine per MoE layer and micro-batch, forward and backward (full recompute
  // replays the forward pair), on the busiest stage's share of the MoE layers.
  auto& e = r.ep;
  e.kind = TrafficKind::ep;
  e.collective = Collective::all_to_all;
  e.group = st.ep;
  e.stride = ex.stride(ExpertGroupKind::ep);
  const double routed_tokens = b * s_local / (st.sequence_parallel ? double(st.tp) : 1.0);  // T_r
  const double s_a2a =
      routed_tokens * double(st.experts_per_token) * st.capacity_factor * h * st.act_bytes;
  if (st.ep > 1) {
    e.calls = (full ? 6.0 : 4.0) * moe_stage * m;
    e.bytes_per_call = collective_bytes_per_rank(Collective::all_to_all, s_a2a, st.ep);
    e.route = {.max_nodes = st.max_route_nodes, .copies_per_token = st.experts_per_token};
    if (st.formulas)
      e.formula = std::string(full ? "6" : "4") +
                  " all-to-alls (dispatch, combine; fwd and bwd" + (full ? "; recompute fwd" : "") +
                  ") per MoE layer per micro-batch x S(ep-1)/ep, S = b*(s/cp)" +
                  (st.sequence_parallel ? "/tp" : "") + "*top_k*capacity*h*act_bytes" + mtp_note;
  }

  // Expert TP: all-gather of the dispatched copies, reduce-scatter of the outputs (Note [expert
  // tensor parallelism]).
  auto& x = r.expert_tp;
  x.kind = TrafficKind::expert_tp;
  x.collective = Collective::all_gather;
  x.paired_with = Collective::reduce_scatter;
  x.group = ex.etp;
  x.stride = ex.stride(ExpertGroupKind::etp);
  const int gather = expert_gather_ranks(st.tp, ex.etp, st.sequence_parallel);
  if (gather > 1 && moe_stage > 0) {
    x.calls = (full ? 6.0 : 4.0) * moe_stage * m;
    x.bytes_per_call = collective_bytes_per_rank(Collective::all_gather, gather * s_a2a, ex.etp);
    if (st.formulas)
      x.formula = std::string(full ? "3" : "2") +
                  " (all-gather + reduce-scatter) pairs per MoE layer per micro-batch (dispatch, "
                  "combine; fwd and bwd" + (full ? "; recompute fwd" : "") +
                  ") x S(etp-1)/etp, S = etp*b*(s/cp)" + (st.sequence_parallel ? "/tp" : "") +
                  "*top_k*capacity*h*act_bytes" + mtp_note;
  }

  for (TrafficItem* it : {&g, &z, &t, &r.tp_regather, &p, &pg, &pe, &c, &e, &x, &r.expert_grad,
                          &r.expert_param_gather})
    it->bytes_per_rank = it->calls * it->bytes_per_call;
  return r;
}

void require_float8_all_gather(Precision p) {
  if (p != Precision::fp8)
    throw InvalidInput("--fsdp-float8-all-gather needs --precision fp8 (torchao gathers its "
                       "tensorwise float8 weights; got --precision " + std::string(to_string(p)) +
                       ")");
}

Fp8Gather fp8_gather(const ModelSpec& m, Precision p, int zero_stage, bool fsdp_float8_all_gather,
                     bool fp8_param_gather) {
  if (p != Precision::fp8) return {};
  if (fp8_param_gather && zero_stage >= 1) return {float8_gather_share(m), m.is_moe()};
  if (fsdp_float8_all_gather && zero_stage == 3) return {float8_gather_share(m), false};
  return {};
}

double megatron_tied_embedding_elements(const ModelSpec& m, int tp) {
  require_int(tp >= 1, "tp", tp, "must be >= 1");
  return m.tied_embeddings ? double(m.vocab) * double(m.hidden) / tp : 0.0;
}

double StepTraffic::total_bytes() const {
  return dp_total_bytes() + tp.bytes_per_rank + tp_regather.bytes_per_rank + pp.bytes_per_rank +
         pp_gather.bytes_per_rank + pp_embedding.bytes_per_rank + cp.bytes_per_rank +
         ep.bytes_per_rank + expert_tp.bytes_per_rank;
}

std::vector<TrafficItem> StepTraffic::items() const {
  return {dp_grad, zero_param_gather, tp,        tp_regather, pp,          pp_gather,
          pp_embedding, cp,         ep,        expert_tp,   expert_grad, expert_param_gather};
}

std::string StepTraffic::convention() const {
  const auto& st = setup;
  std::string c = "bytes sent per rank per optimizer step, ring collectives | DP k=dp*cp=" +
                  std::to_string(st.dp * st.cp) + " ";
  c += st.zero_stage == 0 ? std::string("all-reduce")
                          : "ZeRO-" + std::to_string(st.zero_stage) +
                                " reduce-scatter grads + all-gather params" +
                                (st.fp8_gather_experts
                                     ? " (the linear weights, routed experts included, in "
                                       "float8: Megatron-Core fp8 parameters)"
                                 : st.fp8_gather_share > 0
                                     ? " (" + format_number(100 * st.fp8_gather_share) +
                                           " % of them in float8: float8 all-gather of the "
                                           "linear weights)"
                                     : std::string());
  c += " | TP t=" + std::to_string(st.tp) + (st.sequence_parallel ? " SP" : "") +
       ", recompute " + std::string(to_string(st.recompute)) + " | PP p=" +
       std::to_string(st.pp) + (pp_gather.calls > 0 ? " scatter/gather" : "") +
       " | CP c=" + std::to_string(st.cp) +
       (st.ep > 1 || st.expert_tp() != st.tp
            ? " | EP " + std::to_string(st.ep) + " all-to-all, top-" +
                  std::to_string(st.experts_per_token) + ", capacity " +
                  format_number(st.capacity_factor) + ", ETP " + std::to_string(st.expert_tp()) +
                  ", experts' DP k=tp*dp*cp/(etp*ep)=" +
                  std::to_string(st.tp * st.dp * st.cp / (st.expert_tp() * st.ep))
            : std::string()) +
       " | m=" +
       std::to_string(st.micro_batches) + " micro-batches of b=" +
       std::to_string(st.micro_batch) + " | grad " + format_number(st.grad_bytes) + " B, param " +
       format_number(st.param_bytes) + " B, act " + format_number(st.act_bytes) + " B per element";
  return c;
}

double traffic_seconds(const TrafficItem& item, const LinkSpec& link) {
  require_real(link.bandwidth_bps > 0, "link bandwidth_bps", link.bandwidth_bps,
               "must be > 0 bytes/s");
  require_real(link.latency_s >= 0, "link latency_s", link.latency_s, "must be >= 0 s");
  const int steps = collective_steps(item.collective, item.group);
  return item.calls * steps * link.latency_s + item.bytes_per_rank / link.bandwidth_bps;
}

// The NCCL collective model (collective_seconds and its helpers): core/src/comm_nccl.cpp.

}  // namespace tally
