// Regression tests for the hostile files of issue 8 (items 1–7), across io's readers: links in and
// beside checkpoints, allocation bounded by the files on disk, NUL bytes and trailing bytes in JSON,
// exact float → integer range checks, physical lower bounds on hardware figures, exact integers in
// messages. Each test failed before its fix.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../support/temp_dir.hpp"
#include "io_test_util.hpp"
#include "tally/io/calibration.hpp"
#include "tally/io/checkpoint.hpp"
#include "tally/io/cluster_file.hpp"
#include "tally/io/hf_config.hpp"
#include "tally/io/safetensors.hpp"

namespace tally::io::test_hostile_files {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::expect_invalid;
using test::fixture;
using test::invalid_input_message;

using Scratch = ::tally::test::TempDir;

// One F32 group "params" of n elements over k ranks, values 0.5 * i.
CheckpointIndex save_small(const fs::path& dir, int k = 2, std::int64_t n = 10,
                           std::int64_t step = 3) {
  CheckpointIndex x{.step = step, .world_size = k};
  x.groups.push_back(make_flat_group("params", TensorDType::f32, {{"w", {n}}}, k));
  std::vector<float> flat(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < flat.size(); ++i) flat[i] = 0.5f * float(i);
  std::vector<std::vector<TensorView>> shards;
  for (int r = 0; r < k; ++r) {
    const ShardSpan s = x.groups[0].shards[std::size_t(r)];
    shards.push_back({{.name = "params",
                       .dtype = TensorDType::f32,
                       .shape = {s.count},
                       .data = reinterpret_cast<const std::byte*>(flat.data() + s.offset),
                       .size_bytes = std::size_t(s.count) * 4}});
  }
  write_checkpoint(dir, x, shards);
  return x;
}

void write_bytes(const fs::path& p, std::string_view bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
}

std::string read_bytes(const fs::path& p) { return read_text_file(p, std::size_t{1} << 30); }

// ---- 1. links inside a checkpoint are refused, and reveal nothing ---------------------------------

TEST(HostileCheckpoint, ShardLinkedToAValidCopyOutsideIsRefused) {
  const Scratch t("shard_link");
  const fs::path dir = t / "ckpt";
  save_small(dir);
  const fs::path shard = dir / shard_file_name(1, 2);
  const fs::path outside = t / "elsewhere.safetensors";
  fs::rename(shard, outside);  // the same bytes, now outside the directory
  fs::create_symlink(outside, shard);
  expect_invalid([&] { verify_checkpoint(dir); },
                 {shard.string(), "symbolic link", "must be a regular file"});
  const CheckpointIndex x = read_index(dir);
  expect_invalid([&] { load_flat_range(dir, x, "params", 0, 10); },
                 {shard.string(), "symbolic link"});
}

TEST(HostileCheckpoint, ShardLinkedToASystemFileRevealsNothingAboutIt) {
  const Scratch t("passwd_link");
  const fs::path dir = t / "ckpt";
  save_small(dir);
  const fs::path shard = dir / shard_file_name(0, 2);
  // A file outside with a size no checkpoint figure has.
  const fs::path secret = t / "secret.txt";
  write_bytes(secret, std::string(12345, 's'));
  fs::remove(shard);
  fs::create_symlink(secret, shard);
  for (const std::string& msg : {invalid_input_message([&] { verify_checkpoint(dir); }),
                                 invalid_input_message([&] {
                                   load_flat_range(dir, read_index(dir), "params", 0, 10);
                                 })}) {
    EXPECT_NE(msg.find(shard.string()), std::string::npos) << msg;
    EXPECT_EQ(msg.find("12345"), std::string::npos) << "reveals the target's size: " << msg;
    EXPECT_EQ(msg.find("secret"), std::string::npos) << "reveals the target's name: " << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(HostileCheckpoint, IndexLinkedToAValidCopyOutsideIsRefused) {
  const Scratch t("index_link");
  const fs::path dir = t / "ckpt";
  save_small(dir);
  const fs::path outside = t / "index-copy.json";
  fs::rename(dir / "index.json", outside);
  fs::create_symlink(outside, dir / "index.json");
  expect_invalid([&] { read_index(dir); }, {"index.json", "symbolic link"});
  expect_invalid([&] { verify_checkpoint(dir); }, {"index.json", "symbolic link"});
}

TEST(HostileCheckpoint, UserNamedFilesMayBeLinks) {
  // A Hugging Face cache's snapshots/<rev>/config.json is a link into blobs/: following links is
  // right for a file the user names; only a checkpoint's own files refuse them.
  const Scratch t("user_link");
  write_bytes(t / "blob", fixture("llama-2-7b.json"));
  fs::create_symlink(t / "blob", t / "config.json");
  EXPECT_EQ(load_hf_config(t / "config.json").layers, 32);
  expect_invalid([&] { read_text_file(t / "config.json", 1 << 20, Symlinks::refuse); },
                 {"config.json", "symbolic link"});
}

// ---- 2. recovery never promotes a link ------------------------------------------------------------

TEST(HostileCheckpoint, RecoveryNeverPromotesALinkedSibling) {
  const Scratch t("recover_link");
  const fs::path elsewhere = t / "other" / "ckpt";
  save_small(elsewhere, 2, 10, /*step=*/99);
  const fs::path dir = t / "run" / "ckpt";
  fs::create_directories(dir.parent_path());
  const fs::path link = t / "run" / "ckpt.tmp-123";
  fs::create_directory_symlink(elsewhere, link);
  const RecoveryReport report = recover_checkpoint(dir);
  EXPECT_TRUE(report.restored_from.empty()) << report.restored_from;
  EXPECT_FALSE(fs::exists(fs::symlink_status(dir)));
  EXPECT_FALSE(fs::exists(fs::symlink_status(link))) << "the stale link is removed";
  EXPECT_EQ(verify_checkpoint(elsewhere).step, 99) << "the link's target is untouched";
}

TEST(HostileCheckpoint, RecoveryStillPromotesARealStagedDirectory) {
  const Scratch t("recover_real");
  const fs::path dir = t / "ckpt";
  save_small(dir, 2, 10, 5);
  fs::rename(dir, t / "ckpt.old-42");  // as the fallback commit leaves it between its renames
  const RecoveryReport report = recover_checkpoint(dir);
  EXPECT_EQ(report.restored_from, t / "ckpt.old-42");
  EXPECT_EQ(verify_checkpoint(dir).step, 5);
}

// ---- 3. loading checks the files before it allocates ------------------------------------------------

// Edits the index of a one-rank checkpoint so that its one group claims `numel` F32 elements.
void claim(const fs::path& dir, std::int64_t numel) {
  json j = json::parse(read_bytes(dir / "index.json"));
  j["groups"][0]["numel"] = numel;
  j["groups"][0]["shards"] = json::array({json::array({0, numel})});
  j["groups"][0]["tensors"][0]["shape"] = json::array({numel});
  write_bytes(dir / "index.json", j.dump());
}

// A checkpoint whose index claims `numel` elements, with no shard on disk.
fs::path index_claiming(const Scratch& t, std::int64_t numel) {
  const fs::path dir = t / ("claim" + std::to_string(numel));
  save_small(dir, 1, 10);
  claim(dir, numel);
  fs::remove(dir / shard_file_name(0, 1));
  return dir;
}

long max_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

TEST(HostileCheckpoint, HugeClaimWithoutShardsIsOneLineNotAnAllocation) {
  const Scratch t("huge_claim");
  // 2^60 elements × 4 bytes = 2^62 bytes: std::bad_alloc (or a sanitizer abort) before the fix.
  const fs::path huge = index_claiming(t, std::int64_t{1} << 60);
  const CheckpointIndex x = read_index(huge);
  expect_invalid([&] { load_flat_range(huge, x, "params", 0, std::int64_t{1} << 60); },
                 {shard_file_name(0, 1), "missing"});
  expect_invalid([&] { load_tensor(huge, x, "params", "w"); }, {"missing"});

  // 2^29 floats = 2 GiB: before the fix allocated and zeroed before noticing the missing shard.
  const fs::path big = index_claiming(t, std::int64_t{1} << 29);
  const long before = max_rss_kib();
  expect_invalid([&] { load_flat_range(big, read_index(big), "params", 0, std::int64_t{1} << 29); },
                 {"missing"});
  EXPECT_LT(max_rss_kib() - before, 256 * 1024) << "KiB of peak RSS added by a failed load";
}

TEST(HostileCheckpoint, ShardSmallerThanTheClaimIsRefusedBeforeAllocating) {
  const Scratch t("short_shard");
  const fs::path dir = t / "ckpt";
  save_small(dir, 1, 10);
  const std::int64_t numel = std::int64_t{1} << 58;
  claim(dir, numel);
  // The shard on disk holds 10 floats; its header says so, the index claims 2^58.
  expect_invalid([&] { load_flat_range(dir, read_index(dir), "params", 0, numel); },
                 {shard_file_name(0, 1), "index.json expects F32 [288230376151711744]"});
}

// ---- 4. NUL bytes and trailing bytes in JSON --------------------------------------------------------

TEST(HostileJson, NulByteThenGarbageIsRejectedEverywhere) {
  const std::string nul_garbage = std::string("\0{\"evil\": [[[ not json", 23);
  expect_invalid([&] { parse_hf_config(fixture("llama-2-7b.json") + nul_garbage, "config.json"); },
                 {"config.json", "not valid JSON", "NUL"});
  expect_invalid([&] { parse_cluster(fixture("cluster-custom.json") + nul_garbage, "c.json"); },
                 {"c.json", "NUL"});
  expect_invalid([&] { parse_calibration(fixture("calibration.json") + nul_garbage, "cal.json"); },
                 {"cal.json", "NUL"});
  // A NUL alone at the end, or inside the object, is no better.
  expect_invalid([&] { parse_cluster(fixture("cluster-custom.json") + std::string(1, '\0'), "c"); },
                 {"NUL"});
}

TEST(HostileJson, IndexWithTrailingObjectAfterNulIsRejected) {
  const Scratch t("index_nul");
  const fs::path dir = t / "ckpt";
  save_small(dir);
  const std::string text = read_bytes(dir / "index.json");
  write_bytes(dir / "index.json", text + std::string(1, '\0') + "{\"step\": 999999}");
  expect_invalid([&] { read_index(dir); }, {"index.json", "NUL"});
  // Without the NUL, trailing text was always an error: it still is.
  write_bytes(dir / "index.json", text + "{\"step\": 999999}");
  expect_invalid([&] { read_index(dir); }, {"index.json", "not valid JSON"});
  // Trailing JSON whitespace is part of JSON: accepted.
  write_bytes(dir / "index.json", text + " \n\t\r\n");
  EXPECT_EQ(read_index(dir).step, 3);
}

// A safetensors file from raw header text and data bytes, the length field computed.
std::string safetensors_bytes(std::string_view header, std::string_view data) {
  std::string out(8, '\0');
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[std::size_t(i)] = char((n >> (8 * i)) & 0xff);
  return out + std::string(header) + std::string(data);
}

TEST(HostileSafetensors, HeaderPaddedWithAnythingButSpacesIsRejected) {
  const std::string valid = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  const auto parse = [](const std::string& file) {
    return parse_safetensors(std::as_bytes(std::span(file)), "t.safetensors");
  };
  EXPECT_EQ(parse(safetensors_bytes(valid + "   ", "xy")).header.tensors.size(), 1u);
  expect_invalid([&] { parse(safetensors_bytes(valid + std::string(1, '\0') + "{\"evil\": [[[", "xy")); },
                 {"t.safetensors", "not valid JSON"});
  expect_invalid([&] { parse(safetensors_bytes(valid + std::string(3, '\0'), "xy")); },
                 {"not valid JSON"});
  expect_invalid([&] { parse(safetensors_bytes(valid + "\n  ", "xy")); },
                 {"not valid JSON", "spaces (0x20) only"});
  // The file reader and the in-memory reader agree.
  const Scratch t("st_pad");
  write_bytes(t / "nul.safetensors", safetensors_bytes(valid + std::string(1, '\0') + "  ", "xy"));
  expect_invalid([&] { read_safetensors(t / "nul.safetensors"); }, {"not valid JSON"});
  expect_invalid([&] { read_safetensors_header(t / "nul.safetensors"); }, {"not valid JSON"});
}

// ---- 5. float → integer range checks are exact ------------------------------------------------------

TEST(HostileJson, FloatAtTwoToThe63IsOutOfRangeNotUndefined) {
  const Scratch t("version_float");
  const fs::path dir = t / "ckpt";
  save_small(dir);
  const std::string text = read_bytes(dir / "index.json");
  write_bytes(dir / "index.json", test::replaced(text, "\"version\": 1", "\"version\": 9223372036854775808.0"));
  const std::string msg = invalid_input_message([&] { read_index(dir); });
  EXPECT_NE(msg.find("version"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("-9223372036854775808"), std::string::npos) << "wrapped: " << msg;
  EXPECT_NE(msg.find("[0, 9223372036854775807]"), std::string::npos) << "exact limit: " << msg;

  // The same rule in every reader's integer fields; the largest double below 2^63 still converts.
  expect_invalid([&] {
    parse_hf_config(test::replaced(fixture("llama-2-7b.json"), "\"num_hidden_layers\": 32",
                                   "\"num_hidden_layers\": 9223372036854775808.0"),
                    "config.json");
  }, {"num_hidden_layers"});
  expect_invalid([&] {
    parse_hf_config(test::replaced(fixture("llama-2-7b.json"), "\"num_hidden_layers\": 32",
                                   "\"num_hidden_layers\": -9223372036854777856.0"),
                    "config.json");
  }, {"num_hidden_layers"});
  expect_invalid([&] {
    parse_cluster(test::replaced(fixture("cluster-custom.json"), "\"gpus_per_node\": 8",
                                 "\"gpus_per_node\": 1e300"),
                  "c.json");
  }, {"gpus_per_node", "[1, 1024]"});
}

// ---- 6. subnormal and other unphysical hardware figures ----------------------------------------------

TEST(HostileJson, SubnormalHardwareFiguresAreRejected) {
  const std::string cluster = fixture("cluster-custom.json");
  expect_invalid([&] { parse_cluster(test::replaced(cluster, "\"mfu\": 0.5", "\"mfu\": 5e-324"), "c"); },
                 {"mfu = 5e-324", "[0.001, 1]"});
  expect_invalid([&] {
    parse_cluster(test::replaced(cluster, "\"bandwidth_gbps\": 50", "\"bandwidth_gbps\": 5e-324"), "c");
  }, {"inter_node.bandwidth_gbps", "[0.001, 100000]"});
  expect_invalid([&] {
    parse_cluster(test::replaced(cluster, "\"checkpoint_write_gbps\": 2",
                                 "\"checkpoint_write_gbps\": 1e-300"),
                  "c");
  }, {"checkpoint_write_gbps"});
  expect_invalid([&] {
    parse_cluster(test::replaced(cluster, "\"memory_gib\": 80", "\"memory_gib\": 1e-300"), "c");
  }, {"memory_gib"});
  const std::string cal = fixture("calibration.json");
  expect_invalid([&] { parse_calibration(test::replaced(cal, "\"mfu\": 0.42", "\"mfu\": 5e-324"), "cal"); },
                 {"mfu"});
  expect_invalid([&] {
    parse_calibration(test::replaced(cal, "\"beta_bytes_per_s\": 3.2e+09", "\"beta_bytes_per_s\": 5e-324"),
                      "cal");
  }, {"intra_node.beta_bytes_per_s", "[1000000, 1e+15]"});
  // Ranges that start at 0 admit 0 but no subnormal, in any reader (fuzzing, 2026-12-05: a
  // point's size_bytes = 1.05e-320, whose reciprocal is inf, was accepted).
  // (Plain strings, not a structured binding: clang 14 cannot capture one in the lambda.)
  for (const auto& edit :
       {std::pair{"\"size_bytes\": 1048576", "\"size_bytes\": 1.0479132348292839e-320"},
        std::pair{"\"seconds_median\": 0.00055", "\"seconds_median\": 5e-324"},
        std::pair{"\"busbw_bytes_per_s\": 2.86e+09", "\"busbw_bytes_per_s\": 2e-310"}}) {
    const std::string from = edit.first, to = edit.second;
    const std::string field = from.substr(1, from.find('"', 1) - 1);
    expect_invalid([&] { parse_calibration(test::replaced(cal, from, to), "cal"); },
                   {"points[0]." + field, "not subnormal"});
  }
  EXPECT_EQ(parse_calibration(test::replaced(cal, "\"busbw_bytes_per_s\": 2.86e+09",
                                             "\"busbw_bytes_per_s\": 0"),
                              "cal").points[0].busbw_bps,
            0.0);
  // The bounds admit the real systems: the fixtures still read.
  EXPECT_EQ(parse_cluster(cluster, "c").mfu, 0.5);
  EXPECT_EQ(parse_calibration(cal, "cal").mfu, 0.42);
}

// ---- 7. messages print exact integers -------------------------------------------------------------

TEST(HostileSafetensors, OutOfRangeReadPrintsTheOffsetUnwrapped) {
  const Scratch t("wrap");
  const std::vector<float> v(100, 1.0f);
  write_safetensors(t / "a.safetensors", {{.name = "v",
                                           .dtype = TensorDType::f32,
                                           .shape = {100},
                                           .data = reinterpret_cast<const std::byte*>(v.data()),
                                           .size_bytes = 400}});
  const SafetensorsHeader h = read_safetensors_header(t / "a.safetensors");
  std::vector<std::byte> out(1);
  const std::string msg = invalid_input_message(
      [&] { read_tensor_bytes(h, h.tensors[0], ~std::uint64_t{0}, out); });
  EXPECT_NE(msg.find("18446744073709551615"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("[18446744073709551615, 0)"), std::string::npos) << "wrapped end: " << msg;
  EXPECT_NE(msg.find("lie outside its 400 bytes"), std::string::npos) << msg;
}

TEST(HostileJson, IntegerLimitsPrintExactly) {
  const Scratch t("exact_limit");
  const fs::path dir = t / "ckpt";
  save_small(dir);
  const std::string text = read_bytes(dir / "index.json");
  write_bytes(dir / "index.json", test::replaced(text, "\"step\": 3", "\"step\": -1"));
  const std::string msg = invalid_input_message([&] { read_index(dir); });
  EXPECT_NE(msg.find("[0, 4611686018427387904]"), std::string::npos) << msg;  // 2^62
  EXPECT_EQ(msg.find("e+18"), std::string::npos) << msg;
}

}  // namespace
}  // namespace tally::io::test_hostile_files
