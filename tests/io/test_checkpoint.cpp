// Checkpoints: the sharding rule, index.json round trip, save / verify / load, resharding 3 → 2 and
// 3 → 4 ranks, one test per kind of corruption, and the atomic protocol under simulated crashes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "../support/temp_dir.hpp"
#include "io_test_util.hpp"
#include "tally/io/checkpoint.hpp"

namespace tally::io::test_checkpoint {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

using TempDir = ::tally::test::TempDir;  // tests/support/temp_dir.hpp

// f throws InvalidInput whose message is one line and contains every piece.
void expect_invalid(const std::function<void()>& f,
                    std::initializer_list<std::string_view> pieces) {
  const std::string msg = test::invalid_input_message(f);
  EXPECT_EQ(msg.find('\n'), std::string::npos) << "not one line: " << msg;
  for (const auto piece : pieces)
    EXPECT_NE(msg.find(piece), std::string::npos) << "message: " << msg << "\nlacks: " << piece;
}

// ---- a sample training state --------------------------------------------------------------------

// Groups: "params" (F32: w [rows, 1000], b [3]) and "step_count" (I64 scalar: numel 1, so every
// rank but 0 holds an empty shard).
CheckpointIndex sample_index(int world_size, std::int64_t step = 7, std::int64_t rows = 1) {
  CheckpointIndex x{.step = step,
                    .consumed_samples = step * 512,
                    .seed = ~std::uint64_t{0},
                    .rng_state = "00ff13a7c0de",
                    .lr_schedule = {.name = "cosine",
                                    .step = step,
                                    .base_lr = 3e-4,
                                    .lr = 1.0 / 3.0 * 1e-4,
                                    .warmup_steps = 100,
                                    .total_steps = 10000,
                                    .min_lr = 3e-5},
                    .world_size = world_size};
  x.groups.push_back(
      make_flat_group("params", TensorDType::f32, {{"w", {rows, 1000}}, {"b", {3}}}, world_size));
  x.groups.push_back(make_flat_group("step_count", TensorDType::i64, {{"count", {}}}, world_size));
  return x;
}

struct FlatState {
  std::vector<float> params;
  std::vector<std::int64_t> step_count;
  explicit FlatState(const CheckpointIndex& x, float salt = 0) {
    params.resize(std::size_t(x.find_group("params")->numel));
    for (std::size_t i = 0; i < params.size(); ++i)
      params[i] = float(i) * 1e-3f - 17.0f + salt + (i % 7 == 0 ? 1e-7f : 0.0f);
    step_count = {x.step};
  }
};

template <class T>
TensorView slice(const FlatGroup& g, int rank, const std::vector<T>& flat) {
  const ShardSpan r = g.shards[std::size_t(rank)];
  return {.name = g.name,
          .dtype = g.dtype,
          .shape = {r.count},
          .data = reinterpret_cast<const std::byte*>(flat.data() + r.offset),
          .size_bytes = std::size_t(r.count) * sizeof(T)};
}

std::vector<std::vector<TensorView>> shard_views(const CheckpointIndex& x, const FlatState& s) {
  std::vector<std::vector<TensorView>> out;
  for (int r = 0; r < x.world_size; ++r)
    out.push_back({slice(*x.find_group("params"), r, s.params),
                   slice(*x.find_group("step_count"), r, s.step_count)});
  return out;
}

void save(const fs::path& dir, const CheckpointIndex& x, const CommitOptions& o = {},
          float salt = 0) {
  const FlatState s(x, salt);
  write_checkpoint(dir, x, shard_views(x, s), o);
}

void edit_json(const fs::path& file, const std::function<void(json&)>& edit) {
  json j = json::parse(read_text_file(file));
  edit(j);
  std::ofstream(file, std::ios::binary | std::ios::trunc) << j.dump(1);
}

std::vector<fs::path> siblings_of(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir.parent_path()))
    if (e.path() != dir) out.push_back(e.path());
  return out;
}

// ---- the sharding rule --------------------------------------------------------------------------

TEST(ShardRange, FirstRemainderRanksHoldOneMore) {
  // The engine's chunk_range rule: numel 10 over 4 ranks → 3, 3, 2, 2.
  EXPECT_EQ(shard_range(10, 4, 0).count, 3);
  EXPECT_EQ(shard_range(10, 4, 2).offset, 6);
  EXPECT_EQ(shard_range(10, 4, 3).count, 2);
  for (const std::int64_t n : {0, 1, 2, 3, 7, 10, 1000003})
    for (int k = 1; k <= 5; ++k) {
      std::int64_t end = 0;
      for (int r = 0; r < k; ++r) {
        const ShardSpan c = shard_range(n, k, r);
        EXPECT_EQ(c.offset, end) << n << " over " << k << ", rank " << r;
        EXPECT_EQ(c.count, n / k + (r < n % k ? 1 : 0)) << n << " over " << k << ", rank " << r;
        end = c.offset + c.count;
      }
      EXPECT_EQ(end, n);
    }
  EXPECT_THROW(shard_range(10, 0, 0), InvalidInput);
  EXPECT_THROW(shard_range(10, 4, 4), InvalidInput);
  EXPECT_THROW(shard_range(-1, 4, 0), InvalidInput);
  EXPECT_EQ(shard_file_name(1, 3), "shard-00001-of-00003.safetensors");
}

// ---- index.json ---------------------------------------------------------------------------------

TEST(CheckpointIndex, JsonRoundTripIsExact) {
  CheckpointIndex x = sample_index(3);
  x.files = {{0, shard_file_name(0, 3), 100, 0xE3069283u},
             {1, shard_file_name(1, 3), 99, 0},
             {2, shard_file_name(2, 3), 8, 0xFFFFFFFFu}};
  const std::string text = index_to_json(x);
  const CheckpointIndex y = parse_index(text, "index.json");
  EXPECT_EQ(index_to_json(y), text);
  EXPECT_EQ(y.seed, ~std::uint64_t{0});
  EXPECT_EQ(y.lr_schedule.lr, 1.0 / 3.0 * 1e-4);  // shortest round-trip digits: exact
  EXPECT_EQ(y.files[0].crc32c, 0xE3069283u);
  EXPECT_EQ(y.groups[0].shards[1].offset, 335);  // 1003 = 335 + 334 + 334
  EXPECT_EQ(y.groups[0].tensors[1].offset, 1000);
  EXPECT_NE(text.find("\"crc32c\":\"e3069283\""), std::string::npos) << text;
}

TEST(CheckpointIndex, WriterRefusesInvalidLayouts) {
  CheckpointIndex x = sample_index(2);
  x.groups[0].shards[1].offset += 1;
  expect_invalid([&] { (void)index_to_json(x); },
                 {"groups[0].shards[1] = [503, 501]", "leaves a gap: must start at 502"});
  x = sample_index(2);
  x.groups[0].tensors[1].offset = 999;
  expect_invalid([&] { validate_index(x, "idx", false); },
                 {"idx: groups[0].tensors[1]", "overlaps \"w\" at [0, 1000)"});
  x = sample_index(2);
  x.groups[1].name = "../evil";
  expect_invalid([&] { validate_index(x, "idx", false); }, {"groups[1].name = \"../evil\""});
}

// ---- save, verify, load -------------------------------------------------------------------------

TEST(Checkpoint, SaveVerifyLoadRoundTrip) {
  const TempDir t("roundtrip");
  const fs::path dir = t / "ckpt";
  const CheckpointIndex x = sample_index(3, 42, 1000);  // 1,000,003 parameters
  const FlatState s(x);
  write_checkpoint(dir, x, shard_views(x, s));

  const CheckpointIndex v = verify_checkpoint(dir);
  EXPECT_EQ(v.step, 42);
  EXPECT_EQ(v.consumed_samples, 42 * 512);
  EXPECT_EQ(v.rng_state, "00ff13a7c0de");
  ASSERT_EQ(v.files.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    const fs::path shard = dir / shard_file_name(r, 3);
    EXPECT_EQ(v.files[std::size_t(r)].size_bytes, fs::file_size(shard));
    const std::string bytes = read_text_file(shard, std::size_t{1} << 30);
    EXPECT_EQ(v.files[std::size_t(r)].crc32c, crc32c(std::as_bytes(std::span(bytes))));
  }
  EXPECT_EQ(load_flat_range_f32(dir, v, "params", 0, 1000003), s.params);
  const auto b = load_tensor(dir, v, "params", "b");
  ASSERT_EQ(b.size(), 12u);
  EXPECT_EQ(std::memcmp(b.data(), s.params.data() + 1000000, 12), 0);
  const auto count = load_flat_range(dir, v, "step_count", 0, 1);
  std::int64_t step = 0;
  std::memcpy(&step, count.data(), 8);
  EXPECT_EQ(step, 42);
  EXPECT_EQ(siblings_of(dir).size(), 0u) << "no staging directory left behind";
}

TEST(Checkpoint, ReshardThreeRanksToTwoAndFour) {
  const TempDir t("reshard");
  const fs::path dir = t / "ckpt";
  const CheckpointIndex x = sample_index(3, 1, 1000);
  const FlatState s(x);
  write_checkpoint(dir, x, shard_views(x, s));
  const CheckpointIndex idx = read_index(dir);
  const std::int64_t n = idx.find_group("params")->numel;
  ASSERT_EQ(n, 1000003);
  for (const int k : {2, 4}) {
    std::vector<float> joined;
    for (int r = 0; r < k; ++r) {
      const ShardSpan want = shard_range(n, k, r);
      const std::vector<float> got =
          load_flat_range_f32(dir, idx, "params", want.offset, want.count);
      EXPECT_TRUE(std::equal(got.begin(), got.end(), s.params.begin() + want.offset,
                             s.params.begin() + want.offset + want.count))
          << "world size " << k << ", rank " << r;
      joined.insert(joined.end(), got.begin(), got.end());
    }
    EXPECT_EQ(joined, s.params) << "world size " << k;
  }
  // Ranges straddling shard boundaries (333335 and 666669), empty ranges, the last element.
  for (const auto& [off, cnt] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {333334, 2}, {333330, 333345}, {0, 0}, {1000002, 1}, {1000003, 0}}) {
    const auto got = load_flat_range_f32(dir, idx, "params", off, cnt);
    EXPECT_TRUE(
        std::equal(got.begin(), got.end(), s.params.begin() + off, s.params.begin() + off + cnt))
        << off << " + " << cnt;
  }
  expect_invalid([&] { load_flat_range(dir, idx, "params", 1000000, 4); },
                 {"index.json", "[1000000, 1000000 + 4)", "numel = 1000003"});
  expect_invalid([&] { load_flat_range(dir, idx, "adam.m", 0, 1); }, {"\"adam.m\"", "not in"});
  expect_invalid([&] { load_flat_range_f32(dir, idx, "step_count", 0, 1); }, {"needs F32"});
}

// The engine's way: every rank writes its own shard into one staging directory, then one commits.
TEST(Checkpoint, RanksAsThreadsWriteOneStagingDirectory) {
  const TempDir t("threads");
  const fs::path dir = t / "ckpt";
  const CheckpointIndex x = sample_index(4, 9, 10);
  const FlatState s(x);
  const auto views = shard_views(x, s);
  const fs::path staging = prepare_staging_dir(dir, "run-17");
  EXPECT_EQ(staging, t / "ckpt.tmp-run-17");
  std::vector<ShardFile> files(4);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.emplace_back(
        [&, r] { files[std::size_t(r)] = write_shard(staging, x, r, views[std::size_t(r)]); });
  for (auto& th : ranks) th.join();
  CheckpointIndex full = x;
  full.files = files;
  commit_checkpoint(dir, staging, full);
  EXPECT_EQ(verify_checkpoint(dir).step, 9);
  EXPECT_FALSE(fs::exists(staging));
  expect_invalid([&] { (void)staging_dir(dir, "../x"); }, {"staging token = \"../x\""});
  expect_invalid([&] { write_shard(staging, x, 0, {views[0][0]}); },
                 {"write_shard(rank 0)", "tensors = 1", "one per group"});
  expect_invalid([&] { write_shard(staging, x, 1, views[0]); },
                 {"write_shard(rank 1)", "tensor \"step_count\" = I64 [1]", "must be I64 [0]"});
}

// ---- corruption: each fails with one line naming the file and the check -------------------------

struct Corrupt : ::testing::Test {
  TempDir t{::testing::UnitTest::GetInstance()->current_test_info()->name()};
  fs::path dir = t / "ckpt";
  fs::path index = dir / "index.json";
  fs::path shard1 = dir / "shard-00001-of-00003.safetensors";
  void SetUp() override { save(dir, sample_index(3, 5, 10)); }
};

TEST_F(Corrupt, FlippedByteFailsTheChecksum) {
  {
    std::fstream f(shard1, std::ios::binary | std::ios::in | std::ios::out);
    f.seekp(-5, std::ios::end);
    f.put('\x5a');
  }
  expect_invalid(
      [&] { verify_checkpoint(dir); },
      {shard1.string() + ": crc32c = ", ": index.json records ", "(the file is corrupt)"});
}

TEST_F(Corrupt, TruncatedShard) {
  const auto size = fs::file_size(shard1);
  fs::resize_file(shard1, size - 100);
  expect_invalid([&] { verify_checkpoint(dir); },
                 {shard1.string(), "size = " + std::to_string(size - 100) + " bytes",
                  "index.json records " + std::to_string(size) + " (truncated)"});
  const CheckpointIndex x = read_index(dir);
  expect_invalid([&] { load_flat_range(dir, x, "params", 4000, 10); },
                 {shard1.string(), "truncated"});
  EXPECT_NO_THROW(load_flat_range(dir, x, "params", 0, 10));  // rank 0's range is intact
}

TEST_F(Corrupt, DeletedShard) {
  const fs::path shard2 = dir / "shard-00002-of-00003.safetensors";
  fs::remove(shard2);
  expect_invalid([&] { verify_checkpoint(dir); },
                 {shard2.string(), "missing: index.json lists it as the shard of rank 2"});
}

TEST_F(Corrupt, IndexNotJson) {
  std::ofstream(index, std::ios::trunc) << "{\"format\": \"tally-checkpoint\", ";
  expect_invalid([&] { verify_checkpoint(dir); }, {index.string(), "not valid JSON"});
  fs::remove(index);
  expect_invalid([&] { read_index(dir); }, {index.string(), "cannot read"});
}

TEST_F(Corrupt, IndexWrongWorldSize) {
  edit_json(index, [](json& j) { j["world_size"] = 4; });
  expect_invalid([&] { verify_checkpoint(dir); }, {index.string(), "groups[0].shards = 3 ranges",
                                                   "one [offset, count] per rank, world_size = 4"});
  edit_json(index, [](json& j) { j["world_size"] = 0; });
  expect_invalid([&] { read_index(dir); }, {index.string(), "world_size = 0", "[1, 65536]"});
}

TEST_F(Corrupt, IndexLayoutGap) {
  edit_json(index, [](json& j) { j["groups"][0]["shards"][1] = {3338, 3333}; });
  expect_invalid([&] { read_index(dir); },
                 {index.string(), "groups[0].shards[1] = [3338, 3333]",
                  "leaves a gap: must start at 3335, where shards[0] ends"});
  edit_json(index, [](json& j) {
    j["groups"][0]["shards"][1] = {3335, 3334};
    j["groups"][0]["shards"][2] = {6669, 3330};
  });
  expect_invalid([&] { read_index(dir); },
                 {index.string(), "groups[0].shards = cover [0, 9999)", "[0, numel = 10003)"});
}

TEST_F(Corrupt, IndexLayoutOverlap) {
  edit_json(index, [](json& j) { j["groups"][0]["shards"][2] = {6660, 3334}; });
  expect_invalid([&] { read_index(dir); }, {index.string(), "groups[0].shards[2] = [6660, 3334]",
                                            "overlaps: must start at 6669"});
  edit_json(index, [](json& j) {
    j["groups"][0]["shards"][2] = {6669, 3334};
    j["groups"][0]["tensors"][1]["offset"] = 9990;
  });
  expect_invalid([&] { read_index(dir); },
                 {index.string(), "groups[0].tensors[1]", "overlaps \"w\" at [0, 10000)"});
}

TEST_F(Corrupt, IndexWrongChecksum) {
  edit_json(index, [](json& j) { j["files"][1]["crc32c"] = "00000000"; });
  expect_invalid([&] { verify_checkpoint(dir); },
                 {shard1.string(), "index.json records 00000000", "corrupt"});
  edit_json(index, [](json& j) { j["files"][1]["crc32c"] = "XYZ"; });
  expect_invalid([&] { read_index(dir); },
                 {index.string(), "files[1].crc32c = \"XYZ\"", "8 lower-case hex digits"});
}

TEST_F(Corrupt, IndexOtherFields) {
  const auto expect_field = [&](const std::function<void(json&)>& edit,
                                std::initializer_list<std::string_view> pieces) {
    save(dir, sample_index(3, 5, 10));
    edit_json(index, edit);
    expect_invalid([&] { read_index(dir); }, pieces);
  };
  expect_field([](json& j) { j["files"][0]["name"] = "../../etc/passwd"; },
               {"files[0].name = \"../../etc/passwd\"", "must be \"shard-00000-of-00003"});
  expect_field([](json& j) { j["format"] = "other"; }, {"format = \"other\""});
  expect_field([](json& j) { j["version"] = 2; }, {"version = 2"});
  expect_field([](json& j) { j["stepp"] = 1; }, {"unknown key \"stepp\""});
  expect_field([](json& j) { j.erase("rng_state"); }, {"rng_state missing"});
  expect_field([](json& j) { j["seed"] = -1; }, {"seed = -1"});
  expect_field([](json& j) { j["groups"][0]["dtype"] = "F33"; }, {"groups[0].dtype = \"F33\""});
  expect_field([](json& j) { j["groups"][0]["numel"] = 1e30; }, {"groups[0].numel"});
  expect_field([](json& j) { j["groups"][1]["name"] = "params"; }, {"appears twice"});
  expect_field([](json& j) { j["groups"][0]["tensors"][0]["shape"] = {-1}; },
               {"groups[0].tensors[0].shape[0] = -1"});
  expect_field([](json& j) { j["lr_schedule"]["base_lr"] = "high"; },
               {"lr_schedule.base_lr = \"high\""});
  expect_field([](json& j) { j["files"].erase(2); }, {"files = 2 entries", "one per rank"});
}

// Random byte flips and truncations of index.json: each either reads as an index that round-trips
// exactly through index_to_json, or throws InvalidInput with a one-line message — nothing else
// escapes. The unmutated text still reads as the index that was saved.
// tests/fuzz/fuzz_checkpoint.cpp explores further (verify and load included).
TEST_F(Corrupt, RandomIndexMutationsReadOrFailInOneLine) {
  const std::string valid = read_text_file(index);
  std::mt19937 rng(99);
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string m = valid;
    for (int k = 0; k < 1 + int(rng() % 3); ++k) m[rng() % m.size()] = char(rng() & 0xff);
    if (iter % 5 == 0) m.resize(rng() % m.size());
    const bool ok = test::reads_or_fails_in_one_line(iter, [&] {
      const std::string text = index_to_json(parse_index(m, "fuzz"));
      EXPECT_EQ(index_to_json(parse_index(text, "round trip")), text) << "mutation " << iter;
    });
    ++(ok ? accepted : rejected);
  }
  EXPECT_EQ(accepted + rejected, 2000);
  EXPECT_GT(rejected, 0);

  // The saved index: sample_index(3, 5, 10), plus one entry per shard file as it is on disk.
  const CheckpointIndex got = parse_index(valid, "fuzz");
  CheckpointIndex want = sample_index(3, 5, 10);
  ASSERT_EQ(got.files.size(), 3u);
  for (int r = 0; r < 3; ++r) {
    const fs::path shard = dir / shard_file_name(r, 3);
    const std::string bytes = read_text_file(shard, std::size_t{1} << 20);
    want.files.push_back({.rank = r,
                          .name = shard_file_name(r, 3),
                          .size_bytes = bytes.size(),
                          .crc32c = crc32c(std::as_bytes(std::span(bytes)))});
  }
  EXPECT_EQ(index_to_json(got), index_to_json(want));
}

// A shard that is a valid safetensors file with a matching checksum but the wrong content.
TEST_F(Corrupt, ShardDoesNotMatchTheLayout) {
  const fs::path other = t / "other";
  save(other, sample_index(3, 6, 10));  // step 6 instead of 5
  fs::copy_file(other / shard1.filename(), shard1, fs::copy_options::overwrite_existing);
  const auto patch_file_entry = [&] {
    edit_json(index, [&](json& j) {
      const std::string bytes = read_text_file(shard1, std::size_t{1} << 30);
      j["files"][1]["size_bytes"] = bytes.size();
      j["files"][1]["crc32c"] = crc32c_hex(crc32c(std::as_bytes(std::span(bytes))));
    });
  };
  patch_file_entry();
  expect_invalid([&] { verify_checkpoint(dir); },
                 {shard1.string(), "metadata step = \"6\": index.json expects \"5\""});

  const std::vector<float> wrong(7);
  write_safetensors(
      shard1,
      {TensorView{.name = "params",
                  .dtype = TensorDType::f32,
                  .shape = {7},
                  .data = reinterpret_cast<const std::byte*>(wrong.data()),
                  .size_bytes = 28}},
      {{"format", "tally-checkpoint"}, {"rank", "1"}, {"world_size", "3"}, {"step", "5"}});
  patch_file_entry();
  expect_invalid([&] { verify_checkpoint(dir); },
                 {shard1.string(), "tensor \"params\" = F32 [7]", "index.json expects F32 [3334]"});
}

// ---- the atomic protocol ------------------------------------------------------------------------

TEST(CheckpointAtomic, NewSaveReplacesThePreviousOne) {
  const TempDir t("replace");
  const fs::path dir = t / "ckpt";
  save(dir, sample_index(2, 1, 10));
  save(dir, sample_index(3, 2, 10), {}, 0.5f);
  EXPECT_EQ(verify_checkpoint(dir).step, 2);
  EXPECT_FALSE(fs::exists(dir / "shard-00000-of-00002.safetensors"));  // nothing of the old one
  EXPECT_TRUE(siblings_of(dir).empty());
  save(dir, sample_index(2, 3, 10), {.exchange = false});  // the rename-aside fallback
  EXPECT_EQ(verify_checkpoint(dir).step, 3);
  EXPECT_TRUE(siblings_of(dir).empty());
}

TEST(CheckpointAtomic, CrashBeforeTheSwapKeepsThePreviousCheckpoint) {
  for (const CommitCrash crash : {CommitCrash::before_index, CommitCrash::before_swap}) {
    const TempDir t("crash_before_swap");
    const fs::path dir = t / "ckpt";
    save(dir, sample_index(3, 1, 10));
    save(dir, sample_index(2, 2, 10), {.crash = crash}, 0.5f);
    EXPECT_EQ(siblings_of(dir).size(), 1u) << "the staging directory stays behind";
    EXPECT_EQ(verify_checkpoint(dir).step, 1) << "readers ignore the staging directory";
    const RecoveryReport r = recover_checkpoint(dir);
    EXPECT_TRUE(r.restored_from.empty());
    EXPECT_EQ(r.removed.size(), 1u);
    EXPECT_TRUE(siblings_of(dir).empty());
    EXPECT_EQ(verify_checkpoint(dir).step, 1);
  }
}

TEST(CheckpointAtomic, CrashBetweenTheFallbackRenamesIsRecovered) {
  const TempDir t("crash_aside");
  const fs::path dir = t / "ckpt";
  save(dir, sample_index(3, 1, 10));
  save(dir, sample_index(2, 2, 10), {.exchange = false, .crash = CommitCrash::after_rename_aside});
  EXPECT_FALSE(fs::exists(dir));
  EXPECT_EQ(siblings_of(dir).size(), 2u);  // ckpt.old-<pid> (step 1), ckpt.tmp-<pid> (step 2)
  expect_invalid([&] { read_index(dir); }, {"index.json", "cannot read"});
  const RecoveryReport r = recover_checkpoint(dir);
  EXPECT_EQ(r.restored_from, t / ("ckpt.tmp-" + std::to_string(::getpid())));
  EXPECT_EQ(r.removed.size(), 1u);
  EXPECT_EQ(verify_checkpoint(dir).step, 2);  // the newer complete one
  EXPECT_TRUE(siblings_of(dir).empty());
}

TEST(CheckpointAtomic, RecoveryNeverRestoresAnIncompleteSave) {
  const TempDir t("incomplete");
  const fs::path dir = t / "ckpt";
  save(dir, sample_index(3, 1, 10));
  save(dir, sample_index(2, 2, 10), {.exchange = false, .crash = CommitCrash::after_rename_aside});
  const fs::path staged = t / ("ckpt.tmp-" + std::to_string(::getpid()));
  fs::resize_file(staged / "shard-00001-of-00002.safetensors", 10);  // new save is broken
  const RecoveryReport r = recover_checkpoint(dir);
  EXPECT_EQ(r.restored_from, t / ("ckpt.old-" + std::to_string(::getpid())));
  EXPECT_EQ(verify_checkpoint(dir).step, 1);  // the previous complete one
  EXPECT_TRUE(siblings_of(dir).empty());
}

TEST(CheckpointAtomic, StaleStagingDirectoriesAreIgnoredAndCleaned) {
  const TempDir t("stale");
  const fs::path dir = t / "ckpt";
  fs::create_directories(t / "ckpt.tmp-999999");
  std::ofstream(t / "ckpt.tmp-999999" / "index.json") << "garbage";
  fs::create_directories(t / "ckpt.tmp-other" / "shard-00000-of-00001.safetensors");
  save(dir, sample_index(3, 4, 10));
  EXPECT_EQ(verify_checkpoint(dir).step, 4);
  EXPECT_EQ(siblings_of(dir).size(), 2u);
  const RecoveryReport r = recover_checkpoint(dir / "");  // a trailing separator is fine
  EXPECT_EQ(r.removed.size(), 2u);
  EXPECT_TRUE(siblings_of(dir).empty());
  // A first save that crashed before its swap is complete: recovery puts it in place.
  const fs::path fresh = t / "fresh";
  save(fresh, sample_index(1, 8, 10), {.crash = CommitCrash::before_swap});
  EXPECT_FALSE(fs::exists(fresh));
  EXPECT_FALSE(recover_checkpoint(fresh).restored_from.empty());
  EXPECT_EQ(verify_checkpoint(fresh).step, 8);
}

TEST(CheckpointAtomic, RefusesToReplaceAFile) {
  const TempDir t("file");
  const fs::path dir = t / "ckpt";
  std::ofstream(dir) << "not a directory";
  expect_invalid([&] { save(dir, sample_index(1, 1, 10)); },
                 {dir.string(), "exists and is not a directory"});
  EXPECT_EQ(read_text_file(dir), "not a directory");
}

}  // namespace
}  // namespace tally::io::test_checkpoint
