// Everything a command file shares: flags (CLI11), JSON output (nlohmann) and formatting. A file
// that needs only one of them includes that header alone (flags.hpp, json_output.hpp, format.hpp).
#pragma once

#include "flags.hpp"
#include "format.hpp"
#include "json_output.hpp"
