// Built-in model and GPU presets, each with its source in a comment (presets.cpp).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tally/core/hardware.hpp"
#include "tally/core/model.hpp"

namespace tally {

std::optional<ModelSpec> model_preset(std::string_view name);
const std::vector<std::string>& model_preset_names();

// A single node of 8 GPUs of this type with the preset's NVLink and InfiniBand figures.
std::optional<ClusterSpec> cluster_preset(std::string_view name);
const std::vector<std::string>& cluster_preset_names();

// The built-in default scenario (issue 2 / 5): the seed's generic 7B on 8 × 80 GB GPUs.
inline constexpr std::string_view kDefaultModel = "seed-7b";
inline constexpr std::string_view kDefaultCluster = "a100-80g";

}  // namespace tally
