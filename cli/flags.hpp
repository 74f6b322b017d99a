// Flags shared by the commands (CLI11): model / cluster resolution, output flags, checked numbers
// and units, enum choices. Strings become enums and SI units here, at the boundary (STYLE.md habit
// 2); nothing past this layer sees a flag's spelling.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "format.hpp"
#include "tally/core/finetune.hpp"
#include "tally/core/hardware.hpp"
#include "tally/core/model.hpp"
#include "tally/core/parallel_groups.hpp"
#include "tally/core/planner.hpp"
#include "tally/core/types.hpp"

namespace tally::cli {

void add_output_flags(CLI::App* cmd, OutputOptions& out);

// Note [JSON text for a file]
// --model, --gpu and --calibration name a preset or a file, or hold the file's JSON text itself
// (a value whose first non-blank character is '{'): `--gpu '{"preset": "h100-80g",
// "gpus_per_node": 4}'`, and the text a user pastes into `tally serve`'s page, which reads no
// files. The text goes through the same io reader as the file (size, depth and every field
// checked); messages name it as the file it stands for: "config.json: hidden_size = ...".
bool is_json_text(std::string_view value);
inline constexpr const char* kInlineModelSource = "config.json";
inline constexpr const char* kInlineClusterSource = "cluster.json";
inline constexpr const char* kInlineCalibrationSource = "calibration.json";

// --model PRESET|config.json|{...} or --params N (7e9, 7B). Exactly one must be given unless
// `allow_none`; returns nullopt then. Unset means not typed (a command's default model is set
// before parsing).
struct ModelOptions {
  std::optional<std::string> model;
  std::optional<std::string> params;
  std::optional<std::int64_t> mtp_layers;  // --mtp-layers D (Note [multi-token prediction])
};
void add_model_flags(CLI::App* cmd, ModelOptions& m);
std::optional<ModelSpec> resolve_model(const ModelOptions& m, bool allow_none = false);
// The same without --mtp-layers applied: the preset, config.json or --params as given.
std::optional<ModelSpec> resolve_main_model(const ModelOptions& m, bool allow_none = false);

// --gpu PRESET|cluster.json|{...} (default a100-80g) plus --gpus-per-node and --calibration overrides.
struct ClusterOptions {
  std::string gpu = "a100-80g";
  std::optional<int> gpus_per_node;        // unset: the preset's value
  std::optional<int> nvlink_domain;        // unset: the preset's value
  std::optional<std::string> calibration;  // a file written by `tally bench allreduce`
};
void add_cluster_flags(CLI::App* cmd, ClusterOptions& c);
ClusterSpec resolve_cluster(const ClusterOptions& c);

// Note [reserved memory] (core/planner.hpp) on the command line: --headroom, --allocator-allowance
// and --runtime-mib, for `tally plan`, `tally compare` and `tally memory --gpu`, so both commands
// answer "does it fit" alike.
struct MemoryBudgetOptions {
  double headroom = 0;
  double allocator_allowance = kAllocatorAllowance;
  double runtime_mib = kCudaRuntimeBytes / kMiB;
};
void add_memory_budget_flags(CLI::App* cmd, MemoryBudgetOptions& m);
MemoryBudget memory_budget(const MemoryBudgetOptions& m, double capacity_bytes);

// --loss fused|vocab-parallel|eager (Note [loss kernels]): `tally memory`, `plan`, `compare`.
void add_loss_flag(CLI::App* cmd, std::string& loss);

// --etp N (`tally memory`, `comm`, `compare`): the expert TP of a MoE layout; unset = --tp
// (Megatron-Core's --expert-tensor-parallel-size default).
void add_etp_flag(CLI::App* cmd, std::optional<int>& etp);
// --recompute-modules mla_up_proj,mlp (`plan`, `compare`, `memory`): Megatron-Core's recompute
// modules beside the --recompute policy (core/types.hpp RecomputeModules).
void add_recompute_modules_flag(CLI::App* cmd, std::vector<std::string>& modules);
RecomputeModules recompute_modules_from(const std::vector<std::string>& modules);
// --max-route-nodes M (`tally comm`, `plan`, `compare`): DeepSeek-V3's node-limited routing, a
// token's copies sent to at most M nodes, once each (Note [node-limited routing]); 0 = no limit.
void add_route_flag(CLI::App* cmd, int& max_route_nodes);
// --amax-history N (`tally memory`, `plan`, `compare`): fp8 delayed scaling's amax history per
// tensor (default 1024, Transformer Engine's DelayedScaling; Megatron-Core passes 1 unless told).
void add_amax_history_flag(CLI::App* cmd, int& amax_history);
// --fsdp-float8-all-gather: ZeRO-3 gathers the float8 weights (Note [fp8 all-gather], comm.cpp).
void add_fsdp_float8_flag(CLI::App* cmd, bool& fsdp_float8_all_gather);
void add_fp8_param_gather_flag(CLI::App* cmd, bool& fp8_param_gather);
// --pp-scatter-gather (`tally comm`, `plan`, `compare`): Megatron-LM's scatter/gather of PP sends
// (Note [PP scatter/gather], comm.cpp).
void add_pp_scatter_gather_flag(CLI::App* cmd, bool& pp_scatter_gather);
// A layout's expert split checked with core's rules (Note [expert rank groups], Note [expert tensor
// parallelism]): one line naming --ep or --etp when it does not hold.
void check_expert_split(const ModelSpec& m, const ParallelLayout& layout, int ep, int etp,
                        bool sequence_parallel);

// --method and the LoRA / quantization flags (`tally memory`, `tally plan`).
struct LoraOptions {
  std::string method = "full", quant = "nf4";
  int rank = 8, quant_block = 64;
  double alpha = 16, dropout = 0.05;
  std::vector<std::string> targets = {"q", "v"};
  bool no_double_quant = false, no_upcast = false;
  std::string flag_given;  // the first LoRA/quantization flag typed ("" = none)
};
void add_lora_flags(CLI::App* cmd, LoraOptions& o);
// Call in the command's callback: records which LoRA flag was typed, so --method full refuses it.
void note_lora_flags(CLI::App* cmd, LoraOptions& o);
// The adapters' setup; nullopt for --method full (which refuses any LoRA flag with one line).
// QLoRA with fp32 compute is refused (a GPU fine-tune computes in bf16 or fp16) unless
// `fp32_qlora` (`tally run qlora`, whose CPU run computes in fp32).
std::optional<LoraSetup> lora_setup(const LoraOptions& o, Precision compute, Optimizer optimizer,
                                    bool fp32_qlora = false);

// Note [numbers on the command line]
// CLI::Range tests `v < lo || v > hi`; every comparison with NaN is false, so `--utilisation nan`
// passed it, and commands that read "0 or NaN" as "not given" then ran with the default. Two rules:
//  - every floating-point flag is checked by finite_in: its text must parse (as CLI11 will parse
//    it) to a finite double inside the interval, so nan, inf, -inf and 1e999 are refused with one
//    line naming the flag, the value and the interval:
//      tally: error: --utilisation: 'nan' must be a finite number in [0.001, 1]
//  - a flag whose absence selects a default is a std::optional: "was it given" is the parser's
//    answer, never a sentinel value (0, -1, NaN, "").
// Integer flags need no more than CLI::Range: "nan", "inf" and "1e999" are not integers, so the
// conversion fails and the line names the flag, the value and the range (or, for an engine flag
// without a range, "Could not convert: --steps = nan").
enum class Ends { closed, open_lo, open_hi };  // [lo, hi], (lo, hi], [lo, hi)
CLI::Validator finite_in(double lo, double hi, Ends ends = Ends::closed);
// Finite only, for a flag whose range the engine checks with its own message (`tally launch
// --timeout -1` says "must be >= 0 s (0 = no limit)"); `range` names it in the refusal here:
//   --timeout: 'nan' must be a finite number (>= 0 s; 0 = no limit)
CLI::Validator finite_number(const std::string& range);

// The flags every multi-rank `tally run` experiment ends with, in this order: --timeout (seconds
// for the rendezvous and each `each`: "collective", "send / recv"), --threads (torch intra-op
// threads per rank) and --json (rank 0's one-line object).
void add_rank_run_flags(CLI::App* cmd, double& timeout_s, int& threads, bool& json,
                        const std::string& each);

// Note [units on the command line]
// "Gbps" means gigabits per second to everyone who buys networks, so a value carries its unit:
// `--bandwidth 50GB/s`, `200Gb/s`, `1.6Tb/s`; `--size 14GB`, `512MiB` (core's parse_bandwidth /
// parse_bytes: B is a byte, b a bit). The old unit-in-the-name flags (`--bandwidth-gbps 50`, which
// always meant GB/s, and `--size-gb 14`) stay as documented aliases into the same value; giving
// both is an error. The value lands in SI units (bytes/s, bytes) and is checked against [lo, hi].
void add_bandwidth_flag(CLI::App* cmd, const std::string& name, const std::string& gbps_alias,
                        std::optional<double>& bps, const std::string& what, double lo_bps,
                        double hi_bps);
void add_size_flag(CLI::App* cmd, const std::string& name, const std::string& gb_alias,
                   std::optional<double>& bytes, const std::string& what, double lo_bytes,
                   double hi_bytes);

// Note [empty values]
// `--params ""` once meant "no --params" and ran the default plan. Every flag that takes a value
// names a file, a preset, a number or a choice, and none of them is empty, so refuse_empty_values
// (called once in main, after every command is registered) gives each such option a check that
// refuses "" with one line naming the flag. Positional arguments (the program `tally launch`
// starts and its arguments) are left alone: an empty argument can be legitimate there.
void refuse_empty_values(CLI::App& app);

// Enum flags: a CLI11 check listing the allowed names, so errors name flag, value and choices.
CLI::Validator one_of(const std::vector<std::string>& names);
Precision precision_from(const std::string& s);
// --precision's names: allowed_precisions() and the seed's "mixed" (= bf16), and its help text.
const std::vector<std::string>& precision_names();
inline constexpr const char* kPrecisionHelp =
    "fp32 | bf16 | fp16 (16-bit = mixed precision) | fp8 | mxfp8 | nvfp4 (bf16 mixed with the "
    "linear GEMMs in that format, Transformer Engine's recipes)";
Optimizer optimizer_from(const std::string& s);
Recompute recompute_from(const std::string& s);
Attention attention_from(const std::string& s);

}  // namespace tally::cli
