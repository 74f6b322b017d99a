// `--calibration FILE` on `tally bench ddp` and `tally run zero`: the step time the operator model
// predicts for the run on this host (core/mlp_step.hpp, Note [host step model]), from the
// calibration `tally bench gemm|memory|allreduce --calibration-out FILE` wrote, printed beside the
// measured step time (issue 10: "prediction vs measurement on this machine").
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tally/core/mlp_step.hpp"
#include "tally/io/calibration.hpp"

namespace tally::cli {

struct HostModel {
  std::string path;            // the calibration file
  io::Calibration calibration;
  ClusterSpec host;            // io::host_cluster
  // α–β refitted per implementation from the calibration's points at the run's k
  // (io::fitted_link; Note [per-implementation links], core/mlp_step.hpp): Gloo's all-reduce and
  // tally's ring; and the sharded halves as `run zero` calls them, where `bench allreduce
  // --sharded` timed them (Note [sharded collectives], engine/bench/allreduce.cpp): tally's ring
  // reduce-scatter and Gloo's all-gather. Unset where the file holds no such points (then the
  // host's intra_node prices, or for the halves the all-reduce fit of their implementation).
  std::optional<LinkSpec> gloo_link, ring_link;
  std::optional<LinkSpec> ring_reduce_scatter_link, gloo_all_gather_link;
};

// Loads and checks FILE before the run starts (a bad file is exit 2, not a wasted run). ranks >= 2
// needs the calibration's intra_node α–β.
HostModel load_host_model(const std::string& flag, const std::string& path, int ranks);

// This host's hardware threads (at least 1).
int host_cores();

// setup.cores is set here: host_cores().
MlpStepTime predict_step(const HostModel& m, MlpStepSetup setup);

// {"predicted_step_seconds", "measured_over_predicted", "prediction": {terms, convention,
// calibration}}, merged into a command's JSON.
void add_prediction_json(nlohmann::json& out, const HostModel& m, const MlpStepTime& t,
                         double measured_s);
// "# predicted 12.3 ms (compute 4.1 + gradients 0.8 + optimizer 5.2 ms) x contention 1 + comm
// 2.2 ms; measured/predicted 1.04 (calibration FILE)"
std::string prediction_line(const HostModel& m, const MlpStepTime& t, double measured_s);

// A step's phases as the engine's runs report them (bench ddp: forward_backward, sync_wait,
// optimizer; run zero: forward_backward, collectives, optimizer): medians in seconds, in order.
struct StepPhases {
  std::vector<std::pair<std::string, double>> median_s;
  std::string convention;  // whose phases, and what each includes
};
// {"forward_backward": s, …, "convention": …}: the commands' "phase_seconds_median" (no
// "convention" when it is empty).
nlohmann::json phases_json(const StepPhases& p);
// "forward_backward 7.49 ms + sync_wait 0.12 ms + optimizer 1.02 ms"
std::string phases_line(const StepPhases& p);

}  // namespace tally::cli
