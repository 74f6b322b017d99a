// The reporters of `tally run fault-drill --elastic` (engine::run_elastic_drill): text, each
// figure beside the uninterrupted run's with the verdict, and one JSON object (docs/json.md).
#pragma once

#include <nlohmann/json.hpp>

#include "tally/engine/experiments/elastic_drill.hpp"

namespace tally::cli {

nlohmann::json elastic_json(const engine::ElasticDrillResult& r);
void print_elastic_text(const engine::ElasticDrillResult& r);

}  // namespace tally::cli
