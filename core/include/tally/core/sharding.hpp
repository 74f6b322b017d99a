// The one sharding rule (llm.c's ZeRO shard: a small function returning {offset, size}).
// A flat range of `numel` elements split over `ranks`: the first numel % ranks shards hold one
// element more than the rest, laid end to end in rank order. ZeRO partitions, ring chunks and
// checkpoint shards all use it, so a checkpoint written at k ranks reads back at k' from the same
// arithmetic.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tally {

struct ShardSpan {
  std::int64_t offset = 0;  // elements
  std::int64_t count = 0;   // elements
};

// Precondition (checked by callers at their boundary): numel >= 0, ranks >= 1, 0 <= index < ranks.
constexpr ShardSpan shard_span(std::int64_t numel, int ranks, int index) {
  const std::int64_t base = numel / ranks;
  const std::int64_t extra = numel % ranks;  // shards [0, extra) hold base + 1
  const std::int64_t i = index;
  return {.offset = i * base + std::min(i, extra), .count = base + (i < extra ? 1 : 0)};
}

}  // namespace tally
