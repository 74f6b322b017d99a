// One row of tests/data/megatron_bridge_perf.json (NVIDIA Megatron-Bridge's performance summary,
// 26.04.01 NeMo container, docs/performance-summary.md at v0.4.2 = c8101293) as tally's request
// and layout: the published layout fixed, the rest read from the performance recipe the row ran
// (the row's "recipe", scripts/performance at the same commit), nothing fitted. The pattern of
// torchtitan_rows.hpp and llm_foundry_rows.hpp; read by test_published_bridge.cpp.
//
// A row tally cannot express gets a reason instead (bridge_skip_reason, or the InvalidInput that
// evaluate_layout throws for its layout): it is listed, never dropped.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tally/core/planner.hpp"
#include "tally/core/presets.hpp"
#include "tally/core/types.hpp"

namespace tally {

// The table's model names and tally's presets. Megatron-Bridge builds each model from its Hugging
// Face config (recipes: AutoBridge.from_hf_pretrained): meta-llama/Meta-Llama-3-70B,
// meta-llama/Llama-3.1-405B, deepseek-ai/DeepSeek-V3, openai/gpt-oss-120b, Qwen/Qwen3-30B-A3B,
// Qwen/Qwen3-235B-A22B — the configs the presets cite (core/src/presets.cpp).
inline std::optional<std::string> bridge_model_preset(const std::string& table_model) {
  if (table_model == "LLAMA3_70B") return "llama-3-70b";
  if (table_model == "LLAMA3.1_405B") return "llama-3.1-405b";
  if (table_model == "DeepSeekV3") return "deepseek-v3";
  if (table_model == "GPT OSS 120B") return "gpt-oss-120b";
  if (table_model == "Qwen3_30B_a3B") return "qwen3-30b-a3b";
  if (table_model == "Qwen3_235B_a22B") return "qwen3-235b-a22b";
  return std::nullopt;
}

// The systems: DGX-GB300 and DGX-GB200 are the NVL72 racks (18 trays of 4 GPUs on one NVLink
// domain), DGX-B300 and DGX-B200 eight-GPU HGX nodes, DGX-H100 the eight-GPU H100 SXM node.
inline std::string bridge_cluster(const std::string& system) {
  if (system == "DGX-GB300") return "gb300-nvl72";
  if (system == "DGX-GB200") return "gb200-nvl72";
  if (system == "DGX-B300") return "b300";
  if (system == "DGX-B200") return "b200";
  if (system == "DGX-H100") return "h100-80g";
  return "";
}

// FP8 is the recipes' fp8_cs (per-tensor current scaling, Transformer Engine): tally's per-tensor
// fp8 recipe. MXFP8 (fp8_mx) and NVFP4 are TE's block-scaled recipes, tally's mxfp8 and nvfp4.
inline Precision bridge_precision(const std::string& p) {
  if (p == "BF16") return Precision::bf16;
  if (p == "FP8") return Precision::fp8;
  if (p == "MXFP8") return Precision::mxfp8;
  if (p == "NVFP4") return Precision::nvfp4;
  throw InvalidInput("precision " + p + ": not one of the table's BF16, FP8, MXFP8, NVFP4");
}

inline int bridge_int(const nlohmann::json& v, int if_na) { return v.is_null() ? if_na : v.get<int>(); }
inline int bridge_dp(const nlohmann::json& run) {
  return run["gpus"].get<int>() / (run["tp"].get<int>() * run["pp"].get<int>() * run["cp"].get<int>());
}

// Why a row is not predicted, before its layout is tried; empty = try it.
inline std::string bridge_skip_reason(const nlohmann::json& run) {
  const std::string model = run["model"];
  if (!bridge_model_preset(model)) {
    if (model == "Kimi_K2")
      return "no tally preset for Kimi K2 (1T parameters, 384 experts), and the table says it "
             "trained with the Muon optimizer, which tally's optimizer ledger does not have";
    return "no tally preset for " + model + ": a hybrid Mamba-2 / attention MoE model, and tally "
           "has no Mamba (state-space) layers";
  }
  if (!run.contains("recipe")) return "no recipe read for this row";
  const auto& rc = run["recipe"];
  for (const auto& m : rc.value("recompute", nlohmann::json::array())) {
    const std::string mod = m;
    if (mod != "layernorm" && mod != "moe_act" && mod != "mla_up_proj" && mod != "mlp")
      return "recompute module " + mod + ": no tally recompute policy replays it alone";
  }
  return "";
}

// Megatron-Core's recompute_modules ["layernorm", "moe_act"] replays the norms and the experts'
// activation from saved GEMM outputs: tally's save_matmuls (norms, activation and rotary replayed;
// Megatron's rotary is not, a memory-bound kernel counted once more: for GPT-OSS its unfused 12e
// per element of q and k, Note [GPT-OSS kernels]). [] or neither of the two = none.
inline Recompute bridge_recompute(const nlohmann::json& recipe) {
  for (const auto& m : recipe.value("recompute", nlohmann::json::array()))
    if (m == "layernorm" || m == "moe_act") return Recompute::save_matmuls;
  return Recompute::none;
}
// "mla_up_proj" and "mlp" (DeepSeek-V3's recipes) are tally's RecomputeModules of the same names
// (core/types.hpp), beside that policy.
inline RecomputeModules bridge_recompute_modules(const nlohmann::json& recipe) {
  RecomputeModules r;
  for (const auto& m : recipe.value("recompute", nlohmann::json::array())) {
    r.mla_up_proj = r.mla_up_proj || m == "mla_up_proj";
    r.dense_mlp = r.dense_mlp || m == "mlp";
  }
  return r;
}

// Layers per pipeline stage as Megatron-Core splits them (an explicit list for tally, so that
// the planner's choose_split does not move layers the run did not move): even, or with
// account_for_embedding_in_pipeline_split and account_for_loss_in_pipeline_split (Llama 3.1 405B,
// Qwen3 235B): the embedding and the loss each take one layer's slot, (L + 2) / (pp·v) slots per
// virtual stage, so the first virtual stage holds one layer fewer and the last one fewer. With
// v > 1 the list names every virtual stage, in model order (Note [uneven virtual stages]). Empty
// for an even split that tally's interleaved schedule takes as it is (v > 1) and for pp = 1.
inline std::vector<int> bridge_stage_layers(const nlohmann::json& run, std::int64_t layers) {
  const int pp = run["pp"], v = bridge_int(run["vp"], 1);
  if (pp == 1) return {};
  // DeepSeek-V3's pipeline_model_parallel_layout, transcribed per virtual stage (the fixture's
  // layout_layers; the MTP module and the loss on the last one, where tally puts them).
  if (run["recipe"].contains("layout_layers"))
    return run["recipe"]["layout_layers"].get<std::vector<int>>();
  const bool slots = run["recipe"]["pipeline_split"] == "embedding and loss each count as a layer";
  if (!slots && v > 1) return {};
  const std::int64_t total = layers + (slots ? 2 : 0), chunks = std::int64_t(pp) * v;
  if (total % chunks != 0)
    throw InvalidInput(std::to_string(total) + " layer slots do not split evenly over pp·vp = " +
                       std::to_string(chunks) + " stages");
  std::vector<int> per(std::size_t(chunks), int(total / chunks));
  if (slots) {
    per.front() -= 1;  // the embedding's slot
    per.back() -= 1;   // the loss's slot
  }
  return per;
}

// The request: the system's preset, the row's GPUs, GBS and sequence, its precision; AdamW (the
// recipes' distributed fused Adam with weight decay); Megatron-Core's overlaps as the recipes set
// them (overlap_grad_reduce and overlap_param_gather True: tally's defaults; TP comm overlap where
// tp_comm_overlap is set and TP > 1; the MoE all-to-all overlap where moe_a2a_overlap is set);
// TE's fused kernels and fused cross-entropy; dropless balanced routing (capacity factor 1, the
// page's footnote); fp8 current scaling keeps no amax history (memory only); fp8 parameters
// (Note [fp8 parameters]) where the recipe's precision config sets fp8_param_gather — fp8_cs and
// fp8_mx, not nvfp4 (src/megatron/bridge/training/mixed_precision.py at the same commit); the
// parameter all-gather's overlap off where the recipe records overlap_param_gather False.
inline PlanRequest bridge_request(const nlohmann::json& run) {
  const auto& rc = run["recipe"];
  const Precision p = bridge_precision(run["precision"]);
  PlanRequest q{.model = *model_preset(*bridge_model_preset(run["model"])),
                     .cluster = *cluster_preset(bridge_cluster(run["system"])),
                     .gpus = run["gpus"], .global_batch = run["gbs"], .seq = run["seq"],
                     .precision = p, .optimizer = Optimizer::adamw,
                     .tp_overlap = rc.value("tp_comm_overlap", false) && run["tp"].get<int>() > 1,
                     .ep_overlap = rc.value("moe_a2a_overlap", false),
                     .amax_history = p == Precision::fp8 ? 1 : kTeAmaxHistory,
                     .fp8_param_gather = rc["precision_recipe"] == "fp8_cs" ||
                                         rc["precision_recipe"] == "fp8_mx",
                     .loss = Loss::fused, .kernels = Kernels::fused};
  // Recorded where a recipe turns it off (Llama 3.1 405B GB200 NVFP4:
  // disable_param_gather_overlap).
  q.overlap_param_gather = rc.value("overlap_param_gather", true);
  // TE runs cuDNN's fused attention on Hopper and later (Note [cuDNN attention] in presets.cpp),
  // measured on Hopper only: the other systems keep their FlashAttention-2 figures.
  if (!q.cluster.gpu.kernels.cudnn_attention_table.empty()) q.flash_kernel = FlashKernel::cudnn;
  // DeepSeek-V3's recipes train its multi-token-prediction module (mtp_num_layers 1; Note
  // [multi-token prediction] in core/src/model.cpp) and name recompute modules of their own.
  q.model.mtp_layers = rc.value("mtp_num_layers", 0);
  q.recompute_modules = bridge_recompute_modules(rc);
  // DeepSeek-V3 routes each token to at most 4 nodes (its config's topk_group 4: Note
  // [node-limited routing], core/src/comm_nccl.cpp), and the recipes' flex dispatcher (DeepEP,
  // HybridEP) sends a token once per node: tally's --max-route-nodes 4. A no-op where the EP group
  // stays inside one NVLink domain (the NVL72 rows, EP 8 on an HGX node).
  if (run["model"] == "DeepSeekV3" && rc["dispatcher"].is_string() &&
      rc["dispatcher"].get<std::string>().starts_with("flex"))
    q.max_route_nodes = 4;
  return q;
}

// The layout: the row's TP, PP, CP, VP and EP; DP the rest; SP with TP (the perf configs'
// sequence_parallel = TP > 1); ETP as the recipe sets it (1 for every MoE model here); FSDP > 0
// (Megatron FSDP, optim_grads_params) = ZeRO-3 over dp, otherwise Megatron's distributed optimizer
// = ZeRO-1; GA = GBS / (MBS · DP); flash attention (TE's cuDNN fused attention: the request).
inline Layout bridge_layout(const nlohmann::json& run, const ModelSpec& m) {
  const auto& rc = run["recipe"];
  const int dp = bridge_dp(run);
  const std::int64_t mbs = run["mbs"];
  Layout L{.dp = dp, .tp = run["tp"], .pp = run["pp"], .cp = run["cp"],
           .interleave = bridge_int(run["vp"], 1), .ep = bridge_int(run["ep"], 1),
           .etp = m.is_moe() ? bridge_int(rc["expert_tensor_parallel"], 0) : 0,
           .sp = run["tp"].get<int>() > 1, .zero = run["fsdp"].get<int>() > 0 ? 3 : 1,
           .micro_batch = mbs, .grad_accum = run["gbs"].get<std::int64_t>() / (dp * mbs),
           .recompute = bridge_recompute(rc), .attention = Attention::flash};
  const std::vector<int> stages = bridge_stage_layers(run, m.layers);
  if (!stages.empty()) L.stage_layer_list = std::make_shared<const std::vector<int>>(stages);
  return L;
}

}  // namespace tally
