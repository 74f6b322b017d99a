// The planner's value types (core/planner.hpp): Layout's description, the request's checks, the
// one "does it fit" (Note [does it fit]), buffers and the time model's error band.
#include <algorithm>
#include <cmath>
#include <string>

#include "tally/core/comm.hpp"
#include "tally/core/pipeline.hpp"
#include "tally/core/planner.hpp"
#include "tally/core/roofline.hpp"

namespace tally {

void Layout::stage_runs(int model_layers, std::vector<LayerRun>& out) const {
  if (stage_layer_list == nullptr) {
    stage_layer_runs(model_layers, pp, first_stage_layers, last_stage_layers, out);
    return;
  }
  out.clear();
  for (int s = 0; s < pp; ++s) {
    // Interleaved, a stage's layers are its chunks' (Note [uneven virtual stages]). A middle
    // stage joins the run of the middle stage before it when their layers match.
    const int n = stage_layer_total(*stage_layer_list, pp, s);
    const bool middle_after_middle = s >= 2 && s + 1 < pp;
    if (middle_after_middle && out.back().layers == n)
      ++out.back().stages;
    else
      out.push_back({.layers = n, .stages = 1});
  }
}

int Layout::dimensions() const {
  return (dp > 1) + (tp > 1) + (pp > 1) + (cp > 1) + (ep > 1) + (expert_tp() != tp) +
         (interleave > 1) + sp + (zero > 0) +
         (recompute != Recompute::none) + (grad_accum > 1);
}

namespace {

// "7,8×14,7": a split's entries, three or more equal ones in a row as value×count.
std::string split_text(const std::vector<int>& list) {
  std::string s;
  for (std::size_t i = 0; i < list.size();) {
    std::size_t j = i;
    while (j < list.size() && list[j] == list[i]) ++j;
    const std::size_t run = j - i;
    for (std::size_t k = 0; k < (run >= 3 ? 1 : run); ++k)
      s += (s.empty() ? "" : ",") + std::to_string(list[i]);
    if (run >= 3) s += "×" + std::to_string(run);
    i = j;
  }
  return s;
}

}  // namespace

std::string Layout::describe() const {
  std::string s = "DP " + std::to_string(dp) + " × TP " + std::to_string(tp) + (sp ? "+SP" : "") +
                  " × PP " + std::to_string(pp);
  if (interleave > 1) s += "(v" + std::to_string(interleave) + ")";
  if (stage_layer_list != nullptr) {
    s += (interleave > 1 ? " (virtual stages " : " (stages ") + split_text(*stage_layer_list) +
         " layers)";
  } else if (first_stage_layers != 0 || last_stage_layers != 0)
    s += " (end stages " + std::to_string(first_stage_layers) + " + " +
         std::to_string(last_stage_layers) + " layers)";
  s += " × CP " + std::to_string(cp);
  if (ep > 1 || expert_tp() != tp)
    s += " (EP " + std::to_string(ep) +
         (expert_tp() != tp ? " × ETP " + std::to_string(expert_tp()) : std::string()) + ")";
  s += ", ZeRO-" + std::to_string(zero) + ", micro-batch " +
       std::to_string(micro_batch) + " × accum " + std::to_string(grad_accum) + ", recompute " +
       std::string(to_string(recompute)) + ", " + std::string(to_string(attention)) + " attention";
  return s;
}

double buffer_bytes(int zero_stage, double params_per_gpu, std::int64_t layers_per_stage,
                    double param_bytes, int pp) {
  if (zero_stage == 3 && pp > 1)  // the stage unsharded, and its fp32 gradients
    return (param_bytes + 4.0) * params_per_gpu;
  if (zero_stage == 2 && pp > 1)  // the stage's unsharded fp32 gradients
    return 4.0 * params_per_gpu;
  if (zero_stage == 3)  // current + prefetched layer's gathered parameters
    return 2.0 * params_per_gpu / double(std::max<std::int64_t>(layers_per_stage, 1)) * param_bytes;
  return 2.0 * kDdpBucketBytes;  // two DDP buckets in flight
}

FitCheck check_fit(double states_bytes, double activation_bytes, double buffers,
                   const MemoryBudget& b) {
  require_real(std::isfinite(b.headroom) && b.headroom >= 0 && b.headroom < 1, "headroom",
               b.headroom, "must be in [0, 1)");
  require_real(std::isfinite(b.allocator_allowance) && b.allocator_allowance >= 0 &&
                   b.allocator_allowance <= 1,
               "allocator allowance", b.allocator_allowance, "must be in [0, 1]");
  require_real(std::isfinite(b.runtime_bytes) && b.runtime_bytes >= 0 &&
                   b.runtime_bytes < b.capacity_bytes,
               "runtime bytes", b.runtime_bytes,
               [&] {
                 return "must be in [0, " + format_number(b.capacity_bytes) +
                        ") bytes (the GPU's capacity)";
               });
  FitCheck f{.states_bytes = states_bytes, .activation_bytes = activation_bytes,
             .buffer_bytes = buffers, .capacity_bytes = b.capacity_bytes, .headroom = b.headroom};
  f.allocated_bytes = states_bytes + activation_bytes + buffers;
  f.allocator_bytes = b.allocator_allowance * f.allocated_bytes;
  f.runtime_bytes = b.runtime_bytes;
  f.total_bytes = f.allocated_bytes + f.allocator_bytes + f.runtime_bytes;
  f.usable_bytes = b.capacity_bytes * (1.0 - b.headroom);
  f.fits = f.total_bytes <= f.usable_bytes;
  return f;
}

MemoryBudget PlanRequest::memory_budget() const {
  return MemoryBudget{.capacity_bytes = cluster.gpu.memory_bytes, .headroom = headroom,
                      .allocator_allowance = allocator_allowance, .runtime_bytes = runtime_bytes};
}

LayoutFamily layout_family(const Layout& l) {
  return l.tp == 1 && l.pp == 1 && l.cp == 1 && l.ep == 1 ? LayoutFamily::data_parallel
                                                          : LayoutFamily::model_parallel;
}

std::optional<ErrorBand> step_time_band(TimeModel t, const GpuSpec& gpu, LayoutFamily family) {
  if (t != TimeModel::operators) return std::nullopt;
  const ErrorBand a100{.low = 1.03, .median = 1.085, .high = 1.16, .rank_spread = 0.107,
                       .source = "measured / predicted step time of 28 published Megatron-LM "
                                 "figures on A100 (Korthikanti 2022 Tables 4-5, Narayanan 2021 "
                                 "Table 1)",
                       .runs = "Megatron-LM runs on A100"};
  const ErrorBand hopper{.low = 0.95, .median = 1.23, .high = 1.47, .rank_spread = 0.325,
                         .source = "measured / predicted step time of 20 published torchtitan "
                                   "runs on H100 and H200 (Llama 3.1 8B-405B, Dec 2024 and June "
                                   "2025 tables; kept aside, nothing fitted)",
                         .runs = "torchtitan runs on H100/H200"};
  const ErrorBand a100_fsdp{.low = 0.962, .median = 1.126, .high = 1.571, .rank_spread = 0.559,
                            .source = "measured / predicted step time of 139 published FSDP runs "
                                      "on A100 80GB and 40GB (MosaicML llm-foundry's MPT tables, "
                                      "125M-70B; kept aside, nothing fitted)",
                            .runs = "llm-foundry FSDP runs on A100"};
  const ErrorBand blackwell{.low = 0.94, .median = 1.14, .high = 1.80, .rank_spread = 0.793,
                            .source = "measured / predicted step time of 28 published Megatron-"
                                      "Bridge runs on B200, B300, GB200 and GB300 (26.04.01 "
                                      "performance summary: Llama 3 70B and 3.1 405B, DeepSeek-V3, "
                                      "GPT-OSS 120B, Qwen3 MoE; FP8, MXFP8, NVFP4, BF16; kept "
                                      "aside, nothing fitted)",
                            .runs = "Megatron-Bridge runs on B200/B300/GB200/GB300"};
  const std::string_view name = gpu.name;
  if (name.starts_with("b200") || name.starts_with("b300") || name.starts_with("gb200") ||
      name.starts_with("gb300"))
    return blackwell;
  if (name.starts_with("a100"))
    return family == LayoutFamily::data_parallel ? a100_fsdp : a100;
  if (name.starts_with("h100") || name.starts_with("h200")) return hopper;
  ErrorBand nearest = hopper;  // a cluster file's GPU, a calibrated host
  nearest.source = "no published run checks this GPU: the band of the newest generation checked, "
                   "20 torchtitan runs on H100 and H200 (kept aside, nothing fitted)";
  nearest.runs = "no published run on this GPU; torchtitan runs on H100/H200";
  return nearest;
}

std::string_view to_string(TimeModel t) {
  return t == TimeModel::operators ? "operators" : "utilisation";
}

std::optional<TimeModel> parse_time_model(std::string_view s) {
  for (TimeModel t : {TimeModel::operators, TimeModel::utilisation})
    if (to_string(t) == s) return t;
  return std::nullopt;
}

std::string_view to_string(Wall w) {
  switch (w) {
    case Wall::memory: return "memory";
    case Wall::compute: return "compute";
    case Wall::communication: return "communication";
    case Wall::bubble: return "bubble";
  }
  return "?";
}

void PlanRequest::validate() const {
  if (model.params_only)
    throw InvalidInput("--model: the planner needs an architecture (a preset or config.json), "
                       "not only --params");
  model.validate();
  cluster.validate();
  if (gpus < 1 || gpus > kMaxGpus)
    throw InvalidInput("--gpus = " + std::to_string(gpus) + ": must be in [1, " +
                       std::to_string(kMaxGpus) + "]");
  if (global_batch < 1 || global_batch > kMaxGlobalBatch)
    throw InvalidInput("--global-batch = " + std::to_string(global_batch) + ": must be in [1, " +
                       std::to_string(kMaxGlobalBatch) + "] sequences");
  if (seq < 1) throw InvalidInput("--seq = " + std::to_string(seq) + ": must be >= 1");
  if (!(headroom >= 0 && headroom < 1))
    throw InvalidInput("--headroom = " + std::to_string(headroom) + ": must be in [0, 1)");
  if (!(allocator_allowance >= 0 && allocator_allowance <= 1))
    throw InvalidInput("--allocator-allowance = " + std::to_string(allocator_allowance) +
                       ": must be in [0, 1]");
  if (!(runtime_bytes >= 0 && runtime_bytes < cluster.gpu.memory_bytes))
    throw InvalidInput("--runtime-mib = " + format_number(runtime_bytes / kMiB) +
                       ": must be in [0, " + format_number(cluster.gpu.memory_bytes / kMiB) +
                       ") MiB (the GPU's memory)");
  if (!(restart_hours >= 0)) throw InvalidInput("restart time must be >= 0");
  if (time_model == TimeModel::operators) {
    try {
      validate_kernel_perf(cluster.gpu);
    } catch (const InvalidInput& e) {
      throw InvalidInput(std::string(e.what()) +
                         " — the operator time model needs the GPU's HBM bandwidth and SM count "
                         "(a cluster preset, or gpu.memory_bandwidth_gbps and gpu.sm_count in the "
                         "cluster file), or use --time-model utilisation");
    }
  }
  if (!cluster.gpu.supports(precision))
    throw InvalidInput("--precision " + std::string(to_string(precision)) + ": " + cluster.gpu.name +
                       (precision == Precision::fp8
                            ? " has no fp8 tensor cores (peak_fp8 0)"
                            : " has no block-scaled (Blackwell) tensor cores (peak_fp4 0)"));
  if (run_hours && !(*run_hours > 0)) throw InvalidInput("--days must be > 0");
  if (run_tokens && !(*run_tokens > 0)) throw InvalidInput("--tokens must be > 0");
  if (!(std::isfinite(capacity_factor) && capacity_factor >= 1 && capacity_factor <= 64))
    throw InvalidInput("--capacity-factor = " + format_number(capacity_factor) +
                       ": must be in [1, 64]");
  if (!(overlap_slowdown >= 0 && overlap_slowdown <= 1))
    throw InvalidInput("--overlap-slowdown = " + format_number(overlap_slowdown) +
                       ": must be in [0, 1]");
  require_int(amax_history >= 1, "--amax-history", amax_history, "must be >= 1 entry");
  require_int(max_route_nodes >= 0, "--max-route-nodes", max_route_nodes,
              "must be >= 0 (0 = no node limit)");
  require_int(max_route_nodes == 0 || model.is_moe(), "--max-route-nodes", max_route_nodes,
              model.name + " is not a mixture-of-experts model");
  if (fsdp_float8_all_gather) require_float8_all_gather(precision);
  if (fp8_param_gather) require_fp8_param_gather(precision);
  if (time_model == TimeModel::operators && flash_kernel == FlashKernel::cudnn &&
      cluster.gpu.kernels.cudnn_attention_table.empty() &&
      cluster.gpu.kernels.attention_table.empty())
    throw InvalidInput("--flash-kernel cudnn: no measured cuDNN attention for " +
                       cluster.gpu.name +
                       " (the Hopper presets h100-80g and h200 carry one H200's): give a "
                       "--calibration with the attention your probe timed, or fa2");
  if (kernels == Kernels::local && is_low_precision(precision))
    throw InvalidInput("--kernels local: --precision " + std::string(to_string(precision)) +
                       " needs Transformer Engine's modules (Megatron-LM's local ones run no "
                       "low-precision GEMMs): use --kernels fused");
}

std::string plan_convention(const PlanRequest& r) {
  return (is_low_precision(r.precision)
              ? "bf16 mixed, " + std::string(to_string(r.precision)) +
                    " linear GEMMs (attention, router, LM head bf16; MFU against the "
                    "GPU's " + std::string(to_string(r.precision)) + " peak; their " +
                    "saved inputs " +
                    format_number(saved_linear_input_bytes(r.precision)) +
                    " B per element" +
                    (r.precision == Precision::fp8
                         ? ", amax history " + std::to_string(r.amax_history)
                         : std::string()) +
                    "; weight copies: " +
                    low_precision_copies_label(r.precision,
                                               r.cluster.gpu.compute_capability) +
                    ")"
              : std::string(to_string(r.precision)) +
                    (r.precision == Precision::fp32 ? "" : " mixed")) +
         " | " + std::string(to_string(r.optimizer)) + " | memory held: allocated × " +
         format_number(1 + r.allocator_allowance) + " + " +
         format_number(r.runtime_bytes / kMiB) + " MiB runtime, usable " +
         std::to_string(int(std::lround(100 * (1 - r.headroom)))) +
         " % of capacity | activations: Korthikanti 2022 inventory" +
         (r.loss == Loss::eager ? ", eager fp32 loss" : "") +
         (r.uses_dropout() ? " with dropout masks" : " without dropout") +
         (r.recompute_modules.mla_up_proj ? ", MLA up-projections recomputed" : "") +
         (r.recompute_modules.dense_mlp ? ", dense MLPs recomputed" : "") +
         " | time: " +
         (r.time_model == TimeModel::operators
              ? "operator model (kernels on the " + r.cluster.gpu.name +
                    " roofline, " + (r.causal ? "causal" : "full") + " attention" +
                    (r.kernels == Kernels::eager ? ", eager PyTorch kernels" : "") +
                    (r.kernels == Kernels::local ? ", Megatron-LM local modules" : "") +
                    (r.loss == Loss::vocab_parallel ? ", unfused vocab-parallel loss" : "") +
                    (r.grad_accumulation == GradAccumulation::autograd
                         ? ", micro-batch gradients added by AccumulateGrad"
                         : "") +
                    std::string(convention_words(r.flash_kernel)) +
                    ")"
              : "hardware FLOPs at u = " + format_number(r.cluster.mfu) + " of peak") +
         ", comm " + (r.cluster.comm_model == CommModel::nccl ? "NCCL rings on all rails"
                                                              : "flat ring") +
         ", TP/CP/PP exposed" +
         (r.tp_grad_overlap && !r.tp_overlap && r.time_model == TimeModel::operators
              ? " (but TP's input-gradient collectives, behind the weight-gradient GEMMs)"
              : "") +
         (r.pp_scatter_gather
              ? ", PP sends scattered over TP and all-gathered (Megatron-LM 2021-23)"
              : "") +
         ", DP/ZeRO " +
         (r.overlap_dp ? "gradients overlapped with backward" : "gradients exposed") +
         (r.overlap_param_gather ? ", ZeRO-1/2 gather overlapped with forward" : "") +
         (r.fsdp_float8_all_gather
              ? ", ZeRO-3 gathers the linear weights in float8 (torchao "
                "enable_fsdp_float8_all_gather)"
              : "") +
         (r.fp8_param_gather
              ? std::string(", fp8 parameters (Megatron-Core --fp8-param-gather): no bf16 linear "
                            "weights") +
                    (r.precision == Precision::fp8 ? ", ZeRO gathers them in float8" : "")
              : "") +
         (r.tp_overlap ? ", TP overlapped with GEMMs" : "") +
         (r.time_model == TimeModel::operators
              ? ", kernels beside a hidden collective " +
                    format_number(100 * r.overlap_slowdown) + " % slower"
              : std::string()) +
         (r.model.is_moe() ? (r.ep_overlap ? ", EP all-to-all overlapped"
                                           : ", EP all-to-all exposed")
                           : "") +
         (r.capacity_factor != 1.0
              ? ", MoE capacity factor " + format_number(r.capacity_factor)
              : std::string()) +
         (r.max_route_nodes > 0
              ? ", tokens routed to at most " + std::to_string(r.max_route_nodes) +
                    " nodes, sent once to each (DeepSeek-V3 node-limited routing)"
              : std::string());
}

}  // namespace tally
