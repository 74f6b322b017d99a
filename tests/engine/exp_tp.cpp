// Tensor and sequence parallelism (issue 11; tally/engine/experiments/tp.hpp,
// engine/runtime/tp_model.hpp) and the process groups under them
// (tally/engine/process_groups.hpp), over real processes on loopback:
//   groups       dp 2 × tp 2 on 4 ranks: each rank's TP and DP group sums the members' global
//                ranks, each group counts only its own calls (expected sums by hand from
//                Megatron's order: TP {0,1} {2,3}, DP {0,2} {1,3});
//   equivalence  float64 loss and every gradient shard vs the single-process GPT ≤ 1e-10
//                relative, 10 fp32 SGD steps ≤ 1e-5, at t = 2 and 4, with and without SP;
//   bytes        per layer and per call against hand arithmetic: S = B·T·C·4 bytes = 2·8·16·4 =
//                1024; all-reduce 2S(t−1)/t, all-gather / reduce-scatter S(t−1)/t (ring volumes,
//                Patarasuk & Yuan 2009), 4 all-reduces or 4 (all-gather + reduce-scatter) pairs per
//                layer (Shoeybi 2019 §3, Korthikanti 2022 §4.2.2);
//                With full recompute the replay issues the forward's collectives again: 6 per
//                layer (DESIGN.md erratum 2); SP's backward re-gather (Megatron) 2 per layer;
//   activations  bytes each block leaves alive, by hand from Korthikanti 2022 §4.1's inventory
//                without dropout in fp32 elements (Note [what eager PyTorch saves]): TP (4 + 12/t)
//                ·BTC + a·T²·B/t, TP+SP (16·BTC + a·T²·B)/t, full recompute the block input BTC
//                (/t with SP); plus LayerNorm's mean and rstd, 4·B·T (/t with SP), outside it;
//   the CLI      bad input exits 2 naming the flag; `tally launch -- tally run tp --compare-sp
//                --json` reports measured beside predicted.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "rank_harness.hpp"
#include "../support/subprocess.hpp"
#include "tally/engine/experiments/tp.hpp"
#include "tally/engine/process_groups.hpp"

#ifndef TALLY_BINARY
#error "TALLY_BINARY must name the tally executable"
#endif

namespace tally::engine::exp_tp {
namespace {

using nlohmann::json;
using subprocess::Ran;
using subprocess::rank_lines;
using subprocess::run_command;

constexpr double kLimit_s = 90;  // one run of t ranks on a loaded 2-core box; ctest's 300 s backstop

// h 16, L 2, a 4, V 32, T 8, B 2: t = 2 and 4 divide a, 4h = 64 and T.
TpOptions tiny(SpMode sp, RecomputeMode recompute = RecomputeMode::none) {
  return {.sp = sp,
          .recompute = recompute,
          .model = {.hidden = 16, .layers = 2, .heads = 4, .vocab = 32, .seq = 8, .micro_batch = 2},
          .steps = 10,
          .timeout_s = 60};
}

TEST(ProcessGroups, Dp2Tp2SumsOverEachGroup) {
  const auto run = harness::run_ranks(4, kLimit_s, [](const DistEnv& env) {
    Comm world(env, {.timeout_s = 30});
    ProcessGroups g(world, ParallelLayout{.dp = 2, .tp = 2});
    const int r = env.rank;
    std::vector<double> x = {double(r)};
    g.tp().all_reduce(x);
    EXPECT_EQ(x[0], r < 2 ? 0 + 1 : 2 + 3) << "TP group of rank " << r;
    std::vector<double> y = {double(r), 1.0};
    g.dp().all_reduce(y);
    EXPECT_EQ(y[0], r % 2 == 0 ? 0 + 2 : 1 + 3) << "DP group of rank " << r;
    EXPECT_EQ(y[1], 2);
    EXPECT_EQ(g.tp().world_size(), 2);
    EXPECT_EQ(g.tp().rank(), r % 2);
    EXPECT_EQ(g.dp().rank(), r / 2);
    EXPECT_EQ(g.pp().world_size(), 1);
    // Own counters: one all-reduce of 8 bytes on TP (2S(k−1)/k = 8), one of 16 bytes on DP (16).
    EXPECT_EQ(g.tp().counters()[Collective::all_reduce].calls, 1);
    EXPECT_EQ(g.tp().counters()[Collective::all_reduce].bytes_sent, 8);
    EXPECT_EQ(g.dp().counters()[Collective::all_reduce].bytes_sent, 16);
    EXPECT_EQ(world.counters()[Collective::all_reduce].calls, 0);
    world.barrier();
  });
  EXPECT_TRUE(run.all_ok()) << run.describe();
}

TEST(TpOptions, BadLayoutNamesTheFlagAndRange) {
  auto message = [](TpOptions o, int world) -> std::string {
    try {
      o.validate(world);
    } catch (const InvalidInput& e) {
      return e.what();
    }
    return "no throw";
  };
  TpOptions o = tiny(SpMode::off);
  o.tp = 3;
  EXPECT_EQ(message(o, 3),
            "--tp = 3: must divide --heads = 4 and the FFN width 4 x --hidden = 64 (allowed: 1, 2, 4)");
  EXPECT_EQ(message(o, 4),
            "--tp = 3: must equal the world size 4 (tally run tp runs one TP group over every rank)");
  o = tiny(SpMode::on);
  o.model.seq = 6;
  EXPECT_EQ(message(o, 4), "--seq = 6: must be divisible by --tp = 4 with --sp (sequence shards)");
}

// One launch per t runs the four layouts (SP off and on, without and with full recompute) over
// the same groups.
class TpEquivalence : public ::testing::TestWithParam<int> {};

TEST_P(TpEquivalence, LossGradientsAndBytesMatch) {
  const int t = GetParam();
  const auto run = harness::run_ranks(t, kLimit_s, [t](const DistEnv& env) {
    const TpResult r = run_tp(env, tiny(SpMode::both, RecomputeMode::both));
    ASSERT_EQ(r.variants.size(), 4u);
    const double S = 2 * 8 * 16 * 4.0;  // B·T·C fp32 bytes
    const double BTC = 2 * 8 * 16, aT2B = 4 * 8 * 8 * 2, BT = 2 * 8;
    for (const TpVariant& v : r.variants) {
      SCOPED_TRACE(std::string(v.sequence_parallel ? "SP" : "TP") +
                   (v.full_recompute ? " recompute" : ""));
      const double per_layer_calls = v.full_recompute ? 6 : 4;  // forward, backward (, replay)
      EXPECT_LE(std::abs(v.loss_f64 - v.reference_loss_f64) / v.reference_loss_f64, 1e-10);
      EXPECT_LE(v.max_grad_rel_diff, 1e-10) << v.worst_grad;
      ASSERT_EQ(v.losses.size(), 10u);
      for (std::size_t s = 0; s < v.losses.size(); ++s)
        EXPECT_NEAR(v.losses[s], v.reference_losses[s], 1e-5 * v.reference_losses[s]) << s;
      EXPECT_LT(v.losses.back(), v.losses.front());  // it learns
      ASSERT_EQ(v.per_layer.size(), 2u);
      for (const auto& layer : v.per_layer) {
        double bytes = 0;
        std::int64_t calls = 0;
        for (const TpCollectiveMeasure& m : layer) {
          bytes += m.bytes_sent;
          calls += m.calls;
          if (v.sequence_parallel) {
            EXPECT_TRUE(m.collective == Collective::all_gather ||
                        m.collective == Collective::reduce_scatter);
            EXPECT_EQ(m.calls, per_layer_calls);  // 2 forward + 2 backward (+ 2 replayed) of each
            EXPECT_DOUBLE_EQ(m.bytes_sent / m.calls, S * (t - 1) / t);
          } else {
            EXPECT_EQ(m.collective, Collective::all_reduce);
            EXPECT_DOUBLE_EQ(m.bytes_sent / m.calls, 2 * S * (t - 1) / t);
          }
        }
        EXPECT_EQ(calls, (v.sequence_parallel ? 2 : 1) * per_layer_calls);
        // SP: same bytes, twice the calls
        EXPECT_DOUBLE_EQ(bytes, per_layer_calls * 2 * S * (t - 1) / t);
      }
      EXPECT_DOUBLE_EQ(v.measured_bytes_per_layer(), v.predicted_bytes_per_layer());
      // Activations, fp32 bytes per layer (the file's comment).
      const double saved = v.full_recompute ? BTC / (v.sequence_parallel ? t : 1)
                           : v.sequence_parallel ? (16 * BTC + aT2B) / t + 4 * BT / t
                                                 : (4 + 12.0 / t) * BTC + aT2B / t + 4 * BT;
      EXPECT_DOUBLE_EQ(v.activation_bytes_per_layer, 4 * saved);
      EXPECT_DOUBLE_EQ(v.layer_norm_stat_bytes,
                       v.full_recompute ? 0 : 4 * 4 * BT / (v.sequence_parallel ? t : 1));
      if (v.sequence_parallel) {
        // Edges: the embedding split's backward and the final gather, one all-gather each; the
        // gradients of ln_1, ln_2 and the two row-parallel biases, 6C per layer, one all-reduce.
        ASSERT_EQ(v.edges.size(), 1u);
        EXPECT_EQ(v.edges[0].calls, 2);
        ASSERT_EQ(v.sp_grad_reduce.size(), 1u);
        EXPECT_DOUBLE_EQ(v.sp_grad_reduce[0].bytes_sent, 2 * (2 * 6 * 16 * 4.0) * (t - 1) / t);
        // Megatron's re-gather of the QKV and W1 inputs in backward, 2 layers × 2.
        ASSERT_EQ(v.sp_regather.size(), 1u);
        EXPECT_EQ(v.sp_regather[0].collective, Collective::all_gather);
        EXPECT_EQ(v.sp_regather[0].calls, 4);
        EXPECT_DOUBLE_EQ(v.sp_regather[0].bytes_sent, 4 * S * (t - 1) / t);
      } else {
        EXPECT_TRUE(v.edges.empty());
        EXPECT_TRUE(v.sp_grad_reduce.empty());
        EXPECT_TRUE(v.sp_regather.empty());
      }
    }
    for (const TpCheck& c : tp_checks(r)) EXPECT_TRUE(c.ok) << c.what << ": " << c.measured;
  });
  EXPECT_TRUE(run.all_ok()) << run.describe();
}

INSTANTIATE_TEST_SUITE_P(TpRanks, TpEquivalence, ::testing::Values(2, 4),
                         [](const auto& info) { return "t" + std::to_string(info.param); });

std::vector<std::string> as_rank0_of(int k, const std::vector<std::string>& flags) {
  return subprocess::as_rank0_of(TALLY_BINARY, "tp", k, flags);
}

TEST(TpCli, BadInputExitsTwoWithOneLine) {
  const Ran a = run_command(as_rank0_of(1, {"--tp", "2"}), kLimit_s);
  EXPECT_EQ(a.exit_code, 2) << a.err;
  EXPECT_NE(a.err.find("--tp = 2: must equal the world size 1"), std::string::npos) << a.err;
  const Ran b = run_command(as_rank0_of(3, {"--tp", "3", "--hidden", "16", "--heads", "4"}), kLimit_s);
  EXPECT_EQ(b.exit_code, 2) << b.err;
  EXPECT_NE(b.err.find("--tp = 3: must divide --heads = 4 and the FFN width 4 x --hidden = 64 "
                       "(allowed: 1, 2, 4)"),
            std::string::npos)
      << b.err;
  EXPECT_EQ(std::count(b.err.begin(), b.err.end(), '\n'), 1) << b.err;
  const Ran c = run_command(as_rank0_of(1, {"--sp", "--compare-sp"}), kLimit_s);
  EXPECT_EQ(c.exit_code, 2) << c.err;
}

TEST(TpCli, JsonMeasuredBesidePredicted) {
  const Ran r = run_command(
      {TALLY_BINARY, "launch", "--nproc", "2", "--timeout", "80", "--", TALLY_BINARY, "run", "tp",
       "--compare-sp", "--hidden", "16", "--heads", "4", "--vocab", "32", "--seq", "8", "--steps",
       "3", "--json", "--timeout", "60"},
      kLimit_s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(rank_lines(r.out, 1).empty()) << "rank 0 reports";
  const auto lines = rank_lines(r.out, 0);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  const json j = json::parse(lines[0]);
  EXPECT_EQ(j["experiment"], "tp");
  EXPECT_TRUE(j["ok"].get<bool>()) << j["failed_checks"].dump();
  ASSERT_EQ(j["variants"].size(), 2u);
  const double S = 2 * 8 * 16 * 4.0;  // --micro-batch 2 (default) · T 8 · C 16 · fp32
  const json& sp = j["variants"][1];
  EXPECT_TRUE(sp["sequence_parallel"].get<bool>());
  EXPECT_DOUBLE_EQ(sp["bytes_per_layer"]["predicted"].get<double>(), 4 * S);  // 4·2S(t−1)/t, t = 2
  EXPECT_DOUBLE_EQ(sp["bytes_per_layer"]["ratio"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(sp["bytes_per_call"]["all-gather"]["measured"].get<double>(), S / 2);
  EXPECT_DOUBLE_EQ(sp["calls_per_layer"]["measured"].get<double>(), 8);
  EXPECT_EQ(sp["losses_fp32"].size(), 3u);
  // Measured activations less LayerNorm's statistics equal core's per-layer figure.
  EXPECT_DOUBLE_EQ(sp["activation_bytes_per_layer"]["ratio"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(sp["layer_norm_stat_bytes_per_layer"].get<double>(), 4 * 4 * 2 * 8 / 2.0);
  // One progress line per step per layout on stderr, from rank 0.
  EXPECT_NE(r.err.find("tp t=2 sp=on recompute=none: step 3/3 loss "), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tally::engine::exp_tp
