// The planner: search every parallel layout of a training run with the core ledgers, keep the
// feasible ones, rank them by step time.
//
// Legend: G = GPUs, dp·tp·pp·cp = G, B = global batch (sequences per optimizer step),
// b = micro-batch, m = B/(dp·b) micro-batches per step (gradient accumulation; with a pipeline these
// are its micro-batches), v = interleaved pipeline chunks, s = sequence length.
//
// Note [planner order]
// The seed's order (方案 1): hard constraints first — divisibility, topology, memory — then speed.
//   divisibility: tp | heads, tp | kv_heads (or kv_heads | tp), tp | ffn; pp·v | layers; cp | s;
//                 dp | B; interleaving needs m % pp == 0 (Megatron-LM's schedule).
//   topology:     tp <= GPUs per node (TP traffic must stay on NVLink).
//   memory:       model states + activations + buffers <= capacity · (1 − headroom).
// Then cost (Note [planner time model] in planner.cpp) and rank: step time, then lower memory,
// then fewer parallel dimensions.
//
// Note [planner pruning]
// Two cuts, both exact (tests compare against the exhaustive search):
//   1. Per-GPU activation memory is non-decreasing in b at fixed everything else (b·min(p, m) =
//      min(p·b, B/dp)), so the micro-batch loop stops at the first b that does not fit.
//   2. Step time >= compute time, which depends only on the recompute policy; a subtree whose
//      compute time already exceeds the N-th best step time cannot enter the top N.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tally/core/divisors.hpp"
#include "tally/core/hardware.hpp"
#include "tally/core/model.hpp"
#include "tally/core/model_states.hpp"
#include "tally/core/pipeline.hpp"
#include "tally/core/reliability.hpp"
#include "tally/core/types.hpp"

namespace tally {

// Note [reserved memory]
// The memory a training process holds on a GPU is more than its tensors: PyTorch's caching
// allocator keeps freed blocks and splits others (reserved − allocated), and the CUDA context with
// its kernels and libraries sits outside the allocator. nvidia-smi, and the OOM, see all of it;
// frameworks publish the reserved figure. tally's ledgers predict what is allocated, so "does it fit"
// adds both (Note [does it fit]):
//  - allocator allowance: peak reserved / peak allocated − 1. Measured 0.024–0.070 on one H200
//    over six GPT-2-medium runs (tests/data/h200_memory_probe.json, bench/gpu/memory_probe.py) and
//    0.112–0.115 in two published runs (pytorch/pytorch#40989: 16726 / 15006 and 19354 / 17402 MB
//    peak reserved / allocated). The default is the largest seen, 0.115: the check must not pass a
//    layout that runs out of memory.
//  - runtime: ~300 MB for the CUDA context with lazy module loading (CUDA ≥ 11.7; > 1000 MB
//    before), ptrblck on pytorch/pytorch#107667 — taken as 300 MiB.
// The user's headroom (default 0) is any further margin; the seed's scenarios use its 20 % with
// no allowance, as the seed's rule.
inline constexpr double kAllocatorAllowance = 0.115;
inline constexpr double kCudaRuntimeBytes = 300 * kMiB;

// The memory one GPU offers a layout (Note [does it fit]).
struct MemoryBudget {
  double capacity_bytes = 0;
  double headroom = 0;                   // [0, 1)
  double allocator_allowance = kAllocatorAllowance;  // [0, 1]
  double runtime_bytes = kCudaRuntimeBytes;          // [0, capacity)
};

// How a layout's compute turns into seconds (Note [planner time model] in planner.cpp).
enum class TimeModel {
  operators,    // each layer's kernels on the GPU's roofline (core/operators.hpp); the default
  utilisation,  // the seed's accounting: hardware FLOPs / (G · peak · u), one u per GPU type
};
std::string_view to_string(TimeModel t);
std::optional<TimeModel> parse_time_model(std::string_view s);

// Note [overlap contention] (planner.cpp): kernels that run beside a collective run this much
// slower on average (Lee et al. 2025, arXiv 2507.03114: 18.9 % over GPT and Llama training on
// A100, H100, MI250 and MI210).
inline constexpr double kOverlapSlowdown = 0.189;
// The critical-path time of a collective of comm_s started beside window_s of kernels that run
// σ = slowdown slower while it runs: max(comm − window, comm · σ / (1 + σ)); 0 when comm_s <= 0.
double overlap_exposed_s(double comm_s, double window_s, double slowdown);
// Note [planner overlap]'s overlap_dp rule, the one place it is written: a gradient reduction of
// grad_s whose buckets are reduced while a backward of window_s continues (PyTorch DDP/FSDP,
// DeepSpeed overlap_comm, Megatron --overlap-grad-reduce, tally's DDP) exposes its last bucket
// (last_bucket_s, clamped to grad_s) whole, the rest by overlap_exposed_s.
double gradient_reduction_exposed_s(double grad_s, double last_bucket_s, double window_s,
                                    double slowdown);

// The largest --global-batch: 2²⁴ sequences (--gpus' and --seq's bound too), so that a step's
// micro-batch count, even times the interleave (at most 64), stays within an int.
inline constexpr std::int64_t kMaxGlobalBatch = std::int64_t(1) << 24;

struct PlanRequest {
  ModelSpec model;
  ClusterSpec cluster;
  int gpus = 8;                          // G
  std::int64_t global_batch = 256;       // B, sequences per optimizer step, in [1, kMaxGlobalBatch]
  std::int64_t seq = 2048;               // s
  Precision precision = Precision::bf16;
  Optimizer optimizer = Optimizer::adam;
  // Note [reserved memory]: what the process holds beyond what its tensors need. The seed's rule
  // ("peak > 80 % of capacity is a failure", headroom 0.2) is kept as its scenarios' explicit input.
  double headroom = 0;                   // extra margin kept free, a fraction of capacity
  double allocator_allowance = kAllocatorAllowance;  // reserved / allocated − 1
  double runtime_bytes = kCudaRuntimeBytes;          // CUDA context, outside the allocator
  // Dropout masks and kernels: unset = the model's (ModelSpec::dropout; Llama-family configs have
  // none, GPT and the seed's model do, as Korthikanti counts them).
  std::optional<bool> dropout;
  bool uses_dropout() const { return dropout.value_or(model.dropout); }
  // Overlap, as the frameworks do it (Note [planner overlap] in planner.cpp):
  // gradient reduction overlapped with backward, all but the last bucket (PyTorch DDP and FSDP,
  // DeepSpeed overlap_comm, Megatron-LM --overlap-grad-reduce); false = on the critical path (the
  // seed's accounting, Megatron-LM's 2021 local DDP).
  bool overlap_dp = true;
  // ZeRO-1/2 parameter all-gather after the optimizer step overlapped with the next step's first
  // forward (Megatron-LM distributed optimizer, --overlap-param-gather); false = exposed
  // (DeepSpeed ZeRO-1/2).
  bool overlap_param_gather = true;
  // TP collectives hidden behind the GEMMs beside them (Transformer Engine's comm-GEMM overlap,
  // Megatron-LM --tp-comm-overlap); false = exposed (Megatron-LM's default).
  bool tp_overlap = false;
  // Note [TP gradient overlap] (planner.cpp): each column-parallel linear's input-gradient
  // collective in backward (the all-reduce, or under SP the reduce-scatter) runs asynchronously
  // beside its weight-gradient GEMM and is hidden up to that GEMM's time (Megatron-LM's
  // async_tensor_model_parallel_allreduce, Transformer Engine's Linear and LayerNormLinear); false
  // = exposed (Megatron-LM before 2021-08-30, e.g. Narayanan 2021's runs; PyTorch DTensor TP).
  bool tp_grad_overlap = true;
  // Note [PP scatter/gather] (comm.cpp): with TP > 1 and no SP each TP rank sends 1/t of the
  // stage's activation and the next stage all-gathers it over TP (Megatron-LM from 2021-02 until
  // Megatron-Core's pipeline code of 2023-03, on by default there: the dev set's runs); false =
  // whole activations (Megatron-Core, torchtitan).
  bool pp_scatter_gather = false;
  // MoE all-to-alls hidden behind another micro-batch's kernels (Megatron-Core 0.14
  // --overlap-moe-expert-parallel-comm, DeepSeek-V3's DualPipe); false = exposed (Megatron-Core's
  // default).
  bool ep_overlap = false;
  // Note [overlap contention] (planner.cpp): how much slower kernels run while a collective runs
  // beside them, σ (kernel time with / without it − 1); 0 = a hidden collective is free.
  double overlap_slowdown = kOverlapSlowdown;
  TimeModel time_model = TimeModel::operators;
  bool causal = true;                    // decoder training: flash kernels skip the masked half
  // MoE routing: slots each expert is padded to, as a multiple of its balanced share (token-
  // dropping capacity factor; 1 = dropless with balanced routing, the auxiliary-loss target).
  // Scales the all-to-all bytes, the expert GEMM rows and the routed activations.
  double capacity_factor = 1;
  // Node-limited routing (Note [node-limited routing] in comm.cpp; DeepSeek-V3 §2.1.2, M = 4): a
  // token's routed copies reach at most this many NVLink domains, sent once to each; 0 = no limit.
  int max_route_nodes = 0;
  // fp8 delayed scaling's amax history per tensor (Note [low precision]: TE's default 1024).
  int amax_history = kTeAmaxHistory;
  // ZeRO-3 layouts gather the transformer linears' weights in float8, 1 B instead of bf16's 2
  // (Note [fp8 all-gather] in comm.cpp: torchao's enable_fsdp_float8_all_gather, with
  // precompute_float8_dynamic_scale_for_fsdp); --precision fp8 only. Off, as torchao's and
  // torchtitan's default; torchtitan's published Float8 runs turn it on.
  bool fsdp_float8_all_gather = false;
  // Megatron-Core's fp8 parameters (--fp8-param-gather; Note [fp8 parameters] in
  // model_states.cpp): no bf16 copy of the linear weights; per-tensor fp8's ZeRO >= 1 parameter
  // all-gather moves float8 (routed experts included), MXFP8's bf16. fp8 and mxfp8 only. Off by
  // default, as in Megatron-Core; Megatron-Bridge's fp8_cs and mxfp8 recipes turn it on.
  bool fp8_param_gather = false;
  // Megatron-Core's recompute modules beside each layout's policy (types.hpp RecomputeModules):
  // `--recompute-modules mla_up_proj,mlp`; the search does not vary them.
  RecomputeModules recompute_modules;
  // The loss's kernels (Note [loss kernels], operators.hpp): their bytes in the time model, and
  // under eager the three fp32 tensors of the logits' size held (ActivationSetup::eager_loss).
  Loss loss = Loss::fused;
  // The memory-bound kernels' bytes in the time model (Note [eager kernels], operators.hpp): fused
  // (Megatron-LM, Transformer Engine, torch.compile), eager PyTorch (torchtitan uncompiled) or
  // Megatron-LM's local modules (Note [local kernels]).
  Kernels kernels = Kernels::fused;
  // How the micro-batches' weight gradients are summed (Note [gradient accumulation] in
  // planner.cpp): fused into the weight-gradient GEMM (Megatron-Core) or PyTorch's AccumulateGrad
  // kernel (DDP under no_sync, FSDP, Megatron-LM 2021). The time model only.
  GradAccumulation grad_accumulation = GradAccumulation::fused;
  // Which kernel runs flash attention (Note [flash kernel generations] in operators.hpp):
  // FlashAttention-2's class, FlashAttention (v1) and the 2022–23 Triton kernels no faster
  // (llm-foundry's MPT), or cuDNN's fused attention (Transformer Engine's on Hopper and later;
  // measured on Hopper only, Note [cuDNN attention] in presets.cpp). The time model only.
  FlashKernel flash_kernel = FlashKernel::fa2;
  // Reliability inputs (the report's reliability section).
  double restart_hours = 8.0 / 60;       // R: detect + restart + reload (seed: 5 + 3 min)
  std::optional<double> run_hours;       // for expected failures (--days)
  std::optional<double> run_tokens;      // or a token budget, run at the best plan's tokens/s
  std::optional<double> checkpoint_bytes;  // default: params + m + v + master (no gradients)
  void validate() const;                 // throws InvalidInput naming the field
  MemoryBudget memory_budget() const;
};

// Note [does it fit] — the one answer to "does this fit on the GPU", for `tally plan` (every layout)
// and `tally memory --gpu`:
//     allocated = model states + activations + buffers      (torch's peak memory_allocated)
//     held      = allocated · (1 + allocator allowance) + runtime bytes
//     fits      ⇔ held <= capacity × (1 − headroom)
// Buffers: two PyTorch DDP gradient buckets in flight (2 × 25 MiB, kDdpBucketBytes) for ZeRO 0–2;
// two layers of gathered parameters (current + prefetched) for ZeRO-3 — but under pipeline
// parallelism the whole stage unsharded with its fp32 gradients, (param_bytes + 4) per parameter
// of the stage: torchtitan, the framework that runs FSDP with PP, sets reshard_after_forward =
// False there, and torch.distributed.pipelining defers resharding and the gradient reduce-scatter
// (in FSDP2's fp32 reduce dtype) to the stage's last micro-batch. ZeRO-2 under PP likewise holds
// its stage's unsharded fp32 gradients, 4 bytes per parameter (its parameters are whole already;
// Note [sharded data parallelism under PP] in comm.cpp).
double buffer_bytes(int zero_stage, double params_per_gpu, std::int64_t layers_per_stage,
                    double param_bytes, int pp = 1);
struct FitCheck {
  double states_bytes = 0, activation_bytes = 0, buffer_bytes = 0;
  double allocated_bytes = 0;            // states + activations + buffers
  double allocator_bytes = 0;            // cached and fragmented blocks: allowance · allocated
  double runtime_bytes = 0;              // CUDA context and libraries, outside the allocator
  double total_bytes = 0;                // held: allocated + allocator + runtime
  double capacity_bytes = 0, headroom = 0;
  double usable_bytes = 0;               // capacity · (1 − headroom)
  bool fits = false;                     // total <= usable
};
FitCheck check_fit(double states_bytes, double activation_bytes, double buffers,
                   const MemoryBudget& budget);

// Which dimensions the search may use; defaults search everything.
struct SearchSpace {
  int max_tp = 0;                        // 0 = the NVLink domain's GPUs
  int max_pp = 0;                        // 0 = layers
  int max_cp = 0;                        // 0 = unlimited (cp | s)
  int max_ep = 0;                        // 0 = unlimited (ep·e_t | tp·cp·dp, ep | experts); MoE
  // Expert TP e_t (Note [expert tensor parallelism], parallel_groups.hpp), MoE only: tp
  // (Megatron-Core's default), 1 (needs SP when tp > 1), or both.
  enum class ExpertTp { tp, one, both };
  ExpertTp expert_tp = ExpertTp::both;
  int max_interleave = 8;
  std::int64_t max_micro_batch = 0;      // 0 = B/dp
  std::vector<int> zero_stages = {0, 1, 2, 3};
  std::vector<Recompute> recomputes = {Recompute::none, Recompute::selective, Recompute::full,
                                       Recompute::save_matmuls, Recompute::op_sac};
  std::vector<Attention> attentions = {Attention::flash};
  bool allow_sp = true;
  bool prune = true;                     // Note [planner pruning]; false = exhaustive
  int top = 5;                           // best plans kept
  int near_misses = 5;                   // closest infeasible layouts kept
  // Note [plan points]: costed layouts kept for the scatter of `tally plan --html`; 0 = none (the
  // search then does no extra work).
  std::size_t max_points = 0;
};

struct Layout {
  int dp = 1, tp = 1, pp = 1, cp = 1, interleave = 1;
  // Expert parallelism and expert TP (Note [expert parallelism] in core/src/comm.cpp, Note [expert
  // rank groups] in parallel_groups.hpp): ep·e_t regroups tp·cp·dp; 1 and 0 (= tp) for dense
  // models.
  int ep = 1;
  int etp = 0;
  int expert_tp() const { return etp > 0 ? etp : tp; }
  bool sp = false;
  int zero = 0;
  std::int64_t micro_batch = 1;
  std::int64_t grad_accum = 1;           // m
  Recompute recompute = Recompute::none;
  Attention attention = Attention::flash;
  // Layers of the first and last pipeline stage (core/pipeline.hpp stage_layers); 0 = as even as
  // the layers allow. The planner lightens the end stages when the embedding and the LM head make
  // them the slowest (Note [planner stages]).
  int first_stage_layers = 0, last_stage_layers = 0;
  // Or any split (`tally compare --pp-layers 5,6,6,…`): every stage's layers, overriding the two
  // above (core/pipeline.hpp check_stage_list); interleaved, every virtual stage's (pp·v entries,
  // Note [uneven virtual stages]). Shared and immutable so a Layout stays cheap to copy; the
  // search never sets it.
  std::shared_ptr<const std::vector<int>> stage_layer_list;
  bool uneven_stages() const {
    return first_stage_layers != 0 || last_stage_layers != 0 || stage_layer_list != nullptr;
  }
  int layers_on_stage(int model_layers, int s) const {  // pipeline stage s
    if (stage_layer_list != nullptr) return stage_layer_total(*stage_layer_list, pp, s);
    return layers_of_stage(model_layers, pp, first_stage_layers, last_stage_layers, s);
  }
  // The stages as runs of equal layer counts (core/pipeline.hpp stage_layer_runs: stage 0 and
  // stage P − 1 runs of their own); `out` is cleared and refilled.
  void stage_runs(int model_layers, std::vector<LayerRun>& out) const;
  int dimensions() const;                // parallel/feature dimensions in use (simplicity)
  std::string describe() const;          // "DP 8 × TP 1 × PP 1 × CP 1, ZeRO-2, b 4 × m 8, ..."
};

enum class Wall { memory, compute, communication, bubble };
std::string_view to_string(Wall w);

struct PlanEval {
  Layout layout;
  // memory, bytes per GPU
  StateItems states;
  double scaled_gemms = 0;               // fp8: the GEMMs whose delayed-scaling metadata it holds
  double activation_bytes = 0;
  double buffer_bytes = 0;
  double allocated_bytes = 0;            // states + activations + buffers
  double allocator_bytes = 0, runtime_bytes = 0;  // Note [reserved memory]
  double total_bytes = 0;                // held: allocated + allocator + runtime
  double usable_bytes = 0;               // capacity · (1 − headroom)
  bool fits = false;
  // time, seconds per optimizer step
  double compute_s = 0;                  // the busiest stage's kernels for all micro-batches +
                                         // the optimizer step (utilisation model: FLOPs/(G·peak·u))
  double optimizer_s = 0;                // the optimizer step's kernels (inside compute_s)
  double tp_s = 0, cp_s = 0, pp_s = 0;   // exposed (on the critical path)
  double ep_s = 0;                       // MoE dispatch and combine: the EP all-to-alls and the
                                         // expert-TP gathers, exposed (Megatron-Core's default)
  double dp_s = 0;                       // DP/ZeRO traffic time before overlap
  double dp_exposed_s = 0;
  double bubble_fraction = 0;
  double bubble_s = 0;
  double step_s = 0;
  double comm_bytes_per_gpu = 0;         // all traffic a GPU sends per step
  double tokens_per_s = 0;
  double mfu = 0;                        // model FLOPs / (step·G·peak)
  double efficiency = 0;                 // E: one GPU's time for B (same kernels, no parallelism)
                                         // over G·step
  Wall wall = Wall::compute;             // the tightest wall
};

// Note [error band]: how far measured step times have been from the operator model's predictions,
// measured / predicted, on the published runs that check the GPU's generation:
//   A100 (the development set, tests/validation/test_published_runs.cpp: Korthikanti 2022 Tables
//     4–5, Narayanan 2021 Table 1; 28 Megatron-LM figures, nothing fitted): 1.03 to 1.16, median
//     1.085 — every figure slower than predicted, a bias of the A100 kernel constants shared by
//     both code bases once Korthikanti's backward TP overlap, Megatron-LM's PP scatter/gather and
//     the 400 W power cap are counted (Note [TP gradient overlap], planner.cpp; Note [PP
//     scatter/gather], comm.cpp; presets.cpp); what can reorder two plans on one system is the
//     spread within one published table: at most 10.7 %.
//   H100 / H200 (kept aside, tests/validation/test_published_throughput.cpp: torchtitan's Llama 3.1
//     tables, 20 PyTorch-native runs — FSDP2, TP, PP, CP, Float8, torch.compile; 500 W H100s):
//     1.12 to 1.80, median 1.49 (uncompiled rows with Note [eager kernels], Float8 rows with Note
//     [low-precision casts] and Hopper's fp8 GEMM constants) — the model runs much faster than
//     these runs; within one table up to 36.8 % apart (Table 4: AsyncTP, which tally hides
//     entirely, gained 6 %).
//   A100, data parallelism alone (DP / ZeRO / FSDP: no TP, PP, CP or EP; LayoutFamily) — kept
//     aside, tests/validation/test_published_fsdp.cpp: MosaicML llm-foundry's MPT tables on A100
//     80GB and 40GB, 139 FSDP runs, 125M-70B, sequence 512-65536): 1.00 to 1.62, median 1.28,
//     within one table up to 55 % apart. The Megatron band above does not cover these layouts
//     (the default plan, a 7B on 8 A100s with ZeRO-3, printed 85 % MFU beside it).
//   B200 / B300 / GB200 / GB300 (kept aside, tests/validation/test_published_bridge.cpp: NVIDIA
//     Megatron-Bridge's 26.04.01 performance summary, the 28 Blackwell rows tally can express —
//     Llama 3 70B and 3.1 405B (uneven virtual stages, Note [uneven virtual stages] in
//     pipeline.hpp), DeepSeek-V3 (its MTP module and recompute modules), GPT-OSS 120B, Qwen3
//     30B/235B MoE; FP8, MXFP8, NVFP4, BF16): 0.94 to 1.80, median 1.14; within one system's
//     table up to 79.2 % apart (GB200: GPT-OSS's BF16 MoE row 1.80 beside Llama 3.1 405B's NVFP4
//     1.00; GPT-OSS's own kernels counted, Note [GPT-OSS kernels] in operators.hpp). The same
//     tables' 5 H100 rows read 0.92-1.54, inside the Hopper band's range but for its low end
//     (0.92 < 1.12): Megatron-Core's runs are closer to the model than torchtitan's, which set
//     the Hopper band.
//   any other GPU (a cluster file, a calibrated host): no published run checks it; the band of
//     the newest generation checked by torchtitan (H100 / H200), said so in its source.
// The model mostly runs fast, so the bands sit near or above 1. The tests check each figure
// against its rows, so the bands move with the model.
struct ErrorBand {
  double low = 1, median = 1, high = 1;  // measured / predicted
  double rank_spread = 0;  // largest (high/low − 1) of measured/predicted within one table
  const char* source = "";
  const char* runs = "";   // short: whose runs, on which GPUs (printed beside the band)
};
// Which published runs judge a layout (Note [error band]): data parallelism alone (DP, ZeRO,
// FSDP: tp = pp = cp = ep = 1) or any model parallelism.
enum class LayoutFamily { data_parallel, model_parallel };
LayoutFamily layout_family(const Layout& layout);
// The band of a time model on a GPU (by the preset names' generation: "a100…", "h100…"/"h200…",
// "b200"/"b300"/"gb200"/"gb300", else Hopper's) for a layout family (only A100's bands differ by
// family); none for the utilisation model (not validated against any run).
std::optional<ErrorBand> step_time_band(TimeModel t, const GpuSpec& gpu,
                                        LayoutFamily family = LayoutFamily::model_parallel);

// Note [plan points]
// `tally plan --html` draws every costed layout as a point (step time against memory held per GPU).
// A search costs up to millions of layouts, so SearchSpace::max_points bounds what is kept:
//  - a uniform sample of at most max_points costed layouts (reservoir sampling, Vitter 1985's
//    Algorithm R, with a fixed-seed generator: the same search draws the same page); every one
//    when the search costs no more;
//  - the feasible Pareto frontier (no other fitting layout is both faster and smaller), kept
//    whole while it holds at most max_points layouts (thinned like the sample beyond that).
// PlanResult::points is their union, frontier members flagged. Pruned layouts were never costed
// (Note [planner pruning]), so they are not points. A point's step is the search's price (the
// closed form of Note [priced by the schedule], core/src/plan_stages.cpp); the plans printed
// beside them are re-priced by their schedule: where the stages differ, a few per cent slower at
// v = 1, either way with unequal chunks.
struct PlanPoint {
  Layout layout;
  double step_s = 0;
  double total_bytes = 0;                // held per GPU (Note [does it fit])
  bool fits = false;
  bool frontier = false;                 // on the feasible Pareto frontier
  std::uint64_t index = 0;               // order in which the search costed it
};

struct RejectionCounts {
  std::uint64_t tp_divisibility = 0, topology = 0, pp_divisibility = 0, cp_divisibility = 0,
                batch_divisibility = 0, interleave = 0, memory = 0;
};

struct PlanResult {
  PlanRequest request;
  std::vector<PlanEval> best;            // ranked, at most SearchSpace::top
  std::vector<PlanEval> near_misses;     // infeasible, smallest memory overshoot first
  RejectionCounts rejected;
  std::uint64_t evaluated = 0;           // layouts costed in full
  std::uint64_t pruned = 0;              // layouts skipped by Note [planner pruning]
  std::vector<PlanPoint> points;         // Note [plan points]; empty unless max_points > 0
  bool points_sampled = false;           // true when points holds fewer than `evaluated`
  bool frontier_thinned = false;         // true when the frontier outgrew max_points
  ReliabilityReport reliability;
  std::string convention;                // precision, optimizer, headroom, time-model label
  std::optional<ErrorBand> band;         // the time model's error band (Note [error band])
  // How many of the best plans (from the top) are within band->rank_spread of the best: the model
  // can't rank them; validate them on the cluster. 1 = the best stands out.
  std::size_t indistinguishable = 0;
  bool feasible() const { return !best.empty(); }
};

// Searches the space. Bad input throws InvalidInput; "nothing fits" is a result (best empty) and
// near_misses say which wall each closest layout hits. A request for which no layout passes the
// divisibility and topology rules throws InvalidInput explaining which rule excluded what.
PlanResult plan(const PlanRequest& request, const SearchSpace& space = {});
// PlanResult::convention of a request: precision, optimizer, memory held, activations, time and
// communication conventions, as inputs, never typed by hand.
std::string plan_convention(const PlanRequest& request);

// Costs one given layout (checks its divisibility and topology; throws InvalidInput if broken).
PlanEval evaluate_layout(const PlanRequest& request, const Layout& layout);

// Why each dimension of a plan is or is not used: the plan with that one dimension changed,
// costed with the same ledgers (e.g. "ZeRO-0 instead: needs 121.4 GB of 68.7 GB usable").
struct Reason {
  std::string dimension;         // "TP", "PP", "CP", "SP", "ZeRO", "recompute", "micro-batch"
  bool used = false;
  std::string variant;           // the changed layout, described
  std::optional<PlanEval> eval;  // empty when the variant breaks a shape rule
  std::string invalid_reason;
};
std::vector<Reason> explain_plan(const PlanRequest& request, const PlanEval& chosen);

// When nothing fits (issue 12): the smallest changes that would, each costed with the same ledgers
// — the GPU count at which a layout fits (doubling at the same global batch, up to 16×), an 8-bit
// optimizer, LoRA and QLoRA (r = 8 on q, v, gradient checkpointing, micro-batch 1 on every GPU).
struct Suggestion {
  std::string change;              // "GPUs 8 → 16", "8-bit Adam …", "LoRA r=8 on q,v …"
  bool fits = false;
  double per_gpu_bytes = 0;        // held (Note [does it fit]); 0 when nothing could be costed
  double usable_bytes = 0;
  std::optional<double> step_s;    // the planned alternatives' best step, when it fits
  std::string layout;              // the planned alternatives' best (or closest) layout
  std::string cost;                // what the change costs, in words
};
std::vector<Suggestion> suggest_changes(const PlanRequest& request, const SearchSpace& space = {});

// `tally compare`: the seed's decision (方案 3) made computable. Each alternative changes one thing
// of a base plan while holding the global batch, and is costed with the same ledgers.
enum class Alternative {
  double_micro_batch,    // A: b × 2, accumulation ÷ 2
  recompute_double_seq,  // B: full recompute, s × 2
  double_gpus,           // C: G × 2 across nodes (dp × 2), accumulation ÷ 2 (or b ÷ 2)
};
std::string_view to_string(Alternative a);
std::optional<Alternative> parse_alternative(std::string_view s);

struct Comparison {
  std::string name;            // "base" or the alternative's name
  std::string change;          // what changed, in words
  PlanRequest request;
  Layout layout;
  std::optional<PlanEval> eval;  // empty when the change breaks a shape rule
  std::string invalid_reason;    // why, when eval is empty
  // Time shares of the step (sum to 1 with compute): the walls of the seed's decision tree.
  double comm_share() const;
  double bubble_share() const;
};

std::vector<Comparison> compare_alternatives(const PlanRequest& base_request, const Layout& base,
                                             const std::vector<Alternative>& alternatives);

}  // namespace tally
