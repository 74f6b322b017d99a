// Debian's headless chromium for the browser tests (issue 13): `--dump-dom` prints the DOM after the
// page's scripts ran, `--screenshot` writes a PNG. Console messages reach stderr (--enable-logging),
// where a test looks for ":CONSOLE" lines.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "subprocess.hpp"

namespace tally::chromium {

// The chromium binary, or "" when it is not installed.
inline std::string find_chromium() {
  for (const char* p : {"/usr/bin/chromium", "/usr/bin/chromium-browser"})
    if (access(p, X_OK) == 0) return p;
  return "";
}

// Why a browser test cannot run here, or "" when it can: the sanitizer build (TALLY_SANITIZED_BUILD)
// leaves the browser to the plain build; a machine without chromium has none.
inline std::string why_no_browser() {
#ifdef TALLY_SANITIZED_BUILD
  return "sanitizer build: the browser tests run in the plain build (build/)";
#else
  return find_chromium().empty()
             ? "chromium is not installed (scripts/install-deps.sh installs it; CI runs this)"
             : "";
#endif
}

struct Browser {
  std::string bin;
  std::filesystem::path profile;  // a fresh --user-data-dir
  // Loads `url` (file://… or http://…) with the extra flags, within `limit_s`.
  tally::subprocess::Ran run(const std::vector<std::string>& extra, const std::string& url,
                             double limit_s = 60) const {
    std::vector<std::string> a{bin, "--headless", "--no-sandbox", "--disable-gpu",
                               "--no-first-run", "--user-data-dir=" + profile.string(),
                               "--enable-logging=stderr", "--v=0"};
    a.insert(a.end(), extra.begin(), extra.end());
    a.push_back(url);
    return tally::subprocess::run_command(a, limit_s);
  }
};

}  // namespace tally::chromium
