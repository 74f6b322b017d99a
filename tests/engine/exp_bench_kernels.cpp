// `tally bench gemm` and `tally bench memory` (tally/engine/bench/kernels.hpp) and the loop they
// close (issue 10): the statistics each row reports are recomputed here from its own median; the
// calibration file is built by bench gemm + memory (merging into it) plus a written α–β; and
// `tally bench ddp|run zero --calibration FILE` report a prediction whose terms add up and whose
// ratio is measured / predicted. No speed is asserted (bench/predict_vs_measured.sh reports the
// ratios); suite names start with "bench".
#include <gtest/gtest.h>

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../support/meminfo.hpp"
#include "../support/subprocess.hpp"
#include "../support/temp_dir.hpp"
#include "rank_harness.hpp"
#include "tally/engine/bench/harness.hpp"
#include "tally/engine/bench/kernels.hpp"
#include "tally/engine/comm.hpp"
#include "tally/io/calibration.hpp"
#include "tally/io/files.hpp"

#ifndef TALLY_BINARY
#error "TALLY_BINARY must name the tally executable"
#endif

namespace exp_bench_kernels {
namespace {

using namespace tally;
using namespace tally::engine;
using nlohmann::json;
using tally::subprocess::rank_lines;
using tally::subprocess::Ran;
using tally::subprocess::run_command;

const BenchKernelTiming kQuick{.threads = 1, .warmup = 1, .samples = 3, .min_sample_s = 2e-4};

// Note [run-queue wait] (tally/engine/comm.hpp): this thread and a second one, both pinned to
// the same core and both spinning on the clock for 0.3 s. The scheduler shares the core between
// them, so this thread spends about half of the 0.3 s runnable but off it (other load on the host
// only adds to that); it must read at least a fifth of the 0.3 s, and no more than the wall time
// that passed.
// The benchmarks refuse, in one line before allocating, what the host's ranks cannot hold
// (host_memory.hpp): bench memory's two buffers hold the working set; a GEMM's three fp32
// matrices b·(mk + kn + mn)·4 B. LOCAL_WORLD_SIZE sets the ranks so that the largest working set,
// 16 GiB, is twice the host's memory (MemTotal) on them, then a quarter of it.
TEST(BenchKernels, WhatTheHostCannotHoldIsRefusedInOneLine) {
  const double host = test_support::mem_total_bytes(), w = 16.0 * (1LL << 30);
  ASSERT_GT(host, 0);
  const auto refusal = [](const auto& options) -> std::string {
    try {
      options.validate();
    } catch (const InvalidInput& e) {
      return e.what();
    }
    return "accepted";
  };
  const int over = int(std::ceil(2 * host / w));
  setenv("LOCAL_WORLD_SIZE", std::to_string(over).c_str(), 1);
  const std::string msg = refusal(BenchMemoryOptions{.working_set_bytes = {1 << 20, w}});
  EXPECT_NE(msg.find("--sizes-mib 16384: its two buffers take 17.18 GB per rank"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("on this host's " + std::to_string(over) + " rank(s)"), std::string::npos)
      << msg;
  setenv("LOCAL_WORLD_SIZE", "1", 1);
  EXPECT_EQ(refusal(BenchMemoryOptions{.working_set_bytes = {std::min(0.25 * host, w / 16)}}),
            "accepted");
  // 4096 × (3 × 16384²) × 4 B = 13,194.14 GB.
  const std::string gemm = refusal(
      BenchGemmOptions{.m = {8, 16384}, .n = {16384}, .k = {16384}, .batch = {1, 4096}});
  EXPECT_NE(gemm.find("--m 16384 x --n 16384 x --k 16384 x --batch 4096: its three fp32 matrices "
                      "take 13194.14 GB per rank"),
            std::string::npos)
      << gemm;
  unsetenv("LOCAL_WORLD_SIZE");
}

TEST(BenchKernels, RunQueueWaitIsTheTimeAnotherThreadHeldTheCore) {
  if (!thread_runqueue_wait_s()) GTEST_SKIP() << "no /proc/thread-self/schedstat";
  cpu_set_t before;
  ASSERT_EQ(sched_getaffinity(0, sizeof before, &before), 0);
  int core = 0;
  while (core < CPU_SETSIZE && !CPU_ISSET(core, &before)) ++core;
  ASSERT_LT(core, CPU_SETSIZE);
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(core, &one);
  ASSERT_EQ(sched_setaffinity(0, sizeof one, &one), 0);  // this thread, and threads it starts
  const auto spin = [](double seconds) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
    }
  };
  const double wait0 = *thread_runqueue_wait_s();
  const auto t0 = std::chrono::steady_clock::now();
  std::thread other(spin, 0.3);
  spin(0.3);
  const double waited = *thread_runqueue_wait_s() - wait0;
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  other.join();
  ASSERT_EQ(sched_setaffinity(0, sizeof before, &before), 0);
  EXPECT_GE(waited, 0.3 / 5) << "wall " << wall;
  EXPECT_LE(waited, wall);
}

TEST(BenchKernels, GemmRowsAreTheirOwnArithmetic) {
  const BenchGemmOptions o{.m = {4, 8}, .n = {16, 32}, .k = {8, 64}, .timing = kQuick};
  const BenchGemmResult r = run_bench_gemm(o);
  ASSERT_EQ(r.rows.size(), 8u);
  double best = 0;
  for (const GemmRow& row : r.rows) {
    ASSERT_GT(row.time.median_s, 0);
    EXPECT_LE(row.time.min_s, row.time.median_s);
    EXPECT_LE(row.time.median_s, row.time.max_s);
    EXPECT_DOUBLE_EQ(row.flops_per_s, 2.0 * row.m * row.n * row.k / row.time.median_s);
    best = std::max(best, row.flops_per_s);
  }
  EXPECT_EQ(r.rows.front().m, 4);  // m-major, then n, then k
  EXPECT_EQ(r.rows[1].k, 64);
  EXPECT_DOUBLE_EQ(r.best_flops_per_s, best);
  io::KernelCalibration k;
  add_to_calibration(r, k);
  EXPECT_EQ(k.precision, "fp32");
  EXPECT_EQ(k.peak_flops, best);
  EXPECT_EQ(k.sm_count, 1);
  ASSERT_EQ(k.gemm.size(), 8u);
  EXPECT_EQ(k.gemm[3].seconds, r.rows[3].time.median_s);
  EXPECT_THROW(run_bench_gemm({.m = {0}, .timing = kQuick}), InvalidInput);
  // A zero-length sample could read 0 s and print an infinite FLOP/s: refused.
  EXPECT_THROW(run_bench_gemm({.m = {4}, .n = {4}, .k = {4},
                               .timing = {.threads = 1, .samples = 1, .min_sample_s = 0}}),
               InvalidInput);
}

// --batch: b products per call, batch-major rows, FLOP/s counting all b; into a calibration the
// batch is kept, a second grid of the same device merges by shape (a shape timed again takes the
// new time, the peak is the best of both), another device's GEMMs are replaced.
TEST(BenchKernels, BatchedGemmsAndMergedGrids) {
  const BenchGemmResult r =
      run_bench_gemm({.m = {4}, .n = {8}, .k = {16, 32}, .batch = {1, 3}, .timing = kQuick});
  ASSERT_EQ(r.rows.size(), 4u);
  EXPECT_EQ(r.rows[0].batch, 1);
  EXPECT_EQ(r.rows[2].batch, 3);
  EXPECT_EQ(r.rows[3].k, 32);
  for (const GemmRow& row : r.rows)
    EXPECT_DOUBLE_EQ(row.flops_per_s,
                     2.0 * double(row.batch) * row.m * row.n * row.k / row.time.median_s);
  io::KernelCalibration k;
  add_to_calibration(r, k);
  ASSERT_EQ(k.gemm.size(), 4u);
  EXPECT_EQ(k.gemm[2].batch, 3);
  const BenchGemmResult again =
      run_bench_gemm({.m = {4}, .n = {8}, .k = {32, 64}, .batch = {3}, .timing = kQuick});
  add_to_calibration(again, k);
  ASSERT_EQ(k.gemm.size(), 5u);  // 4·8·32·3 timed again, 4·8·64·3 added
  EXPECT_EQ(k.gemm[3].seconds, again.rows[0].time.median_s);
  EXPECT_EQ(k.gemm[4].k, 64);
  EXPECT_EQ(k.peak_flops, std::max(r.best_flops_per_s, again.best_flops_per_s));
  io::KernelCalibration other{.device = "another device", .precision = "bf16",
                              .peak_flops = 1e15, .gemm = {{.m = 1, .n = 1, .k = 1,
                                                            .seconds = 1}}};
  add_to_calibration(again, other);
  EXPECT_EQ(other.gemm.size(), 2u);
  EXPECT_EQ(other.peak_flops, again.best_flops_per_s);
  EXPECT_THROW(run_bench_gemm({.m = {4}, .batch = {0}, .timing = kQuick}), InvalidInput);
  EXPECT_THROW(run_bench_gemm({.m = {4}, .batch = {5000}, .timing = kQuick}), InvalidInput);
}

// Note [cold-cache GEMMs]: the flush runs, untimed, before every call — warm-up and timed — and
// each sample is one call; the buffer is twice the last-level cache within [64 MiB, 1 GiB].
TEST(BenchKernels, ColdTimingFlushesBeforeEveryCall) {
  std::string order;
  const TimeStats t = time_cold_calls(2, 3, [&] { order += 'f'; }, [&] { order += 'c'; });
  EXPECT_EQ(order, "fcfcfcfcfc");
  EXPECT_GE(t.min_s, 0);
  EXPECT_LE(t.median_s, t.max_s);
  constexpr double kMiB = 1 << 20;
  EXPECT_EQ(cache_flush_bytes(110100480.0), 220200960.0);  // this VM's 105 MiB L3 (getconf)
  EXPECT_EQ(cache_flush_bytes(0), 64 * kMiB);              // unknown: the floor
  EXPECT_EQ(cache_flush_bytes(4 * kMiB), 64 * kMiB);
  EXPECT_EQ(cache_flush_bytes(2048 * kMiB), 1024 * kMiB);
  EXPECT_GE(last_level_cache_bytes(), 0);
  // Cold rows keep their own arithmetic.
  BenchKernelTiming cold = kQuick;
  cold.cold = true;
  const BenchGemmResult r = run_bench_gemm({.m = {4}, .n = {16}, .k = {8, 64}, .timing = cold});
  ASSERT_EQ(r.rows.size(), 2u);
  for (const GemmRow& row : r.rows) {
    ASSERT_GT(row.time.median_s, 0);
    EXPECT_DOUBLE_EQ(row.flops_per_s, 2.0 * row.m * row.n * row.k / row.time.median_s);
  }
}

TEST(BenchKernels, MemoryRowsAreTheirOwnArithmetic) {
  const BenchMemoryOptions o{.working_set_bytes = {1048576.0, 65536.0}, .timing = kQuick};
  const BenchMemoryResult r = run_bench_memory(o);
  ASSERT_EQ(r.rows.size(), 2u);
  EXPECT_EQ(r.rows[0].working_set_bytes, 65536.0);  // ascending; two arrays of W/2 float32
  for (const MemoryRow& row : r.rows) {
    EXPECT_DOUBLE_EQ(row.add_bps, 3 * row.working_set_bytes / 2 / row.add.median_s);
    EXPECT_DOUBLE_EQ(row.copy_bps, 2 * row.working_set_bytes / 2 / row.copy.median_s);
    EXPECT_DOUBLE_EQ(row.zero_bps, row.working_set_bytes / 2 / row.zero.median_s);
  }
  io::KernelCalibration k;
  add_to_calibration(r, k);
  ASSERT_EQ(k.memory_curve.size(), 2u);
  EXPECT_EQ(k.memory_curve[1].bytes_per_s, r.rows[1].add_bps);
  EXPECT_EQ(k.memory_bps, r.rows[1].add_bps);  // the largest working set
  // Note [memory kernel overhead]: the add on 16 floats, its median the calibration's figure —
  // and, moving 128 bytes, no slower than the 1 MiB add (which moves 1.5 MiB).
  EXPECT_GT(r.overhead.median_s, 0);
  EXPECT_LT(r.overhead.median_s, r.rows[1].add.median_s);
  EXPECT_EQ(k.memory_overhead_s, r.overhead.median_s);
  EXPECT_THROW(run_bench_memory({.working_set_bytes = {100}, .timing = kQuick}), InvalidInput);
  // The streaming families go into the calibration as measured (Note [streaming kernel families]).
  ASSERT_EQ(k.streaming_kernels.size(), r.streaming.size());
  for (std::size_t i = 0; i < r.streaming.size(); ++i) {
    EXPECT_EQ(k.streaming_kernels[i].kernel, r.streaming[i].kernel);
    EXPECT_EQ(k.streaming_kernels[i].bytes, r.streaming[i].bytes);
    EXPECT_EQ(k.streaming_kernels[i].seconds_median, r.streaming[i].time.median_s);
  }
}

// Each family is timed on the engine's kernel at the probe shape and carries core's bytes of that
// operator, counted here by hand from core's documented conventions (float32, e = 4): the eager
// GELU reads x and writes y (2e per element of B·T·4C), its backward reads x and g and writes dx
// (3e); softmax and the mask read and write the (B, a, T, T) scores (2e), softmax's backward
// reads y and g and writes dx (3e, core's 1.5× rule); LayerNorm 2e forward, 5e backward over
// B·T·C (Note [norm backward passes]).
TEST(BenchKernels, StreamingFamiliesCarryCoresBytes) {
  const GptProbeShape shape{.hidden = 32, .heads = 2, .seq = 16, .micro_batch = 2};
  const std::vector<StreamingKernelRow> rows = time_streaming_kernels(kQuick, shape);
  const double e = 4, btc = 2.0 * 16 * 32, scores = 2.0 * 2 * 16 * 16;
  const std::vector<std::pair<std::string, double>> expected = {
      {"gelu", 2 * e * 4 * btc},       {"gelu.backward", 3 * e * 4 * btc},
      {"softmax", 2 * e * scores},     {"softmax.backward", 3 * e * scores},
      {"mask", 2 * e * scores},        {"mask.backward", 2 * e * scores},
      {"norm", 2 * e * btc},           {"norm.backward", 5 * e * btc}};
  ASSERT_EQ(rows.size(), expected.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    SCOPED_TRACE(rows[i].op);
    EXPECT_EQ(rows[i].kernel, expected[i].first);
    EXPECT_DOUBLE_EQ(rows[i].bytes, expected[i].second);
    EXPECT_GT(rows[i].time.median_s, 0);
    EXPECT_DOUBLE_EQ(rows[i].bytes_per_s, rows[i].bytes / rows[i].time.median_s);
  }
  EXPECT_EQ(rows[6].op, "norm-1");  // the layer's first norm stands for its family
}

// before_point runs once before each point is timed, and nowhere else: each GEMM shape; each
// working set's add, copy and zero; each streaming family (Note [side-by-side kernels]).
TEST(BenchKernels, BeforePointRunsOncePerPoint) {
  int points = 0;
  BenchKernelTiming t = kQuick;
  t.before_point = [&] { ++points; };
  const BenchGemmResult g = run_bench_gemm({.m = {4, 8}, .n = {16}, .k = {8, 64}, .timing = t});
  EXPECT_EQ(points, 4);
  EXPECT_EQ(g.ranks, 1);  // alone: no rank figures
  for (const GemmRow& row : g.rows) EXPECT_TRUE(row.rank_median_s.empty());
  points = 0;
  (void)time_memory(65536.0, t);
  EXPECT_EQ(points, 3);  // add, copy, zero
  points = 0;
  const GptProbeShape shape{.hidden = 32, .heads = 2, .seq = 16, .micro_batch = 2};
  EXPECT_EQ(time_streaming_kernels(t, shape).size(), 8u);
  EXPECT_EQ(points, 8);
}

// Side by side (Note [side-by-side kernels]): two ranks on loopback time the same grid; each
// figure is the mean of the ranks' own medians (min and max over both), the same on both ranks,
// and the calibration's device names the count.
TEST(BenchKernels, SideBySideRanksReportTheMeanOfTheirMedians) {
  test::TempDir dir("bench_side_by_side");
  const auto run = harness::run_ranks(2, 120, [&](const DistEnv& env) {
    Comm comm(env, {.timeout_s = 60});
    const auto exact = [](double x) {  // every bit: the ranks must agree exactly
      char b[32];
      std::snprintf(b, sizeof b, "%a ", x);
      return std::string(b);
    };
    const BenchGemmResult g =
        run_bench_gemm({.m = {4}, .n = {16, 32}, .k = {8}, .timing = kQuick}, &comm);
    EXPECT_EQ(g.ranks, 2);
    ASSERT_EQ(g.rows.size(), 2u);
    std::string figures;
    double best = 0;
    for (const GemmRow& row : g.rows) {
      ASSERT_EQ(row.rank_median_s.size(), 2u);
      EXPECT_DOUBLE_EQ(row.time.median_s, row.rank_median_s[0] / 2 + row.rank_median_s[1] / 2);
      EXPECT_LE(row.time.min_s, std::min(row.rank_median_s[0], row.rank_median_s[1]));
      EXPECT_GE(row.time.max_s, std::max(row.rank_median_s[0], row.rank_median_s[1]));
      EXPECT_DOUBLE_EQ(row.flops_per_s, 2.0 * row.m * row.n * row.k / row.time.median_s);
      best = std::max(best, row.flops_per_s);
      figures += exact(row.time.median_s);
    }
    EXPECT_DOUBLE_EQ(g.best_flops_per_s, best);
    const BenchMemoryResult m =
        run_bench_memory({.working_set_bytes = {65536.0}, .timing = kQuick}, &comm);
    EXPECT_EQ(m.ranks, 2);
    ASSERT_EQ(m.rows.size(), 1u);
    const MemoryRow& row = m.rows[0];
    ASSERT_EQ(row.rank_add_median_s.size(), 2u);
    EXPECT_DOUBLE_EQ(row.add.median_s,
                     row.rank_add_median_s[0] / 2 + row.rank_add_median_s[1] / 2);
    EXPECT_DOUBLE_EQ(row.add_bps, 3 * row.working_set_bytes / 2 / row.add.median_s);
    EXPECT_DOUBLE_EQ(row.zero_bps, row.working_set_bytes / 2 / row.zero.median_s);
    figures += exact(row.add.median_s) + exact(m.overhead.median_s);
    for (const StreamingKernelRow& s : m.streaming) {
      EXPECT_DOUBLE_EQ(s.bytes_per_s, s.bytes / s.time.median_s);
      figures += exact(s.time.median_s);
    }
    io::write_text_atomically((dir / ("rank" + std::to_string(env.rank))).string(), figures);
    io::KernelCalibration k;
    add_to_calibration(g, k);
    EXPECT_EQ(k.device, "cpu, libtorch 1 thread, 2 ranks side by side");
  });
  ASSERT_TRUE(run.all_ok()) << run.describe();
  EXPECT_EQ(io::read_text_file((dir / "rank0").string()),
            io::read_text_file((dir / "rank1").string()));
}

Ran tally(std::vector<std::string> args, double limit_s = 120) {
  args.insert(args.begin(), TALLY_BINARY);
  return run_command(args, limit_s);
}

Ran launched(int k, std::vector<std::string> command) {
  std::vector<std::string> args = {"launch", "--nproc", std::to_string(k), "--timeout", "100", "--",
                                   TALLY_BINARY};
  args.insert(args.end(), command.begin(), command.end());
  return tally(args);
}

json rank0_json(const Ran& r) {
  const auto lines = rank_lines(r.out, 0);
  EXPECT_EQ(lines.size(), 1u) << r.out << r.err;
  if (lines.empty()) return json();
  return json::parse(lines[0], nullptr, false);
}

// The prediction block's terms add up to its total, and the ratio is measured over it.
void expect_prediction(const json& j, double measured) {
  ASSERT_TRUE(j.contains("predicted_step_seconds")) << j.dump();
  const json& p = j["prediction"];
  const double total = j["predicted_step_seconds"];
  EXPECT_GT(total, 0);
  EXPECT_NEAR(total,
              double(p["contention"]) * (double(p["compute_s"]) + double(p["gradient_passes_s"]) +
                                         double(p["optimizer_s"])) +
                  double(p["comm_exposed_s"]),
              1e-12 * total);
  EXPECT_GT(double(p["comm_s"]), 0);  // k = 2: collectives cost something
  EXPECT_GT(double(p["comm_exposed_s"]), 0);  // at least DDP's last bucket
  EXPECT_LE(double(p["comm_exposed_s"]), double(p["comm_s"]));
  EXPECT_NEAR(double(j["measured_over_predicted"]), measured / total, 1e-9);
}

// `bench gemm --cache`: cold by default, warm on request, anything else refused naming the flag;
// the mode is printed in the JSON and recorded in the calibration's source.
TEST(BenchKernels, GemmCacheModeIsAFlagAndIsRecorded) {
  const std::vector<std::string> grid = {"bench", "gemm", "--m", "64", "--n", "64", "--k", "64",
                                         "--samples", "1", "--warmup", "0", "--json"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> a = grid;
    a.insert(a.end(), extra.begin(), extra.end());
    return tally(a);
  };
  Ran r = with({"--cache", "lukewarm"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("--cache"), std::string::npos) << r.err;
  r = with({});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(json::parse(r.out)["cache"], "cold");
  test::TempDir dir("bench_gemm_cache");
  const std::string cal = (dir / "cal.json").string();
  r = with({"--cache", "warm", "--calibration-out", cal});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(json::parse(r.out)["cache"], "warm");
  EXPECT_NE(io::load_calibration(cal).source.find("warm caches"), std::string::npos);
}

// Under `tally launch --nproc 2` bench gemm times side by side: rank 0 alone prints (the JSON
// says how many ranks, with each rank's median) and writes the calibration, whose device says so.
TEST(BenchKernels, LaunchedGemmTimesSideBySideAndRankZeroWrites) {
  test::TempDir dir("bench_gemm_side_by_side");
  const std::string cal = (dir / "cal.json").string();
  const Ran r = launched(2, {"bench", "gemm", "--m", "64", "--n", "128", "--k", "64,256",
                             "--samples", "2", "--warmup", "0", "--json", "--calibration-out",
                             cal});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(rank_lines(r.out, 1).empty()) << r.out;
  std::string printed;  // bench gemm's JSON spans lines
  for (const std::string& line : rank_lines(r.out, 0)) printed += line + "\n";
  const json j = json::parse(printed, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["ranks_side_by_side"], 2);
  ASSERT_EQ(j["rows"].size(), 2u);
  const io::Calibration c = io::load_calibration(cal);
  ASSERT_TRUE(c.kernels.has_value());
  EXPECT_EQ(c.kernels->device, "cpu, libtorch 1 thread, cold caches, 2 ranks side by side");
  for (std::size_t i = 0; i < 2; ++i) {
    const json& row = j["rows"][i];
    ASSERT_EQ(row["rank_seconds_median"].size(), 2u);
    EXPECT_DOUBLE_EQ(double(row["seconds_median"]),
                     double(row["rank_seconds_median"][0]) / 2 +
                         double(row["rank_seconds_median"][1]) / 2);
    EXPECT_EQ(c.kernels->gemm[i].seconds, double(row["seconds_median"]));
  }
}

TEST(BenchKernels, CalibrateThenPredictTheEnginesRuns) {
  test::TempDir dir("bench_kernels");
  const std::string cal = (dir / "cal.json").string();
  const std::vector<std::string> quick = {"--samples", "3", "--min-sample-ms", "0.2"};

  // bench memory first: it needs the section bench gemm starts (exit 2, saying so).
  Ran r = tally({"bench", "memory", "--sizes-mib", "0.0625,1", "--calibration-out", cal});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("bench gemm"), std::string::npos) << r.err;

  std::vector<std::string> gemm = {"bench", "gemm", "--m", "8,16", "--n", "16,64", "--k",
                                   "8,64",  "--calibration-out", cal};
  gemm.insert(gemm.end(), quick.begin(), quick.end());
  r = tally(gemm);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::vector<std::string> memory = {"bench", "memory", "--sizes-mib", "0.0625,1",
                                     "--calibration-out", cal};
  memory.insert(memory.end(), quick.begin(), quick.end());
  r = tally(memory);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  io::Calibration c = io::load_calibration(cal);
  ASSERT_TRUE(c.kernels.has_value());
  EXPECT_EQ(c.kernels->gemm.size(), 8u);
  EXPECT_EQ(c.kernels->memory_curve.size(), 2u);
  EXPECT_FALSE(c.intra_node.has_value());
  EXPECT_NE(c.source.find("cold caches"), std::string::npos) << c.source;  // bench gemm's default

  // k = 2 needs the α–β: refused before any rank trains, naming the flag and what is missing.
  const std::vector<std::string> ddp = {"bench", "ddp", "--widths", "16,32,32,4", "--batch", "8",
                                        "--warmup", "1", "--steps", "3", "--json",
                                        "--calibration", cal};
  r = launched(2, ddp);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--calibration"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("intra_node"), std::string::npos) << r.err;

  // The α–β as `bench allreduce --calibration-out` would merge it (io::merged_with_file, tested in
  // tests/io), written here: a fit on a loaded 2-core box can refuse, and this test is about the
  // prediction, not the fit (tests/engine/exp_bench_allreduce.cpp covers that).
  c.intra_node = LinkSpec{.bandwidth_bps = 1e9, .latency_s = 2e-5};
  // And both implementations' all-reduce points at k = 2, exact α–β ones (t = 2α + S/β at k = 2,
  // by hand): each run prices a collective on the fit of the implementation that runs it (Note
  // [per-implementation links]), which its JSON reports.
  const LinkSpec gloo{.bandwidth_bps = 2e9, .latency_s = 1e-4}, ring{.bandwidth_bps = 3e9,
                                                                    .latency_s = 3e-4};
  for (double S : {2.5e5, 4e6})
    for (const auto& [label, l] : {std::pair{io::kGlooAllReducePoints, gloo},
                                   std::pair{io::kRingAllReducePoints, ring}})
      c.points.push_back({.collective = std::string(label), .ranks = 2, .size_bytes = S,
                          .seconds_median = 2 * l.latency_s + S / l.bandwidth_bps});
  io::write_text_atomically(cal, io::calibration_to_json(c));
  const auto expect_link = [](const json& link, const LinkSpec& l) {
    EXPECT_NEAR(double(link["alpha_s"]) / l.latency_s, 1, 1e-9) << link.dump();
    EXPECT_NEAR(double(link["beta_bytes_per_s"]) / l.bandwidth_bps, 1, 1e-9) << link.dump();
  };

  r = launched(2, ddp);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json d = rank0_json(r);
  expect_prediction(d, d["step_time_s"]["median"]);
  expect_link(d["prediction"]["reduce_link"], gloo);  // the reducer calls Gloo's all-reduce

  r = launched(2, {"run", "zero", "--widths", "16,33,4", "--batch", "8", "--steps", "3", "--json",
                   "--calibration", cal});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json z = rank0_json(r);
  ASSERT_EQ(z["stages"].size(), 4u);
  for (const json& st : z["stages"]) {
    expect_prediction(st, st["step_seconds_median"]);
    expect_link(st["prediction"]["reduce_link"], ring);  // tally's ring all-reduce / scatter
    expect_link(st["prediction"]["reduce_scatter_link"], ring);
    expect_link(st["prediction"]["all_gather_link"], gloo);
  }
  // With the sharded halves' own points (`bench allreduce --sharded`; Note [sharded
  // collectives]), exact at k = 2: t = α + S/(2β), one step and S/2 bytes a rank, by hand.
  // (β = the file's intra_node 1 GB/s, so that run 3d's SP check below counts α's alone.)
  const LinkSpec rs{.bandwidth_bps = 1e9, .latency_s = 9e-4}, ag{.bandwidth_bps = 1e9,
                                                                 .latency_s = 6e-4};
  for (double S : {2.5e5, 4e6})
    for (const auto& [label, l] : {std::pair{io::kRingReduceScatterPoints, rs},
                                   std::pair{io::kGlooAllGatherPoints, ag}})
      c.points.push_back({.collective = std::string(label), .ranks = 2, .size_bytes = S,
                          .seconds_median = l.latency_s + S / 2 / l.bandwidth_bps});
  const std::string sharded_cal = (dir / "cal-sharded.json").string();
  io::write_text_atomically(sharded_cal, io::calibration_to_json(c));
  r = launched(2, {"run", "zero", "--widths", "16,33,4", "--batch", "8", "--steps", "2", "--json",
                   "--calibration", sharded_cal});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const json& st : rank0_json(r)["stages"]) {
    expect_prediction(st, st["step_seconds_median"]);
    expect_link(st["prediction"]["reduce_link"], ring);  // DP's all-reduce stays on the ring's
    expect_link(st["prediction"]["reduce_scatter_link"], rs);
    expect_link(st["prediction"]["all_gather_link"], ag);
  }

  // run 3d (Note [predicted 3-D step]): TP 2 on the default model, one pipeline stage, DP 1, so
  // each rank's step is its kernels (compute + Adam) plus its TP collectives; both ranks report
  // the slower rank's figure, and the ratio is measured / predicted.
  const std::string page = (dir / "3d.html").string();
  r = launched(2, {"run", "3d", "--tp", "2", "--steps", "2", "--json", "--calibration", cal,
                   "--html", page});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  // The page draws core's bars beside the measured ones (HtmlEngine.* check the page without one).
  EXPECT_NE(io::read_text_file(page).find(">rank 1: core<"), std::string::npos);
  const json t = rank0_json(r);
  ASSERT_EQ(t["ranks"].size(), 2u);
  double slowest = 0;
  for (const json& x : t["ranks"]) {
    const double compute = x["compute_s"]["predicted"], tp = x["tp_comm_s"]["predicted"],
                 adam = x["optimizer_time_s"]["predicted"], dp = x["dp_comm_s"]["predicted"];
    EXPECT_GT(compute, 0);
    EXPECT_GT(tp, 0);  // t = 2: the collectives cost something
    EXPECT_GT(adam, 0);
    EXPECT_EQ(dp, 0);
    EXPECT_EQ(double(x["pp_send_predicted_s"]), 0);
    slowest = std::max(slowest, compute + tp + adam);
    const double fwd = x["forward_time_per_micro_batch_s"]["predicted"],
                 bwd = x["backward_time_per_micro_batch_s"]["predicted"];
    EXPECT_NEAR(t["micro_batches"].get<double>() * (fwd + bwd), compute + tp, 1e-9 * compute);
  }
  double measured = 0;
  for (const json& x : t["ranks"]) {
    const json& step = x["step_time_s"];
    EXPECT_NEAR(double(step["predicted"]), slowest, 1e-9 * slowest);
    EXPECT_NEAR(double(step["ratio"]), double(step["measured"]) / slowest, 1e-9);
    measured = std::max(measured, double(step["measured"]));
  }
  EXPECT_DOUBLE_EQ(double(t["measured_step_seconds"]), measured);
  EXPECT_NEAR(double(t["predicted_step_seconds"]), slowest, 1e-9 * slowest);
  EXPECT_NEAR(double(t["measured_over_predicted"]), measured / slowest, 1e-9);
  // Without SP, k = 2: 2(k−1) = 2 α-steps per all-reduce, the bytes over β (the file's 20 µs and
  // 1 GB/s above); core's calls and bytes are checked against the run's elsewhere (ThreeD*).
  constexpr double alpha = 2e-5, beta = 1e9;
  for (const json& x : t["ranks"])
    EXPECT_NEAR(double(x["tp_comm_s"]["predicted"]),
                2 * alpha * double(x["tp_calls"]["predicted"]) +
                    double(x["tp_bytes"]["predicted"]) / beta,
                1e-9);
  // With SP the TP item's all-gathers and reduce-scatters take k−1 = 1 step each, and the backward
  // re-gathers (core's tp_regather) are on the critical path too: the engine issues them blocking;
  // so are the edges (2 all-gathers per micro-batch on the one stage, 1 step each) and the
  // once-per-step all-reduce of the sequence-sharded gradients (2 steps): Note [engine SP edges].
  r = launched(2, {"run", "3d", "--tp", "2", "--sp", "--steps", "1", "--json", "--calibration",
                   cal});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json sp = rank0_json(r);  // named: a range-for over a temporary's member reads freed memory
  ASSERT_EQ(sp["ranks"].size(), 2u);
  const double M = sp["micro_batches"];
  for (const json& x : sp["ranks"]) {
    const double regather_calls = x["tp_regather_calls"]["predicted"];
    EXPECT_GT(regather_calls, 0);
    EXPECT_GT(double(x["tp_other_predicted_bytes"]), 0);
    EXPECT_EQ(double(x["tp_other_predicted_bytes"]), double(x["tp_other_bytes"]));
    EXPECT_NEAR(double(x["tp_comm_s"]["predicted"]),
                alpha * (double(x["tp_calls"]["predicted"]) + regather_calls + 2 * M + 2) +
                    (double(x["tp_bytes"]["predicted"]) +
                     double(x["tp_regather_bytes"]["predicted"]) +
                     double(x["tp_other_predicted_bytes"])) / beta,
                1e-9);
  }
  // On the sharded points (Note [sharded collectives]): half the TP item's calls are
  // reduce-scatters on their fit, the other half, the re-gathers and the edges all-gathers on
  // theirs; the gradients' all-reduce stays on the file's link.
  r = launched(2, {"run", "3d", "--tp", "2", "--sp", "--steps", "1", "--json", "--calibration",
                   sharded_cal});
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const json sp2 = rank0_json(r);
  ASSERT_EQ(sp2["ranks"].size(), 2u);
  for (const json& x : sp2["ranks"]) {
    const double tp_calls = x["tp_calls"]["predicted"];
    EXPECT_NEAR(double(x["tp_comm_s"]["predicted"]),
                rs.latency_s * tp_calls / 2 +
                    ag.latency_s * (tp_calls / 2 + double(x["tp_regather_calls"]["predicted"]) +
                                    2 * M) +
                    2 * alpha +
                    (double(x["tp_bytes"]["predicted"]) +
                     double(x["tp_regather_bytes"]["predicted"]) +
                     double(x["tp_other_predicted_bytes"])) / beta,
                1e-9);
  }

  // bf16 is refused (each rank exits 2; `tally launch` reports the failed rank and exits 1).
  r = launched(2, {"run", "zero", "--precision", "bf16", "--calibration", cal});
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.err.find("exited with status 2"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("float32"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace exp_bench_kernels
