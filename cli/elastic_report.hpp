// The reporters of `tally run fault-drill --elastic` (engine::run_elastic_drill): text, each
// figure beside the uninterrupted run's with the verdict, and one JSON object (docs/json.md).
#pragma once

#include <nlohmann/json.hpp>

#include "tally/engine/experiments/elastic_drill.hpp"

namespace tally::cli {

nlohmann::json elastic_json(const engine::ElasticDrillResult& r);
// One sub-run's launch (both forms of the drill report them alike).
nlohmann::json drill_launch_json(const engine::DrillLaunch& l);
void print_elastic_text(const engine::ElasticDrillResult& r);

}  // namespace tally::cli
