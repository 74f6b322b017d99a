// How fuzz_checkpoint reads one input as a checkpoint directory (make_seeds.cpp writes the seeds):
//
//   <index.json> kFileSeparator <shard of rank 0> kFileSeparator <shard of rank 1> ...
//
// k = pieces − 1 shards, at most kMaxShards (further separators are part of the last shard); the
// harness writes them as index.json and shard_file_name(r, k).
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace tally::fuzz {

// A line of its own, unlikely inside JSON or tensor bytes.
inline constexpr std::string_view kFileSeparator = "\n--tally-fuzz-next-file--\n";
inline constexpr std::size_t kMaxShards = 8;

inline std::vector<std::string_view> split_checkpoint_input(std::string_view input) {
  std::vector<std::string_view> out;
  while (out.size() < kMaxShards) {
    const auto at = input.find(kFileSeparator);
    if (at == std::string_view::npos) break;
    out.push_back(input.substr(0, at));
    input.remove_prefix(at + kFileSeparator.size());
  }
  out.push_back(input);
  return out;
}

}  // namespace tally::fuzz
