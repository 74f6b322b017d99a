#include "common.hpp"

#include <cstdio>
#include <filesystem>
#include <iostream>

#include "tally/core/presets.hpp"
#include "tally/io/calibration.hpp"
#include "tally/io/cluster_file.hpp"
#include "tally/io/hf_config.hpp"

namespace tally::cli {

namespace {
std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}
}  // namespace

SizeUnit OutputOptions::size_unit() const { return *parse_size_unit(unit); }

void add_output_flags(CLI::App* cmd, OutputOptions& out) {
  cmd->add_flag("--json", out.json, "print one JSON object instead of the text report");
  cmd->add_option("--unit", out.unit, "unit of sizes in the text report: GB (1e9 B) or GiB (2^30 B)")
      ->check(CLI::IsMember({"GB", "GiB"}))
      ->capture_default_str();
}

void add_model_flags(CLI::App* cmd, ModelOptions& m) {
  auto* model = cmd->add_option("--model", m.model,
                                "model preset (" + join(model_preset_names()) +
                                    ") or a Hugging Face config.json path");
  auto* params = cmd->add_option("--params", m.params,
                                 "parameter count when no architecture is known: 7e9, 7B, 350M");
  model->excludes(params);
  params->excludes(model);
}

std::optional<ModelSpec> resolve_model(const ModelOptions& m, bool allow_none) {
  if (!m.params.empty()) return model_from_params(parse_count(m.params, "--params"));
  if (m.model.empty()) {
    if (allow_none) return std::nullopt;
    throw InvalidInput("--model or --params is required (presets: " + join(model_preset_names()) +
                       ")");
  }
  if (auto preset = model_preset(m.model)) return preset;
  const std::filesystem::path p(m.model);
  if (p.extension() == ".json" || std::filesystem::exists(p)) return io::load_hf_config(p);
  throw InvalidInput("--model = '" + m.model + "': not a preset (" + join(model_preset_names()) +
                     ") nor a config.json file");
}

void add_cluster_flags(CLI::App* cmd, ClusterOptions& c) {
  cmd->add_option("--gpu", c.gpu,
                  "GPU preset (" + join(cluster_preset_names()) + ") or a cluster JSON file")
      ->capture_default_str();
  cmd->add_option("--gpus-per-node", c.gpus_per_node, "GPUs per node (default: the preset's)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--calibration", c.calibration,
                  "calibration JSON from `tally bench allreduce` (overrides link α/β)");
}

ClusterSpec resolve_cluster(const ClusterOptions& c) {
  ClusterSpec spec;
  if (auto preset = cluster_preset(c.gpu)) {
    spec = *preset;
  } else {
    const std::filesystem::path p(c.gpu);
    if (p.extension() != ".json" && !std::filesystem::exists(p))
      throw InvalidInput("--gpu = '" + c.gpu + "': not a preset (" +
                         join(cluster_preset_names()) + ") nor a cluster JSON file");
    spec = io::load_cluster(p);
  }
  if (c.gpus_per_node > 0) spec.gpus_per_node = c.gpus_per_node;
  if (!c.calibration.empty())
    spec = io::apply_calibration(spec, io::load_calibration(c.calibration));
  spec.validate();
  return spec;
}

CLI::Validator one_of(const std::vector<std::string>& names) {
  return CLI::Validator(
      [names](std::string& s) -> std::string {
        for (const auto& n : names)
          if (n == s) return {};
        return "'" + s + "' is not one of: " + join(names);
      },
      "{" + join(names) + "}");
}

Precision precision_from(const std::string& s) { return *parse_precision(s); }
Optimizer optimizer_from(const std::string& s) { return *parse_optimizer(s); }
Recompute recompute_from(const std::string& s) { return *parse_recompute(s); }
Attention attention_from(const std::string& s) { return *parse_attention(s); }

void print_json(const nlohmann::json& j) { std::cout << j.dump(2) << "\n"; }

std::string size_str(double bytes, SizeUnit u, int decimals) {
  return format_bytes(bytes, u, decimals);
}
double in_gb(double bytes) { return bytes / kGB; }

}  // namespace tally::cli
