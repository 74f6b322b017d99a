// The communication ledger (通信账): bytes each rank sends per collective and per optimizer step, and
// the α–β time of each.
//
// Legend: S = full tensor bytes (the buffer every rank holds before / after the collective),
// k = ranks in the group, α = link latency per ring step (s), β = per-GPU per-direction bandwidth
// (bytes/s). Ring algorithms (Patarasuk & Yuan 2009; NCCL):
//   all-reduce      2S(k−1)/k bytes per rank, 2(k−1) steps   (reduce-scatter then all-gather)
//   reduce-scatter   S(k−1)/k,                 k−1 steps
//   all-gather       S(k−1)/k,                 k−1 steps
//   broadcast        S (pipelined chain),      k−1 steps
//   p2p (send/recv)  S,                        1 step
//   all-to-all       S(k−1)/k,                 k−1 steps (pairwise exchange: S is the buffer
//                    a rank scatters, S/k to each peer; Thakur, Rabenseifner & Gropp 2005 §4)
//   time = α·steps + bytes_per_rank/β; k = 1 moves nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tally/core/hardware.hpp"
#include "tally/core/types.hpp"

namespace tally {

struct ModelSpec;

// PyTorch DistributedDataParallel's gradient buckets (torch.nn.parallel.DistributedDataParallel,
// bucket_cap_mb = 25, meaning 25 MiB: bucket_cap_mb * 1024 * 1024; the first bucket is
// dist._DEFAULT_FIRST_BUCKET_BYTES = 1 MiB). The planner's buffer allowance and the engine's DDP
// both use these.
inline constexpr double kDdpBucketBytes = 25 * kMiB;
inline constexpr double kDdpFirstBucketBytes = 1 * kMiB;

enum class Collective { all_reduce, reduce_scatter, all_gather, broadcast, send_recv, all_to_all };
inline constexpr int kCollectiveKinds = 6;

// Names: "all-reduce", "reduce-scatter", "all-gather", "broadcast", "p2p", "all-to-all".
std::string_view to_string(Collective c);
std::optional<Collective> parse_collective(std::string_view s);
const std::vector<std::string>& allowed_collectives();

// Bytes each rank sends in one ring collective over k ranks on an S-byte tensor (table above).
double collective_bytes_per_rank(Collective c, double size_bytes, int ranks);
// Ring steps (latency terms) of one collective over k ranks.
int collective_steps(Collective c, int ranks);

struct CollectiveCost {
  Collective collective = Collective::all_reduce;
  double size_bytes = 0;     // S
  int ranks = 1;             // k
  LinkSpec link;
  double bytes_per_rank = 0; // sent by each rank
  int steps = 0;
  double latency_s = 0;      // α·steps
  double transfer_s = 0;     // bytes_per_rank/β
  double seconds = 0;        // latency_s + transfer_s
  // nccl-tests algorithm bandwidth S/seconds (0 when nothing moves, k = 1).
  double algbw_bps() const;
  // nccl-tests bus bandwidth: bus_bandwidth(collective, algbw_bps(), ranks).
  double busbw_bps() const;
  // e.g. "ring all-reduce, k=8, bytes per rank = 2S(k-1)/k, steps = 2(k-1), t = a*steps + bytes/B"
  std::string convention() const;
};

// One collective under the α–β model. Throws InvalidInput on S < 0, k < 1, β <= 0 or α < 0.
CollectiveCost collective_cost(Collective c, double size_bytes, int ranks, const LinkSpec& link);

// nccl-tests (doc/PERFORMANCE.md) bus-bandwidth factor applied to algbw: all-reduce 2(n−1)/n,
// reduce-scatter and all-gather (n−1)/n, broadcast and p2p 1. The engine's benchmark calls this.
double bus_bandwidth(Collective c, double algbw_bps, int ranks);

// The link a ring over `group_size` ranks spaced `stride` apart in the global rank order runs on:
// intra_node iff group_size·stride <= the NVLink domain (the whole group shares one fabric), else
// inter_node (the slowest link bounds a ring). A group of 1 sends nothing: intra_node.
LinkSpec link_for_group(const ClusterSpec& cluster, int group_size, int stride = 1);

// ---- Per-step traffic ------------------------------------------------------------------------
// Rank order (Megatron-LM default "tp-cp-dp-pp"): TP groups are adjacent ranks (stride 1), CP
// groups stride tp, DP groups stride tp·cp, pipeline neighbours stride tp·cp·dp.

struct StepTrafficSetup {
  double params = 0;                  // N, total parameters of the model
  double param_bytes = 2;             // bytes per parameter element (2 bf16, 4 fp32)
  // f: the share of N that ZeRO-3 all-gathers in float8, 1 B per element instead of param_bytes
  // (Note [fp8 all-gather] in comm.cpp: torchao's enable_fsdp_float8_all_gather, its Float8Linear
  // weights — the transformer layers' linears but the routed experts); 0 = none (torchao's and
  // torchtitan's default). Needs zero_stage >= 1; f <= 1 − expert_share.
  double fp8_gather_share = 0;
  // The routed experts' weights are gathered in float8 too (Megatron-Core --fp8-param-gather with
  // per-tensor fp8: Note [fp8 parameters] in model_states.cpp); needs fp8_gather_share's zero.
  bool fp8_gather_experts = false;
  double grad_bytes = 2;              // bytes per gradient element
  double act_bytes = 2;               // bytes per activation element
  std::int64_t hidden = 0;            // h
  std::int64_t layers = 0;            // L
  std::int64_t seq_len = 0;           // s
  std::int64_t micro_batch = 1;       // b, sequences per micro-batch
  std::int64_t micro_batches = 1;     // m, micro-batches per optimizer step (accumulation)
  int dp = 1, tp = 1, pp = 1, cp = 1;
  // v, model chunks per pipeline stage (interleaved 1F1B): each micro-batch crosses every stage
  // boundary v times each way, so the PP sends grow v-fold (Narayanan et al. 2021 §2.2.2).
  int interleave = 1;
  // Megatron-LM's scatter/gather of PP sends (Note [PP scatter/gather] in comm.cpp): with tp > 1
  // and no SP each TP rank sends 1/tp of the activation and the receiving stage all-gathers it over
  // its TP group (Megatron-LM 2021-02 to 2023-03, --scatter-gather-tensors-in-pipeline, on by
  // default there); false = each TP rank sends the whole activation (Megatron-Core, the engine).
  bool pp_scatter_gather = false;
  // Elements of the tied word embedding that a rank of the first or the last stage holds (Note
  // [tied embedding under PP] in comm.cpp; Megatron-LM's vocabulary-parallel V·h/t, tally's engine
  // V·h); 0 = untied. Only counted when pp > 1.
  double tied_embedding_elements = 0;
  int zero_stage = 0;                 // 0..3, sharded over dp
  bool sequence_parallel = false;
  Recompute recompute = Recompute::none;
  std::int64_t kv_hidden = 0;         // a_kv·d, needed when cp > 1
  std::int64_t busiest_stage_layers = 0;  // layers of the busiest pipeline stage; 0 = ⌈L/pp⌉
  // Mixture of experts (Note [expert parallelism] in comm.cpp). ep > 1 shards the routed experts
  // over ep ranks of the expert layout ETP × EP × EDP = TP × CP × DP (Note [expert rank groups],
  // parallel_groups.hpp); etp is the expert TP (0 = tp, Megatron-Core's default).
  int ep = 1;
  int etp = 0;
  double expert_share = 0;            // routed experts' share of N (routed_expert_share)
  std::int64_t moe_layers = 0;        // MoE layers of the model (L − dense leading layers)
  std::int64_t experts_per_token = 1; // top-k
  double capacity_factor = 1;         // routed slots sent per token and expert choice (>= 1)
  // The MoE layers keep shared experts, whose MLP runs on TP like a dense one (its TP collectives
  // stay in the TP item under SP; without them a MoE layer's MLP-side TP pair is the expert-TP
  // item's).
  bool shared_experts = false;
  // Multi-token-prediction modules on the last stage (ModelSpec::mtp_layers), each one layer of the
  // model's last kind with that layer's collectives (Note [MTP in the ledger] in comm.cpp); only
  // with busiest_stage_layers = 0 (a caller that gives the busiest stage counts the modules
  // itself, as the planner does).
  int mtp_layers = 0;
  // M: each token's routed copies reach at most this many NVLink domains, sent once to each
  // (DeepSeek-V3's node-limited routing and dispatch; Note [node-limited routing]); 0 = no limit.
  int max_route_nodes = 0;
  // false: the items' `formula` texts are left empty (the planner's hot path costs millions of
  // layouts and prints none of them).
  bool formulas = true;
  int expert_tp() const { return etp > 0 ? etp : tp; }
  void validate() const;              // throws InvalidInput naming the field
};

// Node-limited routing of an all-to-all (Note [node-limited routing] in comm.cpp).
struct RouteLimit {
  int max_nodes = 0;                  // M: NVLink domains a token's copies may reach; 0 = none
  std::int64_t copies_per_token = 1;  // k: its routed copies (top-k)
};

enum class TrafficKind { dp_grad, zero_param_gather, tp, tp_regather, pp, pp_gather,
                         pp_embedding, cp, ep, expert_tp, expert_grad, expert_param_gather };
std::string_view to_string(TrafficKind k);

// One line of the per-step ledger. bytes_per_rank = calls · bytes_per_call.
struct TrafficItem {
  TrafficKind kind = TrafficKind::dp_grad;
  Collective collective = Collective::all_reduce;
  // Set when each logical operation is a pair (sequence parallel: all-gather + reduce-scatter);
  // calls then split evenly between `collective` and `paired_with`.
  std::optional<Collective> paired_with;
  int group = 1;                 // ranks in the collective (p2p: the 2 neighbouring stages)
  int stride = 1;                // spacing of the group in the global rank order
  double calls = 0;              // collective calls per rank per optimizer step
  double bytes_per_call = 0;     // bytes each rank sends per call
  double bytes_per_rank = 0;     // per optimizer step
  std::string formula;           // short derivation, e.g. "2·S(k-1)/k, S = grad_bytes·N/(tp·pp)"
  RouteLimit route;              // the MoE all-to-all's node limit (no limit elsewhere)
};

struct StepTraffic {
  TrafficItem dp_grad;           // DP all-reduce, or ZeRO reduce-scatter of gradients
  TrafficItem zero_param_gather; // ZeRO all-gather of parameters (stages 1–3)
  TrafficItem tp;
  // Note [SP re-gather] (comm.cpp): under SP, the all-gathers in backward that rebuild each
  // column-parallel linear's input for its weight gradient. Sent, but off the critical path.
  TrafficItem tp_regather;
  // Of tp's calls, the backward input-gradient collectives of the column-parallel linears (the
  // all-reduce, or under SP the reduce-scatter, of QKV's and the MLP up's input gradient): one per
  // such linear per micro-batch. Note [TP gradient overlap] (planner.cpp) hides them behind their
  // weight-gradient GEMMs.
  double tp_input_grad_calls = 0;
  TrafficItem pp;
  // Note [PP scatter/gather] (comm.cpp): the receiving stage's all-gather of the 1/tp pieces, over
  // its TP group; on the critical path with the send.
  TrafficItem pp_gather;
  // Note [tied embedding under PP] (comm.cpp): the end stages' all-reduce of the tied word
  // embedding's gradient, once per step after the schedule; a rank of the first or the last stage
  // sends it (middle stages hold no copy).
  TrafficItem pp_embedding;
  TrafficItem cp;
  TrafficItem ep;                // MoE token dispatch and combine all-to-alls
  // The expert-TP all-gather of the dispatched tokens and reduce-scatter of the expert outputs
  // (Note [expert tensor parallelism], parallel_groups.hpp): when the ETP group's ranks hold
  // different tokens (SP, or tp = 1) and e_t > 1.
  TrafficItem expert_tp;
  // ep > 1 or e_t ≠ t: the routed experts' gradients and ZeRO gathers run over the expert-data-
  // parallel group t·c·d/(e_t·ep); dp_grad and zero_param_gather then carry the other parameters.
  TrafficItem expert_grad;
  TrafficItem expert_param_gather;
  // Erratum 4: the seed's "ZeRO-2 halves communication" figure, S_grad(k−1)/k — the gradient
  // reduce-scatter alone, without the parameter all-gather that must follow it.
  double reduce_scatter_only_bytes = 0;
  StepTrafficSetup setup;
  double dp_total_bytes() const {
    return dp_grad.bytes_per_rank + zero_param_gather.bytes_per_rank +
           expert_grad.bytes_per_rank + expert_param_gather.bytes_per_rank;
  }
  double total_bytes() const;
  std::vector<TrafficItem> items() const;  // the twelve items in ledger order
  std::string convention() const;
};

// Per-rank bytes per optimizer step of each parallel dimension. Sources in comm.cpp.
StepTraffic step_traffic(const StepTrafficSetup& setup);
// The same without StepTrafficSetup::validate: the planner's search, whose layouts pass the same
// rules by construction (evaluate_layout, the one-layout path, keeps the check).
StepTraffic step_traffic_unchecked(const StepTrafficSetup& setup);

// The FSDP float8 all-gather is torchao's tensorwise fp8 recipe's (Note [fp8 all-gather]): throws
// InvalidInput naming --fsdp-float8-all-gather unless p is fp8.
void require_float8_all_gather(Precision p);

// The share of N the ZeRO parameter all-gather moves in float8 for a precision and the two
// switches (Note [fp8 all-gather]): torchao's FSDP float8 all-gather (ZeRO-3 only) gathers
// float8_gather_share(model); Megatron-Core's fp8 parameters (ZeRO >= 1) the same, plus the routed
// experts (StepTrafficSetup::fp8_gather_experts) — per-tensor fp8 only: MXFP8 parameters are
// gathered in bf16. 0 for ZeRO-0 or neither switch.
struct Fp8Gather {
  double share = 0;
  bool experts = false;
};
Fp8Gather fp8_gather(const ModelSpec& m, Precision p, int zero_stage, bool fsdp_float8_all_gather,
                     bool fp8_param_gather);

// StepTrafficSetup::tied_embedding_elements as Megatron-LM holds it (Note [tied embedding under
// PP]): the word embedding split over the vocabulary, V·h/t per end-stage rank; 0 when untied.
double megatron_tied_embedding_elements(const ModelSpec& m, int tp);

// α–β time of one ledger item on a link: calls·steps·α + bytes_per_rank/β.
double traffic_seconds(const TrafficItem& item, const LinkSpec& link);
// The same on `cluster`, under its comm_model: flat_ring = the α–β time on link_for_group(cluster,
// item.group, item.stride); nccl = Note [NCCL collective model] in comm.cpp. The item carries its
// group and stride, so no caller re-derives them.
double traffic_seconds(const TrafficItem& item, const ClusterSpec& cluster);
// A host calibration's own α–β for some collective kinds (io::fitted_link of its labelled points;
// Note [sharded collectives] in engine/bench/allreduce.cpp: on the CPU host a reduce-scatter or
// all-gather called after compute pays the host's fixed cost whole, not half an all-reduce's).
struct CollectiveLinks {
  std::optional<LinkSpec> reduce_scatter, all_gather;
};
// traffic_seconds on `cluster`, but every call of a kind `links` holds priced on that link:
// steps(kind, group)·α + bytes_per_call/β; a paired item (sequence parallelism's all-gather +
// reduce-scatter) splits its calls evenly between its two kinds.
double traffic_seconds(const TrafficItem& item, const ClusterSpec& cluster,
                       const CollectiveLinks& links);

// One call of a collective whose ring moves `bytes_per_rank` per rank, over `group` ranks spaced
// `stride` apart, on `cluster` (same two models); an all-to-all under `route`'s node limit.
double collective_seconds(Collective c, double bytes_per_rank, int group, int stride,
                          const ClusterSpec& cluster, const RouteLimit& route = {});

// Where one all-to-all call's bytes go for a member of a full NVLink domain (Note [node-limited
// routing]): to ranks in other domains (the NICs) and inside its own (NVLink).
struct AllToAllSplit {
  double inter_node_bytes = 0, intra_node_bytes = 0;
  int domains = 1;             // n: NVLink domains the group spans
  int members_per_domain = 1;  // q
};
AllToAllSplit all_to_all_split(double bytes_per_rank, int group, int stride,
                               const ClusterSpec& cluster, const RouteLimit& route = {});

}  // namespace tally
