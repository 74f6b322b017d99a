// save_sharded / load_sharded (sharded_checkpoint.hpp): io's checkpoint protocol over a Comm.
#include "sharded_checkpoint.hpp"

#include <ATen/ATen.h>

#include <chrono>
#include <cstring>
#include <exception>
#include <span>
#include <system_error>

#include "comm_torch.hpp"
#include "tally/core/types.hpp"
#include "tally/io/files.hpp"
#include "tally/io/safetensors.hpp"
#include "run_helpers.hpp"

namespace tally::engine {

namespace fs = std::filesystem;

namespace {


std::string index_text_checksum(std::string_view text) {
  return io::crc32c_hex(io::crc32c(std::as_bytes(std::span(text.data(), text.size()))));
}

// Rank 0's verdict on a checkpoint, broadcast to every rank before anything is loaded.
// Sent as a double (the Comm's element types).
constexpr double kNoCheckpoint = 0, kValid = 1, kInvalid = 2, kIoFailure = 3;

void check_group(const io::CheckpointIndex& index, const fs::path& dir, const std::string& name) {
  const io::FlatGroup* g = index.find_group(name);
  if (g == nullptr)
    throw InvalidInput((dir / "index.json").string() + ": group \"" + name +
                       "\" missing: this run saves and loads it");
  if (g->dtype != io::TensorDType::f32)
    throw InvalidInput((dir / "index.json").string() + ": group \"" + name + "\" dtype = " +
                       std::string(io::to_string(g->dtype)) + ": this run holds it in F32");
}

}  // namespace

std::string crc32c_of(const at::Tensor& flat_f32) {
  const at::Tensor c = flat_f32.contiguous();
  const auto* p = static_cast<const std::byte*>(c.data_ptr());
  return io::crc32c_hex(io::crc32c(std::span(p, std::size_t(c.nbytes()))));
}

void check_index_checksum(const fs::path& dir) {
  const fs::path index_path = dir / "index.json";
  const fs::path sum_path = dir / kIndexChecksumName;
  std::error_code ec;
  if (!fs::exists(sum_path, ec))
    throw InvalidInput(sum_path.string() +
                       ": missing: a tally run writes the checksum of index.json beside it");
  std::string recorded = io::read_text_file(sum_path, 64, io::Symlinks::refuse);
  if (!recorded.empty() && recorded.back() == '\n') recorded.pop_back();
  if (recorded.size() != 8 || recorded.find_first_not_of("0123456789abcdef") != std::string::npos)
    throw InvalidInput(sum_path.string() + ": content = \"" + recorded +
                       "\": must be 8 lower-case hex digits (CRC-32C of index.json)");
  if (!fs::exists(index_path, ec))
    throw InvalidInput(index_path.string() + ": missing: a checkpoint directory holds it");
  const std::string actual = index_text_checksum(
      io::read_text_file(index_path, io::kMaxJsonFileBytes, io::Symlinks::refuse));
  if (actual != recorded)
    throw InvalidInput(index_path.string() + ": crc32c = " + actual + ": " + kIndexChecksumName +
                       " records " + recorded + " (index.json was edited or is corrupt)");
}

SaveOutcome save_sharded(Comm& comm, const fs::path& dir, const io::CheckpointIndex& state,
                         const std::vector<FlatGroupData>& groups,
                         const AfterShardHook& after_shard) {
  const auto t0 = std::chrono::steady_clock::now();
  const int k = comm.world_size(), r = comm.rank();
  io::CheckpointIndex index = state;
  index.world_size = k;
  index.groups.clear();
  index.files.clear();
  for (const FlatGroupData& g : groups) {
    index.groups.push_back(io::make_flat_group(g.name, io::TensorDType::f32, g.tensors, k));
    TALLY_INVARIANT(g.flat.dim() == 1 && g.flat.scalar_type() == at::kFloat &&
                    g.flat.numel() == index.groups.back().numel);
  }
  const std::string token = "s" + std::to_string(index.step);
  const fs::path staging = io::staging_dir(dir, token);
  if (r == 0) io::prepare_staging_dir(dir, token);
  comm.barrier();

  // 2. This rank's 1/k of every group. A failure is reported through the all-gather below, so
  // the other ranks stop with a message instead of waiting for a timeout.
  std::vector<double> mine = {1, 0, 0};  // {ok, size_bytes, crc32c}: exact in a double
  std::exception_ptr error;
  try {
    std::vector<at::Tensor> parts;
    std::vector<io::TensorView> views;
    for (std::size_t i = 0; i < groups.size(); ++i) {
      const ShardSpan s = index.groups[i].shards[std::size_t(r)];
      parts.push_back(groups[i].flat.narrow(0, s.offset, s.count).contiguous());
      views.push_back({.name = groups[i].name,
                       .dtype = io::TensorDType::f32,
                       .shape = {s.count},
                       .data = static_cast<const std::byte*>(parts.back().data_ptr()),
                       .size_bytes = std::size_t(parts.back().nbytes())});
    }
    const io::ShardFile f = io::write_shard(staging, index, r, views);
    mine = {1, double(f.size_bytes), double(f.crc32c)};
  } catch (...) {
    error = std::current_exception();
    mine = {0, 0, 0};
  }
  if (!error && after_shard) after_shard();

  // 3. Every shard's size and checksum to every rank; rank 0 commits.
  std::vector<double> all(std::size_t(3 * k));
  comm.all_gather(mine, all);
  if (error) std::rethrow_exception(error);
  SaveOutcome out;
  for (int q = 0; q < k; ++q) {
    const double* e = &all[std::size_t(3 * q)];
    if (e[0] != 1)
      throw std::runtime_error("rank " + std::to_string(r) + ": the save at step " +
                               std::to_string(index.step) + " failed: rank " + std::to_string(q) +
                               " could not write its shard (its message says why)");
    index.files.push_back({.rank = q,
                           .name = io::shard_file_name(q, k),
                           .size_bytes = std::uint64_t(e[1]),
                           .crc32c = std::uint32_t(e[2])});
    out.shard_bytes += e[1];
  }
  const std::string text = io::index_to_json(index);
  out.index_bytes = std::int64_t(text.size());
  std::vector<double> committed = {0};
  if (r == 0) {
    try {
      const std::string sum = index_text_checksum(text) + "\n";
      const auto piece = std::as_bytes(std::span(sum.data(), sum.size()));
      io::write_file_atomically(staging / kIndexChecksumName, std::span(&piece, 1));
      io::commit_checkpoint(dir, staging, index);
      committed[0] = 1;
    } catch (...) {
      error = std::current_exception();
    }
  }
  comm.broadcast(committed, 0);  // nobody goes on before the checkpoint is in place
  if (error) std::rethrow_exception(error);
  if (committed[0] != 1)
    throw std::runtime_error("rank " + std::to_string(r) + ": the save at step " +
                             std::to_string(index.step) +
                             " failed on rank 0 while committing (its message says why)");
  out.seconds = seconds_since(t0);
  return out;
}

std::optional<LoadOutcome> load_sharded(Comm& comm, const fs::path& dir,
                                        const std::vector<std::string>& group_names) {
  const auto t0 = std::chrono::steady_clock::now();
  const int k = comm.world_size(), r = comm.rank();
  LoadOutcome out;

  // 1. Rank 0 recovers and verifies; everyone learns the verdict before reading a byte.
  std::vector<double> verdict = {kNoCheckpoint};
  std::exception_ptr error;
  if (r == 0) {
    try {
      std::error_code ec;
      const fs::path parent = dir.has_parent_path() ? dir.parent_path() : fs::path(".");
      if (fs::is_directory(parent, ec)) out.recovery = io::recover_checkpoint(dir);
      if (fs::exists(fs::symlink_status(dir, ec))) {
        check_index_checksum(dir);
        out.index = io::verify_checkpoint(dir);
        for (const std::string& name : group_names) check_group(out.index, dir, name);
        verdict[0] = kValid;
      }
    } catch (const InvalidInput&) {
      error = std::current_exception();
      verdict[0] = kInvalid;
    } catch (...) {
      error = std::current_exception();
      verdict[0] = kIoFailure;
    }
  }
  comm.broadcast(verdict, 0);
  if (error) std::rethrow_exception(error);
  const std::string rank_text = "rank " + std::to_string(r);
  if (verdict[0] == kInvalid)
    throw InvalidInput(rank_text + ": the checkpoint at " + dir.string() +
                       " failed verification on rank 0 (rank 0's message names the file and the "
                       "check); nothing was loaded");
  if (verdict[0] == kIoFailure)
    throw std::runtime_error(rank_text + ": rank 0 could not read the checkpoint at " +
                             dir.string() + " (its message says why); nothing was loaded");
  if (verdict[0] == kNoCheckpoint) return std::nullopt;
  if (r != 0) {
    out.index = io::read_index(dir);
    for (const std::string& name : group_names) check_group(out.index, dir, name);
  }

  // 2. This rank's 1/k' of each group, from whichever saved shards hold it; then all-gather.
  for (const std::string& name : group_names) {
    const io::FlatGroup& g = *out.index.find_group(name);
    const ShardSpan mine = io::shard_range(g.numel, k, r);
    std::vector<float> values = io::load_flat_range_f32(dir, out.index, name, mine.offset,
                                                        mine.count);
    at::Tensor local = at::empty({mine.count}, at::kFloat);
    if (mine.count > 0)
      std::memcpy(local.data_ptr<float>(), values.data(), values.size() * sizeof(float));
    at::Tensor full = at::empty({g.numel}, at::kFloat);
    all_gather(comm, local, full);
    out.flats.push_back(full);
  }
  out.seconds = seconds_since(t0);
  return out;
}

}  // namespace tally::engine
