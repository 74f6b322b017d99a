// `tally run checkpoint` end to end through the real binary under `tally launch` at world sizes 2
// and 4: the seed's save_sharded / load_sharded criteria ①–⑤ and exact resume (checkpoint.hpp),
// asserted on each rank's JSON lines and on the files the runs leave, read back with io and with an
// independent reader (tests/io/read_safetensors.py: json + numpy). No torch here: the ranks are
// separate processes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "../support/temp_dir.hpp"
#include "../support/subprocess.hpp"
#include "tally/engine/experiments/checkpoint.hpp"
#include "tally/io/checkpoint.hpp"
#include "tally/io/safetensors.hpp"

#ifndef TALLY_BINARY
#error "TALLY_BINARY must name the tally executable"
#endif

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using tally::subprocess::rank_lines;
using tally::subprocess::Ran;
using tally::subprocess::run_command;

constexpr double kLimit_s = 90;  // one launch; a rank needs ~3 s to start, a loaded box more
const std::string kPython = "/usr/bin/python3";
const std::string kReader = std::string(TALLY_SOURCE_DIR) + "/tests/io/read_safetensors.py";

// The run's defaults (experiments/checkpoint.hpp): MLP 32→128→128→10, seed 1234, n 1024, B 48.
constexpr std::int64_t kParams = 32 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10;  // N = 22026
constexpr std::uint64_t kSeed = 1234;
constexpr std::int64_t kSamples = 1024;
constexpr std::int64_t kBatch = 48;

using TempDir = ::tally::test::TempDir;  // tests/support/temp_dir.hpp
using ::tally::test::names_in;
using ::tally::test::ScopedEnv;

// Each rank's JSON lines, split into events (by kind) and the final result.
struct RankOutput {
  std::map<std::string, std::vector<json>> events;
  json result;
};

struct LaunchRun {
  Ran ran;
  std::vector<RankOutput> ranks;
};

// An empty dir: no --dir (the run's temporary directory).
LaunchRun launch_checkpoint(int k, const fs::path& dir, std::vector<std::string> args) {
  std::vector<std::string> cmd = {TALLY_BINARY, "launch", "--nproc", std::to_string(k),
                                  "--timeout", "80", "--", TALLY_BINARY, "run", "checkpoint",
                                  "--json", "--timeout", "30"};
  if (!dir.empty()) cmd.insert(cmd.end(), {"--dir", dir.string()});
  cmd.insert(cmd.end(), args.begin(), args.end());
  LaunchRun run;
  run.ran = run_command(cmd, kLimit_s);
  for (int rank = 0; rank < k; ++rank) {
    RankOutput out;
    for (const std::string& line : rank_lines(run.ran.out, rank)) {
      const json j = json::parse(line, nullptr, false);
      EXPECT_FALSE(j.is_discarded()) << "rank " << rank << ": " << line;
      if (j.is_discarded()) continue;
      if (j["event"] == "result")
        out.result = j;
      else
        out.events[j["event"].get<std::string>()].push_back(j);
    }
    run.ranks.push_back(std::move(out));
  }
  return run;
}

std::string crc_of_bytes(const std::vector<std::byte>& bytes) {
  return tally::io::crc32c_hex(tally::io::crc32c(bytes));
}

// The batch a run takes at stream position p (Note [sample stream]).
std::vector<std::int64_t> batch_at(std::int64_t position) {
  return tally::engine::sample_indices(kSeed, kSamples, position, kBatch);
}

class Checkpoint : public ::testing::TestWithParam<int> {};

// ①②③ and the files on disk, plus ⑤'s independent reader on every shard.
TEST_P(Checkpoint, SaveZeroLoadIsBitExactAndShardsHoldTheStateOnce) {
  const int k = GetParam();
  TempDir tmp;
  const fs::path dir = tmp.path / "ckpt";
  const LaunchRun run = launch_checkpoint(k, dir, {"--steps", "6", "--save-every", "3"});
  ASSERT_EQ(run.ran.exit_code, 0) << run.ran.out << run.ran.err;
  std::string params_crc;
  for (int rank = 0; rank < k; ++rank) {
    const json& r = run.ranks[std::size_t(rank)].result;
    SCOPED_TRACE("rank " + std::to_string(rank) + ": " + r.dump());
    ASSERT_TRUE(r.contains("roundtrip"));
    const json& t = r["roundtrip"];
    EXPECT_EQ(r["n_params"], kParams);
    // ① zeroed, loaded: bit-identical params and Adam m, v (fp32).
    EXPECT_TRUE(t["params_bit_exact"].get<bool>());
    EXPECT_TRUE(t["optimizer_bit_exact"].get<bool>());
    EXPECT_EQ(t["max_abs_diff"].get<double>(), 0.0);
    // ② step, consumed_samples, seed (and the rest of the training state) round-trip.
    EXPECT_EQ(t["step_saved"], 6);
    EXPECT_EQ(t["step_read"], 6);
    EXPECT_EQ(t["consumed_saved"], 6 * kBatch);
    EXPECT_EQ(t["consumed_read"], 6 * kBatch);
    EXPECT_EQ(t["seed_read"], kSeed);
    EXPECT_TRUE(t["rng_state_equal"].get<bool>());
    EXPECT_TRUE(t["lr_schedule_equal"].get<bool>());
    // ③ params + m + v = 12N (core's fp32 Adam 16N minus the 4N of gradients) within 5 %; the
    // difference is k safetensors headers. Not k× (every rank writing everything).
    EXPECT_DOUBLE_EQ(t["predicted_bytes"].get<double>(), 12.0 * kParams);
    const double on_disk = t["shard_bytes_on_disk"].get<double>();
    EXPECT_GT(on_disk, 12.0 * kParams);  // the headers
    EXPECT_LT(std::abs(on_disk / (12.0 * kParams) - 1), 0.05);
    EXPECT_LT(on_disk, 0.6 * t["full_copy_bytes"].get<double>());
    EXPECT_NE(t["convention"].get<std::string>().find("fp32"), std::string::npos);
    EXPECT_TRUE(r["ok"].get<bool>());
    EXPECT_EQ(run.ranks[std::size_t(rank)].events.at("saved").size(), 2u);  // steps 3 and 6
    if (rank == 0) params_crc = r["params_crc32c"];
    EXPECT_EQ(r["params_crc32c"], params_crc);  // the replicas agree
  }

  // The directory: k shards + index.json + its checksum; no staging left; liveness files gone.
  const tally::io::CheckpointIndex index = tally::io::verify_checkpoint(dir);
  EXPECT_EQ(index.world_size, k);
  EXPECT_EQ(index.step, 6);
  EXPECT_EQ(index.consumed_samples, 6 * kBatch);
  EXPECT_EQ(index.seed, kSeed);
  EXPECT_EQ(index.lr_schedule.step, 6);
  EXPECT_FALSE(index.rng_state.empty());
  ASSERT_EQ(index.groups.size(), 3u);
  double shard_bytes = 0;
  std::size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    ++entries;
    if (e.path().extension() == ".safetensors") shard_bytes += double(fs::file_size(e.path()));
  }
  EXPECT_EQ(entries, std::size_t(k) + 2);
  EXPECT_EQ(shard_bytes, run.ranks[0].result["roundtrip"]["shard_bytes_on_disk"].get<double>());
  for (const auto& e : fs::directory_iterator(tmp.path))
    EXPECT_EQ(e.path(), dir) << "left behind: " << e.path();
  // What is on disk is the model the run ended with: the CRC of the whole flat params group.
  EXPECT_EQ(crc_of_bytes(tally::io::load_flat_range(dir, index, "params", 0, kParams)), params_crc);

  // ⑤ the independent reader (json + numpy) sees every tensor of every shard as io does.
  for (int rank = 0; rank < k; ++rank) {
    const fs::path shard = dir / tally::io::shard_file_name(rank, k);
    const Ran py = run_command({kPython, kReader, shard.string()}, 30);
    ASSERT_EQ(py.exit_code, 0) << py.err;
    const tally::io::SafetensorsFile file = tally::io::read_safetensors(shard);
    std::istringstream lines(py.out);
    std::map<std::string, std::string> meta;
    int tensors = 0;
    for (std::string line; std::getline(lines, line);) {
      std::vector<std::string> f;
      std::istringstream cols(line);
      for (std::string c; std::getline(cols, c, '\t');) f.push_back(c);
      if (f[0] == "meta") meta[f[1]] = f[2];
      if (f[0] != "tensor") continue;
      ++tensors;
      const std::string& name = f[1];
      const tally::io::FlatGroup* g = index.find_group(name);
      ASSERT_NE(g, nullptr) << name;
      const std::int64_t count = g->shards[std::size_t(rank)].count;
      EXPECT_EQ(f[2], "F32");
      EXPECT_EQ(f[3], "[" + std::to_string(count) + "]");
      const auto bytes = file.bytes(name);
      std::uint64_t byte_sum = 0;
      double sum = 0;
      std::vector<float> values(bytes.size() / 4);
      std::memcpy(values.data(), bytes.data(), bytes.size());
      for (std::byte b : bytes) byte_sum += std::uint64_t(b);
      for (float v : values) sum += v;
      EXPECT_EQ(std::stoull(f[5]), byte_sum) << name;  // every byte, exactly
      EXPECT_NEAR(std::stod(f[4]), sum, 1e-9 * (1 + std::abs(sum))) << name;
      const json first = json::parse(f[6]);
      for (std::size_t i = 0; i < first.size(); ++i)
        EXPECT_EQ(std::strtod(first[i].get<std::string>().c_str(), nullptr), double(values[i]));
      // The shard's range of the group, through io's resharding reader, is the same bytes.
      const auto via_index =
          tally::io::load_flat_range(dir, index, name, g->shards[std::size_t(rank)].offset, count);
      EXPECT_TRUE(std::equal(via_index.begin(), via_index.end(), bytes.begin(), bytes.end()));
    }
    EXPECT_EQ(tensors, 3);
    EXPECT_EQ(meta["format"], "tally-checkpoint");
    EXPECT_EQ(meta["rank"], std::to_string(rank));
    EXPECT_EQ(meta["world_size"], std::to_string(k));
    EXPECT_EQ(meta["step"], "6");
  }
}

// n steps, save, every process gone, resume (new processes) for n more == 2n steps straight.
TEST_P(Checkpoint, ResumeInNewProcessesIsBitIdenticalToTrainingStraight) {
  const int k = GetParam();
  TempDir tmp;
  const LaunchRun straight = launch_checkpoint(k, tmp.path / "a", {"--steps", "8", "--no-roundtrip"});
  ASSERT_EQ(straight.ran.exit_code, 0) << straight.ran.out << straight.ran.err;
  const LaunchRun first = launch_checkpoint(k, tmp.path / "b", {"--steps", "4", "--no-roundtrip"});
  ASSERT_EQ(first.ran.exit_code, 0) << first.ran.out << first.ran.err;
  const LaunchRun resumed =
      launch_checkpoint(k, tmp.path / "b", {"--steps", "8", "--resume", "--no-roundtrip"});
  ASSERT_EQ(resumed.ran.exit_code, 0) << resumed.ran.out << resumed.ran.err;
  for (int rank = 0; rank < k; ++rank) {
    const json& a = straight.ranks[std::size_t(rank)].result;
    const json& b1 = first.ranks[std::size_t(rank)].result;
    const json& b2 = resumed.ranks[std::size_t(rank)].result;
    SCOPED_TRACE("rank " + std::to_string(rank));
    ASSERT_EQ(a["steps"].size(), 8u);
    ASSERT_EQ(b1["steps"].size(), 4u);
    ASSERT_EQ(b2["steps"].size(), 4u);
    EXPECT_FALSE(b1["resumed"].get<bool>());
    EXPECT_TRUE(b2["resumed"].get<bool>());
    EXPECT_EQ(b2["loaded_world_size"], k);
    EXPECT_EQ(b2["start_step"], 4);
    EXPECT_EQ(b2["start_consumed_samples"], 4 * kBatch);
    // Every step's loss, gradient norm and learning rate, exactly (JSON doubles round-trip).
    for (int s = 0; s < 8; ++s) {
      const json& want = a["steps"][std::size_t(s)];
      const json& got = s < 4 ? b1["steps"][std::size_t(s)] : b2["steps"][std::size_t(s - 4)];
      EXPECT_EQ(got["step"], s + 1);
      EXPECT_EQ(got["loss"].get<double>(), want["loss"].get<double>()) << "step " << s + 1;
      EXPECT_EQ(got["grad_norm"].get<double>(), want["grad_norm"].get<double>()) << "step " << s + 1;
      EXPECT_EQ(got["lr"].get<double>(), want["lr"].get<double>());
      EXPECT_EQ(got["consumed_samples"], want["consumed_samples"]);
    }
    // The parameters and the optimizer state at the end, bit for bit.
    EXPECT_EQ(b2["params_crc32c"], a["params_crc32c"]);
    EXPECT_EQ(b2["optimizer_crc32c"], a["optimizer_crc32c"]);
    EXPECT_EQ(b2["loaded_params_crc32c"], b1["params_crc32c"]);
    // The resumed run's first batches continue the stream at position 4B.
    ASSERT_EQ(b2["batches"].size(), 3u);
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(b2["batches"][std::size_t(i)]["sample_indices"].get<std::vector<std::int64_t>>(),
                batch_at((4 + i) * kBatch));
  }
  // Training moved the model: the loss fell from the first steps.
  EXPECT_LT(straight.ranks[0].result["steps"][7]["loss"].get<double>(),
            straight.ranks[0].result["steps"][0]["loss"].get<double>());
}

// ⑤ resharding: saved at k, loaded at k' ≠ k; the loaded state is the saved one, bit for bit.
TEST_P(Checkpoint, SavedAtOneWorldSizeLoadsAtAnother) {
  const int k = GetParam();
  const int k2 = k == 2 ? 4 : 2;
  TempDir tmp;
  const fs::path dir = tmp.path / "ckpt";
  const LaunchRun saved = launch_checkpoint(k, dir, {"--steps", "4", "--no-roundtrip"});
  ASSERT_EQ(saved.ran.exit_code, 0) << saved.ran.out << saved.ran.err;
  const LaunchRun loaded = launch_checkpoint(k2, dir, {"--steps", "6", "--resume"});
  ASSERT_EQ(loaded.ran.exit_code, 0) << loaded.ran.out << loaded.ran.err;
  for (int rank = 0; rank < k2; ++rank) {
    const json& r = loaded.ranks[std::size_t(rank)].result;
    SCOPED_TRACE("rank " + std::to_string(rank) + " of " + std::to_string(k2));
    EXPECT_TRUE(r["resumed"].get<bool>());
    EXPECT_EQ(r["loaded_world_size"], k);
    EXPECT_EQ(r["world_size"], k2);
    EXPECT_EQ(r["start_step"], 4);
    EXPECT_EQ(r["loaded_params_crc32c"], saved.ranks[0].result["params_crc32c"]);
    EXPECT_EQ(r["loaded_optimizer_crc32c"], saved.ranks[0].result["optimizer_crc32c"]);
    EXPECT_EQ(r["steps"].size(), 2u);
    EXPECT_TRUE(r["roundtrip"]["params_bit_exact"].get<bool>());  // ① at k' too
    EXPECT_TRUE(r["ok"].get<bool>());
  }
  EXPECT_EQ(tally::io::verify_checkpoint(dir).world_size, k2);
}

// Without --dir (Note [default checkpoint directory]): every rank uses the one fresh temporary
// directory rank 0 made, the run succeeds, and nothing is left behind. TMPDIR points the ranks at
// a directory the test watches.
TEST_P(Checkpoint, WithoutDirUsesOneTemporaryDirectoryAndLeavesNothing) {
  const int k = GetParam();
  TempDir tmp;
  const ScopedEnv tmpdir("TMPDIR", tmp.path.string());
  const LaunchRun run = launch_checkpoint(k, {}, {"--steps", "4", "--save-every", "2"});
  ASSERT_EQ(run.ran.exit_code, 0) << run.ran.out << run.ran.err;
  ASSERT_EQ(run.ranks[0].events.at("started").size(), 1u) << run.ran.out;
  const fs::path dir = run.ranks[0].events.at("started")[0]["dir"].get<std::string>();
  // <TMPDIR>/tally-checkpoint-XXXXXX/ckpt
  EXPECT_EQ(dir.filename(), "ckpt");
  EXPECT_EQ(dir.parent_path().parent_path(), tmp.path);
  EXPECT_EQ(dir.parent_path().filename().string().rfind("tally-checkpoint-", 0), 0u) << dir;
  for (int rank = 0; rank < k; ++rank) {
    const RankOutput& out = run.ranks[std::size_t(rank)];
    SCOPED_TRACE("rank " + std::to_string(rank) + ": " + out.result.dump());
    ASSERT_EQ(out.events.at("started").size(), 1u);
    EXPECT_EQ(out.events.at("started")[0]["dir"], dir.string());
    EXPECT_TRUE(out.events.at("started")[0]["dir_temporary"].get<bool>());
    EXPECT_EQ(out.result["dir"], dir.string());
    EXPECT_TRUE(out.result["dir_temporary"].get<bool>());
    EXPECT_EQ(out.result["dir_removed"].get<bool>(), rank == 0);  // rank 0 removes it
    EXPECT_EQ(out.result["saves"].size(), 2u);                    // steps 2 and 4, in it
    EXPECT_TRUE(out.result["roundtrip"]["params_bit_exact"].get<bool>());
    EXPECT_TRUE(out.result["ok"].get<bool>());
  }
  EXPECT_EQ(names_in(tmp.path), std::vector<std::string>{}) << "left behind in " << tmp.path;
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Checkpoint, ::testing::Values(2, 4),
                         [](const auto& info) { return "k" + std::to_string(info.param); });

// ④ a resume that drops consumed_samples restarts the data stream; a correct one continues it.
TEST(CheckpointConsumedSamples, ForcedToZeroRestartsTheStreamCorrectResumeContinues) {
  TempDir tmp;
  const fs::path dir = tmp.path / "ckpt", copy = tmp.path / "copy";
  const LaunchRun first = launch_checkpoint(2, dir, {"--steps", "4", "--no-roundtrip"});
  ASSERT_EQ(first.ran.exit_code, 0) << first.ran.out << first.ran.err;
  fs::copy(dir, copy, fs::copy_options::recursive);

  // The broken resume, in text: it says what it did and prints the batches it takes.
  const Ran broken = run_command(
      {TALLY_BINARY, "launch", "--nproc", "2", "--timeout", "80", "--", TALLY_BINARY, "run",
       "checkpoint", "--timeout", "30", "--dir", dir.string(), "--resume", "--steps", "7",
       "--consumed-samples-override", "0", "--no-roundtrip"},
      kLimit_s);
  ASSERT_EQ(broken.exit_code, 0) << broken.out << broken.err;
  const std::string text = broken.out;
  EXPECT_NE(text.find("④ consumed_samples forced to 0 (the checkpoint says 192)"), std::string::npos)
      << text;
  // Its steps 5, 6, 7 take the samples of steps 1, 2, 3 — the fresh run's first batches.
  for (int i = 0; i < 3; ++i) {
    const auto want = first.ranks[0].result["batches"][std::size_t(i)]["sample_indices"]
                          .get<std::vector<std::int64_t>>();
    EXPECT_EQ(want, batch_at(i * kBatch));
    std::string shown = "[";
    for (int j = 0; j < 8; ++j) shown += (j ? ", " : "") + std::to_string(want[std::size_t(j)]);
    EXPECT_NE(text.find("④ step " + std::to_string(5 + i) + " takes samples " + shown + ", …] "
                        "(stream position " + std::to_string(i * kBatch) + ")"),
              std::string::npos)
        << text;
  }

  // The correct resume continues at position 4B = 192.
  const LaunchRun correct = launch_checkpoint(2, copy, {"--resume", "--steps", "7", "--no-roundtrip"});
  ASSERT_EQ(correct.ran.exit_code, 0) << correct.ran.out << correct.ran.err;
  const json& r = correct.ranks[0].result;
  EXPECT_FALSE(r["consumed_overridden"].get<bool>());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r["batches"][std::size_t(i)]["step"], 5 + i);
    EXPECT_EQ(r["batches"][std::size_t(i)]["sample_indices"].get<std::vector<std::int64_t>>(),
              batch_at((4 + i) * kBatch));
    EXPECT_NE(batch_at((4 + i) * kBatch), batch_at(i * kBatch));
  }
}

// --keep: the temporary directory stays, holding a checkpoint that verifies and nothing else (the
// liveness locks are gone); the text names it at the start and at the end.
TEST(CheckpointTemporaryDir, KeepLeavesTheVerifiedCheckpointAndSaysWhere) {
  TempDir tmp;
  const ScopedEnv tmpdir("TMPDIR", tmp.path.string());
  const Ran r = run_command({TALLY_BINARY, "launch", "--nproc", "2", "--timeout", "80", "--",
                             TALLY_BINARY, "run", "checkpoint", "--timeout", "30", "--steps", "3",
                             "--keep"},
                            kLimit_s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::vector<std::string> roots = names_in(tmp.path);
  ASSERT_EQ(roots.size(), 1u) << r.out;
  const fs::path root = tmp.path / roots[0];
  EXPECT_EQ(roots[0].rfind("tally-checkpoint-", 0), 0u);
  EXPECT_NE(r.out.find("[rank 0] checkpoint: fresh start (seed 1234); checkpoint directory " +
                       (root / "ckpt").string() + " (temporary, kept: --keep)\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("[rank 0] checkpoint: temporary directory " + root.string() + " kept\n"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(names_in(root), std::vector<std::string>{"ckpt"});
  const tally::io::CheckpointIndex index = tally::io::verify_checkpoint(root / "ckpt");
  EXPECT_EQ(index.step, 3);
  EXPECT_EQ(index.world_size, 2);
}

TEST(CheckpointSampleStream, IsAPermutationPerEpochAndDependsOnTheSeed) {
  const auto epoch0 = tally::engine::sample_indices(kSeed, 10, 0, 10);
  auto sorted = epoch0;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<std::int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  const auto epoch1 = tally::engine::sample_indices(kSeed, 10, 10, 10);
  EXPECT_NE(epoch0, epoch1);  // reshuffled each epoch
  EXPECT_NE(epoch0, tally::engine::sample_indices(kSeed + 1, 10, 0, 10));
  // A batch straddling the epoch boundary is the end of one epoch and the start of the next.
  const auto straddle = tally::engine::sample_indices(kSeed, 10, 7, 6);
  EXPECT_EQ(straddle, (std::vector<std::int64_t>{epoch0[7], epoch0[8], epoch0[9], epoch1[0],
                                                 epoch1[1], epoch1[2]}));
}

TEST(CheckpointInput, BadFlagsExitTwoNamingTheFlag) {
  TempDir tmp;
  const Ran r = run_command({TALLY_BINARY, "launch", "--nproc", "2", "--timeout", "60", "--",
                             TALLY_BINARY, "run", "checkpoint", "--dir",
                             (tmp.path / "c").string(), "--batch", "47"},
                            kLimit_s);
  EXPECT_EQ(r.exit_code, 1) << r.err;  // launch: a rank failed (each exits 2)
  EXPECT_NE(r.err.find("--batch = 47: must be divisible by WORLD_SIZE = 2"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("exited with status 2"), std::string::npos) << r.err;
  const Ran phase = run_command({TALLY_BINARY, "run", "checkpoint", "--dir", "x", "--kill-rank",
                                 "1", "--kill-phase", "later"},
                                30);
  EXPECT_EQ(phase.exit_code, 2);
  EXPECT_NE(phase.err.find("--kill-phase"), std::string::npos) << phase.err;
}

// Sampled consistency (Note [consistency check]): 3 ranks with gradient accumulation, replicas
// compared every 2 steps; rank 1 flips a bit of its first weight after step 3's update. The check
// at step 2 agrees bit for bit; the one at step 4 names rank 1 — the other two agree with each
// other — and every rank stops there (exit 1), before any save: nothing is committed.
TEST(CheckpointConsistency, NamesTheRankWhoseWeightsWerePerturbed) {
  TempDir tmp;
  const fs::path dir = tmp.path / "ckpt";
  const LaunchRun run = launch_checkpoint(
      3, dir, {"--steps", "6", "--grad-accum", "2", "--consistency-every", "2",
               "--inject-perturb-rank", "1", "--inject-perturb-at-step", "3", "--no-roundtrip"});
  EXPECT_EQ(run.ran.exit_code, 1) << run.ran.out << run.ran.err;
  for (int rank = 0; rank < 3; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank) + ":\n" + run.ran.out + run.ran.err);
    const auto it = run.ranks[std::size_t(rank)].events.find("consistency");
    ASSERT_NE(it, run.ranks[std::size_t(rank)].events.end());
    const std::vector<json>& checks = it->second;
    ASSERT_EQ(checks.size(), 2u);
    EXPECT_EQ(checks[0]["step"], 2);
    EXPECT_EQ(checks[0]["disagreeing_ranks"], json::array());
    const auto losses0 = checks[0]["losses"].get<std::vector<double>>();
    ASSERT_EQ(losses0.size(), 3u);
    EXPECT_EQ(losses0[0], losses0[1]);
    EXPECT_EQ(losses0[0], losses0[2]);
    EXPECT_EQ(checks[1]["step"], 4);
    EXPECT_EQ(checks[1]["disagreeing_ranks"], json::array({1}));
    const auto losses = checks[1]["losses"].get<std::vector<double>>();
    const auto norms = checks[1]["grad_norms"].get<std::vector<double>>();
    EXPECT_EQ(losses[0], losses[2]);
    EXPECT_EQ(norms[0], norms[2]);
    EXPECT_TRUE(losses[1] != losses[0] || norms[1] != norms[0]);
    EXPECT_NE(run.ran.err.find("[rank " + std::to_string(rank) +
                               "] tally: error: consistency check at step 4: rank 1 disagrees "
                               "with the majority (2 of 3 ranks) on the reference batch"),
              std::string::npos);
    EXPECT_TRUE(run.ranks[std::size_t(rank)].result.is_null()) << "the run must stop at step 4";
    EXPECT_EQ(run.ranks[std::size_t(rank)].events.count("saved"), 0u) << "nothing saved";
  }
  EXPECT_FALSE(fs::exists(dir / "index.json"));
}

}  // namespace
