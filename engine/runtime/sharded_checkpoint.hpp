// Sharded checkpoints over a Comm (internal: at::Tensor): io/checkpoint.hpp's format and atomic
// protocol driven by k ranks, with resharding on load. The state is a list of flat F32 groups that
// every rank holds in full (data-parallel replicas: parameters, Adam m, Adam v).
//
// Legend: k = ranks saving, k' = ranks loading, r = rank, numel = elements of one flat group.
//
// Saving (every rank calls save_sharded with the same index and groups):
//   1. rank 0 creates the staging directory <dir>.tmp-s<step> (a stale one is replaced); barrier;
//   2. rank r writes shard_range(numel, k, r) of every group — 1/k of the state — to its shard
//      (io::write_shard: written, fsynced, renamed);
//   3. all-gather of each shard's {size, CRC-32C}; rank 0 writes index.json.crc32c (Note [index
//      checksum]) and commits (index.json last, verify, swap with <dir>); barrier, so no rank
//      goes on (or exits) before the checkpoint is in place.
// Loading (every rank calls load_sharded):
//   1. rank 0 runs io::recover_checkpoint (stale staging directories of a crashed save go; a
//      complete one is put back if <dir> was lost between renames), checks index.json against
//      its checksum and verifies every shard (size, CRC-32C, header, layout); the verdict is
//      broadcast, so a bad checkpoint stops every rank before anything is loaded;
//   2. rank r' reads shard_range(numel, k', r') of each group — whichever saved shards hold it
//      (io::load_flat_range) — so each byte is read once whatever k' is; an all-gather rebuilds the
//      full group on every rank.
//
// Note [index checksum]
// io's format checksums every shard but not index.json itself: an edit of consumed_samples,
// seed, rng_state or the schedule would load silently. Until io records one, the engine writes
// <dir>/index.json.crc32c — the CRC-32C of index.json's exact bytes (io::index_to_json, which
// io::write_index writes verbatim), 8 hex digits and a newline — into the staging directory
// before the commit, and load_sharded refuses an index.json whose checksum differs.
#pragma once

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tally/engine/comm.hpp"
#include "tally/io/checkpoint.hpp"

namespace tally::engine {

inline constexpr const char* kIndexChecksumName = "index.json.crc32c";

// One flat F32 group held in full on every rank.
struct FlatGroupData {
  std::string name;  // the group's name in the checkpoint, e.g. "params", "adam.m"
  // The model tensors laid end to end in `flat` (name, shape), as io::make_flat_group takes them.
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> tensors;
  at::Tensor flat;  // 1-D, float32, contiguous, numel = the tensors' total
};

struct SaveOutcome {
  double seconds = 0;       // rank 0's wall time from the first barrier to the commit's end
  double shard_bytes = 0;   // the shard files' sizes summed over ranks (from their write_shard)
  std::int64_t index_bytes = 0;  // index.json
};

// Called on each rank right after its shard is written (fault injection: "after-shard").
using AfterShardHook = std::function<void()>;

// Saves `groups` as a checkpoint at `dir`; `index` supplies the training state (step, consumed
// samples, seed, rng_state, lr_schedule) — its world_size, groups and files are filled in here.
// Collective: every rank calls it with the same index and group layout. Throws CommError when a
// peer fails, InvalidInput / std::system_error from io.
SaveOutcome save_sharded(Comm& comm, const std::filesystem::path& dir,
                         const io::CheckpointIndex& index, const std::vector<FlatGroupData>& groups,
                         const AfterShardHook& after_shard = {});

struct LoadOutcome {
  io::CheckpointIndex index;
  std::vector<at::Tensor> flats;  // per requested group: the full flat space, float32
  io::RecoveryReport recovery;    // rank 0's; empty elsewhere
  double seconds = 0;             // this rank's wall time for the whole load
};

// Loads the groups named in `group_names` from `dir`. Returns nullopt on every rank when there is
// no checkpoint at `dir` (after recovery). Collective. Throws InvalidInput when the checkpoint is
// invalid — on rank 0 with io's one line naming the file and the failed check, on the other
// ranks a line pointing at rank 0's — and before any state is returned.
std::optional<LoadOutcome> load_sharded(Comm& comm, const std::filesystem::path& dir,
                                        const std::vector<std::string>& group_names);

// CRC-32C of index.json's bytes vs index.json.crc32c (Note [index checksum]). Throws InvalidInput
// naming the file. Torch-free; used by load_sharded on rank 0.
void check_index_checksum(const std::filesystem::path& dir);

// CRC-32C of a float32 tensor's bytes, 8 hex digits: a digest for "bit-identical" comparisons.
std::string crc32c_of(const at::Tensor& flat_f32);

}  // namespace tally::engine
