// `tally --version` (Note [version] in version.cpp).
#pragma once

namespace tally::cli {

// "tally, commit 0ef9176a1b2c" (or "…-dirty", or "commit unknown"): what --version prints.
const char* version_line();

}  // namespace tally::cli
