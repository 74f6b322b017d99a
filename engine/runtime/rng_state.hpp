// torch's default CPU generator state as text (internal: torch), for checkpoints (index.json's
// rng_state), so a resumed run draws the same dropout masks as an uninterrupted one.
#pragma once

#include <string>

namespace tally::engine {

// The default CPU generator's state, lower-case hex (two digits per byte).
std::string generator_state_hex();
// Sets it back. Throws InvalidInput naming `source` (e.g. "<dir>/index.json: rng_state") when the
// text is not hex or torch rejects the state.
void set_generator_state_hex(const std::string& hex, const std::string& source);

}  // namespace tally::engine
