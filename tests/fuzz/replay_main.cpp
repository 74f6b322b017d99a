// fuzz_replay_<reader>: runs a harness's LLVMFuzzerTestOneInput once over each file named on the
// command line (a directory: every regular file below it, in sorted order), without libFuzzer.
// ctest runs it over the seeds and tests/fuzz/regressions/<reader>/; a finding aborts it, failing
// the test. Built by every compiler, sanitizers or not.
//
//   fuzz_replay_safetensors PATH...
//
// Allocations are bounded at kAllocationLimitMiB, as scripts/fuzz.sh bounds libFuzzer's
// (-malloc_limit_mb), so an input that makes a reader allocate gigabytes fails here too: under ASan
// a larger allocation is reported as an error; without it the address space is capped, so it throws
// std::bad_alloc, which the harness reports.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_check.hpp"

namespace {

constexpr std::size_t kAllocationLimitMiB = 1024;

#if defined(__SANITIZE_ADDRESS__)  // gcc
#define TALLY_REPLAY_ASAN 1
#elif defined(__has_feature)  // clang
#if __has_feature(address_sanitizer)
#define TALLY_REPLAY_ASAN 1
#endif
#endif

#if !defined(TALLY_REPLAY_ASAN)
void cap_address_space() {
  const rlim_t limit = rlim_t{kAllocationLimitMiB} << 20;
  const rlimit r{.rlim_cur = limit, .rlim_max = limit};
  if (::setrlimit(RLIMIT_AS, &r) != 0) std::perror("replay: setrlimit(RLIMIT_AS)");
}
#endif

}  // namespace

#if defined(TALLY_REPLAY_ASAN)
// Read by ASan at start-up, before ASAN_OPTIONS (which can still override it).
extern "C" const char* __asan_default_options() { return "max_allocation_size_mb=1024"; }
static_assert(kAllocationLimitMiB == 1024, "keep __asan_default_options in step");
#endif

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIRECTORY...\n", argv[0]);
    return 2;
  }
  std::vector<fs::path> inputs;
  for (int i = 1; i < argc; ++i) {
    const fs::path arg = argv[i];
    std::error_code ec;
    if (fs::is_directory(arg, ec)) {
      std::vector<fs::path> found;
      for (const auto& e : fs::recursive_directory_iterator(arg))
        if (e.is_regular_file()) found.push_back(e.path());
      std::sort(found.begin(), found.end());
      if (found.empty()) {
        std::fprintf(stderr, "replay: %s holds no files\n", arg.c_str());
        return 2;
      }
      inputs.insert(inputs.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(arg, ec)) {
      inputs.push_back(arg);
    } else {
      std::fprintf(stderr, "replay: %s: no such file or directory\n", arg.c_str());
      return 2;
    }
  }
#if !defined(TALLY_REPLAY_ASAN)
  cap_address_space();
#endif
  for (const fs::path& p : inputs) {
    std::printf("replay: %s\n", p.c_str());
    std::fflush(stdout);
    const std::vector<std::byte> bytes = tally::fuzz::read_bytes(p);
    LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("replay: %zu inputs, no finding\n", inputs.size());
  return 0;
}
