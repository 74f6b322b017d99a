#include "tally/core/planner.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <utility>
#include <string>
#include <tuple>
#include <unordered_map>

#include "tally/core/activations.hpp"
#include "tally/core/comm.hpp"
#include "tally/core/compute.hpp"
#include "tally/core/operators.hpp"
#include "tally/core/parallel_groups.hpp"
#include "tally/core/pipeline.hpp"
#include "tally/core/plan_points.hpp"
#include "tally/core/roofline.hpp"
#include "plan_prepared.hpp"

namespace tally {

// Note [planner time model]
// Per optimizer step, per GPU (every assumption here is printed with the plan). Two models:
// operators (default) and the seed's utilisation model (--time-model utilisation).
//   compute   operators: one micro-batch on a stage runs its layers' kernels (core/operators.hpp,
//             forward + backward + recompute, each on the roofline of core/roofline.hpp) plus the
//             embedding (first stage) or the final norm, LM head and loss (last stage); the slowest
//             stage sets the pace. Per step: m micro-batches of it, then the optimizer's kernels on
//             the GPU's shard of the states (bytes over HBM bandwidth).
//             utilisation: t_c = hardware FLOPs (compute.hpp, with recompute) / (G · peak · u), u =
//             the GPU type's utilisation (ClusterSpec::mfu or a calibration file); the last
//             stage's LM-head share stretches it by (1 + (P−1)·F_head/F).
//   TP, CP    on the critical path: Megatron's TP all-reduces block the next matmul (unless
//             tp_overlap), but for the backward input-gradient ones (Note [TP gradient
//             overlap]); CP's ring is counted exposed (conservative: ring attention can overlap
//             it).
//   PP        point-to-point sends per micro-batch, exposed (with pp_scatter_gather, Megatron-LM
//             2021–23: 1/t of each over the network, then an all-gather over TP, exposed too);
//             a tied embedding's gradient all-reduce between the end stages once per step, after
//             the schedule (Note [tied embedding under PP], comm.cpp).
//   bubble    pipeline wall = (stage time + TP + CP + PP) / (1 − f), f = (P−1)/(v·m + P−1).
//   DP/ZeRO   Note [planner overlap].
//   step      pipeline wall + optimizer + exposed DP time + the once-per-step all-reduces after
//             the schedule (a tied embedding's; under SP the replicated parameters' gradients,
//             Note [TP edges]). E = t_ideal / step, t_ideal = the time one GPU would take for B
//             with the same kernels and no parallelism, over G.
// Note [planner overlap] — each default follows a framework, each is a PlanRequest switch:
//   overlap_dp (default on; PyTorch DDP/FSDP, DeepSpeed overlap_comm, Megatron --overlap-grad-
//             reduce): gradient buckets are reduced while backward continues; a reduction done
//             once per step hides in the last micro-batch's backward, one done per micro-batch
//             (ZeRO-2/3 without PP) in every backward; the last bucket (25 MiB, kDdpBucketBytes) is always
//             exposed. Off: the whole reduction is on the critical path (the seed; Megatron's 2021
//             local DDP, which the Narayanan 2021 dev-set rows use).
//   overlap_param_gather (default on; Megatron's distributed optimizer --overlap-param-gather):
//             ZeRO-1/2's parameter all-gather after the optimizer step hides in the next step's
//             first forward, but for its first bucket. Off: exposed (DeepSpeed ZeRO-1/2).
//   ZeRO-3    per-layer gathers are prefetched one layer ahead and overlap the whole compute.
//   tp_overlap (default off, Megatron's default; on = Transformer Engine comm-GEMM overlap): each
//             layer's TP collectives hide behind that layer's kernels.
//   tp_grad_overlap (default on) — Note [TP gradient overlap]: in backward a column-parallel
//             linear (QKV, the MLP's up or gate-up) computes its input gradient, issues that
//             gradient's all-reduce (under SP: reduce-scatter) asynchronously and computes its
//             weight gradient meanwhile; the collective costs max(0, its time − that GEMM's).
//             Megatron-LM since cf7efd4f5a (2021-08-30, --async-tensor-parallel-allreduce; on by
//             default from 2022, LinearWithGradAccumulationAndAsyncCommunication, which Korthikanti
//             2022's runs use) and Transformer Engine's Linear / LayerNormLinear ("Overlap dgrad-
//             RS/AR with wgrad"). Off: exposed — Megatron-LM de7dc40f88 (Narayanan 2021's runs)
//             and PyTorch DTensor TP (torchtitan), whose autograd node runs both GEMMs before the
//             collective. The forward's collectives, a full-recompute replay's, and under SP the
//             row-parallel outputs' all-gathers in backward stay exposed. The bound is the
//             planner's sum: per step, m · layers · the layer's column-parallel weight-gradient
//             GEMMs.
//   EP        the MoE dispatch and combine all-to-alls (Note [expert parallelism], comm.cpp) are
//             on the critical path, per layer like TP (Megatron-Core's default); ep_overlap (on =
//             Megatron-Core 0.14 --overlap-moe-expert-parallel-comm, DeepSeek-V3's DualPipe)
//             hides them behind the kernels of another micro-batch, up to the stage's compute.
//   PP        sends stay on the critical path at stage boundaries.
// Note [overlap contention] — a hidden collective is not free. NCCL's kernels run on SMs of
//             their own and share HBM with the compute beside them, so the kernels that hide a
//             collective run slower while it runs: Lee et al. 2025 ("Characterizing Compute-
//             Communication Overlap in GPU-Accelerated Distributed Deep Learning", arXiv
//             2507.03114) measured an average computational slowdown of σ = 18.9 % (up to 40 %)
//             over GPT and Llama training on A100, H100, MI250 and MI210, against the same
//             kernels with no communication beside them. With kernels of w seconds beside a
//             collective of c, the kernels progress at 1/(1 + σ) while it runs: everything ends
//             after w + c·σ/(1 + σ) if c <= w·(1 + σ), else after c, so the critical path grows
//             by max(c − w, c·σ/(1 + σ)) (overlap_exposed_s) instead of max(c − w, 0). Applied
//             wherever a collective hides above: DP gradient buckets, ZeRO-1/2 and ZeRO-3 gathers,
//             TP's input-gradient collectives and, under SP, the re-gathers of the same linears'
//             inputs (Note [SP re-gather], comm.cpp), tp_overlap and ep_overlap; a DP reduction's
//             last bucket (a ZeRO-1/2 gather's first) stays exposed whole, the rest runs beside
//             the kernels. σ is one average over GPUs and models, not a per-GPU measurement;
//             PlanRequest::overlap_slowdown (--overlap-slowdown) replaces it, 0 gives the ideal
//             overlap.
// Note [TP edges] — the model's ends under TP, per micro-batch, as Megatron-LM (and DTensor's
//             vocabulary-sharded embedding and column-wise output layer) run them, each of
//             S = b·(s/c)·h, on the end stages only:
//             first stage: the vocabulary-parallel embedding's partial outputs all-reduced
//               (under SP: reduce-scattered to the sequence shard, Megatron-Core's
//               reduce_scatter_embeddings — Megatron-LM 2022 all-reduced, then split: one unit
//               more, not counted — and its backward all-gathers the shards' gradients) —
//               exposed;
//             last stage: the output layer's input gathered from the sequence shards (SP:
//               all-gather forward, exposed; its backward's reduce-scatter, or without SP the
//               input gradient's all-reduce, is that linear's input-gradient collective, hidden
//               behind the LM head's weight-gradient GEMM under tp_grad_overlap or tp_overlap,
//               else exposed).
//             last stage, forward: the vocabulary-parallel loss's all-reduces of one fp32 value
//               per token, b·(s/c)·4 B (latency, mostly): Megatron-LM's unfused loss (mpu/
//               cross_entropy.py, de7dc40f88; core/tensor_parallel/cross_entropy.py) 3 (the max,
//               the target's logit, the sum of exponentials), its fused one (core/fusions/
//               fused_cross_entropy.py) 2 (the max; the other two concatenated, 2·b·(s/c)·4 B),
//               PyTorch's loss_parallel (DTensor, torchtitan's eager loss) 3 (the max, the sum of
//               exponentials, the target's log-probability); none in backward.
//             once per step, under SP, after the schedule: the all-reduce of the gradients of
//               the parameters every TP rank holds whole and sees a sequence shard of — the norms'
//               weights (and LayerNorm's biases) and the row-parallel linears' biases, 6h per
//               GPT layer, 2h per Llama layer, at the gradients' bytes (Megatron-LM 2022
//               training.py "All-reduce layernorm parameters ... when sequence parallelism is
//               used", Megatron-Core finalize_model_grads.py _allreduce_layernorm_grads),
//               charged to the busiest stage's layers.
//             Time only: step_traffic's per-rank byte ledger is the busiest stage's layers (the
//             one the engine checks exactly), so the plan's bytes per GPU leave these few calls
//             out (the tied embedding's exchange is a ledger item: Note [tied embedding under
//             PP]).
// Note [gradient accumulation] (PlanRequest::grad_accumulation): with m > 1 micro-batches each
// one's weight gradients are added into the step's gradient buffer.
//   fused (default: Megatron-Core --gradient-accumulation-fusion, Transformer Engine
//             fuse_wgrad_accumulation): the weight-gradient GEMM adds into the buffer (β = 1); its
//             extra operand read is inside a compute-bound GEMM and not counted.
//   autograd  PyTorch's AccumulateGrad (torch/csrc/autograd/functions/accumulate_grad.h) steals the
//             first micro-batch's gradient and adds each later one in place, `grad += new`: one
//             kernel reading both and writing the sum, 3 × the gradient bytes the GPU holds
//             (ModelStateResult::bytes.grads: sharded under ZeRO-2/3) for each of the m − 1
//             later micro-batches, over HBM bandwidth; spread over the stage's m micro-batches
//             as (m − 1)/m of it per micro-batch, on every stage alike (the heaviest stage's
//             gradients: at most the embedding or head more than a middle stage holds). PyTorch
//             DDP under no_sync and FSDP run it; so did Megatron-LM's 2021 code (commit de7dc40f88:
//             without --use-contiguous-buffers-in-ddp no main_grad hook is registered), which the
//             Narayanan 2021 dev-set rows use.
// Communication: core/comm.hpp traffic_seconds on the cluster's comm model (presets: NCCL rings
// over NVLink and every rail, Note [NCCL collective model]).
// Buffers: DDP-style gradient buckets 2 × 25 MiB (PyTorch DDP's default bucket) for ZeRO 0–2; two
// layers of gathered parameters for ZeRO-3 (current + prefetched).

// A window the collective always fits in (the LM head's weight gradient behind its input
// gradient's collective, Note [TP edges]).
constexpr double kFullyHidden = std::numeric_limits<double>::infinity();
// How many times `top` layouts the search keeps for the schedule to re-price (Note [priced by the
// schedule]): the closed form is within a few per cent of the schedule on the splits the search
// makes, so the best few by the schedule lie among the first few dozen by the form. Checked
// exhaustively by VirtualStages.PlanPoolHoldsTheSchedulesBestFive (tests/core/
// test_virtual_stages.cpp): on seven searches the schedule's best five were among the form's
// first seven; with a pool of `top` alone Llama 3 70B on 64 H100s printed a wrong fourth and fifth.
constexpr std::size_t kPricedBySchedule = 4;

double overlap_exposed_s(double comm_s, double window_s, double slowdown) {
  if (!(comm_s > 0)) return 0.0;
  return std::max(comm_s - window_s, comm_s * slowdown / (1 + slowdown));
}

double gradient_reduction_exposed_s(double grad_s, double last_bucket_s, double window_s,
                                    double slowdown) {
  const double last = std::min(grad_s, last_bucket_s);
  return last + overlap_exposed_s(grad_s - last, window_s, slowdown);
}

namespace {

using detail::MicroTimes;
using detail::Prepared;
using detail::choose_split;
using detail::prepare;
using detail::slot_split;
using detail::scheduled_makespan;


// Parameters on the GPU of the heaviest stage: N/(t·p) for an even split (the seed's ledger);
// with uneven stages or MTP modules, each stage's layers plus the embedding (first) or the head
// and the MTP modules (last; a tied head keeps a copy of the embedding there, as Megatron-LM
// does), scaled to the state ledger's N.
double params_per_gpu(const Prepared& P, const Layout& L, const std::vector<LayerRun>& runs) {
  const ParamCount& c = P.count;
  // The multi-token-prediction modules sit on the last stage (Note [multi-token prediction]).
  if (!L.uneven_stages() && (c.mtp == 0 || L.pp == 1)) return P.n_state / (double(L.tp) * L.pp);
  const double per_layer = (c.attention + c.mlp + c.norms) / double(P.req->model.layers);
  const double head = (P.req->model.tied_embeddings ? c.embedding : c.output_head) + c.mtp;
  double heaviest = 0;
  for (std::size_t i = 0; i < runs.size(); ++i)  // stage 0 and stage P − 1 are runs of their own
    heaviest = std::max(heaviest, runs[i].layers * per_layer + (i == 0 ? c.embedding : 0.0) +
                                      (i + 1 == runs.size() ? head : 0.0));
  return heaviest * (P.n_state / c.total()) / L.tp;
}

// Memory of a layout; returns total bytes and fills the memory fields of `e`.
// The GPU's model states: the heaviest stage's parameters split by TP, sharded by ZeRO over dp·cp,
// the routed experts split over ep and sharded over dp·cp/ep (core/model_states.hpp).
// The layers of the layout's fullest pipeline stage.
int busiest_stage_layers(const std::vector<LayerRun>& runs) {
  int busiest = 0;
  for (const LayerRun& run : runs) busiest = std::max(busiest, run.layers);
  return busiest;
}

// A layout's stages, computed once per layout and shared by its memory and time.
struct Stages {
  const std::vector<LayerRun>& runs;
  int busiest = 0;  // layers of the fullest stage
};

ModelStateResult states_of(const Prepared& P, const Layout& L, const Stages& st) {
  const PlanRequest& r = *P.req;
  // fp8 delayed scaling: the metadata of the fullest stage's GEMMs (Note [low precision]).
  const double gemms =
      r.precision == Precision::fp8 ? low_precision_gemms(r.model, st.busiest, L.ep) : 0.0;
  return model_states(params_per_gpu(P, L, st.runs),
                      StateSetup{.precision = r.precision, .optimizer = r.optimizer,
                                 .zero_stage = L.zero, .shard_degree = L.dp * L.cp, .ep = L.ep,
                                 .tp = L.tp, .etp = L.etp, .expert_share = P.expert_share,
                                 .gemm_weight_share = P.gemm_weight_share,
                                 .scaled_gemms = gemms, .amax_history = r.amax_history,
                                 .compute_capability = r.cluster.gpu.compute_capability,
                                 .fp8_param_gather = r.fp8_param_gather});
}

void cost_memory(const Prepared& P, const Layout& L, const Stages& stages,
                 const ModelStateResult& states, PlanEval& e) {
  const PlanRequest& r = *P.req;
  const double n_gpu = states.local_params;
  e.states = states.bytes;
  e.scaled_gemms = states.setup.scaled_gemms;
  const ActivationSetup a{.seq = r.seq, .micro_batch = L.micro_batch, .tp = L.tp,
                          .sequence_parallel = L.sp, .cp = L.cp, .pp = L.pp,
                          .interleave = L.interleave, .micro_batches = int(L.grad_accum),
                          .recompute = L.recompute, .recompute_modules = r.recompute_modules,
                          .attention = L.attention,
                          .dropout = r.uses_dropout(), .act_bytes = P.act_bytes,
                          .linear_input_bytes = saved_linear_input_bytes(r.precision),
                          .etp = L.etp, .capacity_factor = r.capacity_factor,
                          .eager_loss = r.loss == Loss::eager,
                          .first_stage_layers = L.first_stage_layers,
                          .last_stage_layers = L.last_stage_layers,
                          .stage_layer_list = L.stage_layer_list.get()};
  e.activation_bytes = activation_peak_bytes_unchecked(r.model, a, P.layer_activation_bytes(a));
  const FitCheck fit = check_fit(e.states.total(), e.activation_bytes,
                                 buffer_bytes(L.zero, n_gpu, stages.busiest, P.param_bytes, L.pp),
                                 r.memory_budget());
  e.buffer_bytes = fit.buffer_bytes;
  e.allocated_bytes = fit.allocated_bytes;
  e.allocator_bytes = fit.allocator_bytes;
  e.runtime_bytes = fit.runtime_bytes;
  e.total_bytes = fit.total_bytes;
  e.usable_bytes = fit.usable_bytes;
  e.fits = fit.fits;
}

// One micro-batch on one GPU of a stage (Note [planner time model]): per layer, and the extras of
// the end stages. The utilisation model spreads hardware FLOPs at u the same way, which gives its
// t_c · (1 + (P−1)·F_head/F) for even stages.
struct StageTimes {
  double layer_s = 0, layer_backward_s = 0;
  double first_extra_s = 0, last_extra_s = 0, last_extra_backward_s = 0;
};

// The layout's kernel times (operator model; null under the utilisation model).
const MicroTimes* layout_micro_times(const Prepared& P, const Layout& L) {
  if (P.req->time_model == TimeModel::utilisation) return nullptr;
  return &P.micro_times(L.micro_batch, L.tp, L.sp, L.cp, L.recompute, L.attention, L.ep, L.etp);
}

StageTimes stage_times(const Prepared& P, const Layout& L, const MicroTimes* micro) {
  const PlanRequest& r = *P.req;
  if (r.time_model == TimeModel::utilisation) {
    // Per micro-batch per GPU: the step's FLOPs over m micro-batches and the t·c GPUs of a stage.
    const double per_mb = double(L.micro_batch) / double(r.global_batch) / (double(L.tp) * L.cp) /
                          (P.peak * P.util);
    const double head = P.head_flops[int(L.recompute)];
    const double layer = (P.hw_flops[int(L.recompute)] - head) / double(r.model.layers);
    return StageTimes{.layer_s = layer * per_mb, .layer_backward_s = (2.0 / 3.0) * layer * per_mb,
                      .last_extra_s = head * per_mb,
                      .last_extra_backward_s = (2.0 / 3.0) * head * per_mb};
  }
  const MicroTimes& t = *micro;
  return StageTimes{.layer_s = t.layer_per_micro_batch(double(L.grad_accum)),
                    .layer_backward_s = t.backward_per_micro_batch(),
                    .first_extra_s = t.embedding_s, .last_extra_s = t.output_s,
                    .last_extra_backward_s = t.output_backward_s};
}

// The single-GPU ideal for E: one GPU, the same kernels (or u), no parallelism, B sequences, over G.
// A MoE layout's experts run the GEMMs its EP gives them (ep micro-batches' tokens per expert, as
// if one GPU ran the EP group's ranks one after another): token batching is the layout's choice,
// not a parallel overhead, and an ideal whose experts see one micro-batch's b·s·k/E rows made E
// exceed 1 (1.52 for DeepSeek-V3 at micro-batch 1, EP 8).
double ideal_seconds(const Prepared& P, const Layout& L, const MicroTimes* micro) {
  const PlanRequest& r = *P.req;
  if (r.time_model == TimeModel::utilisation)
    return P.model_flops / (double(r.gpus) * P.peak * P.util);
  const MicroTimes& one = *micro->single;
  const double micro_batches = double(r.global_batch) / double(L.micro_batch);
  const double single =
      micro_batches * (double(r.model.layers) * one.layer_per_micro_batch(micro_batches) +
                       one.embedding_s + one.output_s) +
      roofline_seconds(r.cluster.gpu, 0.0, 1.0,
                       optimizer_update_bytes(r.precision, r.optimizer) * P.n_state);
  // Note [gradient accumulation]: one GPU adds all N gradients after every micro-batch but the
  // first.
  const double accumulate =
      r.grad_accumulation == GradAccumulation::autograd
          ? (micro_batches - 1) *
                roofline_seconds(r.cluster.gpu, 0.0, 1.0, 3.0 * P.grad_bytes * P.n_state)
          : 0.0;
  return (single + accumulate) / double(r.gpus);
}

// One all-reduce of `bytes` over a TP group of `tp` adjacent ranks (Note [TP edges]).
double tp_all_reduce_s(double bytes, int tp, const ClusterSpec& c) {
  return collective_seconds(Collective::all_reduce,
                            collective_bytes_per_rank(Collective::all_reduce, bytes, tp), tp, 1,
                            c);
}

void cost_time(const Prepared& P, const Layout& L, const Stages& stages,
               const ModelStateResult& states, PlanEval& e) {
  const PlanRequest& r = *P.req;
  const ClusterSpec& c = r.cluster;
  const int busiest = stages.busiest;
  const Fp8Gather fp8 =
      fp8_gather(r.model, r.precision, L.zero, r.fsdp_float8_all_gather, r.fp8_param_gather);
  const StepTrafficSetup traffic_setup{
      .params = P.n_state, .param_bytes = P.param_bytes, .fp8_gather_share = fp8.share,
      .fp8_gather_experts = fp8.experts, .grad_bytes = P.param_bytes,
      .act_bytes = P.act_bytes, .hidden = r.model.hidden, .layers = r.model.layers,
      .seq_len = r.seq, .micro_batch = L.micro_batch, .micro_batches = L.grad_accum, .dp = L.dp,
      .tp = L.tp, .pp = L.pp, .cp = L.cp, .interleave = L.interleave,
      .pp_scatter_gather = r.pp_scatter_gather,
      .tied_embedding_elements = megatron_tied_embedding_elements(r.model, L.tp),
      .zero_stage = L.zero,
      .sequence_parallel = L.sp,
      .recompute = L.recompute, .kv_hidden = r.model.kv_heads * r.model.head_dim(),
      .busiest_stage_layers = busiest, .ep = L.ep, .etp = L.etp, .expert_share = P.expert_share,
      .moe_layers = r.model.moe_layers(), .experts_per_token = r.model.experts_per_token,
      .capacity_factor = r.capacity_factor, .shared_experts = r.model.shared_experts > 0,
      .max_route_nodes = r.max_route_nodes, .formulas = false};
  const StepTraffic traffic = P.check_each ? step_traffic(traffic_setup)
                                           : step_traffic_unchecked(traffic_setup);
  e.comm_bytes_per_gpu = traffic.total_bytes();
  e.tp_s = traffic_seconds(traffic.tp, c);
  e.cp_s = traffic_seconds(traffic.cp, c);
  // Note [PP scatter/gather] (comm.cpp): the gather after each receive is part of the transfer.
  e.pp_s = traffic_seconds(traffic.pp, c) + traffic_seconds(traffic.pp_gather, c);
  e.ep_s = traffic_seconds(traffic.ep, c) + traffic_seconds(traffic.expert_tp, c);
  const double grad_s =
      traffic_seconds(traffic.dp_grad, c) + traffic_seconds(traffic.expert_grad, c);
  const double gather_s = traffic_seconds(traffic.zero_param_gather, c) +
                          traffic_seconds(traffic.expert_param_gather, c);
  e.dp_s = grad_s + gather_s;

  // Each stage's time per micro-batch: its layers' kernels and exposed TP/CP collectives, its
  // extras, and the PP sends (Note [planner time model]); the schedule's makespan from
  // core/pipeline.hpp (equal stages: the bubble (P−1)/(v·m + P−1)).
  const double m = double(L.grad_accum);
  const MicroTimes* micro = layout_micro_times(P, L);
  const StageTimes st = stage_times(P, L, micro);
  // Note [gradient accumulation]: per micro-batch, in its backward.
  const double accumulate_s =
      micro != nullptr && r.grad_accumulation == GradAccumulation::autograd && m > 1
          ? (m - 1) / m * roofline_seconds(c.gpu, 0.0, 1.0, 3.0 * states.bytes.grads)
          : 0.0;
  // Note [overlap contention]: every hidden collective still costs σ/(1 + σ) of its time (the
  // utilisation model's u is an end-to-end figure that holds it already).
  const double sigma = r.time_model == TimeModel::operators ? r.overlap_slowdown : 0.0;
  // Note [TP edges]: the end stages' own TP collectives, per micro-batch, in units of one call of
  // the TP item (every one moves S = b·(s/c)·h).
  double edge_first_s = 0, edge_last_s = 0;
  if (traffic.tp.calls > 0) {
    const double per_call = e.tp_s / traffic.tp.calls;
    const bool hidden = (r.tp_grad_overlap && micro != nullptr) || r.tp_overlap;
    edge_first_s = per_call * (L.sp ? 2.0 : 1.0);
    // Hidden: the output layer's input-gradient collective, behind the LM head's weight gradient.
    const double behind_head = hidden ? overlap_exposed_s(per_call, kFullyHidden, sigma)
                                      : per_call;
    edge_last_s = per_call * (L.sp ? 1.0 : 0.0) + behind_head;
    // The vocabulary-parallel loss's all-reduces of one fp32 value per token (Note [TP edges]).
    const double values = double(L.micro_batch) * double(r.seq) / L.cp * 4.0;
    edge_last_s += r.loss == Loss::fused
                       ? tp_all_reduce_s(values, L.tp, c) + tp_all_reduce_s(2 * values, L.tp, c)
                       : 3 * tp_all_reduce_s(values, L.tp, c);
  }
  // Note [TP gradient overlap]: of the TP time, the input-gradient collectives' share (every TP
  // call moves the same bytes) hides behind the column-parallel weight-gradient GEMMs.
  if (r.tp_grad_overlap && !r.tp_overlap && micro != nullptr && traffic.tp.calls > 0) {
    const double input_grad_s = e.tp_s * traffic.tp_input_grad_calls / traffic.tp.calls;
    e.tp_s += overlap_exposed_s(input_grad_s, m * busiest * micro->column_wgrad_s, sigma) -
              input_grad_s;
  }
  // Note [SP re-gather] (comm.cpp): under SP the same linears' inputs are re-gathered beside their
  // input-gradient GEMMs (as many FLOPs as the weight-gradient ones): hidden, not free.
  if (L.sp && r.tp_grad_overlap && !r.tp_overlap && micro != nullptr &&
      traffic.tp_regather.calls > 0)
    e.tp_s += overlap_exposed_s(traffic_seconds(traffic.tp_regather, c),
                                m * busiest * micro->column_wgrad_s, sigma);
  if (r.tp_overlap)  // each layer's TP collectives behind that layer's kernels
    e.tp_s = overlap_exposed_s(e.tp_s, m * busiest * st.layer_s, sigma);
  if (r.ep_overlap)  // the all-to-alls behind another micro-batch's kernels
    e.ep_s = overlap_exposed_s(e.ep_s, m * busiest * st.layer_s, sigma);
  const double comm_per_layer = (e.tp_s + e.cp_s + e.ep_s) / (m * busiest);
  // Note [multi-token prediction] (model.cpp): each MTP module on the last stage repeats the
  // head's TP edges and adds its layer's collectives.
  const double mtp = double(r.model.mtp_layers);
  edge_last_s = edge_last_s * (1 + mtp) + mtp * comm_per_layer;
  const double pp_per_mb = e.pp_s / m;
  // Per run of equal stages (stage 0 and stage P − 1 are runs of their own).
  std::vector<StageRun>& stage_s = P.stage_seconds;
  stage_s.clear();
  double slowest = 0, slowest_compute = 0, slowest_backward = 0, slowest_edges = 0;
  for (std::size_t i = 0; i < stages.runs.size(); ++i) {
    const bool first = i == 0, last = i + 1 == stages.runs.size();
    const int n = stages.runs[i].layers;
    const double compute = n * st.layer_s + (first ? st.first_extra_s : 0.0) +
                           (last ? st.last_extra_s : 0.0) + accumulate_s;
    const double edges = (first ? edge_first_s : 0.0) + (last ? edge_last_s : 0.0);
    const double seconds = compute + n * comm_per_layer + edges + pp_per_mb;
    stage_s.push_back({.seconds = seconds, .stages = stages.runs[i].stages});
    if (seconds > slowest) {
      slowest = seconds;
      slowest_compute = compute;
      slowest_edges = edges;
      slowest_backward =
          n * st.layer_backward_s + (last ? st.last_extra_backward_s : 0.0) + accumulate_s;
    }
  }
  e.tp_s += m * slowest_edges;  // the slowest stage's exposed TP time, its edges included
  const double beta = st.layer_s > 0 ? st.layer_backward_s / st.layer_s : 2.0 / 3.0;
  // Note [priced by the schedule] (plan_stages.cpp): the search's closed form, or the schedule.
  const double pipe =
      P.simulate_pipeline && L.pp > 1
          ? scheduled_makespan(
                L, int(r.model.layers),
                {.layer_s = st.layer_s, .layer_backward_s = st.layer_backward_s,
                 .comm_per_layer_s = comm_per_layer, .first_extra_s = st.first_extra_s,
                 .edge_first_s = edge_first_s, .last_extra_s = st.last_extra_s,
                 .last_extra_backward_s = st.last_extra_backward_s, .edge_last_s = edge_last_s,
                 .accumulate_s = accumulate_s, .pp_s = pp_per_mb, .beta = beta})
          : pipeline_makespan(stage_s, int(L.grad_accum), L.interleave, beta);
  const double busy = m * slowest;
  e.bubble_s = pipe - busy;
  e.bubble_fraction = pipe > 0 ? e.bubble_s / pipe : 0.0;
  // The optimizer updates this GPU's shard of the states.
  const double updated = states.updated_params;
  e.optimizer_s =
      r.time_model == TimeModel::utilisation
          ? 0.0
          : roofline_seconds(c.gpu, 0.0, 1.0,
                             optimizer_update_bytes(r.precision, r.optimizer) * updated);
  e.compute_s = m * slowest_compute + e.optimizer_s;
  // Note [planner overlap]. One 25 MiB bucket of a collective: its share of one call.
  auto last_bucket_s = [&](const TrafficItem& item, double full_bytes) {
    if (item.calls <= 0 || full_bytes <= 0) return 0.0;
    const double share = std::min(1.0, kDdpBucketBytes / full_bytes);
    return collective_seconds(item.collective, item.bytes_per_call * share, item.group,
                              item.stride, c);
  };
  const double shard_bytes = P.param_bytes * P.n_state / (double(L.tp) * L.pp);
  double grad_exposed = grad_s, gather_exposed = gather_s;
  if (r.overlap_dp) {
    const double window_s = traffic.dp_grad.calls > 1 ? slowest_backward * m : slowest_backward;
    // The last bucket after the backward, the rest beside it: with σ = 0 this is
    // max(last bucket, gradients − window).
    grad_exposed = gradient_reduction_exposed_s(
        grad_s, last_bucket_s(traffic.dp_grad, shard_bytes), window_s, sigma);
  }
  if (L.zero == 3) {
    gather_exposed = overlap_exposed_s(gather_s, m * slowest_compute, sigma);
  } else if (r.overlap_param_gather && gather_s > 0) {
    // The first bucket before the forward, the rest beside it.
    const double first = std::min(gather_s, last_bucket_s(traffic.zero_param_gather, shard_bytes));
    gather_exposed =
        first + overlap_exposed_s(gather_s - first, slowest_compute - slowest_backward, sigma);
  }
  e.dp_exposed_s = grad_exposed + gather_exposed;
  // Note [tied embedding under PP] (comm.cpp): after the schedule, before the optimizer step;
  // counted with the exposed PP time.
  const double tied_s = traffic_seconds(traffic.pp_embedding, c);
  e.pp_s += tied_s;
  // Note [TP edges]: under SP the sequence-parallel parameters' gradients, all-reduced over TP
  // once per step after the schedule.
  double sp_grads_s = 0;
  if (L.sp && L.tp > 1) {
    const ModelSpec& mo = r.model;
    const double per_layer = 2.0 * (mo.norm == NormKind::layernorm ? 2.0 : 1.0) +
                             (mo.linear_bias ? 2.0 : 0.0);  // × h
    sp_grads_s = tp_all_reduce_s(per_layer * double(mo.hidden) * busiest * P.param_bytes, L.tp, c);
    e.tp_s += sp_grads_s;
  }
  e.step_s = pipe + e.optimizer_s + e.dp_exposed_s + tied_s + sp_grads_s;

  const double G = r.gpus;
  e.tokens_per_s = P.tokens / e.step_s;
  e.mfu = P.model_flops / (e.step_s * G * P.peak);
  e.efficiency = ideal_seconds(P, L, micro) / e.step_s;

  // The tightest wall: the resource closest to its budget (all four are fractions of one budget).
  const double shares[4] = {e.total_bytes / e.usable_bytes, e.compute_s / e.step_s,
                            (e.tp_s + e.cp_s + e.pp_s + e.ep_s + e.dp_exposed_s) / e.step_s,
                            e.bubble_s / e.step_s};
  e.wall = e.fits ? Wall(std::max_element(shares, shares + 4) - shares) : Wall::memory;
}

// The layout with its stage split settled (Note [planner stages]): an explicit split is kept.
Layout with_stages(const Prepared& P, Layout L) {
  if (L.pp > 1 && L.interleave == 1 && !L.uneven_stages())
    std::tie(L.first_stage_layers, L.last_stage_layers) = choose_split(P, L.pp, L.recompute);
  // Interleaved over virtual stages that don't divide the layers: Megatron-Core's slots, as the
  // search takes them (Note [planner virtual stages]; none when they don't divide L + 2).
  if (L.pp > 1 && L.interleave > 1 && !L.uneven_stages() &&
      P.req->model.layers % (std::int64_t(L.pp) * L.interleave) != 0)
    L.stage_layer_list = slot_split(P, L.pp, L.interleave);
  return L;
}

PlanEval cost(const Prepared& P, const Layout& layout) {
  PlanEval e;
  const Layout L = with_stages(P, layout);
  e.layout = L;
  L.stage_runs(int(P.req->model.layers), P.layer_runs);
  const Stages stages{.runs = P.layer_runs, .busiest = busiest_stage_layers(P.layer_runs)};
  const ModelStateResult states = states_of(P, L, stages);
  cost_memory(P, L, stages, states, e);
  cost_time(P, L, stages, states, e);
  return e;
}

auto layout_key(const Layout& l) {
  return std::make_tuple(l.dp, l.tp, l.pp, l.cp, l.ep, l.expert_tp(), l.interleave, l.sp, l.zero,
                         l.micro_batch,
                         int(l.recompute), int(l.attention), l.first_stage_layers,
                         l.last_stage_layers);
}

// Total order: step time, then memory, then simplicity, then the layout itself (deterministic, so
// the pruned and exhaustive searches return the same list).
bool better(const PlanEval& a, const PlanEval& b) {
  if (a.step_s != b.step_s) return a.step_s < b.step_s;
  if (a.total_bytes != b.total_bytes) return a.total_bytes < b.total_bytes;
  if (a.layout.dimensions() != b.layout.dimensions())
    return a.layout.dimensions() < b.layout.dimensions();
  return layout_key(a.layout) < layout_key(b.layout);
}

bool closer_miss(const PlanEval& a, const PlanEval& b) {
  if (a.total_bytes != b.total_bytes) return a.total_bytes < b.total_bytes;
  return better(a, b);
}

// Keeps the `cap` smallest under `less`, sorted.
template <class Less>
void keep_top(std::vector<PlanEval>& v, const PlanEval& e, std::size_t cap, Less less) {
  if (cap == 0) return;
  if (v.size() == cap && !less(e, v.back())) return;
  v.insert(std::upper_bound(v.begin(), v.end(), e, less), e);
  if (v.size() > cap) v.pop_back();
}

// The (e_t, ep) pairs the search tries at one (tp, dp·cp): e_t = tp, and 1 when SearchSpace
// allows it; for each, ep | experts with ep·e_t | tp·dp·cp, up to max_ep. A dense model: (tp, 1).
struct ExpertSplit {
  int etp = 1, ep = 1;
};
std::vector<ExpertSplit> expert_splits(const ModelSpec& m, const SearchSpace& space, int tp,
                                       std::int64_t dp_cp) {
  if (!m.is_moe()) return {{tp, 1}};
  std::vector<int> etps;
  if (space.expert_tp != SearchSpace::ExpertTp::one || tp == 1) etps.push_back(tp);
  if (space.expert_tp != SearchSpace::ExpertTp::tp && tp > 1) etps.push_back(1);
  std::vector<ExpertSplit> out;
  for (const int etp : etps) {
    if (m.ffn % etp != 0) continue;
    for (const std::int64_t ep : divisors(std::int64_t(tp) * dp_cp / etp))
      if (m.experts % ep == 0 && (space.max_ep == 0 || ep <= space.max_ep))
        out.push_back({etp, int(ep)});
  }
  return out;
}

bool tp_divides(const ModelSpec& m, int tp) {
  return m.heads % tp == 0 && m.ffn % tp == 0 && m.dense_ffn % tp == 0 &&
         (m.shared_experts * m.shared_expert_ffn) % tp == 0 &&
         (m.kv_heads % tp == 0 || tp % m.kv_heads == 0);
}

}  // namespace

PlanEval evaluate_layout(const PlanRequest& r, const Layout& L) {
  r.validate();
  const ModelSpec& m = r.model;
  auto bad = [](const std::string& msg) { throw InvalidInput(msg); };
  if (std::int64_t(L.dp) * L.tp * L.pp * L.cp != r.gpus)
    bad("dp·tp·pp·cp = " + std::to_string(std::int64_t(L.dp) * L.tp * L.pp * L.cp) +
        " must equal --gpus = " + std::to_string(r.gpus));
  if (L.tp > r.cluster.nvlink_domain_size())
    bad("tp = " + std::to_string(L.tp) + ": must stay within an NVLink domain (" +
        std::to_string(r.cluster.nvlink_domain_size()) + " GPUs)");
  if (L.micro_batch < 1 || L.grad_accum < 1 ||
      std::int64_t(L.dp) * L.micro_batch * L.grad_accum != r.global_batch)
    bad("dp × micro-batch × accum = " +
        std::to_string(std::int64_t(L.dp) * L.micro_batch * L.grad_accum) +
        " must equal --global-batch = " + std::to_string(r.global_batch));
  if (L.zero < 0 || L.zero > 3) bad("zero = " + std::to_string(L.zero) + ": allowed 0..3");
  require_expert_split(m, L.ep, L.expert_tp(), L.tp);
  (void)expert_layout(ParallelLayout{.dp = L.dp, .tp = L.tp, .pp = L.pp, .cp = L.cp}, L.etp, L.ep);
  require_expert_tp(L.tp, L.expert_tp(), L.sp);
  Prepared P = prepare(r);
  P.check_each = true;
  P.simulate_pipeline = true;
  const Layout staged = with_stages(P, L);
  ActivationSetup{.seq = r.seq, .micro_batch = L.micro_batch, .tp = L.tp,
                  .sequence_parallel = L.sp, .cp = L.cp, .pp = L.pp, .interleave = L.interleave,
                  .micro_batches = int(L.grad_accum),
                  .first_stage_layers = staged.first_stage_layers,
                  .last_stage_layers = staged.last_stage_layers,
                  .stage_layer_list = staged.stage_layer_list.get()}
      .validate(m);
  if (L.interleave > 1 && L.grad_accum % L.pp != 0)
    bad("interleave = " + std::to_string(L.interleave) + " needs accum (" +
        std::to_string(L.grad_accum) + ") divisible by pp = " + std::to_string(L.pp));
  return cost(P, staged);
}

PlanResult plan(const PlanRequest& r, const SearchSpace& space) {
  r.validate();
  Prepared P = prepare(r);
  const ModelSpec& m = r.model;
  PlanResult res;
  res.request = r;
  auto& rej = res.rejected;
  const int max_tp = space.max_tp > 0 ? space.max_tp : r.cluster.nvlink_domain_size();
  const std::size_t top = std::size_t(std::max(space.top, 1));
  // Note [priced by the schedule] (plan_stages.cpp): the search ranks by the closed form and
  // keeps kPricedBySchedule·top layouts, which the schedule re-prices; the best top are kept.
  const std::size_t pool_size = top * kPricedBySchedule;
  std::vector<PlanEval> pool;
  std::uint64_t shape_ok = 0;
  PointCollector points(space.max_points);  // Note [plan points]

  for (std::int64_t tp : divisors(r.gpus)) {
    if (tp > max_tp) { ++rej.topology; continue; }
    if (!tp_divides(m, int(tp))) { ++rej.tp_divisibility; continue; }
    for (std::int64_t pp : divisors(r.gpus / tp)) {
      if (space.max_pp > 0 && pp > space.max_pp) continue;
      if (m.layers < pp) { ++rej.pp_divisibility; continue; }  // a stage needs a layer
      for (std::int64_t cp : divisors(r.gpus / tp / pp)) {
        if (space.max_cp > 0 && cp > space.max_cp) continue;
        if (r.seq % cp != 0) { ++rej.cp_divisibility; continue; }
        const std::int64_t dp = r.gpus / tp / pp / cp;
        if (r.global_batch % dp != 0) { ++rej.batch_divisibility; continue; }
        const std::int64_t per_dp = r.global_batch / dp;
        std::vector<std::int64_t> micro;
        for (std::int64_t b : divisors(per_dp))
          if (space.max_micro_batch == 0 || b <= space.max_micro_batch) micro.push_back(b);
        // Interleaving: equal chunks where pp·v | layers, else Megatron-Core's embedding and
        // loss slots where pp·v | layers + 2 (Note [planner virtual stages]).
        struct Chunking {
          std::int64_t v = 1;
          std::shared_ptr<const std::vector<int>> list;  // null: equal chunks
        };
        std::vector<Chunking> chunks{{}};
        for (std::int64_t v = 2; pp > 1 && v <= space.max_interleave; ++v) {
          if (m.layers % (pp * v) == 0)
            chunks.push_back({.v = v});
          else if (auto list = slot_split(P, int(pp), int(v)))
            chunks.push_back({.v = v, .list = std::move(list)});
        }
        // Expert parallelism and expert TP: MoE models only, e_t ∈ {tp, 1} (SearchSpace::
        // expert_tp), e_t | f, ep·e_t | tp·cp·dp and ep | experts.
        const std::vector<ExpertSplit> experts = expert_splits(m, space, int(tp), dp * cp);
        for (const ExpertSplit& ex : experts)
        for (const Chunking& chunking : chunks)
          for (bool sp : {false, true}) {
            const std::int64_t v = chunking.v;
            if (sp && (tp == 1 || !space.allow_sp)) continue;
            if (!sp && ex.etp != tp && tp > 1) continue;  // Note [expert tensor parallelism]
            for (int zero : space.zero_stages) {
              if (zero > 0 && dp * cp == 1) continue;  // nothing to shard over
              for (Recompute rc : space.recomputes) {
                if (!recompute_applies(rc, m)) continue;  // op-sac: dense layers only
                const double lower_bound_s = P.lower_bound_s[int(rc)];
                for (Attention att : space.attentions) {
                  if (space.prune && pool.size() == pool_size &&
                      lower_bound_s > pool.back().step_s) {
                    res.pruned += micro.size();
                    continue;
                  }
                  for (std::int64_t b : micro) {
                    const std::int64_t accum = per_dp / b;
                    if (v > 1 && accum % pp != 0) { ++rej.interleave; continue; }
                    ++shape_ok;
                    const Layout L{.dp = int(dp), .tp = int(tp), .pp = int(pp), .cp = int(cp),
                                   .interleave = int(v), .ep = ex.ep, .etp = ex.etp, .sp = sp,
                                   .zero = zero,
                                   .micro_batch = b, .grad_accum = accum, .recompute = rc,
                                   .attention = att, .stage_layer_list = chunking.list};
                    const PlanEval e = cost(P, L);
                    ++res.evaluated;
                    if (space.max_points > 0) points.add(e);
                    if (!e.fits) {
                      ++rej.memory;
                      keep_top(res.near_misses, e, std::size_t(space.near_misses), closer_miss);
                      if (space.prune) break;  // Note [planner pruning] cut 1
                      continue;
                    }
                    keep_top(pool, e, pool_size, better);
                  }
                }
              }
            }
          }
      }
    }
  }
  if (shape_ok == 0) {
    const auto n = [](std::uint64_t v) { return std::to_string(v); };
    throw InvalidInput(
        "no layout of --gpus = " + std::to_string(r.gpus) + " passes the shape rules (rejected: " +
        n(rej.topology) + " TP beyond an NVLink domain of " +
        std::to_string(r.cluster.nvlink_domain_size()) +
        ", " + n(rej.tp_divisibility) + " TP not dividing heads " + std::to_string(m.heads) +
        "/kv " + std::to_string(m.kv_heads) + "/ffn " + std::to_string(m.ffn) + ", " +
        n(rej.pp_divisibility) + " PP not dividing layers " + std::to_string(m.layers) + ", " +
        n(rej.cp_divisibility) + " CP not dividing --seq " + std::to_string(r.seq) + ", " +
        n(rej.batch_divisibility) + " DP not dividing --global-batch " +
        std::to_string(r.global_batch) + ")");
  }

  P.simulate_pipeline = true;
  for (PlanEval& e : pool) e = cost(P, e.layout);
  std::sort(pool.begin(), pool.end(), better);
  if (pool.size() > top) pool.resize(top);
  res.best = std::move(pool);
  for (PlanEval& e : res.near_misses) e = cost(P, e.layout);
  std::sort(res.near_misses.begin(), res.near_misses.end(), closer_miss);
  res.points = points.points();
  res.points_sampled = points.sampled();
  res.frontier_thinned = points.frontier_thinned();
  // The best plan's family picks the band (Note [error band]); no plan: the model-parallel one.
  res.band = step_time_band(r.time_model, r.cluster.gpu,
                            res.best.empty() ? LayoutFamily::model_parallel
                                             : layout_family(res.best.front().layout));
  if (!res.best.empty()) {
    const double spread = 1.0 + (res.band ? res.band->rank_spread : 0.0);
    res.indistinguishable = 1;
    while (res.indistinguishable < res.best.size() &&
           res.best[res.indistinguishable].step_s < res.best.front().step_s * spread)
      ++res.indistinguishable;
  }
  const StateItems pp = state_bytes_per_param(r.precision, r.optimizer);
  const double ckpt = r.checkpoint_bytes.value_or((pp.params + pp.m + pp.v + pp.master) * P.n_state);
  std::optional<double> run_hours = r.run_hours;
  if (!run_hours && r.run_tokens && !res.best.empty())
    run_hours = *r.run_tokens / res.best.front().tokens_per_s / 3600.0;
  res.reliability = reliability(ReliabilitySetup{
      .gpus = double(r.gpus), .failure_rate_per_hour = r.cluster.failure_rate_per_hour,
      .state_bytes = ckpt, .write_bps = r.cluster.checkpoint_write_bps_for(r.gpus),
      .restart_hours = r.restart_hours, .run_hours = run_hours});
  res.convention = plan_convention(r);
  return res;
}

}  // namespace tally
