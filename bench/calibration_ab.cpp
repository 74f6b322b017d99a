// The paired comparison behind docs/ledgers.md §5 *Kernels side by side*: for every `run zero`
// stage at k >= 2 in one or more report directories of bench/predict_vs_measured.sh as it stood at
// 2765556 (which kept, per round r, the kernels timed alone in cal-r<r>.json and the side-by-side
// ones plus the α–β points in cal-k<k>-r<r>.json), the step predicted twice by core's
// predict_mlp_step — on the same α–β fits, only the kernels swapped — against the step measured.
// Prints one row per (directory, round, k, stage) and, per calibration, the mean |log(measured /
// predicted)| and the count within ±15 %; a third prediction takes the side-by-side GEMMs with the
// alone memory figures.
//
// Run: build/bench/calibration_ab DIR...   (no torch; reads JSON only)
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "tally/core/mlp_step.hpp"
#include "tally/io/calibration.hpp"

namespace {

using namespace tally;

// The step `tally run zero --calibration FILE` predicts (cli/run_zero.cpp): tally's ring for the
// all-reduce and reduce-scatter, Gloo's all-gather, one thread per rank, this host's cores.
double predicted(const io::Calibration& c, const nlohmann::json& run, int stage, int k) {
  const auto gloo = io::fitted_link(c, io::kGlooAllReducePoints, k);
  const auto gather = io::fitted_link(c, io::kGlooAllGatherPoints, k);
  MlpStepSetup s{.widths = run["model"]["widths"].get<std::vector<std::int64_t>>(),
                 .rows = run["batch"].get<std::int64_t>() / k,
                 .ranks = k,
                 .zero_stage = stage,
                 .optimizer = Optimizer::adam,
                 .threads_per_rank = 1,
                 .cores = int(std::max(1u, std::thread::hardware_concurrency())),
                 .reduce_link = io::fitted_link(c, io::kRingAllReducePoints, k),
                 .reduce_scatter_link = io::fitted_link(c, io::kRingReduceScatterPoints, k),
                 .all_gather_link = gather ? gather : gloo};
  return predict_mlp_step(s, io::host_cluster(c, true)).total_s;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: calibration_ab REPORT_DIR...\n");
    return 2;
  }
  try {
    constexpr int kVariants = 3;  // alone, side by side, side-by-side GEMMs with alone memory
    double log_err[kVariants] = {};
    int within[kVariants] = {}, pairs = 0;
    std::printf("# dir round k stage measured_ms alone_ms side_ms mixed_ms alone_ratio side_ratio "
                "mixed_ratio\n");
    for (int a = 1; a < argc; ++a) {
      const std::string dir = argv[a];
      for (int r = 1;; ++r) {
        const std::string rs = std::to_string(r);
        if (!std::filesystem::exists(dir + "/cal-r" + rs + ".json")) break;
        const io::Calibration alone_kernels = io::load_calibration(dir + "/cal-r" + rs + ".json");
        for (int k = 2; k <= 64; k *= 2) {
          const std::string run_path = dir + "/zero-k" + std::to_string(k) + "-r" + rs + ".json";
          if (!std::filesystem::exists(run_path)) continue;
          const io::Calibration side =
              io::load_calibration(dir + "/cal-k" + std::to_string(k) + "-r" + rs + ".json");
          if (!side.kernels || !alone_kernels.kernels)
            throw std::runtime_error(dir + ": round " + rs + " lacks a kernels section");
          io::Calibration alone = side;  // the same α–β points
          alone.kernels = alone_kernels.kernels;
          io::Calibration mixed = alone;  // alone memory, side-by-side GEMMs
          mixed.kernels->gemm = side.kernels->gemm;
          mixed.kernels->peak_flops = side.kernels->peak_flops;
          nlohmann::json run;
          std::ifstream(run_path) >> run;
          for (const nlohmann::json& st : run["stages"]) {
            const int stage = st["stage"];
            const double measured = st["step_seconds_median"];
            const double p[kVariants] = {predicted(alone, run, stage, k),
                                         predicted(side, run, stage, k),
                                         predicted(mixed, run, stage, k)};
            std::printf("%s %d %d %d %.2f %.2f %.2f %.2f %.3f %.3f %.3f\n", dir.c_str(), r, k,
                        stage, measured * 1e3, p[0] * 1e3, p[1] * 1e3, p[2] * 1e3,
                        measured / p[0], measured / p[1], measured / p[2]);
            for (int v = 0; v < kVariants; ++v) {
              log_err[v] += std::abs(std::log(measured / p[v]));
              within[v] += std::abs(measured / p[v] - 1) <= 0.15;
            }
            ++pairs;
          }
        }
      }
    }
    if (pairs == 0) {
      std::fprintf(stderr, "calibration_ab: no run zero at k >= 2 with both calibrations found\n");
      return 2;
    }
    std::printf("# %d steps: mean |log(measured/predicted)| alone %.3f, side by side %.3f, mixed "
                "%.3f; within ±15 %%: alone %d, side by side %d, mixed %d\n",
                pairs, log_err[0] / pairs, log_err[1] / pairs, log_err[2] / pairs, within[0],
                within[1], within[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "calibration_ab: %s\n", e.what());
    return 2;
  }
  return 0;
}
