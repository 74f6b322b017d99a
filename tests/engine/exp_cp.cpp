// Context parallelism (issue 11; tally/engine/experiments/cp.hpp, engine/runtime/ring_attention.hpp)
// over real processes on loopback:
//   equivalence  float64 output and dQ, dK, dV of every rank's chunks vs single-process causal
//                attention with torch autograd (computed in the experiment from the plain
//                softmax(QKᵀ/√d + mask)·V) ≤ 1e-10 relative, at c = 1, 2, 3, 4, both splits, GQA
//                (4 query heads on 2 K,V heads);
//   bytes        per layer against hand arithmetic: 3(c−1) sends (forward K,V; backward K,V and
//                dK,dV: Liu et al. 2023, Megatron-LM context parallelism) of
//                2·B·(s/c)·g·d·bytes = 2·2·(24/c)·2·8·bytes, and against core's CP item;
//   balance      block pairs by hand from the chunk lists (query chunk i attends key chunks 0..i):
//                zigzag (Transformer Engine: chunks r, 2c−1−r) 2c+1 on every rank, contiguous
//                (chunks 2r, 2r+1) 4r+3, max/min (4c−1)/3;
//   the CLI      bad input exits 2 with one line naming the flag; `tally launch -- tally run cp
//                --json` reports measured beside predicted, and with --calibration each rank's
//                ring computation beside core's operator model of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "rank_harness.hpp"
#include "../support/subprocess.hpp"
#include "../support/temp_dir.hpp"
#include "tally/engine/experiments/cp.hpp"
#include "tally/io/calibration.hpp"
#include "tally/io/files.hpp"

#ifndef TALLY_BINARY
#error "TALLY_BINARY must name the tally executable"
#endif

namespace tally::engine::exp_cp {
namespace {

using nlohmann::json;
using subprocess::Ran;
using subprocess::rank_lines;
using subprocess::run_command;

constexpr double kLimit_s = 90;  // one run of c ranks on a loaded 2-core box; ctest's 300 s backstop

// B 2, a 4, g 2, d 8, s 24: 2c = 2, 4, 6, 8 chunks of 12, 6, 4, 3 tokens.
CpOptions tiny() {
  return {.batch = 2, .heads = 4, .kv_heads = 2, .head_dim = 8, .seq = 24, .repeats = 2,
          .timeout_s = 60};
}

std::string message(const CpOptions& o, int world) {
  try {
    o.validate(world);
  } catch (const InvalidInput& e) {
    return e.what();
  }
  return "no throw";
}

TEST(CpOptions, BadInputNamesTheFlagAndRange) {
  CpOptions o = tiny();
  o.cp = 3;
  EXPECT_EQ(message(o, 4),
            "--cp = 3: must equal the world size 4 (tally run cp runs one CP group over every rank)");
  o.cp = 5;  // 24 tokens do not split into 10 chunks
  EXPECT_EQ(message(o, 5),
            "--cp = 5: must split --seq = 24 into 2c equal chunks (allowed: 1, 2, 3, 4, 6, 12)");
  o = tiny();
  o.kv_heads = 3;
  EXPECT_EQ(message(o, 2), "--kv-heads = 3: must divide --heads = 4 (allowed: 1, 2, 4)");
  o = tiny();
  o.seq = 25;
  EXPECT_EQ(message(o, 1),
            "--seq = 25: must be even and in [2, 1048576] (the causal split cuts it into 2c chunks)");
  o = tiny();
  o.seq = 8192;  // 2·4·8192² scores in the reference
  EXPECT_NE(message(o, 2).find("--seq = 8192: the single-process reference's"), std::string::npos);
}

// One launch per c runs both splits over the same groups; the world sizes in one test, so the test
// binary (and libtorch) loads once for all four.
void check_equivalence(int c) {
  SCOPED_TRACE("c = " + std::to_string(c));
  const auto run = harness::run_ranks(c, kLimit_s, [c](const DistEnv& env) {
    const CpResult r = run_cp(env, tiny());
    ASSERT_EQ(r.variants.size(), 2u);
    // One K,V (or dK,dV) message: 2·B·(s/c)·g·d elements.
    const double message_elements = 2.0 * 2 * (24 / c) * 2 * 8;
    for (const CpVariant& v : r.variants) {
      const bool zigzag = v.balance == CpBalance::zigzag;
      SCOPED_TRACE(zigzag ? "zigzag" : "contiguous");
      EXPECT_LE(v.out_rel_diff, 1e-10);
      EXPECT_LE(v.dq_rel_diff, 1e-10);
      EXPECT_LE(v.dk_rel_diff, 1e-10);
      EXPECT_LE(v.dv_rel_diff, 1e-10);
      EXPECT_EQ(v.forward_sends_f64, c - 1);
      EXPECT_EQ(v.sends_f64, 3 * (c - 1));
      EXPECT_DOUBLE_EQ(v.bytes_f64, 3 * (c - 1) * message_elements * 8);
      EXPECT_DOUBLE_EQ(v.bytes_f32, 3 * (c - 1) * message_elements * 4);
      EXPECT_DOUBLE_EQ(v.bytes_f64, v.predicted_f64.cp.bytes_per_rank);  // core's CP item
      EXPECT_DOUBLE_EQ(double(v.sends_f64), v.predicted_f64.cp.calls);
      ASSERT_EQ(v.block_pairs.size(), std::size_t(c));
      for (int rank = 0; rank < c; ++rank)
        EXPECT_EQ(v.block_pairs[std::size_t(rank)], zigzag ? 2 * c + 1 : 4 * rank + 3) << rank;
      EXPECT_DOUBLE_EQ(v.block_pair_imbalance(), zigzag ? 1.0 : (4.0 * c - 1) / 3);
      EXPECT_EQ(v.layer_seconds.size(), 2u);
      EXPECT_EQ(v.compute_s_by_rank.size(), std::size_t(c));
    }
    for (const CpCheck& check : cp_checks(r)) EXPECT_TRUE(check.ok) << check.what << ": " << check.measured;
  });
  EXPECT_TRUE(run.all_ok()) << run.describe();
}

TEST(CpEquivalence, OutputGradientsBytesAndBalanceAtC1To4) {
  for (int c = 1; c <= 4; ++c) check_equivalence(c);
}

std::vector<std::string> as_rank0_of(int k, const std::vector<std::string>& flags) {
  return subprocess::as_rank0_of(TALLY_BINARY, "cp", k, flags);
}

TEST(CpCli, BadInputExitsTwoWithOneLine) {
  const Ran a = run_command(as_rank0_of(5, {"--cp", "5"}), kLimit_s);
  EXPECT_EQ(a.exit_code, 2) << a.err;
  EXPECT_NE(a.err.find("--cp = 5: must split --seq = 48 into 2c equal chunks (allowed: 1, 2, 3, 4, "
                       "6, 8, 12, 24)"),
            std::string::npos)
      << a.err;
  EXPECT_EQ(std::count(a.err.begin(), a.err.end(), '\n'), 1) << a.err;
}

TEST(CpCli, JsonMeasuredBesidePredicted) {
  const Ran r = run_command({TALLY_BINARY, "launch", "--nproc", "2", "--timeout", "80", "--",
                             TALLY_BINARY, "run", "cp", "--cp", "2", "--seq", "24", "--head-dim",
                             "8", "--repeats", "2", "--json", "--timeout", "60"},
                            kLimit_s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(rank_lines(r.out, 1).empty()) << "rank 0 reports";
  const auto lines = rank_lines(r.out, 0);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  const json j = json::parse(lines[0]);
  EXPECT_EQ(j["experiment"], "cp");
  EXPECT_TRUE(j["ok"].get<bool>()) << j["failed_checks"].dump();
  ASSERT_EQ(j["variants"].size(), 2u);
  const json& zig = j["variants"][0];
  EXPECT_EQ(zig["balance"], "zigzag");
  // 3 sends of 2·B·(s/c)·g·d·8 bytes = 2·2·12·2·8·8 = 6144 (defaults B 2, g 2).
  EXPECT_DOUBLE_EQ(zig["bytes_per_layer_f64"]["predicted"].get<double>(), 3 * 6144.0);
  EXPECT_DOUBLE_EQ(zig["bytes_per_layer_f64"]["ratio"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(zig["bytes_per_send_f64"]["measured"].get<double>(), 6144.0);
  EXPECT_DOUBLE_EQ(zig["block_pair_imbalance"]["measured"].get<double>(), 1.0);
  // Contiguous at c = 2: rank 0 chunks {0, 1} → 3 pairs, rank 1 {2, 3} → 7.
  EXPECT_EQ(j["variants"][1]["block_pairs_by_rank"], json::array({3.0, 7.0}));
  EXPECT_EQ(zig["layer_seconds_fp32"].size(), 2u);
  EXPECT_TRUE(zig["predicted_compute_seconds_by_rank_fp32"].is_null());  // no --calibration
  // One progress line per timed layer on stderr, from rank 0.
  EXPECT_NE(r.err.find("cp c=2 contiguous: layer 2/2 forward+backward "), std::string::npos) << r.err;
}

// --calibration FILE: each rank's ring computation predicted beside the measured one, from core's
// operator model of the ring's kernels under each split (Note [engine ring attention]) — the same
// on every zigzag rank (2c + 1 = 5 block pairs each), more for contiguous rank 1 (7 pairs) than
// rank 0 (3); a missing file is exit 2 naming the flag. A synthetic one-core host: 27 GEMMs at
// 100 GFLOP/s plus 10 µs, 30 GB/s streaming.
TEST(CpCli, CalibrationPredictsEachRanksRingKernels) {
  const test::TempDir dir("tally-exp-cp-calibration");
  io::KernelCalibration k{.device = "test-cpu", .precision = "fp32", .peak_flops = 100e9,
                          .sm_count = 1, .memory_bps = 3e10};
  for (std::int64_t m : {8, 64, 512})
    for (std::int64_t n : {16, 256, 1024})
      for (std::int64_t kk : {16, 256, 1024})
        k.gemm.push_back({.m = m, .n = n, .k = kk, .seconds = 2.0 * m * n * kk / 100e9 + 1e-5});
  const std::string cal = (dir.path / "cal.json").string();
  io::write_text_atomically(cal, io::calibration_to_json({.source = "synthetic", .kernels = k}));
  const auto launch = [&](const std::string& file) {
    return run_command({TALLY_BINARY, "launch", "--nproc", "2", "--timeout", "80", "--",
                        TALLY_BINARY, "run", "cp", "--cp", "2", "--seq", "24", "--head-dim", "8",
                        "--repeats", "2", "--json", "--timeout", "60", "--calibration", file},
                       kLimit_s);
  };
  const Ran r = launch(cal);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto lines = rank_lines(r.out, 0);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  const json j = json::parse(lines[0]);
  const json& zig = j["variants"][0]["predicted_compute_seconds_by_rank_fp32"];
  const json& contiguous = j["variants"][1]["predicted_compute_seconds_by_rank_fp32"];
  ASSERT_EQ(zig.size(), 2u) << j.dump();
  ASSERT_EQ(contiguous.size(), 2u) << j.dump();
  EXPECT_GT(zig[0].get<double>(), 0);
  EXPECT_DOUBLE_EQ(zig[0].get<double>(), zig[1].get<double>());
  EXPECT_GT(contiguous[1].get<double>(), contiguous[0].get<double>());
  EXPECT_LT(contiguous[0].get<double>(), zig[0].get<double>());  // 3 pairs against 5
  const Ran missing = launch((dir.path / "none.json").string());
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("--calibration"), std::string::npos) << missing.err;
}

}  // namespace
}  // namespace tally::engine::exp_cp
