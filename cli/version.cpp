// Note [version]: `tally --version` (both executables) prints the commit the binary was built
// from, the source tree's HEAD at build time ("-dirty" when tracked files differed from it), so a
// figure or a bug report can name the code that made it. cmake/version.cmake regenerates the header
// on every build and rewrites it only when that text changes; this file is its only reader and a
// library of its own (cli/CMakeLists.txt), so a new commit recompiles one small file. tally has no
// release numbers: the commit is the version.
#include "version.hpp"

#include "tally_version.hpp"  // generated: TALLY_GIT_DESCRIBE

namespace tally::cli {

const char* version_line() { return "tally, commit " TALLY_GIT_DESCRIBE; }

}  // namespace tally::cli
