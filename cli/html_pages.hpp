// The `--html FILE` pages of `tally plan`, `tally bubble` and `tally reliability` (issue 13), drawn
// with cli/html_report.hpp from what the commands already computed.
#pragma once

#include <string>
#include <vector>

#include "html_report.hpp"
#include "tally/core/finetune_plan.hpp"
#include "tally/core/pipeline.hpp"
#include "tally/core/planner.hpp"
#include "tally/core/reliability.hpp"
#include "tally/core/types.hpp"

namespace tally::cli {

// Layouts the plan page's scatter keeps (Note [plan points]): about 0.4 KB of page each.
inline constexpr std::size_t kHtmlPlanPoints = 1500;

// Each returns the page's title and body; html::page() makes the file (html_report.hpp).

// `reasons`: explain_plan(r.request, r.best.front()) (empty when nothing fits).
html::Page plan_page(const PlanResult& r, const std::vector<Reason>& reasons,
                      const std::vector<Suggestion>& suggestions, double search_s, SizeUnit u);

// The bubble against M at P stages for 1F1B and interleaved (v chunks), the target line and the
// smallest M meeting it; `given` is the M the user asked about.
struct BubblePageInput {
  int stages = 1, given_micro_batches = 1, interleave = 2;
  double max_bubble = 0.1;
};
html::Page bubble_page(const BubblePageInput& in);

// `tally compare`: the base and its alternatives side by side, memory and step-time bars, and a
// table with each one's tightest wall.
html::Page compare_page(const std::vector<Comparison>& options, SizeUnit u);

// The lost fraction of wall-clock against the checkpoint interval (Young's and Daly's optima).
html::Page reliability_page(const ReliabilityReport& r);

// `tally plan --method lora|qlora`: per-GPU memory of the chosen configuration and its
// alternatives (or the closest misses) as stacked bars — the fine-tune ledger's items, the
// activations, the allocator's cache and the CUDA runtime against the usable and capacity lines —
// the step's parts (kernels, QLoRA's dequantization, the adapters' optimizer step and all-reduce),
// and the longest sequence that fits; tables hold the numbers of --json.
html::Page finetune_page(const FineTunePlan& p, SizeUnit u);

}  // namespace tally::cli
