// Fuzz harness: the checkpoint index + verify + load path (io/include/tally/io/checkpoint.hpp).
//
// The input is a whole checkpoint directory in one byte string (checkpoint_input.hpp: index.json,
// then each shard file in rank order; make_seeds.cpp writes valid ones with tally's own writer).
// The harness writes the pieces into <scratch>/ckpt/, then checks (Note [fuzz contract] in
// fuzz_check.hpp):
//  - parse_index (in memory) and read_index (the file) agree, value or message; an accepted
//    index.json is JSON;
//  - an accepted index written with index_to_json reads back to the same index, and writing that
//    again gives the same text;
//  - verify_checkpoint agrees with read_index when it accepts;
//  - load_flat_range of every group, whole, never lets anything but InvalidInput out; when
//    verify_checkpoint accepted, it must succeed, give what the shards hold in memory
//    (parse_safetensors of each piece), and agree with load_flat_range_f32 and load_tensor;
//  - a verified checkpoint saved again with write_checkpoint verifies and loads to the same index
//    (files aside: their checksums depend on the header's layout) and the same bytes.
#include <algorithm>
#include <cstring>

#include "checkpoint_input.hpp"
#include "fuzz_check.hpp"
#include "tally/io/checkpoint.hpp"

namespace tally::fuzz {

// Bounds the harness's own work per input, not the reader's: load_tensor is called for at most
// this many tensors of each group.
inline constexpr std::size_t kMaxTensorLoads = 16;

namespace {

using namespace tally::io;

bool same_group(const FlatGroup& a, const FlatGroup& b) {
  if (a.name != b.name || a.dtype != b.dtype || a.numel != b.numel ||
      a.shards.size() != b.shards.size() || a.tensors.size() != b.tensors.size())
    return false;
  for (std::size_t i = 0; i < a.shards.size(); ++i)
    if (a.shards[i].offset != b.shards[i].offset || a.shards[i].count != b.shards[i].count)
      return false;
  for (std::size_t i = 0; i < a.tensors.size(); ++i)
    if (a.tensors[i].name != b.tensors[i].name || a.tensors[i].shape != b.tensors[i].shape ||
        a.tensors[i].offset != b.tensors[i].offset)
      return false;
  return true;
}

bool same_index(const CheckpointIndex& a, const CheckpointIndex& b, bool with_files) {
  const LrScheduleState &s = a.lr_schedule, &t = b.lr_schedule;
  if (a.step != b.step || a.consumed_samples != b.consumed_samples || a.seed != b.seed ||
      a.rng_state != b.rng_state || a.world_size != b.world_size || s.name != t.name ||
      s.step != t.step || !same_bits(s.base_lr, t.base_lr) || !same_bits(s.lr, t.lr) ||
      s.warmup_steps != t.warmup_steps || s.total_steps != t.total_steps ||
      !same_bits(s.min_lr, t.min_lr) || a.groups.size() != b.groups.size())
    return false;
  for (std::size_t i = 0; i < a.groups.size(); ++i)
    if (!same_group(a.groups[i], b.groups[i])) return false;
  if (!with_files) return true;
  if (a.files.size() != b.files.size()) return false;
  for (std::size_t i = 0; i < a.files.size(); ++i)
    if (a.files[i].rank != b.files[i].rank || a.files[i].name != b.files[i].name ||
        a.files[i].size_bytes != b.files[i].size_bytes || a.files[i].crc32c != b.files[i].crc32c)
      return false;
  return true;
}

bool same_index_with_files(const CheckpointIndex& a, const CheckpointIndex& b) {
  return same_index(a, b, true);
}

void write_directory(const fs::path& dir, const std::vector<std::string_view>& pieces) {
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
  write_bytes(dir / "index.json", std::as_bytes(std::span(pieces[0])));
  const int k = int(pieces.size()) - 1;
  for (int r = 0; r < k; ++r)
    write_bytes(dir / shard_file_name(r, k), std::as_bytes(std::span(pieces[std::size_t(r) + 1])));
}

// index_to_json → parse_index is exact, and a second write gives the same text.
void check_index_round_trip(const CheckpointIndex& x) {
  const std::string text = must_succeed("index_to_json", [&] { return index_to_json(x); });
  const CheckpointIndex back =
      must_succeed("parse_index(index_to_json)", [&] { return parse_index(text, "round trip"); });
  FUZZ_CHECK(same_index(x, back, true), "index_to_json → parse_index changed the index");
  FUZZ_CHECK(index_to_json(back) == text, "index_to_json of the same index differs");
}

// Group g's whole flat space, as the shard pieces hold it in memory (only ranks holding some).
std::vector<std::byte> flat_from_pieces(const FlatGroup& g,
                                        const std::vector<std::string_view>& pieces) {
  std::vector<std::byte> out;
  for (std::size_t r = 0; r < g.shards.size(); ++r) {
    if (g.shards[r].count == 0) continue;
    FUZZ_CHECK(r + 1 < pieces.size(), "a verified checkpoint lacks shard " + std::to_string(r));
    const auto piece = std::as_bytes(std::span(pieces[r + 1]));
    const SafetensorsFile f = must_succeed("parse_safetensors(verified shard)",
                                           [&] { return parse_safetensors(piece, "shard"); });
    const auto bytes = f.bytes(g.name);
    out.insert(out.end(), bytes.begin(), bytes.end());
  }
  return out;
}

// Every group, whole, from the files in dir; nullopt where one load was refused.
std::optional<std::vector<std::vector<std::byte>>> load_groups(const fs::path& dir,
                                                               const CheckpointIndex& x) {
  std::vector<std::vector<std::byte>> out;
  bool all = true;
  for (const FlatGroup& g : x.groups) {
    auto loaded =
        attempt("load_flat_range", [&] { return load_flat_range(dir, x, g.name, 0, g.numel); });
    if (!loaded.ok()) {
      all = false;  // keep going: each load must still fail cleanly
      continue;
    }
    out.push_back(std::move(*loaded.value));
  }
  if (!all) return std::nullopt;
  return out;
}

// A verified checkpoint's loads agree with each other and with the shards in memory.
void check_loads(const fs::path& dir, const CheckpointIndex& x,
                 const std::vector<std::vector<std::byte>>& groups,
                 const std::vector<std::string_view>& pieces) {
  for (std::size_t i = 0; i < x.groups.size(); ++i) {
    const FlatGroup& g = x.groups[i];
    const std::vector<std::byte>& flat = groups[i];
    const std::size_t esize = element_size_bytes(g.dtype);
    FUZZ_CHECK(flat.size() == std::size_t(g.numel) * esize, g.name);
    FUZZ_CHECK(flat == flat_from_pieces(g, pieces), "load_flat_range vs the shards in memory");
    if (g.dtype == TensorDType::f32) {
      const auto floats = must_succeed(
          "load_flat_range_f32", [&] { return load_flat_range_f32(dir, x, g.name, 0, g.numel); });
      FUZZ_CHECK(floats.size() * 4 == flat.size() &&
                     (flat.empty() || std::memcmp(floats.data(), flat.data(), flat.size()) == 0),
                 "load_flat_range_f32 vs load_flat_range");
    }
    for (std::size_t t = 0; t < std::min(g.tensors.size(), kMaxTensorLoads); ++t) {
      const TensorSlot& slot = g.tensors[t];
      const auto bytes =
          must_succeed("load_tensor", [&] { return load_tensor(dir, x, g.name, slot.name); });
      const std::size_t begin = std::size_t(slot.offset) * esize;
      FUZZ_CHECK(begin + bytes.size() <= flat.size() &&
                     std::equal(bytes.begin(), bytes.end(), flat.begin() + std::ptrdiff_t(begin)),
                 "load_tensor vs load_flat_range for " + slot.name);
    }
  }
}

// The verified checkpoint saved again from what was loaded: it verifies to the same index and loads
// to the same bytes.
void check_save_round_trip(const CheckpointIndex& x,
                           const std::vector<std::vector<std::byte>>& groups) {
  const fs::path again = scratch_dir() / "again";
  std::error_code ec;
  fs::remove_all(again, ec);
  std::vector<std::vector<TensorView>> shards(std::size_t(x.world_size));
  for (std::size_t i = 0; i < x.groups.size(); ++i) {
    const FlatGroup& g = x.groups[i];
    const std::size_t esize = element_size_bytes(g.dtype);
    for (std::size_t r = 0; r < shards.size(); ++r) {
      const ShardSpan s = g.shards[r];
      shards[r].push_back({.name = g.name,
                           .dtype = g.dtype,
                           .shape = {s.count},
                           .data = groups[i].data() + std::size_t(s.offset) * esize,
                           .size_bytes = std::size_t(s.count) * esize});
    }
  }
  CheckpointIndex unsaved = x;
  unsaved.files.clear();
  must_succeed("write_checkpoint", [&] { write_checkpoint(again, unsaved, shards); });
  const CheckpointIndex back =
      must_succeed("verify_checkpoint(saved again)", [&] { return verify_checkpoint(again); });
  FUZZ_CHECK(same_index(x, back, false), "save → verify changed the index");
  const auto reloaded = load_groups(again, back);
  FUZZ_CHECK(reloaded && *reloaded == groups, "save → load changed the bytes");
  fs::remove_all(again, ec);
}

}  // namespace
}  // namespace tally::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tally::fuzz;
  using namespace tally::io;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::vector<std::string_view> pieces = split_checkpoint_input(input);
  const fs::path dir = scratch_dir() / "ckpt";
  write_directory(dir, pieces);

  const std::string source = (dir / "index.json").string();
  const auto mem = attempt("parse_index", [&] { return parse_index(pieces[0], source); });
  const auto file = attempt("read_index", [&] { return read_index(dir); });
  expect_agree("parse_index", mem, "read_index", file, same_index_with_files);
  if (!file.ok()) return 0;
  const CheckpointIndex& x = *file.value;
  expect_json_text("read_index", pieces[0]);
  check_index_round_trip(x);

  const auto verified = attempt("verify_checkpoint", [&] { return verify_checkpoint(dir); });
  if (verified.ok())
    FUZZ_CHECK(same_index(x, *verified.value, true), "verify_checkpoint vs read_index");
  // Loading checks sizes and headers but not checksums, so it may accept what verify refused; it
  // must still never let anything but InvalidInput out.
  const auto groups = load_groups(dir, x);
  if (!verified.ok()) return 0;
  FUZZ_CHECK(groups.has_value(), "a verified checkpoint does not load");
  check_loads(dir, x, *groups, pieces);
  check_save_round_trip(x, *groups);
  return 0;
}
