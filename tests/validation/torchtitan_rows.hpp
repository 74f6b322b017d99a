// One row of tests/data/published_memory_peaks.json (torchtitan's benchmark tables) as tally's
// request and layout: the published layout fixed, nothing fitted. Shared by the memory-peak test
// (test_published_peaks.cpp) and the throughput test kept aside (test_published_throughput.cpp), so
// both read the same row the same way.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tally/core/planner.hpp"
#include "tally/core/presets.hpp"
#include "tally/core/types.hpp"

namespace tally {

// The GPU as the source describes it: the preset, with the published HBM bandwidth where the
// row gives one (torchtitan's Dec 2024 H100s: HBM2e at 2.4 TB/s, not the preset's HBM3).
inline ClusterSpec published_cluster(const nlohmann::json& run) {
  ClusterSpec c = *cluster_preset(run["cluster"].get<std::string>());
  if (run.contains("hbm_bytes_per_s")) c.gpu.memory_bps = run["hbm_bytes_per_s"].get<double>();
  return c;
}

inline PlanRequest published_request(const nlohmann::json& run) {
  return PlanRequest{.model = *model_preset(run["model"].get<std::string>()),
                     .cluster = published_cluster(run),
                     .gpus = run["gpus"], .global_batch = run["global_batch"], .seq = run["seq"],
                     .precision = *parse_precision(run["precision"].get<std::string>()),
                     .optimizer = Optimizer::adamw,
                     .tp_overlap = run.value("async_tp", false),
                     // DTensor TP: the autograd node runs both backward GEMMs before the input
                     // gradient's collective (Note [TP gradient overlap], planner.cpp)
                     .tp_grad_overlap = false,
                     // the row's fsdp_float8_all_gather_source gives where it was set
                     .fsdp_float8_all_gather = run.value("fsdp_float8_all_gather", false),
                     .loss = run["loss"].get<std::string>() == "eager" ? Loss::eager : Loss::fused,
                     // Note [eager kernels]: an uncompiled run's elementwise kernels unfused
                     .kernels = run["torch_compile"].get<bool>() ? Kernels::fused : Kernels::eager};
}

inline Layout published_layout(const nlohmann::json& run) {
  Layout L{.dp = run["dp"], .tp = run["tp"], .pp = run["pp"], .cp = run["cp"],
           .interleave = run.value("interleave", 1), .sp = run["sp"], .zero = run["zero"],
           .micro_batch = run["micro_batch"], .grad_accum = run["grad_accum"],
           .recompute = *parse_recompute(run["recompute"].get<std::string>()),
           .attention = Attention::flash};
  if (run.contains("stage_layers"))
    L.stage_layer_list = std::make_shared<const std::vector<int>>(
        run["stage_layers"].get<std::vector<int>>());
  return L;
}

}  // namespace tally
