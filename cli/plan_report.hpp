// Reporters for `tally plan` and `tally compare` (text and JSON), kept apart from the runner.
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "tally/core/planner.hpp"

namespace tally::cli {

nlohmann::json plan_json(const PlanResult& r, double search_s);
void print_plan(const PlanResult& r, double search_s, SizeUnit u);
nlohmann::json compare_json(const std::vector<Comparison>& rows);
void print_compare(const std::vector<Comparison>& rows, SizeUnit u);

}  // namespace tally::cli
