#include "tally/engine/gloo_smoke.hpp"

#include <vector>

namespace tally::engine {

GlooSmokeResult run_gloo_smoke(const DistEnv& env, const GlooSmokeOptions& options) {
  Comm comm(env, {.timeout_s = options.timeout_s});
  std::vector<double> value{double(env.rank + 1)};
  comm.all_reduce(value);
  const double k = env.world_size;
  return {.rank = env.rank,
          .world_size = env.world_size,
          .sum = value[0],
          .expected = k * (k + 1) / 2,
          .all_reduce = comm.counters()[Collective::all_reduce]};
}

}  // namespace tally::engine
