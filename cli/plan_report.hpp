// Reporters for `tally plan` and `tally compare` (text and JSON), kept apart from the runner.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "tally/core/finetune_plan.hpp"
#include "tally/core/planner.hpp"

namespace tally::cli {

// `suggestions`: suggest_changes() when nothing fits (empty otherwise).
nlohmann::json plan_json(const PlanResult& r, double search_s,
                         const std::vector<Suggestion>& suggestions = {});
void print_plan(const PlanResult& r, double search_s, SizeUnit u,
                const std::vector<Suggestion>& suggestions = {});
nlohmann::json compare_json(const std::vector<Comparison>& rows);
// `tally plan --method lora|qlora` (core/finetune_plan.hpp).
nlohmann::json finetune_plan_json(const FineTunePlan& p, double search_s);
void print_finetune_plan(const FineTunePlan& p, double search_s, SizeUnit u);
void print_compare(const std::vector<Comparison>& rows, SizeUnit u);

}  // namespace tally::cli
