// Training checkpoints on disk (DESIGN.md §3 "Checkpoints"): a directory holding one safetensors
// shard per rank plus index.json with the training state, the shard layout and a checksum per file.
// The engine hands over raw byte buffers; nothing here knows about torch. Format: docs/formats.md
// section 4.
//
//   <dir>/index.json                           written last; its presence marks a complete save
//   <dir>/shard-<rank>-of-<world>.safetensors  rank and world zero-padded to 5 digits, rank from 0
//
// Legend: k = world size (ranks that saved), r = rank, numel = elements of one flat group.
//
// Flat groups. Each piece of sharded state (parameters, Adam m, Adam v, master weights, ...) is one
// flat group: its model tensors laid end to end in a 1-D "flat space" of numel elements of one
// dtype. Rank r holds the contiguous range shards[r] = {offset, count} of that space and stores it
// in its shard as a 1-D tensor named after the group, shape [count]. The ranges cover [0, numel) in
// rank order without gap or overlap; tally writes them with shard_range (below). Any range of the
// flat space can be reassembled from whichever shards hold it (load_flat_range), which is what
// loading a checkpoint saved at world size k on k' ranks needs.
//
// Atomic protocol (Note [atomic checkpoint]). A save writes everything into the staging directory
// <dir>.tmp-<token> — the shards, each fsynced, then index.json — and only then puts the staging
// directory in place of <dir>: with renameat2(RENAME_EXCHANGE), one atomic swap, after which the
// old checkpoint (now at the staging name) is removed; where the file system lacks the swap, by
// renaming <dir> aside to <dir>.old-<pid>, renaming the staging directory to <dir> and removing the
// old one. A crash at any point leaves a complete previous or a complete new checkpoint: at <dir>,
// or — only between the two renames of the fallback — at <dir>.old-<pid> and <dir>.tmp-<token>,
// from which recover_checkpoint puts the newest complete one back at <dir>. Readers look at <dir>
// alone, so stale staging directories are ignored; recover_checkpoint removes them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tally/core/sharding.hpp"
#include "tally/io/safetensors.hpp"

namespace tally::io {

// ---- the sharding rule --------------------------------------------------------------------------

// Rank `rank`'s share of `numel` elements split over `world_size` ranks: the first numel % k ranks
// hold ⌊numel/k⌋ + 1 elements, the rest ⌊numel/k⌋, in rank order — the engine's chunk_range rule
// (llm.c's ZeRO shard). E.g. numel 10, k 4 → [0,3) [3,6) [6,8) [8,10). Throws InvalidInput unless
// numel >= 0 and 0 <= rank < world_size.
ShardSpan shard_range(std::int64_t numel, int world_size, int rank);

// ---- the index ----------------------------------------------------------------------------------

// Where the learning-rate schedule stands. io stores it; the engine interprets it.
struct LrScheduleState {
  std::string name = "constant";  // schedule kind, 1–64 characters of a-z 0-9 _ -, e.g. "cosine"
  std::int64_t step = 0;          // position in the schedule, optimizer steps
  double base_lr = 0;             // peak learning rate
  double lr = 0;                  // learning rate at `step`
  std::int64_t warmup_steps = 0;  // optimizer steps
  std::int64_t total_steps = 0;   // optimizer steps; 0 = unbounded
  double min_lr = 0;              // floor of the decay
};

// A model tensor inside a flat group.
struct TensorSlot {
  std::string name;                 // 1–1024 characters, unique within the group
  std::vector<std::int64_t> shape;  // [] is a scalar (1 element)
  std::int64_t offset = 0;          // elements from the start of the flat space
};

struct FlatGroup {
  // 1–128 characters of A-Z a-z 0-9 _ . -, unique in the checkpoint; its tensor name in every shard
  std::string name;
  TensorDType dtype = TensorDType::f32;
  std::int64_t numel = 0;           // elements of the flat space
  std::vector<ShardSpan> shards;    // shards[r]: what rank r holds; k entries
  std::vector<TensorSlot> tensors;  // inside [0, numel), not overlapping; gaps (padding) allowed
};

// One shard file as written: checked by verify_checkpoint.
struct ShardFile {
  int rank = 0;
  std::string name;  // shard_file_name(rank, k): a plain file name inside the directory
  std::uint64_t size_bytes = 0;
  std::uint32_t crc32c = 0;  // CRC-32C of the whole file (safetensors.hpp)
};

inline constexpr std::string_view kCheckpointFormat = "tally-checkpoint";
inline constexpr int kCheckpointVersion = 1;
inline constexpr int kMaxCheckpointWorldSize = 1 << 16;

struct CheckpointIndex {
  std::int64_t step = 0;              // optimizer steps completed
  std::int64_t consumed_samples = 0;  // training samples consumed
  std::uint64_t seed = 0;             // the run's base seed
  std::string rng_state;              // opaque to io (e.g. hex of the generator state), ≤ 1 MiB
  LrScheduleState lr_schedule;
  int world_size = 1;  // k: ranks that saved, one shard each
  std::vector<FlatGroup> groups;
  std::vector<ShardFile> files;  // files[r] for rank r; filled in by write_shard/commit

  const FlatGroup* find_group(std::string_view name) const;  // nullptr when absent
};

// Every cross-field rule of the format (layouts cover [0, numel) exactly, k shards, file names,
// ...). With check_files = false the files list may be empty (an index before the shards are
// written). Throws InvalidInput "<source>: <field> = <value>: <rule>".
void validate_index(const CheckpointIndex& index, std::string_view source, bool check_files = true);

// A flat group of these tensors laid end to end from offset 0, split with shard_range. Each item is
// a name and a shape.
FlatGroup make_flat_group(
    std::string name, TensorDType dtype,
    const std::vector<std::pair<std::string, std::vector<std::int64_t>>>& tensors, int world_size);

std::string shard_file_name(int rank, int world_size);  // "shard-00001-of-00003.safetensors"

// index.json text (pretty-printed, newline-terminated) and back. parse_index treats the text as
// hostile: the limits of files.hpp (4 MiB, depth 64), unknown keys rejected, then validate_index.
std::string index_to_json(const CheckpointIndex& index);
CheckpointIndex parse_index(std::string_view text, std::string_view source);

// <dir>/index.json, written atomically (write_file_atomically) / read and validated.
void write_index(const std::filesystem::path& dir, const CheckpointIndex& index);
CheckpointIndex read_index(const std::filesystem::path& dir);

// ---- saving -------------------------------------------------------------------------------------

// <dir>.tmp-<token>. All ranks of one save must use the same token (e.g. rank 0's pid, broadcast).
std::filesystem::path staging_dir(const std::filesystem::path& dir, std::string_view token);
// Creates an empty staging directory (removing a stale one of the same name) and its parents.
std::filesystem::path prepare_staging_dir(const std::filesystem::path& dir, std::string_view token);

// Rank `rank` writes its shard into the staging directory. `tensors` holds one 1-D tensor per group
// of `index` (files may still be empty), named after the group, of the group's dtype and of shape
// [shards[rank].count]. Returns the entry for index.files[rank]. Throws InvalidInput on a mismatch
// with the layout, std::system_error on an I/O failure.
ShardFile write_shard(const std::filesystem::path& staging, const CheckpointIndex& index, int rank,
                      const std::vector<TensorView>& tensors);

// For tests: where commit_checkpoint stops, as if the process had died there.
enum class CommitCrash {
  none,
  before_index,        // shards written, no index.json: the staging directory is incomplete
  before_swap,         // staging complete, <dir> untouched
  after_rename_aside,  // fallback only: old checkpoint at <dir>.old-<pid>, new one still staged
};

struct CommitOptions {
  bool verify = true;    // verify the staged shards (sizes, checksums, layout) before the swap
  bool exchange = true;  // try renameat2(RENAME_EXCHANGE); false forces the rename-aside fallback
  CommitCrash crash = CommitCrash::none;
};

// Writes index.json (whose files[] every rank's write_shard returned) into the staging directory
// and puts the staging directory in place of `dir` (Note [atomic checkpoint]). Called once, by one
// rank, after every rank's write_shard has returned.
void commit_checkpoint(const std::filesystem::path& dir, const std::filesystem::path& staging,
                       const CheckpointIndex& index, const CommitOptions& options = {});

// A whole save from one process: shards[r] are rank r's tensors (as for write_shard). Uses the
// staging token "<pid>".
void write_checkpoint(const std::filesystem::path& dir, const CheckpointIndex& index,
                      const std::vector<std::vector<TensorView>>& shards,
                      const CommitOptions& options = {});

// ---- loading ------------------------------------------------------------------------------------

// Reads index.json, then checks every shard: present, size and CRC-32C as recorded, a valid
// safetensors file whose tensors and metadata match the layout. Reads every byte once. Returns the
// index. Throws InvalidInput naming the file and the check that failed.
CheckpointIndex verify_checkpoint(const std::filesystem::path& dir);

// Elements [offset, offset + count) of group `group`'s flat space, raw little-endian bytes,
// reassembled from the shards that hold them (reading only those bytes). Checks each shard it reads
// from against the index (size, header, layout) but not its checksum: run verify_checkpoint once
// per load for that.
std::vector<std::byte> load_flat_range(const std::filesystem::path& dir,
                                       const CheckpointIndex& index, std::string_view group,
                                       std::int64_t offset, std::int64_t count);
// The same for an F32 group, as floats (InvalidInput for another dtype).
std::vector<float> load_flat_range_f32(const std::filesystem::path& dir,
                                       const CheckpointIndex& index, std::string_view group,
                                       std::int64_t offset, std::int64_t count);
// The bytes of one model tensor of a group (its TensorSlot).
std::vector<std::byte> load_tensor(const std::filesystem::path& dir, const CheckpointIndex& index,
                                   std::string_view group, std::string_view tensor);

// ---- recovery -----------------------------------------------------------------------------------

struct RecoveryReport {
  std::filesystem::path restored_from;         // empty unless <dir> was missing and put back
  std::vector<std::filesystem::path> removed;  // stale <dir>.tmp-* and <dir>.old-* directories
};

// Run when no save is in progress (e.g. at start-up, before the first save). When <dir> is missing,
// moves the complete (verified) sibling <dir>.tmp-* or <dir>.old-* with the highest step to <dir>;
// then removes every remaining <dir>.tmp-* and <dir>.old-* sibling. Incomplete or corrupt siblings
// are never restored.
RecoveryReport recover_checkpoint(const std::filesystem::path& dir);

}  // namespace tally::io
