// The `--html FILE` pages of the engine's runs (issue 13): measured beside predicted, drawn with
// cli/html_report.hpp from the JSON object the run prints with --json — one source for both, so
// the page's tables hold the same figures as the JSON (Note [engine pages]). Torch-free: these
// live in tally_cli, and tally-engine's reporters call them on rank 0.
#pragma once

#include <nlohmann/json.hpp>

#include "html_report.hpp"

namespace tally::cli {

// Note [engine pages]
// Each page takes the object its command prints with --json (the key names are that command's
// JSON contract, tested in tests/engine/exp_*.cpp) and draws:
//   bench allreduce  bus bandwidth against message size for each algorithm (log x, nccl-tests'
//                    plot) and the time per call (log-log), each beside core's α–β cost with the
//                    run's fitted α and β; the rows as a table;
//   run zero         model-state bytes per rank beside core model_states(), rank 0's allocated
//                    bytes by phase (after setup, the peaks of forward + backward and of the
//                    update, after the steps: Note [zero memory phases] in engine/experiments/
//                    zero.cpp) beside the same states, bytes sent per step by collective beside
//                    core step_traffic(), rank 0's step phases, and the loss curve of every stage
//                    (ZeRO-1/2/3 against DP);
//   run memory-profile  allocated bytes after each phase beside the ledgers' prediction, with
//                    the peak, for each precision;
//   run tp           (cli/html_parallel.cpp) bytes sent per layer by collective beside core's
//                    TP item, activation bytes per layer beside core's (LayerNorm's statistics
//                    apart), the fp32 loss of each layout against the single-process model's,
//                    and the float64 equivalence;
//   run 3d           (cli/html_parallel.cpp) every rank's model states and peak activations,
//                    bytes per step by group (TP, PP, DP, CP) and step time by part, each beside
//                    core (times only with --calibration, but the PP wait), activation bytes
//                    per layer for every recompute policy, the fp32 loss and the float64
//                    equivalence.
// Byte figures in tables are exact (whole bytes, as in the JSON); charts scale them to B, kB,
// MB or GB (decimal, named on the axis).

// `tally bench allreduce --json`'s object (cli/bench_commands.cpp).
html::Page allreduce_page(const nlohmann::json& report);
// `tally run zero --json`'s object (cli/run_zero.cpp).
html::Page zero_page(const nlohmann::json& report);
// `tally run memory-profile --json`'s object (cli/run_memory_profile.cpp).
html::Page memory_profile_page(const nlohmann::json& report);
// `tally run tp --json`'s object (cli/run_tp.cpp; docs/json.md).
html::Page tp_page(const nlohmann::json& report);
// `tally run 3d --json`'s object (cli/run_3d.cpp; docs/json.md).
html::Page three_d_page(const nlohmann::json& report);

}  // namespace tally::cli
