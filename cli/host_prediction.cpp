// --calibration on the engine's runs (host_prediction.hpp).
#include "host_prediction.hpp"

#include <fmt/core.h>

#include <thread>

#include "tally/core/types.hpp"

namespace tally::cli {

HostModel load_host_model(const std::string& flag, const std::string& path, int ranks) {
  HostModel m{.path = path};
  try {
    m.calibration = io::load_calibration(path);
    m.host = io::host_cluster(m.calibration, ranks >= 2);
    m.gloo_link = io::fitted_link(m.calibration, io::kGlooAllReducePoints, ranks);
    m.ring_link = io::fitted_link(m.calibration, io::kRingAllReducePoints, ranks);
    m.ring_reduce_scatter_link =
        io::fitted_link(m.calibration, io::kRingReduceScatterPoints, ranks);
    m.gloo_all_gather_link = io::fitted_link(m.calibration, io::kGlooAllGatherPoints, ranks);
  } catch (const InvalidInput& e) {
    throw InvalidInput(flag + " = '" + path + "': " + e.what());
  }
  return m;
}

int host_cores() { return int(std::max(1u, std::thread::hardware_concurrency())); }

MlpStepTime predict_step(const HostModel& m, MlpStepSetup setup) {
  setup.cores = host_cores();
  return predict_mlp_step(setup, m.host);
}

namespace {
nlohmann::json link_json(const LinkSpec& l) {
  return {{"alpha_s", l.latency_s}, {"beta_bytes_per_s", l.bandwidth_bps}};
}
}  // namespace

void add_prediction_json(nlohmann::json& out, const HostModel& m, const MlpStepTime& t,
                         double measured_s) {
  out["predicted_step_seconds"] = t.total_s;
  out["measured_over_predicted"] = t.total_s > 0 ? measured_s / t.total_s : 0.0;
  out["prediction"] = {{"compute_s", t.compute_s},
                       {"gradient_passes_s", t.gradient_s},
                       {"optimizer_s", t.optimizer_s},
                       {"comm_s", t.comm_s},
                       {"comm_exposed_s", t.comm_exposed_s},
                       {"overlap_slowdown", t.overlapped ? nlohmann::json(t.overlap_slowdown)
                                                         : nlohmann::json(nullptr)},
                       {"contention", t.contention},
                       {"memory_bytes_per_s", t.memory_bps},
                       {"reduce_link", link_json(t.reduce_link)},
                       {"reduce_scatter_link", link_json(t.reduce_scatter_link)},
                       {"all_gather_link", link_json(t.all_gather_link)},
                       {"convention", t.convention()},
                       {"calibration", m.path}};
}

std::string prediction_line(const HostModel& m, const MlpStepTime& t, double measured_s) {
  return fmt::format(
      "# predicted {:.2f} ms = contention {:.2g} x (compute {:.2f} + gradient passes {:.2f} + "
      "optimizer {:.2f} ms) + comm {:.2f} ms{}; measured/predicted {:.3f} (calibration {})",
      t.total_s * 1e3, t.contention, t.compute_s * 1e3, t.gradient_s * 1e3, t.optimizer_s * 1e3,
      t.comm_exposed_s * 1e3,
      t.overlapped
          ? fmt::format(" exposed of {:.2f} (overlapped with the backward)", t.comm_s * 1e3)
          : "",
      t.total_s > 0 ? measured_s / t.total_s : 0.0, m.path);
}

nlohmann::json phases_json(const StepPhases& p) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, s] : p.median_s) j[name] = s;
  if (!p.convention.empty()) j["convention"] = p.convention;
  return j;
}

std::string phases_line(const StepPhases& p) {
  std::string line;
  for (const auto& [name, s] : p.median_s)
    line += fmt::format("{}{} {:.2f} ms", line.empty() ? "" : " + ", name, s * 1e3);
  return line;
}

}  // namespace tally::cli
