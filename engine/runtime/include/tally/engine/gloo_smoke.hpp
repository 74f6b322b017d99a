// `tally run gloo-smoke`: the smallest real experiment. Each of k ranks all-reduces the value
// rank + 1 and checks the sum against k(k+1)/2, so one command proves the rendezvous, the Gloo
// transport and the launcher's environment end to end.
#pragma once

#include "tally/engine/comm.hpp"
#include "tally/engine/dist_env.hpp"

namespace tally::engine {

struct GlooSmokeOptions {
  double timeout_s = 60;  // rendezvous and the all-reduce
};

struct GlooSmokeResult {
  int rank = 0;
  int world_size = 1;
  double sum = 0;       // measured: all-reduce of rank + 1
  double expected = 0;  // k(k+1)/2
  CollectiveCounter all_reduce;  // this rank's counter after the run
  bool ok() const { return sum == expected; }
};

// Throws InvalidInput for bad env / options and CommError when the group fails.
GlooSmokeResult run_gloo_smoke(const DistEnv& env, const GlooSmokeOptions& options = {});

}  // namespace tally::engine
