// Shared pieces of the command line: model / cluster resolution, output flags, JSON printing.
// Strings become enums and SI units here, at the boundary (STYLE.md habit 2); nothing past this
// layer sees a flag's spelling.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tally/core/hardware.hpp"
#include "tally/core/model.hpp"
#include "tally/core/types.hpp"

namespace tally::cli {

// Exit codes (STYLE.md, after google/benchmark): 0 ok, 1 a run failed, 2 bad input.
enum ExitCode : int { kOk = 0, kRunFailed = 1, kBadInput = 2 };

struct OutputOptions {
  bool json = false;
  std::string unit = "GB";
  SizeUnit size_unit() const;
};
void add_output_flags(CLI::App* cmd, OutputOptions& out);

// --model PRESET|config.json or --params N (7e9, 7B). Exactly one must be given unless
// `allow_none`; returns nullopt then.
struct ModelOptions {
  std::string model;
  std::string params;
};
void add_model_flags(CLI::App* cmd, ModelOptions& m);
std::optional<ModelSpec> resolve_model(const ModelOptions& m, bool allow_none = false);

// --gpu PRESET|cluster.json (default a100-80g) plus --gpus-per-node and --calibration overrides.
struct ClusterOptions {
  std::string gpu = "a100-80g";
  int gpus_per_node = 0;          // 0 = the preset's value
  std::string calibration;        // a file written by `tally bench allreduce`
};
void add_cluster_flags(CLI::App* cmd, ClusterOptions& c);
ClusterSpec resolve_cluster(const ClusterOptions& c);

// Enum flags: a CLI11 check listing the allowed names, so errors name flag, value and choices.
CLI::Validator one_of(const std::vector<std::string>& names);
Precision precision_from(const std::string& s);
Optimizer optimizer_from(const std::string& s);
Recompute recompute_from(const std::string& s);
Attention attention_from(const std::string& s);

void print_json(const nlohmann::json& j);
// "12.34 GB" in the chosen unit.
std::string size_str(double bytes, SizeUnit u, int decimals = 2);
double in_gb(double bytes);  // JSON fields named *_gb are always decimal GB (1e9 B)

}  // namespace tally::cli
