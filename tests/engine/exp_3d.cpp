// 3-D parallelism (issue 11; tally/engine/experiments/three_d.hpp) over real processes on loopback:
//   8 ranks, DP 2 x TP 2 x PP 2 twice — 1F1B with ZeRO-1, and interleaved (v = 2) with SP and
//   ZeRO-0: float64 loss, gradients after the DP reduction and parameters after one Adam step vs
//   the single-process GPT ≤ 1e-10; per rank the TP, PP and DP bytes of one fp32 step and the
//   model-state bytes against figures worked out by hand below (Shoeybi 2019 §3: 4 all-reduces
//   of B·T·C per layer per micro-batch; Korthikanti 2022 §4.2.2: with SP 4 all-gather +
//   reduce-scatter pairs of S(t−1)/t each, and p2p of the shard B·T·C/t; Narayanan 2021 §3.2:
//   b·s·h per boundary; ZeRO §5: 16 N bytes of fp32 Adam state, 8N + 8N/D under ZeRO-1; a ring
//   all-reduce over 2 ranks sends S, as do reduce-scatter + all-gather);
//   8 ranks, TP 2 + SP x PP 2 x CP 2 (zigzag ring attention): the same, with the CP sends;
//   4 ranks through the CLI with --plan (TP 2 + SP x PP 2, taken from a plan object) and --json;
//   bad input exits 2 with one line naming the flag or the plan field;
//   4 ranks each, ZeRO-2 and ZeRO-3 (Note [3-D data-parallel step] in three_d.cpp): DP 2 x TP 2
//   + SP without PP, ZeRO-3 gathered per micro-batch, with full recompute (6 TP collectives per
//   layer, DESIGN.md erratum 2); DP 2 x PP 2 with ZeRO-2 reduced once per step; DP 4 with
//   ZeRO-2 reduced per micro-batch; through the CLI a plan of DP 2 x PP 2, ZeRO-3, full
//   recompute and uneven stages 1 + 4 (the planned depth); and a rank SIGKILLed mid-step, which
//   `tally launch` names while the others exit non-zero. Model-state bytes by hand from ZeRO §5
//   (fp32 Adam: ZeRO-2 4N + 12N/k, ZeRO-3 16N/k), DP bytes from the ring formulas: over k ranks a
//   reduce-scatter or all-gather of S bytes sends S(k−1)/k;
//   4 ranks each, the selective recompute policies (selective on TP 2 x PP 2, save-matmuls on
//   TP 2 + SP x PP 2, op-sac on DP 2 x TP 2 + SP and on TP 2 + SP x CP 2, and op-sac at t = 1
//   through a plan): float64 equivalence, TP bytes as without recompute (their replays issue no
//   collective of core's item), and every policy's saved bytes per layer by hand (without CP),
//   against core's and in its order;
//   and, without the launcher, the survivors of a rank SIGKILLed mid-step naming it themselves.
//
// Tiny model: h 16, a 4, V 32, T 8, B 2, L 4 (2 layers per stage at P = 2). One fp32 step.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../support/subprocess.hpp"
#include "../support/temp_dir.hpp"
#include "rank_harness.hpp"
#include "tally/engine/comm.hpp"
#include "tally/engine/experiments/three_d.hpp"
#include "tally/engine/temp_directory.hpp"

#ifndef TALLY_BINARY
#error "TALLY_BINARY must name the tally executable"
#endif

namespace tally::engine::exp_3d {
namespace {

using nlohmann::json;
using subprocess::Ran;
using subprocess::rank_lines;
using subprocess::run_command;

constexpr double kLimit_s = 120;  // 8 ranks on a loaded 2-core box; ctest's 300 s backstop

ThreeDOptions tiny() {
  return {.dp = 2, .tp = 2, .pp = 2,
          .model = {.hidden = 16, .layers = 4, .heads = 4, .vocab = 32, .seq = 8, .micro_batch = 2},
          .steps = 1,
          .timeout_s = 90};
}

std::string message(ThreeDOptions o, int world) {
  try {
    o.validate(world);
  } catch (const InvalidInput& e) {
    return e.what();
  }
  return "no throw";
}

TEST(ThreeDOptions, BadLayoutsNameTheFlag) {
  ThreeDOptions o = tiny();
  EXPECT_EQ(message(o, 8), "no throw");
  EXPECT_EQ(message(o, 4), "--dp x --tp x --pp x --cp = 2 x 2 x 2 x 1 = 8: must equal the world "
                           "size 4");
  o.tp = 3, o.dp = 1, o.pp = 1;
  EXPECT_EQ(message(o, 3), "--tp = 3: must divide --heads = 4 and the FFN width 4 x --hidden = 64 "
                           "(allowed: 1, 2, 4)");
  o = tiny();
  o.zero = 4;
  EXPECT_EQ(message(o, 8), "--zero = 4: must be 0, 1, 2 or 3 (over the DP x CP group)");
  o = tiny();
  o.pp_layers = {1, 2};
  EXPECT_EQ(message(o, 8), "--pp-layers: the stages hold 3 layers; the model has 4");
  o.pp_layers = {4};
  EXPECT_EQ(message(o, 8), "--pp-layers: 1 stages given for --pp = 2");
  o = tiny();
  o.kill_rank = 8;
  EXPECT_EQ(message(o, 8), "--kill-rank = 8: must be -1 (none) or a rank in [0, 8)");
  o = tiny();
  o.cp = 2, o.dp = 1, o.model.seq = 6;
  EXPECT_EQ(message(o, 8), "--seq = 6: must split into 2 x --cp = 4 equal chunks (context "
                           "parallelism's zigzag: rank r holds chunks r and 2c-1-r)");
  o.model.seq = 12, o.sp = true, o.tp = 4, o.pp = 1;  // 6 tokens per CP rank over 4 TP ranks
  EXPECT_EQ(message(o, 8), "--seq = 12: must be divisible by --cp x --tp = 8 with --sp (sequence "
                           "shards of each CP rank's share)");
  o = tiny();
  o.interleave = 2;
  EXPECT_EQ(message(o, 8), "--interleave = 2: needs --schedule interleaved (gpipe and 1f1b run one "
                           "chunk per stage)");
  o.schedule = PipelineSchedule::interleaved;
  o.micro_batches = 3;
  EXPECT_EQ(message(o, 8),
            "--micro-batches = 3: must be a multiple of --pp = 2 for the interleaved schedule");
  o = tiny();
  o.tp = 1, o.dp = 4, o.sp = true;
  EXPECT_EQ(message(o, 8), "--sp: sequence parallelism needs --tp > 1");
  o = tiny();
  o.pp = 8, o.dp = 1, o.tp = 1;
  EXPECT_EQ(message(o, 8), "--pp = 8: must be <= --layers = 4 (one layer per stage at least)");
  // Interleaved, --pp-layers may name every virtual stage (Note [uneven virtual stages]): 4
  // layers as 1, 1, 1, 1 over 2 × 2, stage totals 2 and 2; a virtual stage may hold no block, a
  // stage not; with pp entries, v must divide each stage's total.
  o = tiny();
  o.schedule = PipelineSchedule::interleaved;
  o.interleave = 2;
  o.pp_layers = {1, 1, 1, 1};
  EXPECT_EQ(message(o, 8), "no throw");
  EXPECT_EQ(o.stage_split(), (std::vector<int>{2, 2}));
  o.pp_layers = {2, 1, 0, 1};  // virtual stage 2 (stage 0's second chunk) empty: the identity
  EXPECT_EQ(message(o, 8), "no throw");
  EXPECT_EQ(o.stage_split(), (std::vector<int>{2, 2}));
  o.pp_layers = {2, 0, 2, 0};
  EXPECT_EQ(message(o, 8), "--pp-layers: stage 1's virtual stages hold no layer: every stage "
                           "needs >= 1");
  o.model.layers = 5;
  o.pp_layers = {3, 2};
  EXPECT_EQ(message(o, 8), "--interleave = 2: must divide the layers of every stage (stage 0 "
                           "holds 3 of --layers = 5 over --pp = 2)");
}

// A rank's own parameters, by hand (C = 16, t = 2, V = 32, T = 8): one block's TP slice is
// ln_1 2C + QKV 3C·C/t + 3C/t + out-proj C·C/t + C + ln_2 2C + W1 4C·C/t + 4C/t + W2 C·4C/t + C
// = 32 + 384 + 24 + 128 + 16 + 32 + 512 + 32 + 512 + 16 = 1688; stage 0 adds the embedding V·C
// and positions T·C, stage 1 the tied embedding and ln_f 2C.
constexpr double kBlock = 1688, kStage0 = 32 * 16 + 8 * 16 + 2 * kBlock, kStage1 = 32 * 16 + 32 + 2 * kBlock;

void expect_layout(const ThreeDResult& r, bool sp, int zero, int v) {
  ASSERT_EQ(r.ranks.size(), 8u);
  const int M = 4;  // 2·P
  EXPECT_EQ(r.micro_batches, M);
  EXPECT_LE(std::abs(r.loss_f64 - r.reference_loss_f64) / r.reference_loss_f64, 1e-10);
  const double S = 2 * 8 * 16 * 4.0;  // B·T·C fp32 bytes
  for (const ThreeDRank& x : r.ranks) {
    SCOPED_TRACE("rank " + std::to_string(x.rank));
    // Megatron's order: rank = tp + 2·(dp + 2·pp).
    EXPECT_EQ(x.rank, x.tp_index + 2 * (x.dp_index + 2 * x.pp_index));
    EXPECT_LE(x.max_grad_rel_diff, 1e-10);
    EXPECT_LE(x.max_param_rel_diff, 1e-10);
    EXPECT_EQ(x.stage_layers, 2);
    const double n = x.pp_index == 0 ? kStage0 : kStage1;
    EXPECT_EQ(x.own_params, n);
    // TP: 2 layers × M micro-batches × 4 all-reduces of 2S(t−1)/t = S, or 8 SP collectives of S/2.
    EXPECT_EQ(x.tp_layer_bytes, 2 * M * 4 * S);
    EXPECT_EQ(x.tp_layer_calls, 2 * M * (sp ? 8 : 4));
    // PP: stage 0 sends v·M activations and (v − 1)·M gradients; stage 1 the converse.
    EXPECT_EQ(x.pp_sends, (2 * v - 1) * M);
    EXPECT_EQ(x.pp_max_send, sp ? S / 2 : S);
    EXPECT_EQ(x.pp_min_send, sp ? S / 2 : S);
    // DP over 2 ranks: an all-reduce of the 4n-byte gradient sends 4n; so do ZeRO-1's
    // reduce-scatter and all-gather, 2n each.
    EXPECT_EQ(x.dp_bytes, 4 * n);
    EXPECT_EQ(x.dp_calls, zero == 0 ? 1 : 2);
    // fp32 Adam: params + grads + m + v = 16n; ZeRO-1 over 2: m and v halved (n is even here).
    EXPECT_EQ(x.state_bytes, zero == 0 ? 16 * n : 12 * n);
    EXPECT_GT(x.peak_activation_bytes, 0);
  }
}

// One launch per layout (8 ranks each).
TEST(ThreeDEquivalence, Dp2Tp2Pp2ThenWithSpInterleaved) {
  {
    SCOPED_TRACE("2x2x2 1f1b ZeRO-1");
    const auto run = harness::run_ranks(8, kLimit_s, [](const DistEnv& env) {
      ThreeDOptions o = tiny();
      o.zero = 1;
      const ThreeDResult r = run_3d(env, o);
      expect_layout(r, false, 1, 1);
      for (const ThreeDCheck& c : three_d_checks(r)) EXPECT_TRUE(c.ok) << c.what << ": " << c.measured;
    });
    EXPECT_TRUE(run.all_ok()) << run.describe();
  }
  {
    SCOPED_TRACE("2x2x2 SP interleaved v=2 ZeRO-0");
    const auto run = harness::run_ranks(8, kLimit_s, [](const DistEnv& env) {
      ThreeDOptions o = tiny();
      o.sp = true;
      o.schedule = PipelineSchedule::interleaved;
      o.interleave = 2;
      const ThreeDResult r = run_3d(env, o);
      expect_layout(r, true, 0, 2);
      for (const ThreeDCheck& c : three_d_checks(r)) EXPECT_TRUE(c.ok) << c.what << ": " << c.measured;
    });
    EXPECT_TRUE(run.all_ok()) << run.describe();
  }
}

// TP 2 + SP × PP 2 × CP 2 (8 ranks): each CP rank holds T/c = 4 of the 8 positions (zigzag chunks
// r and 3 − r of 4), its TP shard 2 of them. S = B·(T/c)·C·4 = 512 bytes. Ring attention: 3(c−1) =
// 3 sends per layer per micro-batch of K and V for the rank's a/t heads, 2·B·(T/c)·(C/t)·4 = 512
// bytes (Liu et al. 2023; Note [ring attention]); gradients averaged over DP × CP (2 ranks).
TEST(ThreeDEquivalence, Tp2SpPp2Cp2) {
  const auto run = harness::run_ranks(8, kLimit_s, [](const DistEnv& env) {
    ThreeDOptions o = tiny();
    o.dp = 1, o.cp = 2, o.sp = true, o.zero = 1;
    const ThreeDResult r = run_3d(env, o);
    ASSERT_EQ(r.ranks.size(), 8u);
    EXPECT_LE(std::abs(r.loss_f64 - r.reference_loss_f64) / r.reference_loss_f64, 1e-10);
    const int M = 4;
    const double S = 2 * 4 * 16 * 4.0;
    for (const ThreeDRank& x : r.ranks) {
      SCOPED_TRACE("rank " + std::to_string(x.rank));
      EXPECT_EQ(x.rank, x.tp_index + 2 * (x.cp_index + 2 * x.pp_index));  // tp-cp-dp-pp
      EXPECT_LE(x.max_grad_rel_diff, 1e-10);
      EXPECT_LE(x.max_param_rel_diff, 1e-10);
      const double n = x.pp_index == 0 ? kStage0 : kStage1;
      EXPECT_EQ(x.tp_layer_bytes, 2 * M * 4 * S);
      EXPECT_EQ(x.tp_layer_calls, 2 * M * 8);
      EXPECT_EQ(x.pp_max_send, S / 2);
      EXPECT_EQ(x.pp_sends, M);
      EXPECT_EQ(x.cp_sends, 2 * M * 3);
      EXPECT_EQ(x.cp_bytes, 2 * M * 3 * 512.0);
      EXPECT_EQ(x.dp_bytes, 4 * n);
      EXPECT_EQ(x.state_bytes, 12 * n);
    }
    for (const ThreeDCheck& c : three_d_checks(r)) EXPECT_TRUE(c.ok) << c.what << ": " << c.measured;
  });
  EXPECT_TRUE(run.all_ok()) << run.describe();
}

// ---- ZeRO-2 and ZeRO-3 in 3-D (4 ranks each) -------------------------------------------------

// One block's parameters at t = 1 (C = 16): ln_1 2C + QKV 3C·C + 3C + out-proj C·C + C + ln_2 2C
// + W1 4C·C + 4C + W2 C·4C + C = 32 + 768 + 48 + 256 + 16 + 32 + 1024 + 64 + 1024 + 16 = 3280;
// the embedding V·C = 512, positions T·C = 128, ln_f 2C = 32.
constexpr double kBlockT1 = 3280, kEmbed = 512 + 128, kHead = 512 + 32;

void expect_all_checks(const ThreeDResult& r) {
  EXPECT_LE(std::abs(r.loss_f64 - r.reference_loss_f64) / r.reference_loss_f64, 1e-10);
  for (const ThreeDRank& x : r.ranks) {
    EXPECT_LE(x.max_grad_rel_diff, 1e-10) << "rank " << x.rank;
    EXPECT_LE(x.max_param_rel_diff, 1e-10) << "rank " << x.rank;
  }
  for (const ThreeDCheck& c : three_d_checks(r)) EXPECT_TRUE(c.ok) << c.what << ": " << c.measured;
}

// DP 2 x TP 2 + SP, no PP, ZeRO-3 with full recompute, M = 2. A rank holds the TP slice of the
// whole model: n = 640 + 4·1688 + 32 = 7424. Core without PP: the parameters gathered for each
// micro-batch's forward and backward and the gradient reduce-scattered after each backward, 3M
// calls of S/2 = 2n bytes over 2 ranks; states 16n/2. TP: 4 layers × M × 6 all-reduce
// equivalents (forward 2, backward 2, the replay 2), each an SP pair of S/2 + S/2, S = B·T·C·4.
TEST(ThreeDZero, Dp2Tp2SpZero3PerMicroBatchWithFullRecompute) {
  const auto run = harness::run_ranks(4, kLimit_s, [](const DistEnv& env) {
    ThreeDOptions o = tiny();
    o.pp = 1, o.sp = true, o.zero = 3, o.recompute = Recompute::full;
    const ThreeDResult r = run_3d(env, o);
    ASSERT_EQ(r.ranks.size(), 4u);
    ASSERT_EQ(r.micro_batches, 2);
    const double n = kEmbed + 4 * kBlock + 32, M = 2, S = 2 * 8 * 16 * 4.0;
    for (const ThreeDRank& x : r.ranks) {
      SCOPED_TRACE("rank " + std::to_string(x.rank));
      EXPECT_EQ(x.own_params, n);
      EXPECT_EQ(x.dp_calls, 3 * M);
      EXPECT_EQ(x.dp_bytes, 3 * M * 2 * n);
      EXPECT_EQ(x.state_bytes, 16 * n / 2);
      EXPECT_EQ(x.tp_layer_calls, 4 * M * 6 * 2);
      EXPECT_EQ(x.tp_layer_bytes, 4 * M * 6 * S);
      EXPECT_EQ(x.pp_sends, 0);
    }
    expect_all_checks(r);
  });
  EXPECT_TRUE(run.all_ok()) << run.describe();
}

// DP 2 x PP 2, ZeRO-2 under PP: the stage's gradient accumulates whole over the M = 4 micro-
// batches and is reduce-scattered once, then the updated parameters all-gathered: 2 calls of 2n
// bytes; states 4n + 12n/2 = 10n. Stage 0: n = 640 + 2·3280 = 7200; stage 1: 544 + 6560 = 7104.
TEST(ThreeDZero, Dp2Pp2Zero2ReducesOncePerStep) {
  const auto run = harness::run_ranks(4, kLimit_s, [](const DistEnv& env) {
    ThreeDOptions o = tiny();
    o.tp = 1, o.zero = 2;
    const ThreeDResult r = run_3d(env, o);
    ASSERT_EQ(r.ranks.size(), 4u);
    for (const ThreeDRank& x : r.ranks) {
      SCOPED_TRACE("rank " + std::to_string(x.rank));
      const double n = x.pp_index == 0 ? kEmbed + 2 * kBlockT1 : kHead + 2 * kBlockT1;
      EXPECT_EQ(x.own_params, n);
      EXPECT_EQ(x.dp_calls, 2);
      EXPECT_EQ(x.dp_bytes, 4 * n);
      EXPECT_EQ(x.state_bytes, 10 * n);
      EXPECT_EQ(x.pp_sends, 4);  // M activations forward (stage 0) or M gradients back (stage 1)
    }
    expect_all_checks(r);
  });
  EXPECT_TRUE(run.all_ok()) << run.describe();
}

// DP 4, no PP, ZeRO-2: a reduce-scatter after each of the M = 2 backwards and one all-gather, each
// sending 3S/4 = 3n over 4 ranks (n = 640 + 4·3280 + 32 = 13792, a multiple of 4); states
// 4n + 12n/4 = 7n.
TEST(ThreeDZero, Dp4Zero2ReducesPerMicroBatch) {
  const auto run = harness::run_ranks(4, kLimit_s, [](const DistEnv& env) {
    ThreeDOptions o = tiny();
    o.dp = 4, o.tp = 1, o.pp = 1, o.zero = 2;
    const ThreeDResult r = run_3d(env, o);
    ASSERT_EQ(r.ranks.size(), 4u);
    const double n = kEmbed + 4 * kBlockT1 + 32;
    for (const ThreeDRank& x : r.ranks) {
      SCOPED_TRACE("rank " + std::to_string(x.rank));
      EXPECT_EQ(x.own_params, n);
      EXPECT_EQ(x.dp_calls, 3);
      EXPECT_EQ(x.dp_bytes, 3 * 3 * n);
      EXPECT_EQ(x.state_bytes, 7 * n);
    }
    expect_all_checks(r);
  });
  EXPECT_TRUE(run.all_ok()) << run.describe();
}

// ---- Recompute policies in 3-D (tp_model.hpp Note [selective recompute policies]) ------------

// A layer's saved fp32 bytes per policy, by hand from each policy's definition (Korthikanti 2022
// §4.1 and §5, without dropout; PyTorch's save-matmuls and torchtitan's op-level SAC as
// core/types.hpp defines them), for this tiny model: BTC = B·T·C = 256 elements of the whole
// sequence (÷t for the terms inside the TP region, ÷rep = t with SP for the replicated ones) and
// aT²B = 512 score elements (÷t):
//   none          LN-1 input, QKV input, LN-2 input, W1 input (4/rep); Q, K, V, out-proj input,
//                 GeLU input and W2 input (3 + 1 + 4 + 4 = 12/t); the softmax output
//   selective     none less the softmax output
//   save-matmuls  layer input, MLP block input (2/rep); Q, K, V, out-proj input, up output (8/t);
//                 the QKᵀ output
//   op-sac        layer input (1/rep); Q, V, out-proj input, up output (7/t); the QKᵀ output; at
//                 t > 1 also the out-projection collective's output (1/rep) — beyond core's set
//   full          the layer input (1/rep)
double saved_bytes(Recompute r, int t, bool sp) {
  const double BTC = 256, aT2B = 512, rep = sp ? t : 1;
  switch (r) {
    case Recompute::none: return 4 * ((4 / rep + 12.0 / t) * BTC + aT2B / t);
    case Recompute::selective: return 4 * (4 / rep + 12.0 / t) * BTC;
    case Recompute::save_matmuls: return 4 * ((2 / rep + 8.0 / t) * BTC + aT2B / t);
    case Recompute::op_sac:
      return 4 * ((1 / rep + 7.0 / t + (t > 1 ? 1 / rep : 0)) * BTC + aT2B / t);
    case Recompute::full: return 4 * BTC / rep;
  }
  return 0;
}

// Every policy's measured bytes per layer on every rank: the hand figures above exactly; core's
// per-layer bytes exactly but for op-sac's kept collective output at t > 1; and the policies in
// core's order (a policy saves less than another in the measurement iff it does in core).
void expect_policy_activations(const ThreeDResult& r) {
  const int t = r.options.tp;
  const bool sp = r.options.sp;
  for (const ThreeDRank& x : r.ranks) {
    SCOPED_TRACE("rank " + std::to_string(x.rank));
    EXPECT_DOUBLE_EQ(x.layer_norm_stat_bytes, 2 * 2 * 4.0 * 16 / (sp ? t : 1));  // B·T = 16
    for (int i = 0; i < kRecomputePolicies; ++i) {
      const auto policy = Recompute(i);
      SCOPED_TRACE(std::string(to_string(policy)));
      EXPECT_DOUBLE_EQ(x.layer_activation_bytes[i], saved_bytes(policy, t, sp));
      const double kept = policy == Recompute::op_sac && t > 1 ? 4 * 256.0 / (sp ? t : 1) : 0;
      EXPECT_DOUBLE_EQ(x.layer_activation_bytes[i], x.layer_activation_predicted[i] + kept);
      for (int j = 0; j < kRecomputePolicies; ++j)
        EXPECT_EQ(x.layer_activation_bytes[i] < x.layer_activation_bytes[j],
                  x.layer_activation_predicted[i] < x.layer_activation_predicted[j])
            << "vs " << to_string(Recompute(j));
    }
  }
}

// One policy on a 4-rank layout: the float64 loss, gradients and updated parameters equal the
// single-process model's (every check of the run, TP bytes against core's item included), and
// the TP bytes by hand: the replays issue no collective of core's item, so each layer moves the
// 4 all-reduce equivalents of S = B·(T/c)·C·4 = 1024/c bytes per micro-batch, as without
// recompute — all-reduces of 2S(t−1)/t = S, or with SP 8 all-gathers and reduce-scatters of S/2.
// With CP the attention is ring attention (no materialised softmax, its own saved set), which the
// per-layer figures by hand do not describe: those are checked without CP.
void run_policy(ThreeDOptions o) {
  const auto run = harness::run_ranks(4, kLimit_s, [o](const DistEnv& env) {
    const ThreeDResult r = run_3d(env, o);
    ASSERT_EQ(r.ranks.size(), 4u);
    const double S = 2 * (8 / o.cp) * 16 * 4.0;
    for (const ThreeDRank& x : r.ranks) {
      SCOPED_TRACE("rank " + std::to_string(x.rank));
      const double lm = x.stage_layers * r.micro_batches;
      EXPECT_EQ(x.tp_layer_bytes, lm * 4 * S);
      EXPECT_EQ(x.tp_layer_calls, lm * (o.sp ? 8 : 4));
    }
    expect_all_checks(r);
    if (o.cp == 1) expect_policy_activations(r);
  });
  EXPECT_TRUE(run.all_ok()) << run.describe();
}

// TP 2 x PP 2, selective (M = 4, 2 layers per stage).
TEST(ThreeDRecompute, SelectiveTp2Pp2) {
  ThreeDOptions o = tiny();
  o.dp = 1, o.recompute = Recompute::selective;
  run_policy(o);
}

// TP 2 + SP x PP 2, save-matmuls.
TEST(ThreeDRecompute, SaveMatmulsTp2SpPp2) {
  ThreeDOptions o = tiny();
  o.dp = 1, o.sp = true, o.recompute = Recompute::save_matmuls;
  run_policy(o);
}

// TP 2 + SP x CP 2, op-sac (M = 2, 4 layers): the norm, GeLU and residual replays around ring
// attention; CP bytes against core's item in the run's checks.
TEST(ThreeDRecompute, OpSacTp2SpCp2) {
  ThreeDOptions o = tiny();
  o.dp = 1, o.pp = 1, o.cp = 2, o.sp = true, o.recompute = Recompute::op_sac;
  run_policy(o);
}

// DP 2 x TP 2 + SP, op-sac with ZeRO-1 (M = 2, 4 layers): K replayed on the re-gathered norm
// output, the MLP block input from the kept reduce-scattered shard.
TEST(ThreeDRecompute, OpSacDp2Tp2SpZero1) {
  ThreeDOptions o = tiny();
  o.pp = 1, o.sp = true, o.zero = 1, o.recompute = Recompute::op_sac;
  run_policy(o);
}

std::vector<std::string> as_rank0_of(int k, const std::vector<std::string>& flags) {
  return subprocess::as_rank0_of(TALLY_BINARY, "3d", k, flags);
}

json plan_object(int dp, int tp, int pp, bool sp, int zero, int grad_accum) {
  return {{"dp", dp}, {"tp", tp}, {"pp", pp}, {"cp", 1}, {"ep", 1}, {"sp", sp},
          {"interleave", 1}, {"zero", zero}, {"micro_batch", 1}, {"grad_accum", grad_accum},
          {"recompute", "none"}, {"attention", "flash"}};
}

std::string write(const std::filesystem::path& p, const json& j) {
  std::ofstream(p) << j.dump();
  return p.string();
}

TEST(ThreeDCli, BadInputExitsTwoWithOneLine) {
  const test::TempDir dir;
  const std::string wide = write(dir.path / "wide.json", {{"best", plan_object(2, 2, 2, false, 1, 4)}});
  json moe = plan_object(2, 1, 1, false, 0, 1);
  moe["ep"] = 2;
  const std::string ep = write(dir.path / "ep.json", moe);
  json sel = plan_object(4, 1, 1, false, 0, 1);
  sel["recompute"] = "partial";
  const std::string unknown_policy = write(dir.path / "partial.json", sel);
  json unev = plan_object(2, 1, 2, false, 3, 2);
  unev["stage_layers"] = {1, 4};
  const std::string uneven = write(dir.path / "uneven.json", unev);
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--dp", "2", "--tp", "2", "--pp", "3"}, "--dp x --tp x --pp x --cp = 2 x 2 x 3 x 1 = 12"},
      {{"--dp", "4", "--zero", "5"}, "--zero = 5: must be 0, 1, 2 or 3"},
      {{"--dp", "2", "--pp", "2", "--pp-layers", "1,2"}, "--pp-layers: the stages hold 3 layers"},
      {{"--plan", unknown_policy},
       "recompute: 'partial' is not one of: none, selective, full, save-matmuls, op-sac"},
      {{"--dp", "4", "--recompute", "partial"}, "--recompute"},
      {{"--plan", uneven, "--layers", "4"},
       "the plan's uneven stages 1,4 hold 5 layers, but --layers = 4"},
      {{"--plan", wide}, "dp x tp x pp x cp = 2 x 2 x 2 x 1 = 8 ranks, but the world size is 4"},
      {{"--plan", ep}, "ep = 2: tally run 3d runs dense layouts"},
      {{"--plan", wide, "--tp", "2"}, "--tp with --plan"},
  };
  for (const auto& [flags, want] : cases) {
    const Ran a = run_command(as_rank0_of(4, flags), kLimit_s);
    EXPECT_EQ(a.exit_code, 2) << want << ": " << a.err;
    EXPECT_NE(a.err.find(want), std::string::npos) << a.err;
    EXPECT_EQ(std::count(a.err.begin(), a.err.end(), '\n'), 1) << a.err;
  }
}

TEST(ThreeDCli, PlanObjectRunsWithJson) {
  const test::TempDir dir;
  // TP 2 + SP over PP 2, M = 3 micro-batches of B = 1 (the plan's grad_accum and micro_batch).
  const std::string plan =
      write(dir.path / "plan.json", {{"command", "plan"}, {"best", plan_object(1, 2, 2, true, 0, 3)}});
  const Ran r = run_command(
      {TALLY_BINARY, "launch", "--nproc", "4", "--timeout", "100", "--", TALLY_BINARY, "run", "3d",
       "--plan", plan, "--layers", "4", "--hidden", "16", "--heads", "4", "--vocab", "32", "--seq",
       "8", "--steps", "1", "--json", "--timeout", "90"},
      kLimit_s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(rank_lines(r.out, 1).empty()) << "rank 0 reports";
  const auto lines = rank_lines(r.out, 0);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  const json j = json::parse(lines[0]);
  EXPECT_EQ(j["experiment"], "3d");
  EXPECT_TRUE(j["ok"].get<bool>()) << j["failed_checks"].dump();
  EXPECT_EQ(j["tp"], 2);
  EXPECT_EQ(j["pp"], 2);
  EXPECT_EQ(j["sp"], true);
  EXPECT_EQ(j["micro_batches"], 3);
  EXPECT_EQ(j["model"]["micro_batch"], 1);
  ASSERT_EQ(j["ranks"].size(), 4u);
  const double S = 1 * 8 * 16 * 4.0;  // B·T·C fp32 bytes
  for (const json& x : j["ranks"]) {
    // 2 layers × 3 micro-batches × 8 SP collectives of S(t−1)/t = S/2.
    EXPECT_DOUBLE_EQ(x["tp_bytes"]["measured"].get<double>(), 2 * 3 * 8 * S / 2);
    EXPECT_DOUBLE_EQ(x["tp_bytes"]["ratio"].get<double>(), 1.0);
    EXPECT_DOUBLE_EQ(x["pp_bytes_per_send"]["measured"].get<double>(), S / 2);  // the shard
    EXPECT_DOUBLE_EQ(x["pp_sends"]["measured"].get<double>(), 3);
    EXPECT_DOUBLE_EQ(x["dp_bytes"]["measured"].get<double>(), 0);  // DP 1
    EXPECT_TRUE(x["compute_s"]["predicted"].is_null());           // no --calibration
    EXPECT_TRUE(x["step_time_s"]["predicted"].is_null());
    EXPECT_TRUE(x["optimizer_time_s"]["predicted"].is_null());
    EXPECT_TRUE(x["pp_send_predicted_s"].is_null());
    // Note [arrival wait]: TP 2 on loopback, so the part of the TP time spent waiting for the
    // partner is measured, a part of it (the upper bound holds by the engine's clamp: the
    // contract; CommSpans.RecordedPerBlockingCollectiveAndSplitByArrival checks the measurement).
    ASSERT_TRUE(x["tp_arrival_wait_s"].is_number()) << x.dump();
    EXPECT_GE(x["tp_arrival_wait_s"].get<double>(), 0.0);
    EXPECT_LE(x["tp_arrival_wait_s"].get<double>(), x["tp_comm_s"]["measured"].get<double>());
    EXPECT_TRUE(x["dp_arrival_wait_s"].is_null()) << "DP 1";
    ASSERT_EQ(x["step_seconds"].size(), 1u);  // one step: its own time
    EXPECT_DOUBLE_EQ(x["step_s"].get<double>(), x["step_seconds"][0].get<double>());
    // Note [run-queue wait]: the main thread's time queued for a core, read inside the step's
    // window, so within the step; the part inside the TP collectives (their spans, disjoint
    // pieces of the step) within the whole. A value left in ns or read around the wrong window
    // would break a bound.
    if (std::filesystem::exists("/proc/thread-self/schedstat")) {
      ASSERT_TRUE(x["runqueue_wait_s"].is_number()) << x.dump();
      ASSERT_TRUE(x["runqueue_wait_in_collectives_s"].is_number()) << x.dump();
      const double queued = x["runqueue_wait_s"].get<double>();
      const double inside = x["runqueue_wait_in_collectives_s"].get<double>();
      EXPECT_GE(inside, 0.0);
      EXPECT_LE(inside, queued);
      EXPECT_LE(queued, x["step_s"].get<double>());
    } else {
      EXPECT_TRUE(x["runqueue_wait_s"].is_null());
    }
  }
  EXPECT_TRUE(j["predicted_step_seconds"].is_null());
  EXPECT_TRUE(j["measured_over_predicted"].is_null());
  EXPECT_GT(double(j["measured_step_seconds"]), 0);
  EXPECT_NE(r.err.find("3d dp=1 tp=2 pp=2 sp zero=0: step 1/1 loss "), std::string::npos) << r.err;
}

// `tally run 3d --plan FILE` on 4 ranks at the tiny width (h 16, a 4, V 32, T 8), `steps` fp32
// steps, --json: rank 0's object once the run has passed (exit 0, one line, every check ok); an
// empty object after a failure.
json run_plan(const std::string& plan, const std::vector<std::string>& flags, int steps = 1) {
  std::vector<std::string> command{TALLY_BINARY, "launch", "--nproc", "4", "--timeout", "100",
                                   "--", TALLY_BINARY, "run", "3d", "--plan", plan, "--hidden",
                                   "16", "--heads", "4", "--vocab", "32", "--seq", "8", "--steps",
                                   std::to_string(steps), "--json", "--timeout", "90"};
  command.insert(command.end(), flags.begin(), flags.end());
  const Ran r = run_command(command, kLimit_s);
  const auto lines = rank_lines(r.out, 0);
  if (r.exit_code != 0 || lines.size() != 1) {
    ADD_FAILURE() << "exit " << r.exit_code << ": " << r.out << r.err;
    return json::object();
  }
  const json j = json::parse(lines[0]);
  EXPECT_TRUE(j["ok"].get<bool>()) << j["failed_checks"].dump();
  return j;
}

// A plan of DP 2 x PP 2 with ZeRO-3, full recompute and uneven stages 1 + 4 (the planner's form
// for lighter end stages, or compare --pp-layers): without --layers the run takes the planned
// depth, 5. Stage 0: n = 640 + 3280 = 3920; stage 1: 544 + 4·3280 = 13664. ZeRO-3 under PP: one
// all-gather and one reduce-scatter per step, 2n bytes each over 2 ranks; states 16n/2. PP: M = 2
// sends a stage of B·T·C·4 = 512 bytes (B = 1). Three steps: the times are the medians of steps 2
// and 3 (Note [3-D step times]: step 1 warms up), and the DP group's arrival wait is measured.
TEST(ThreeDCli, UnevenZero3RecomputePlanRuns) {
  const test::TempDir dir;
  json p = plan_object(2, 1, 2, false, 3, 2);
  p["recompute"] = "full";
  p["stage_layers"] = {1, 4};
  const json j = run_plan(write(dir.path / "plan.json", {{"best", p}}), {}, 3);
  ASSERT_TRUE(j.contains("ranks"));
  EXPECT_EQ(j["model"]["layers"], 5);
  EXPECT_EQ(j["stage_layers"], json({1, 4}));
  EXPECT_EQ(j["zero"], 3);
  EXPECT_EQ(j["recompute"], "full");
  ASSERT_EQ(j["ranks"].size(), 4u);
  for (const json& x : j["ranks"]) {
    const bool first = x["pp_index"] == 0;
    const double n = first ? kEmbed + kBlockT1 : kHead + 4 * kBlockT1;
    EXPECT_EQ(x["stage_layers"], first ? 1 : 4);
    EXPECT_DOUBLE_EQ(x["own_params"].get<double>(), n);
    EXPECT_DOUBLE_EQ(x["dp_bytes"]["measured"].get<double>(), 4 * n);
    EXPECT_DOUBLE_EQ(x["dp_calls"].get<double>(), 2);
    EXPECT_DOUBLE_EQ(x["state_bytes"]["measured"].get<double>(), 8 * n);
    EXPECT_DOUBLE_EQ(x["pp_bytes_per_send"]["measured"].get<double>(), 512);
    EXPECT_DOUBLE_EQ(x["pp_sends"]["measured"].get<double>(), 2);
    const std::vector<double> steps = x["step_seconds"].get<std::vector<double>>();
    ASSERT_EQ(steps.size(), 3u);
    EXPECT_NEAR(x["step_s"].get<double>(), (steps[1] + steps[2]) / 2, 1e-12) << "not step 1";
    // Note [arrival wait]: DP 2 on loopback; a part of the DP time (the engine's clamp).
    ASSERT_TRUE(x["dp_arrival_wait_s"].is_number()) << x.dump();
    EXPECT_GE(x["dp_arrival_wait_s"].get<double>(), 0.0);
    EXPECT_LE(x["dp_arrival_wait_s"].get<double>(), x["dp_comm_s"]["measured"].get<double>());
  }
}

// A plan of DP 2 x PP 2 interleaved over 2 × 2 uneven virtual stages (Note [uneven virtual
// stages]; `tally compare --interleave 2 --pp-layers 1,2,1,1` writes `virtual_stage_layers`):
// 5 layers, stage 0 runs virtual stages 0 and 2 (1 + 1 layers), stage 1 virtual stages 1 and 3
// (2 + 1). Every check passes (float64 equivalence with the single-process model, bytes); each
// stage owns its chunks' blocks, n = 640 + 2·3280 and 544 + 3·3280; M = 4 micro-batches send
// (2v − 1)·M = 12 messages a stage.
TEST(ThreeDCli, UnevenVirtualStagesPlanRuns) {
  const test::TempDir dir;
  json p = plan_object(2, 1, 2, false, 0, 4);
  p["interleave"] = 2;
  p["stage_layers"] = {2, 3};
  p["virtual_stage_layers"] = {1, 2, 1, 1};
  const json j = run_plan(write(dir.path / "plan.json", {{"best", p}}), {});
  ASSERT_TRUE(j.contains("ranks"));
  EXPECT_EQ(j["model"]["layers"], 5);
  EXPECT_EQ(j["stage_layers"], json({2, 3}));
  ASSERT_EQ(j["ranks"].size(), 4u);
  for (const json& x : j["ranks"]) {
    const bool first = x["pp_index"] == 0;
    EXPECT_EQ(x["stage_layers"], first ? 2 : 3);
    EXPECT_DOUBLE_EQ(x["own_params"].get<double>(),
                     first ? kEmbed + 2 * kBlockT1 : kHead + 3 * kBlockT1);
    EXPECT_DOUBLE_EQ(x["pp_sends"]["measured"].get<double>(), 12);
  }
}

// Megatron-Core's slot split at its smallest: 2 layers as 0, 1, 1, 0 over 2 × 2 virtual stages
// (DP 2, M = 4), the shape of the planner's Llama 3.1 405B choice (0, 1×126, 0). Virtual stage 0
// is the embedding alone, virtual stage 3 the loss alone; every float64 and byte check passes.
// Own parameters: stage 0 the embedding and block 1 (virtual stage 2), stage 1 block 0 (virtual
// stage 1) and the head; sends 2·v·M − M = 12 per stage, as with blocks in every chunk. Then an
// empty chunk in the middle, 3 layers as 1, 1, 0, 1: virtual stage 2 passes its input on as the
// identity (stage 0: the embedding and block 0; stage 1: blocks 1 and 2 and the head).
TEST(ThreeDCli, EmptyVirtualStagesRunAsTheSlotSplit) {
  const test::TempDir dir;
  struct Case {
    std::vector<int> chunks, stages;
    double stage0_params, stage1_params;
  };
  for (const Case& c : {Case{{0, 1, 1, 0}, {1, 1}, kEmbed + kBlockT1, kHead + kBlockT1},
                        Case{{1, 1, 0, 1}, {1, 2}, kEmbed + kBlockT1, kHead + 2 * kBlockT1}}) {
    SCOPED_TRACE(json(c.chunks).dump());
    json p = plan_object(2, 1, 2, false, 0, 4);
    p["interleave"] = 2;
    p["stage_layers"] = c.stages;
    p["virtual_stage_layers"] = c.chunks;
    const json j = run_plan(write(dir.path / "plan.json", {{"best", p}}), {});
    ASSERT_TRUE(j.contains("ranks"));
    EXPECT_EQ(j["model"]["layers"], c.stages[0] + c.stages[1]);
    ASSERT_EQ(j["ranks"].size(), 4u);
    for (const json& x : j["ranks"]) {
      const bool first = x["pp_index"] == 0;
      EXPECT_EQ(x["stage_layers"], c.stages[first ? 0 : 1]);
      EXPECT_DOUBLE_EQ(x["own_params"].get<double>(),
                       first ? c.stage0_params : c.stage1_params);
      EXPECT_DOUBLE_EQ(x["pp_sends"]["measured"].get<double>(), 12);
    }
  }
}

// A plan of DP 2 x PP 2 with op-sac (t = 1: the out-projection GEMM replayed, nothing beyond
// core's saved set kept) through the CLI: every check passes (float64 equivalence, bytes), the
// JSON names the policy, and each rank's per-layer bytes of every policy equal the hand figures
// and core's.
TEST(ThreeDCli, OpSacPlanRunsAtTp1) {
  const test::TempDir dir;
  json p = plan_object(2, 1, 2, false, 1, 2);
  p["recompute"] = "op-sac";
  p["micro_batch"] = 2;  // B = 2, as saved_bytes counts
  const json j = run_plan(write(dir.path / "plan.json", {{"best", p}}), {"--layers", "4"});
  ASSERT_TRUE(j.contains("ranks"));
  EXPECT_EQ(j["recompute"], "op-sac");
  ASSERT_EQ(j["ranks"].size(), 4u);
  for (const json& x : j["ranks"]) EXPECT_TRUE(x["tp_arrival_wait_s"].is_null()) << "TP 1";
  for (const json& x : j["ranks"])
    for (int i = 0; i < kRecomputePolicies; ++i) {
      const auto policy = Recompute(i);
      const json& cell = x["activation_bytes_per_layer"][std::string(to_string(policy))];
      EXPECT_DOUBLE_EQ(cell["measured"].get<double>(), saved_bytes(policy, 1, false))
          << to_string(policy);
      EXPECT_DOUBLE_EQ(cell["ratio"].get<double>(), 1.0) << to_string(policy);
    }
}

// DESIGN.md §5: rank 0 SIGKILLs itself after its first pipeline operation of fp32 step 2 of 3;
// the run fails, `tally launch` names it, and no rank reports (each survivor either noticed —
// its CommError — or was stopped by the launcher: both non-zero). Rank 0 is the one the launcher
// checks first, so a survivor exiting in the same tick cannot be named instead.
// The liveness locks' directory is the launcher's (Note [launch scratch]): TMPDIR is empty after.
TEST(ThreeDCli, LostRankFailsTheRunAndIsNamed) {
  const test::TempDir tmp;
  const Ran r = run_command(
      {"/usr/bin/env", "TMPDIR=" + tmp.path.string(), TALLY_BINARY, "launch", "--nproc", "4",
       "--timeout", "100", "--", TALLY_BINARY, "run", "3d", "--dp", "2", "--pp", "2", "--zero",
       "3", "--layers", "4", "--hidden", "16", "--heads", "4", "--vocab", "32", "--seq", "8",
       "--steps", "3", "--kill-rank", "0", "--kill-at-step", "2", "--timeout", "10"},
      kLimit_s);
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("tally launch: rank 0 failed (killed by signal 9 (SIGKILL))"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("zero=3: step 1/3 loss "), std::string::npos) << "died mid-run: " << r.err;
  EXPECT_EQ(r.err.find("zero=3: step 2/3 loss "), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("checks: "), std::string::npos) << r.out;
  EXPECT_LT(r.elapsed_s, 60) << r.err;
  EXPECT_EQ(test::names_in(tmp.path), std::vector<std::string>{}) << "left in " << tmp.path;
}

// Note [naming a lost rank]: the liveness locks are an aid. With no temporary directory to hold
// them (TMPDIR names none, so neither the launcher's scratch nor rank 0's own can be made) the run
// goes on without them and passes its checks.
TEST(ThreeDCli, RunsWithoutATemporaryDirectory) {
  const Ran r = run_command(
      {"/usr/bin/env", "TMPDIR=/nonexistent/tally-test", TALLY_BINARY, "launch", "--nproc", "2",
       "--timeout", "100", "--", TALLY_BINARY, "run", "3d", "--dp", "2", "--layers", "2",
       "--hidden", "16", "--heads", "4", "--vocab", "32", "--seq", "8", "--steps", "2",
       "--timeout", "30"},
      kLimit_s);
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[rank 0] checks: "), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("FAIL"), std::string::npos) << r.out;
}

// Note [naming a lost rank] (three_d.cpp): the survivors name the lost rank themselves. Rank 0 of
// DP 2 x PP 2 SIGKILLs itself in fp32 step 2; every other rank's run_3d throws a CommError whose
// line names rank 0 and the step (whichever of its collectives, sends or receives failed first:
// its own peer's, or a survivor's that had already given up), with rank 0 as the peer.
// Forked without a launcher, the ranks are given a scratch directory as `tally launch` would
// (TALLY_LAUNCH_SCRATCH): the failed run's locks go there — one tally-3d-XXXXXX — and not to the
// system temp directory, where nobody would remove them.
TEST(ThreeDFault, SurvivorsNameTheLostRank) {
  const test::TempDir scratch;
  const test::ScopedEnv given(kLaunchScratchEnv, scratch.path.string());
  const auto run = harness::run_ranks(4, kLimit_s, [](const DistEnv& env) {
    ThreeDOptions o = tiny();
    o.tp = 1, o.zero = 3, o.steps = 3, o.kill_rank = 0, o.kill_at_step = 2, o.timeout_s = 20;
    try {
      run_3d(env, o);
      ADD_FAILURE() << "rank " << env.rank << ": no failure";
    } catch (const CommError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("rank " + std::to_string(env.rank) + ": lost rank 0 at fp32 step 2: ",
                           0),
                0u)
          << what;
      EXPECT_EQ(e.peer_rank(), 0) << what;
      EXPECT_EQ(std::count(what.begin(), what.end(), '\n'), 0) << what;
    }
  });
  ASSERT_EQ(run.ranks.size(), 4u);
  EXPECT_TRUE(WIFSIGNALED(run.ranks[0].status) && WTERMSIG(run.ranks[0].status) == SIGKILL)
      << run.describe();
  for (int q = 1; q < 4; ++q) EXPECT_TRUE(run.ranks[std::size_t(q)].ok()) << run.describe();
  EXPECT_LT(run.elapsed_s, 60) << run.describe();
  const std::vector<std::string> left = test::names_in(scratch.path);
  ASSERT_EQ(left.size(), 1u) << "in " << scratch.path;
  EXPECT_EQ(left[0].rfind("tally-3d-", 0), 0u) << left[0];
}

}  // namespace
}  // namespace tally::engine::exp_3d
