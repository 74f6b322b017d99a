// The MLP's sizing (tally/engine/mlp.hpp).
#include "tally/engine/mlp.hpp"

namespace tally::engine {

std::int64_t mlp_parameter_count(const std::vector<std::int64_t>& widths) {
  std::int64_t n = 0;
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) n += widths[l] * widths[l + 1] + widths[l + 1];
  return n;
}

}  // namespace tally::engine
