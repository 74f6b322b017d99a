// Pipeline parallelism (issue 11; tally/engine/experiments/pp.hpp, engine/runtime/pp_model.hpp)
// over real processes on loopback:
//   equivalence  float64 mean loss and every stage's gradients vs the single-process GPT run on the
//                same micro-batches ≤ 1e-10 relative, for P = 4 and 2, GPipe and 1F1B at
//                M ∈ {1, P, 2P+1}, interleaved at M ∈ {P, 2P} (one launch per P: --sweep);
//   order        each stage's executed operations == core's schedule (core's schedules are tested
//                against the papers' orders in tests/core/test_pipeline.cpp);
//   bytes        every send = B·T·C·8 bytes = 2·8·16·8 = 2048 (one float64 activation or
//                gradient of one micro-batch, Narayanan 2021 §3.2's b·s·h per boundary), and the
//                number of sends by hand: a stage sends one activation per chunk-forward except
//                on the last virtual stage, one gradient per chunk-backward except on the first;
//   memory       stage 0's activations held at peak, in forwards' worth, within one forward of
//                the in-flight count by hand (P for 1F1B, M for GPipe, Megatron's warm-up + 1
//                interleaved);
//   the CLI      bad layouts exit 2 with one line naming the flag; `tally launch --nproc 3 --
//                tally run pp --layers 7 --json` (uneven stages 2+2+3) reports measured beside
//                predicted.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "rank_harness.hpp"
#include "../support/subprocess.hpp"
#include "tally/engine/experiments/pp.hpp"

#ifndef TALLY_BINARY
#error "TALLY_BINARY must name the tally executable"
#endif

namespace tally::engine::exp_pp {
namespace {

using nlohmann::json;
using subprocess::Ran;
using subprocess::rank_lines;
using subprocess::run_command;

constexpr double kLimit_s = 90;  // one run of P ranks on a loaded 2-core box; ctest's 300 s backstop

// h 16, a 4, V 32, T 8, B 2: S = 2·8·16 float64 = 2048 bytes per send.
PpOptions tiny(int layers) {
  return {.sweep = true,
          .model = {.hidden = 16, .layers = layers, .heads = 4, .vocab = 32, .seq = 8,
                    .micro_batch = 2},
          .steps = 0,
          .timeout_s = 60};
}
constexpr double kSendBytes = 2 * 8 * 16 * 8.0;

std::string message(PpOptions o, int world) {
  try {
    o.validate(world);
  } catch (const InvalidInput& e) {
    return e.what();
  }
  return "no throw";
}

TEST(PpOptions, BadLayoutsNameTheFlagAndTheSweepsShapes) {
  PpOptions o = tiny(3);
  o.sweep = false;
  EXPECT_EQ(message(o, 4), "--pp = 4: must be <= --layers = 3 (one layer per stage at least)");
  o = tiny(6);
  o.sweep = false;
  o.schedule = PipelineSchedule::interleaved;
  o.interleave = 2;  // 6 layers over 4 stages: 1+1+2+2
  o.micro_batches = 4;
  EXPECT_EQ(message(o, 4), "--interleave = 2: must divide the layers of every stage (stage 0 holds "
                           "1 of --layers = 6 over --pp = 4)");
  o.model.layers = 8;
  o.micro_batches = 6;
  EXPECT_EQ(message(o, 4),
            "--micro-batches = 6: must be a multiple of --pp = 4 for the interleaved schedule");
  o.schedule = PipelineSchedule::gpipe;
  EXPECT_EQ(message(o, 4), "--interleave = 2: needs --schedule interleaved (gpipe and 1f1b run one "
                           "chunk per stage)");
  o = tiny(8);
  o.pp = 2;
  EXPECT_EQ(message(o, 4),
            "--pp = 2: must equal the world size 4 (tally run pp runs one PP group over every rank)");
  // The sweep's runs at P = 4: the M values, in order.
  const auto runs = tiny(8).runs(4);
  ASSERT_EQ(runs.size(), 8u);
  EXPECT_EQ(runs[0].schedule, PipelineSchedule::gpipe);
  EXPECT_EQ(runs[2].micro_batches, 9);
  EXPECT_EQ(runs[3].schedule, PipelineSchedule::one_f_one_b);
  EXPECT_EQ(runs[6].schedule, PipelineSchedule::interleaved);
  EXPECT_EQ(runs[6].micro_batches, 4);
  EXPECT_EQ(runs[7].micro_batches, 8);
  EXPECT_EQ(runs[7].interleave, 2);
}

void expect_run_matches(const PpRun& run, int P) {
  const int M = run.spec.micro_batches, v = run.spec.interleave;
  SCOPED_TRACE(std::string(to_string(run.spec.schedule)) + " M=" + std::to_string(M) +
               " v=" + std::to_string(v));
  EXPECT_LE(std::abs(run.loss_f64 - run.reference_loss_f64) / run.reference_loss_f64, 1e-10);
  ASSERT_EQ(int(run.stages.size()), P);
  EXPECT_DOUBLE_EQ(run.predicted_send_bytes, kSendBytes);
  for (int s = 0; s < P; ++s) {
    const PpStageMeasure& st = run.stages[std::size_t(s)];
    EXPECT_LE(st.max_grad_rel_diff, 1e-10) << "stage " << s;
    EXPECT_TRUE(st.order_ok) << "stage " << s;
    EXPECT_EQ(st.activation_sends, v * M - (s == P - 1 ? M : 0)) << "stage " << s;
    EXPECT_EQ(st.gradient_sends, v * M - (s == 0 ? M : 0)) << "stage " << s;
    if (st.activation_sends + st.gradient_sends > 0) {
      EXPECT_EQ(st.min_send_bytes, kSendBytes);
      EXPECT_EQ(st.max_send_bytes, kSendBytes);
    }
  }
  // Stage 0 holds min(P, M) micro-batches' activations under 1F1B, M under GPipe; interleaved,
  // its (P−1)·2 + (v−1)·P warm-up chunk-forwards plus the steady state's first, at most all v·M
  // (reached when M = P). Measured by the allocator in (chunk-)forwards' worth; not exact
  // (the received inputs' gradients, autograd's buffers): within one forward.
  const int warm = (P - 1) * 2 + (v - 1) * P;
  const int expect = run.spec.schedule == PipelineSchedule::gpipe         ? M
                     : run.spec.schedule == PipelineSchedule::one_f_one_b ? std::min(P, M)
                                                                          : std::min(warm + 1, v * M);
  EXPECT_EQ(run.predicted_in_flight, expect);
  EXPECT_NEAR(run.stages[0].in_flight(), expect, 1.0);
}

// One launch per P runs the whole sweep. P = 4 over 8 layers (2 per stage, v = 2); P = 2 over 6
// (3 per stage, v = 3).
TEST(PpEquivalence, SweepP4AndP2) {
  for (const auto& [P, layers, v] : {std::tuple{4, 8, 2}, std::tuple{2, 6, 3}}) {
    SCOPED_TRACE("P=" + std::to_string(P));
    const auto run = harness::run_ranks(P, kLimit_s, [P, layers, v](const DistEnv& env) {
      PpOptions o = tiny(layers);
      o.interleave = v;
      const PpResult r = run_pp(env, o);
      ASSERT_EQ(r.runs.size(), 8u);
      for (const PpRun& run : r.runs) expect_run_matches(run, P);
      for (const PpCheck& c : pp_checks(r)) EXPECT_TRUE(c.ok) << c.what << ": " << c.measured;
    });
    EXPECT_TRUE(run.all_ok()) << run.describe();
  }
}

std::vector<std::string> as_rank0_of(int k, const std::vector<std::string>& flags) {
  return subprocess::as_rank0_of(TALLY_BINARY, "pp", k, flags);
}

TEST(PpCli, BadInputExitsTwoWithOneLine) {
  const Ran a = run_command(as_rank0_of(4, {"--schedule", "interleaved", "--micro-batches", "6"}),
                            kLimit_s);
  EXPECT_EQ(a.exit_code, 2) << a.err;
  EXPECT_NE(a.err.find("--micro-batches = 6: must be a multiple of --pp = 4"), std::string::npos)
      << a.err;
  EXPECT_EQ(std::count(a.err.begin(), a.err.end(), '\n'), 1) << a.err;
  const Ran b = run_command(as_rank0_of(2, {"--schedule", "zigzag"}), kLimit_s);
  EXPECT_EQ(b.exit_code, 2) << b.err;
  EXPECT_NE(b.err.find("--schedule"), std::string::npos) << b.err;
}

TEST(PpCli, JsonMeasuredBesidePredictedOnUnevenStages) {
  const Ran r = run_command(
      {TALLY_BINARY, "launch", "--nproc", "3", "--timeout", "80", "--", TALLY_BINARY, "run", "pp",
       "--schedule", "1f1b", "--micro-batches", "4", "--layers", "7", "--hidden", "16", "--heads",
       "4", "--vocab", "32", "--seq", "8", "--steps", "1", "--json", "--timeout", "60"},
      kLimit_s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(rank_lines(r.out, 1).empty()) << "rank 0 reports";
  const auto lines = rank_lines(r.out, 0);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  const json j = json::parse(lines[0]);
  EXPECT_EQ(j["experiment"], "pp");
  EXPECT_TRUE(j["ok"].get<bool>()) << j["failed_checks"].dump();
  EXPECT_EQ(j["stage_layers"], json::array({2, 2, 3}));  // 7 over 3, the extra layer last
  ASSERT_EQ(j["runs"].size(), 1u);
  const json& run = j["runs"][0];
  EXPECT_EQ(run["schedule"], "1f1b");
  EXPECT_DOUBLE_EQ(run["stage0_idle_fraction"]["predicted"].get<double>(), 2.0 / 6.0);  // (P−1)/(M+P−1)
  EXPECT_EQ(run["stage0_in_flight"]["predicted"].get<int>(), 3);
  EXPECT_DOUBLE_EQ(run["stages"][1]["send_bytes"]["measured"].get<double>(), kSendBytes);
  EXPECT_DOUBLE_EQ(run["stages"][1]["send_bytes"]["ratio"].get<double>(), 1.0);
  EXPECT_NE(r.err.find("pp P=3 1f1b M=4 v=1: loss "), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tally::engine::exp_pp
