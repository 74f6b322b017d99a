// `tally run grad-accum` end to end through the real binary under `tally launch` at world sizes
// 1, 2 and 4: the seed's gradient-accumulation criteria ①–⑤ asserted on each rank's JSON.
// No torch here: the ranks are separate processes.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../support/subprocess.hpp"

#ifndef TALLY_BINARY
#error "TALLY_BINARY must name the tally executable"
#endif

namespace {

using tally::subprocess::rank_lines;
using tally::subprocess::Ran;
using tally::subprocess::run_command;
using nlohmann::json;

constexpr double kLimit_s = 120;  // 20 steps × 4 micro-batches; ~3 s per rank on an idle box

std::vector<std::string> launch(int k, std::vector<std::string> command) {
  std::vector<std::string> args = {TALLY_BINARY, "launch", "--nproc", std::to_string(k),
                                   "--timeout", "100", "--"};
  args.insert(args.end(), command.begin(), command.end());
  return args;
}

class GradAccum : public ::testing::TestWithParam<int> {};

TEST_P(GradAccum, EveryCriterionHoldsOnEveryRank) {
  const int k = GetParam();
  const Ran r = run_command(
      launch(k, {TALLY_BINARY, "run", "grad-accum", "--json", "--timeout", "60"}), kLimit_s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::vector<double> losses_rank0;
  for (int rank = 0; rank < k; ++rank) {
    const auto lines = rank_lines(r.out, rank);
    ASSERT_EQ(lines.size(), 1u) << r.out;
    const json j = json::parse(lines[0]);
    SCOPED_TRACE("rank " + std::to_string(rank) + ": " + lines[0]);
    EXPECT_EQ(j["world_size"], k);
    EXPECT_EQ(j["micro_batches"], 4);
    EXPECT_EQ(j["micro_batch_samples"], 64 / (4 * k));
    // ① loss/K over K = 4 micro-batches = one big batch (float64), and = one process on all 64.
    EXPECT_LT(j["max_accum_vs_big_batch"].get<double>(), 1e-6);
    EXPECT_LT(j["max_accum_vs_full_batch"].get<double>(), 1e-6);
    // ② without the 1/K the gradient is exactly K times as large.
    EXPECT_LT(j["unnormalized_relative_error"].get<double>(), 1e-5);
    // ③ 3 effective steps at K = 4: 3 optimizer steps, 12 backward passes (and DDP's hooks agree).
    EXPECT_EQ(j["optimizer_steps_counted"], 3);
    EXPECT_EQ(j["backward_calls_counted"], 12);
    EXPECT_EQ(j["ddp_backward_passes_counted"], 12);
    // ④ 20 SGD steps at lr 0.1: the loss goes down.
    const auto losses = j["step_losses"].get<std::vector<double>>();
    ASSERT_EQ(losses.size(), 20u);
    EXPECT_LT(j["last5_mean_loss"].get<double>(), j["first5_mean_loss"].get<double>());
    EXPECT_LT(losses.back(), losses.front());
    if (rank == 0) losses_rank0 = losses;
    EXPECT_EQ(losses, losses_rank0) << "the global loss is averaged over ranks";
    // ⑤ one gradient sync per optimizer step: 20 sync events, 1 bucket, 20 all-reduce calls for
    // 80 backward passes; the 60 no_sync passes sent nothing.
    EXPECT_EQ(j["optimizer_steps"], 20);
    EXPECT_EQ(j["backward_calls"], 80);
    EXPECT_EQ(j["sync_events"], 20);
    EXPECT_EQ(j["buckets"], 1);
    EXPECT_EQ(j["bucket_all_reduces"], 20);
    EXPECT_EQ(j["comm_all_reduce_calls"], 20);
    EXPECT_EQ(j["no_sync_backward_passes"], 60);
    // Bytes per optimizer step: 2S(k−1)/k with S = 676 float64 gradients — independent of K.
    const double S = 676 * 8;
    EXPECT_DOUBLE_EQ(j["gradient_bytes_per_optimizer_step"].get<double>(), 2 * S * (k - 1) / k);
    EXPECT_EQ(j["wire_dtype"], "float64");
    EXPECT_TRUE(j["ok"].get<bool>());
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GradAccum, ::testing::Values(1, 2, 4),
                         [](const auto& info) { return "k" + std::to_string(info.param); });

TEST(GradAccumText, PrintsEachCriterion) {
  const Ran r = run_command(launch(2, {TALLY_BINARY, "run", "grad-accum", "--timeout", "60"}),
                            kLimit_s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto lines = rank_lines(r.out, 1);
  ASSERT_EQ(lines.size(), 7u) << r.out;
  EXPECT_EQ(lines[0].rfind("grad-accum: rank 1 of world 2 (float64, K = 4", 0), 0u) << lines[0];
  for (int i = 1; i <= 5; ++i) EXPECT_NE(lines[i].find(": ok"), std::string::npos) << lines[i];
  EXPECT_NE(lines[5].find("⑤ sync events 20 = optimizer steps 20"), std::string::npos) << lines[5];
}

TEST(GradAccumInput, MicroBatchesNotDividingTheShardIsBadInput) {
  const Ran r = run_command(
      launch(1, {TALLY_BINARY, "run", "grad-accum", "--micro-batches", "3"}), kLimit_s);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("WORLD_SIZE × --micro-batches = 1 × 3 does not divide the 64 samples"),
            std::string::npos)
      << r.err;
  const Ran s = run_command(launch(1, {TALLY_BINARY, "run", "grad-accum", "--steps", "4"}), kLimit_s);
  EXPECT_NE(s.err.find("--steps = 4: must be in [10, 100000]"), std::string::npos) << s.err;
}

}  // namespace
