#include "common.hpp"

#include "commands.hpp"
#include "html_report.hpp"

#include <fmt/core.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
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

bool is_json_text(std::string_view value) {
  const auto first = value.find_first_not_of(" \t\r\n");
  return first != std::string_view::npos && value[first] == '{';
}

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
                                    "), a Hugging Face config.json path, or that file's text "
                                    "({...})");
  auto* params = cmd->add_option("--params", m.params,
                                 "parameter count when no architecture is known: 7e9, 7B, 350M");
  model->excludes(params);
  params->excludes(model);
  cmd->add_option("--mtp-layers", m.mtp_layers,
                  "multi-token-prediction modules trained beside the model (DeepSeek-V3: 1; "
                  "Megatron-Core --mtp-num-layers): each a projection, one layer of the model's "
                  "last kind and a pass through the shared head, on the last pipeline stage "
                  "(default 0: presets and config.json files describe the main model)")
      ->check(CLI::Range(0, 1024));
}

std::optional<ModelSpec> resolve_model(const ModelOptions& m, bool allow_none) {
  std::optional<ModelSpec> spec = resolve_main_model(m, allow_none);
  if (spec && m.mtp_layers) {
    if (spec->params_only)
      throw InvalidInput("--mtp-layers = " + std::to_string(*m.mtp_layers) +
                         ": needs an architecture (--model), not only --params");
    spec->mtp_layers = *m.mtp_layers;
    if (spec->mtp_layers > spec->layers)
      throw InvalidInput("--mtp-layers = " + std::to_string(*m.mtp_layers) +
                         ": allowed 0.." + std::to_string(spec->layers) + " (the model's layers)");
    // Every report names the model it costs: "deepseek-v3 + 1 MTP module".
    if (spec->mtp_layers > 0)
      spec->name += " + " + std::to_string(spec->mtp_layers) +
                    (spec->mtp_layers == 1 ? " MTP module" : " MTP modules");
  }
  return spec;
}

std::optional<ModelSpec> resolve_main_model(const ModelOptions& m, bool allow_none) {
  if (m.params) return model_from_params(parse_count(*m.params, "--params"));
  if (!m.model) {
    if (allow_none) return std::nullopt;
    throw InvalidInput("--model or --params is required (presets: " + join(model_preset_names()) +
                       ")");
  }
  if (auto preset = model_preset(*m.model)) return preset;
  if (is_json_text(*m.model)) return io::parse_hf_config(*m.model, kInlineModelSource);
  const std::filesystem::path p(*m.model);
  if (p.extension() == ".json" || std::filesystem::exists(p)) return io::load_hf_config(p);
  throw InvalidInput("--model = '" + *m.model + "': not a preset (" + join(model_preset_names()) +
                     ") nor a config.json file");
}

void add_cluster_flags(CLI::App* cmd, ClusterOptions& c) {
  cmd->add_option("--gpu", c.gpu,
                  "GPU preset (" + join(cluster_preset_names()) +
                      "), a cluster JSON file, or its text ({...})")
      ->capture_default_str();
  cmd->add_option("--gpus-per-node", c.gpus_per_node, "GPUs per node (default: the preset's)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--nvlink-domain", c.nvlink_domain,
                  "GPUs on one NVLink fabric, whole hosts (default: the preset's; NVL72 racks: 72)")
      ->check(CLI::Range(1, 65536));
  cmd->add_option("--calibration", c.calibration,
                  "calibration JSON from `tally bench allreduce`, or its text ({...}) (overrides "
                  "link α/β)");
}

ClusterSpec resolve_cluster(const ClusterOptions& c) {
  ClusterSpec spec;
  if (auto preset = cluster_preset(c.gpu)) {
    spec = *preset;
  } else if (is_json_text(c.gpu)) {
    spec = io::parse_cluster(c.gpu, kInlineClusterSource);
  } else {
    const std::filesystem::path p(c.gpu);
    if (p.extension() != ".json" && !std::filesystem::exists(p))
      throw InvalidInput("--gpu = '" + c.gpu + "': not a preset (" +
                         join(cluster_preset_names()) + ") nor a cluster JSON file");
    spec = io::load_cluster(p);
  }
  if (c.gpus_per_node) spec.gpus_per_node = *c.gpus_per_node;
  if (c.nvlink_domain) spec.nvlink_domain = *c.nvlink_domain;
  if (c.calibration)
    spec = io::apply_calibration(
        spec, is_json_text(*c.calibration)
                  ? io::parse_calibration(*c.calibration, kInlineCalibrationSource)
                  : io::load_calibration(*c.calibration));
  spec.validate();
  return spec;
}

void add_memory_budget_flags(CLI::App* cmd, MemoryBudgetOptions& m) {
  cmd->add_option("--headroom", m.headroom,
                  "extra memory kept free, a fraction of capacity (the seed's rule: 0.2)")
      ->check(finite_in(0, 0.99))
      ->capture_default_str();
  cmd->add_option("--allocator-allowance", m.allocator_allowance,
                  "PyTorch caching allocator's reserved / allocated − 1 (default: the largest "
                  "measured, docs/ledgers.md)")
      ->check(finite_in(0, 1))
      ->capture_default_str();
  cmd->add_option("--runtime-mib", m.runtime_mib,
                  "CUDA context and libraries outside the allocator, MiB (at most 16 GiB, "
                  "below every preset's memory)")
      ->check(finite_in(0, 16384))
      ->capture_default_str();
}

void add_loss_flag(CLI::App* cmd, std::string& loss) {
  cmd->add_option("--loss", loss,
                  "fused (one fp32 logits tensor, 4sbV/t, one fused kernel: Megatron-Core "
                  "--cross-entropy-loss-fusion, Transformer Engine's) | vocab-parallel (the same "
                  "tensor; Megatron-LM's unfused vocab-parallel cross-entropy, its default: a "
                  "kernel per line, 48 + 2e B per logit in the time model) | eager (PyTorch's "
                  "uncompiled cross_entropy(logits.float()): three fp32 tensors of the logits' "
                  "size, 12sbV/t, and its unfused kernels' bytes in the time model)")
      ->check(one_of(allowed_losses()))
      ->capture_default_str();
}

void add_recompute_modules_flag(CLI::App* cmd, std::vector<std::string>& modules) {
  cmd->add_option("--recompute-modules", modules,
                  "Megatron-Core recompute modules beside the --recompute policy "
                  "(comma-separated): mla_up_proj (MLA's q/kv up-projections and RoPE replayed, "
                  "their q, k, v not kept), mlp (each dense MLP replayed from its input); "
                  "default none")
      ->delimiter(',')
      ->check(one_of({"mla_up_proj", "mlp"}));
}

RecomputeModules recompute_modules_from(const std::vector<std::string>& modules) {
  RecomputeModules r;
  for (const std::string& m : modules) {
    r.mla_up_proj = r.mla_up_proj || m == "mla_up_proj";
    r.dense_mlp = r.dense_mlp || m == "mlp";
  }
  return r;
}

void add_etp_flag(CLI::App* cmd, std::optional<int>& etp) {
  cmd->add_option("--etp", etp,
                  "expert tensor-parallel degree (MoE: each expert's FFN split over ETP ranks; "
                  "default --tp, Megatron-Core's; other than --tp needs --sp when --tp > 1)")
      ->check(CLI::Range(1, 1024));
}

void add_route_flag(CLI::App* cmd, int& max_route_nodes) {
  cmd->add_option("--max-route-nodes", max_route_nodes,
                  "MoE: each token's routed copies reach at most M nodes (NVLink domains), sent "
                  "once to each and forwarded inside (DeepSeek-V3 node-limited routing, M = 4); "
                  "0 = no limit, every copy sent")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
}

void add_amax_history_flag(CLI::App* cmd, int& amax_history) {
  cmd->add_option("--amax-history", amax_history,
                  "fp8 delayed scaling: amax history entries per tensor, 5 fp32 histories and "
                  "scales per GEMM in the state ledger (Transformer Engine's DelayedScaling "
                  "default; Megatron-Core's --fp8-amax-history-len default is 1)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
}

void add_fsdp_float8_flag(CLI::App* cmd, bool& fsdp_float8_all_gather) {
  cmd->add_flag("--fsdp-float8-all-gather", fsdp_float8_all_gather,
                "--precision fp8, ZeRO-3: all-gather the layers' linear weights in float8, 1 B "
                "instead of 2 (torchao enable_fsdp_float8_all_gather, as torchtitan's Float8 "
                "benchmarks ran; default: off, torchao's default)");
}

void add_fp8_param_gather_flag(CLI::App* cmd, bool& fp8_param_gather) {
  cmd->add_flag("--fp8-param-gather", fp8_param_gather,
                "--precision fp8|mxfp8: Megatron-Core's fp8 parameters: the linear weights held "
                "only in the low-precision format (no bf16 copy); per-tensor fp8's ZeRO >= 1 "
                "parameter all-gather moves 1 B per linear weight, MXFP8's stays bf16 "
                "(Megatron-Bridge's fp8_cs and mxfp8 recipes set it; default: off, "
                "Megatron-Core's default)");
}

void add_pp_scatter_gather_flag(CLI::App* cmd, bool& pp_scatter_gather) {
  cmd->add_flag("--pp-scatter-gather", pp_scatter_gather,
                "TP > 1 without SP: each TP rank sends 1/t of a PP activation and the next stage "
                "all-gathers it over TP (Megatron-LM 2021-02 to 2023-03, its default there; "
                "default: whole activations, as Megatron-Core)");
}

void check_expert_split(const ModelSpec& m, const ParallelLayout& layout, int ep, int etp,
                        bool sequence_parallel) {
  if (m.params_only && (ep > 1 || etp != layout.tp))
    throw InvalidInput("--ep/--etp need an architecture: give --model, not --params");
  require_expert_split(m, ep, etp, layout.tp);
  (void)expert_layout(layout, etp, ep);
  require_expert_tp(layout.tp, etp, sequence_parallel);
}

void add_lora_flags(CLI::App* cmd, LoraOptions& o) {
  cmd->add_option("--method", o.method,
                  "full | lora (frozen backbone in the compute dtype) | qlora (frozen 4-bit "
                  "backbone; the seed's program)")
      ->check(one_of({"full", "lora", "qlora"}))
      ->capture_default_str();
  cmd->add_option("--lora-rank", o.rank, "LoRA rank r")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  cmd->add_option("--lora-alpha", o.alpha, "LoRA α (scale α/r; no memory of its own)")
      ->check(finite_in(1e-6, 1e6))
      ->capture_default_str();
  cmd->add_option("--lora-dropout", o.dropout,
                  "PEFT lora_dropout: > 0 keeps each adapter's dropped input and mask for "
                  "backward (activations)")
      ->check(finite_in(0, 1, Ends::open_hi))
      ->capture_default_str();
  cmd->add_option("--lora-targets", o.targets,
                  "adapted matrices, Hugging Face Llama names: q,k,v,o,gate,up,down")
      ->delimiter(',')
      ->check(one_of({"q", "k", "v", "o", "gate", "up", "down"}))
      ->capture_default_str();
  cmd->add_option("--quant", o.quant, "qlora backbone format: nf4 | fp4 | int8")
      ->check(one_of({"nf4", "fp4", "int8"}))
      ->capture_default_str();
  cmd->add_flag("--no-double-quant", o.no_double_quant,
                "one fp32 absmax per block (default: double quantization, QLoRA §3)");
  cmd->add_option("--quant-block", o.quant_block, "first-level quantization block")
      ->check(CLI::Range(16, 4096))
      ->capture_default_str();
  cmd->add_flag("--no-upcast", o.no_upcast,
                "keep embeddings, head and norms in the compute dtype (default: fp32, as PEFT's "
                "prepare_model_for_kbit_training casts them)");
}

void note_lora_flags(CLI::App* cmd, LoraOptions& o) {
  for (const char* flag : {"--lora-rank", "--lora-alpha", "--lora-dropout", "--lora-targets",
                           "--quant", "--no-double-quant", "--quant-block", "--no-upcast"})
    if (o.flag_given.empty() && cmd->get_option(flag)->count() > 0) o.flag_given = flag;
}

std::optional<LoraSetup> lora_setup(const LoraOptions& o, Precision compute, Optimizer optimizer,
                                    bool fp32_qlora) {
  const FineTune method = *parse_finetune(o.method);
  if (method == FineTune::full) {
    if (!o.flag_given.empty())  // never silently ignored
      throw InvalidInput(o.flag_given + " applies to --method lora or qlora (--method is full)");
    return std::nullopt;
  }
  if (compute == Precision::fp32 && method == FineTune::qlora && !fp32_qlora)
    throw InvalidInput("--method qlora --precision fp32: the compute dtype must be bf16 or fp16");
  if (is_low_precision(compute))
    throw InvalidInput("--method " + o.method + " --precision " + std::string(to_string(compute)) +
                       ": the LoRA ledger's precision is the compute dtype: fp32, bf16 or fp16");
  LoraSetup s{.method = method, .rank = o.rank, .alpha = o.alpha, .dropout = o.dropout,
              .targets = {},
              .quant = *parse_quant(o.quant), .double_quant = !o.no_double_quant,
              .block = o.quant_block, .compute = compute, .optimizer = optimizer};
  s.upcast_unquantized = !o.no_upcast;
  for (const std::string& t : o.targets) s.targets.push_back(*parse_lora_target(t));
  return s;
}

MemoryBudget memory_budget(const MemoryBudgetOptions& m, double capacity_bytes) {
  return MemoryBudget{.capacity_bytes = capacity_bytes, .headroom = m.headroom,
                      .allocator_allowance = m.allocator_allowance,
                      .runtime_bytes = m.runtime_mib * kMiB};
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

namespace {
// 1e-09, 0.001, 1e+12: %g when that reads back as `v`, else the shortest form that does
// (1.000001, which %g would print as 1).
std::string bound_text(double v) {
  const std::string g = fmt::format("{:g}", v);
  return std::strtod(g.c_str(), nullptr) == v ? g : fmt::format("{}", v);
}
}  // namespace

CLI::Validator finite_in(double lo, double hi, Ends ends) {
  const std::string interval = fmt::format("{}{}, {}{}", ends == Ends::open_lo ? '(' : '[',
                                           bound_text(lo), bound_text(hi),
                                           ends == Ends::open_hi ? ')' : ']');
  return CLI::Validator(
      [lo, hi, ends, interval](std::string& s) -> std::string {
        double v = 0;  // parsed exactly as CLI11 will parse it into the option's double
        const bool inside = CLI::detail::lexical_cast(s, v) && std::isfinite(v) &&
                            (ends == Ends::open_lo ? v > lo : v >= lo) &&
                            (ends == Ends::open_hi ? v < hi : v <= hi);
        return inside ? std::string() : "'" + s + "' must be a finite number in " + interval;
      },
      "in " + interval);
}

namespace {

// `--NAME <value with unit>` and its alias `--ALIAS <number in GB or GB/s>` into one SI value
// (Note [units on the command line]).
void add_unit_flag(CLI::App* cmd, const std::string& name, const std::string& alias,
                   std::optional<double>& target, const std::string& what, double lo, double hi,
                   double (*parse)(std::string_view, std::string_view), const char* example,
                   const std::string& si_unit, const std::string& alias_unit) {
  const std::string bounds = fmt::format("[{}, {}] {}", bound_text(lo), bound_text(hi), si_unit);
  CLI::Option* typed = cmd->add_option_function<std::string>(
      name,
      [&target, name, parse, lo, hi, bounds, si_unit](const std::string& text) {
        const double v = parse(text, name);
        if (!(v >= lo && v <= hi))
          throw InvalidInput(fmt::format("{} = '{}' = {} {}: must be in {}", name, text,
                                         bound_text(v), si_unit, bounds));
        target = v;
      },
      fmt::format("{}, with its unit, e.g. {}", what, example));
  typed->type_name("QUANTITY");
  CLI::Option* old = cmd->add_option_function<double>(
      alias, [&target](double v) { target = v * kGB; },
      fmt::format("the same as a plain number in {} (1e9 bytes{}); alias of {}", alias_unit,
                  si_unit == "B/s" ? " per second" : "", name));
  old->check(finite_in(lo / kGB, hi / kGB));
  typed->excludes(old);
}

}  // namespace

void add_bandwidth_flag(CLI::App* cmd, const std::string& name, const std::string& gbps_alias,
                        std::optional<double>& bps, const std::string& what, double lo_bps,
                        double hi_bps) {
  add_unit_flag(cmd, name, gbps_alias, bps, what, lo_bps, hi_bps, &parse_bandwidth,
                "50GB/s or 200Gb/s", "B/s", "GB/s");
}

void add_size_flag(CLI::App* cmd, const std::string& name, const std::string& gb_alias,
                   std::optional<double>& bytes, const std::string& what, double lo_bytes,
                   double hi_bytes) {
  add_unit_flag(cmd, name, gb_alias, bytes, what, lo_bytes, hi_bytes, &parse_bytes,
                "14GB or 512MiB", "B", "GB");
}

void refuse_empty_values(CLI::App& app) {
  const CLI::Validator non_empty(
      [](std::string& s) -> std::string {
        return s.empty() ? "empty value: give one, or leave the flag out for its default"
                         : std::string();
      },
      "");
  // Options that take a value (a flag such as --json expects none), named (not positional).
  for (CLI::Option* opt : app.get_options())
    if (opt->nonpositional() && opt->get_items_expected_max() > 0) opt->check(non_empty);
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; }))
    refuse_empty_values(*sub);
}

Precision precision_from(const std::string& s) { return *parse_precision(s); }

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> v = [] {
    std::vector<std::string> out = allowed_precisions();
    out.emplace_back("mixed");
    return out;
  }();
  return v;
}
Optimizer optimizer_from(const std::string& s) { return *parse_optimizer(s); }
Recompute recompute_from(const std::string& s) { return *parse_recompute(s); }
Attention attention_from(const std::string& s) { return *parse_attention(s); }

CLI::Validator finite_number(const std::string& range) {
  return CLI::Validator(
      [range](std::string& s) -> std::string {
        double v = 0;
        return CLI::detail::lexical_cast(s, v) && std::isfinite(v)
                   ? std::string()
                   : "'" + s + "' must be a finite number (" + range + ")";
      },
      "finite, " + range);
}

void add_rank_run_flags(CLI::App* cmd, double& timeout_s, int& threads, bool& json,
                        const std::string& each) {
  cmd->add_option("--timeout", timeout_s, "seconds for the rendezvous and each " + each)
      ->check(finite_in(0, 86400, Ends::open_lo))
      ->capture_default_str();
  cmd->add_option("--threads", threads, "torch intra-op threads per rank (0 = default)")
      ->capture_default_str();
  cmd->add_flag("--json", json, "one JSON object on one line (rank 0)");
}

namespace {
// The first non-finite number in `j`, as "path = value"; empty when there is none.
std::string first_non_finite(const nlohmann::json& j, const std::string& path) {
  if (j.is_number_float()) {
    const double v = j.get<double>();
    return std::isfinite(v) ? std::string() : fmt::format("{} = {}", path, v);
  }
  if (j.is_object()) {
    for (const auto& [key, value] : j.items())
      if (auto bad = first_non_finite(value, path.empty() ? key : path + "." + key); !bad.empty())
        return bad;
  } else if (j.is_array()) {
    for (std::size_t i = 0; i < j.size(); ++i)
      if (auto bad = first_non_finite(j[i], fmt::format("{}[{}]", path, i)); !bad.empty())
        return bad;
  }
  return {};
}
}  // namespace

void require_finite(const nlohmann::json& j) {
  if (const std::string bad = first_non_finite(j, ""); !bad.empty())
    throw InvalidInput(bad + ": these inputs give a figure that is not a finite number, so "
                             "nothing is printed (check the extreme values among them)");
}

void print_json(const nlohmann::json& j) { std::cout << j.dump(2) << "\n"; }

Answers Answers::printed() {
  return {.json = print_json, .page = [](const std::string& path, const html::Page& p) {
            html::write_file("--html", path, html::page(p));
          }};
}

nlohmann::json count_json(double n) {
  return n == std::floor(n) && std::fabs(n) < 9.007199254740992e15 ? nlohmann::json(std::int64_t(n))
                                                                  : nlohmann::json(n);
}

bool no_failures_expected(const ReliabilityReport& r) { return std::isinf(r.mtbf_hours); }

nlohmann::json unless_no_failures(const ReliabilityReport& r, double v) {
  return no_failures_expected(r) ? nlohmann::json(nullptr) : nlohmann::json(v);
}

std::string sig_str(double v, int digits) { return fmt::format("{:.{}g}", v, digits); }

std::string pct_str(double fraction) { return fmt::format("{:.1f} %", 100 * fraction); }

std::string size_str(double bytes, SizeUnit u, int decimals) {
  return format_bytes(bytes, u, decimals);
}
double in_gb(double bytes) { return bytes / kGB; }

}  // namespace tally::cli
