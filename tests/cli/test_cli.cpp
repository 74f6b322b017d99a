// End-to-end tests of the `tally` binary: the JSON interface contracts of issue 2 / 5, the text
// reports' convention lines, and exit code 2 with one line naming the flag for each class of bad
// input. Figures asserted here come from the seed (cited) — the CLI must print what core computes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace {

struct Run {
  int rc = -1;
  std::string out, err;
};

// Runs tally with `args` (shell words), capturing stdout and stderr separately.
Run tally(const std::string& args) {
  const auto err_path = std::filesystem::temp_directory_path() /
                        ("tally_cli_err_" + std::to_string(::getpid()) + ".txt");
  const std::string cmd = std::string(TALLY_BIN) + " " + args + " 2>" + err_path.string();
  Run r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  std::size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream e(err_path);
  r.err.assign(std::istreambuf_iterator<char>(e), {});
  std::filesystem::remove(err_path);
  return r;
}

nlohmann::json json_of(const Run& r) {
  EXPECT_EQ(r.rc, 0) << r.err;
  return nlohmann::json::parse(r.out);
}

// Issue 2 contract; seed §A5: ZeRO-2 over 8 ranks, N = 7e9 → 26.25 GB itemized 14/1.75/3.5/3.5/3.5.
TEST(Cli, MemoryJsonContract) {
  const auto j = json_of(tally("memory --params 7e9 --precision bf16 --optimizer adam --zero 2 "
                               "--dp 8 --json"));
  EXPECT_NEAR(j["total_gb"].get<double>(), 26.25, 1e-9);
  EXPECT_NEAR(j["items_gb"]["params"].get<double>(), 14.0, 1e-9);
  EXPECT_NEAR(j["items_gb"]["grads"].get<double>(), 1.75, 1e-9);
  EXPECT_NEAR(j["items_gb"]["m"].get<double>(), 3.5, 1e-9);
  EXPECT_NEAR(j["items_gb"]["v"].get<double>(), 3.5, 1e-9);
  EXPECT_NEAR(j["items_gb"]["master"].get<double>(), 3.5, 1e-9);
  const std::string conv = j["convention"];
  for (const char* part : {"bf16", "adam", "master fp32 counted", "ZeRO-2 k=8", "GB"})
    EXPECT_NE(conv.find(part), std::string::npos) << conv;
  EXPECT_FALSE(j["items_gb"].contains("activations"));
}

// With an architecture, sequence and micro-batch, activations join the items: seed-7b at b = 4,
// T = 2048 is ≈37.8 GB by Korthikanti (DESIGN.md erratum 3).
TEST(Cli, MemoryWithActivations) {
  const auto j = json_of(tally("memory --model seed-7b --zero 2 --dp 8 --seq 2048 "
                               "--micro-batch 4 --json"));
  EXPECT_NEAR(j["items_gb"]["activations"].get<double>(), 37.76, 0.05);
  EXPECT_NEAR(j["total_gb"].get<double>(), 26.25 + 37.76, 0.05);
  EXPECT_NE(j["activations"]["convention"].get<std::string>().find("Korthikanti"),
            std::string::npos);
}

TEST(Cli, MemoryTextCarriesConventionAndUnit) {
  const auto r = tally("memory --params 7B --unit GiB");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("GiB (2^30 B)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("104.31 GiB"), std::string::npos) << r.out;  // 112e9 B = 104.31 GiB
}

// Reads a Hugging Face config.json (the io layer) and counts Llama-2-7B's 6.74B parameters.
TEST(Cli, MemoryFromConfigJson) {
  const auto j = json_of(tally(std::string("memory --model ") + TALLY_TEST_DATA +
                               "/llama-2-7b.json --json"));
  EXPECT_NEAR(j["n_params"].get<double>() / 1e9, 6.74, 0.005);
}

// Seed §A2: S = 14 GB, k = 8 → 24.5 GB per rank, 0.49 s at 50 GB/s.
TEST(Cli, CommCollectiveJsonContract) {
  const auto j = json_of(tally("comm --collective all-reduce --size-gb 14 --ranks 8 "
                               "--bandwidth-gbps 50 --json"));
  EXPECT_NEAR(j["bytes_per_rank"].get<double>(), 24.5e9, 1);
  EXPECT_NEAR(j["seconds"].get<double>(), 0.49, 1e-9);
}

// Seed §A4 (TP): B=4, T=2048, h=4096, t=8 → ≈15 GB per step over 32 layers without recompute,
// ≈22 GB with full recompute (DESIGN.md erratum 2).
TEST(Cli, CommPerStepTable) {
  const auto none = json_of(tally("comm --model seed-7b --tp 8 --seq 2048 --micro-batch 4 --json"));
  const auto full = json_of(tally("comm --model seed-7b --tp 8 --seq 2048 --micro-batch 4 "
                                  "--recompute full --json"));
  auto tp_gb = [](const nlohmann::json& j) {
    for (const auto& it : j["items"])
      if (it["kind"] == "tp") return it["gb_per_rank"].get<double>();
    return -1.0;
  };
  EXPECT_NEAR(tp_gb(none), 15.0, 0.1);
  EXPECT_NEAR(tp_gb(full), 22.5, 0.1);
  // ZeRO-2 at m = 1 moves what DP moves (erratum 4); the seed's "half" is the reduce-scatter only.
  const auto z2 = json_of(tally("comm --params 7e9 --dp 8 --zero 2 --json"));
  const auto dp = json_of(tally("comm --params 7e9 --dp 8 --json"));
  EXPECT_NEAR(z2["dp_total_bytes"].get<double>(), dp["dp_total_bytes"].get<double>(), 1);
  EXPECT_NEAR(z2["seed_reduce_scatter_only_bytes"].get<double>(), 12.25e9, 1);
}

// Seed §A3: P = 8, M = 16 → 30.4 %; smallest M for ≤ 10 % is 63.
TEST(Cli, BubbleJsonContract) {
  const auto j = json_of(tally("bubble --pp 8 --micro-batches 16 --json"));
  EXPECT_NEAR(j["bubble_fraction"].get<double>(), 7.0 / 23, 1e-12);
  EXPECT_EQ(j["min_micro_batches_for_max_bubble"].get<int>(), 63);
}

// Seed §A4 (reliability) with DESIGN.md erratum 1: MTBF ≈41 h, 56 s save, Young ≈1.13 h,
// Daly ≈1.11 h, ≈3.1 % overhead, and ≈30 % at the seed's 24 h.
TEST(Cli, ReliabilityJsonContract) {
  const auto j = json_of(tally("reliability --gpus 8192 --failure-rate 3e-6 --state-gb 112 "
                               "--write-gbps 2 --restart-minutes 8 --interval-hours 24 --json"));
  EXPECT_NEAR(j["mtbf_hours"].get<double>(), 40.7, 0.1);
  EXPECT_NEAR(j["save_seconds"].get<double>(), 56, 1e-9);
  EXPECT_NEAR(j["young_interval_hours"].get<double>(), 1.13, 0.01);
  EXPECT_NEAR(j["daly_interval_hours"].get<double>(), 1.11, 0.01);
  EXPECT_NEAR(j["overhead_fraction"].get<double>(), 0.031, 0.002);
  EXPECT_NEAR(j["overhead_fraction_at_interval"].get<double>(), 0.30, 0.01);
}

// Issue 5 contract; seed 方案 1 (DP 8, ZeRO-1/2, no TP/PP) and 方案 4's reliability keys.
TEST(Cli, PlanJsonContract) {
  const auto j = json_of(tally("plan --json"));
  const auto& b = j["best"];
  for (const char* k : {"dp", "tp", "pp", "cp", "zero", "micro_batch", "grad_accum", "recompute",
                        "per_gpu_gb", "step_seconds", "mfu"})
    EXPECT_TRUE(b.contains(k)) << k;
  EXPECT_EQ(b["dp"], 8);
  EXPECT_EQ(b["tp"], 1);
  EXPECT_EQ(b["pp"], 1);
  const int zero = b["zero"];
  EXPECT_TRUE(zero == 1 || zero == 2);
  EXPECT_LE(b["per_gpu_gb"].get<double>(), b["usable_gb"].get<double>());
  for (const char* k : {"mtbf_hours", "save_seconds", "interval_hours", "overhead_fraction",
                        "expected_failures"})
    EXPECT_TRUE(j["reliability"].contains(k)) << k;
}

TEST(Cli, PlanReliabilityAtScale) {
  const auto j = json_of(tally("plan --gpus 8192 --global-batch 8192 --failure-rate 3e-6 "
                               "--write-gbps 2 --checkpoint-gb 112 --days 30 --json"));
  EXPECT_NEAR(j["reliability"]["mtbf_hours"].get<double>(), 40.7, 0.1);
  EXPECT_NEAR(j["reliability"]["save_seconds"].get<double>(), 56, 1e-9);
  EXPECT_NEAR(j["reliability"]["interval_hours"].get<double>(), 1.11, 0.01);
  EXPECT_NEAR(j["reliability"]["expected_failures"].get<double>(), 17.7, 0.1);
}

TEST(Cli, PlanTextHasTheSeedsSections) {
  const auto r = tally("plan");
  EXPECT_EQ(r.rc, 0) << r.err;
  for (const char* s : {"PLAN", "ACCOUNTS", "REASONS", "FAILURE CRITERIA", "VALIDATION PLAN",
                        "RELIABILITY", "ALTERNATIVES", "convention:"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s;
}

TEST(Cli, PlanNothingFitsIsAResult) {
  const auto r = tally("plan --model llama-2-70b --gpus 1 --global-batch 8 --seq 4096");
  EXPECT_EQ(r.rc, 0) << r.err;
  EXPECT_NE(r.out.find("NO LAYOUT FITS"), std::string::npos);
  EXPECT_NE(r.out.find("memory"), std::string::npos);
}

// Seed 方案 3 from plan 1's choice: A hits memory, B and C are costed.
TEST(Cli, CompareThreeOptions) {
  const auto j = json_of(tally("compare --json"));
  const auto& o = j["options"];
  ASSERT_EQ(o.size(), 4u);
  EXPECT_EQ(o[0]["name"], "base");
  EXPECT_EQ(o[1]["eval"]["fits"], false);
  EXPECT_EQ(o[1]["eval"]["wall"], "memory");
  EXPECT_EQ(o[2]["eval"]["fits"], true);
  EXPECT_EQ(o[3]["gpus"], 16);
}

// Bad input: exit 2, one line on stderr naming the flag (or file and field), nothing on stdout.
void expect_bad(const std::string& args, const std::string& names) {
  const auto r = tally(args);
  EXPECT_EQ(r.rc, 2) << args << "\n" << r.err;
  EXPECT_NE(r.err.find(names), std::string::npos) << args << "\n" << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
}

TEST(Cli, BadInputExitsTwoNamingTheFlag) {
  expect_bad("memory --params 0", "--params");                              // zero size
  expect_bad("memory --params -7B", "--params");                            // negative size
  expect_bad("comm --collective all-reduce --size-gb -1 --ranks 8", "--size-gb");
  expect_bad("memory --model seed-7b --seq 2048 --tp 3", "--tp = 3");       // k does not divide
  expect_bad("memory --model llama-9-1t", "--model");                       // unknown preset
  expect_bad("plan --gpu tpu-v9", "--gpu");                                 // unknown GPU preset
  expect_bad("memory --model /nonexistent/config.json", "/nonexistent/config.json");  // unreadable
  expect_bad("memory --params 7e9 --bogus", "--bogus");                     // unknown flag
  expect_bad("memory --params 7e9 --precision fp8", "--precision");
  expect_bad("bubble --pp 0 --micro-batches 4", "--pp");
  expect_bad("plan --gpus 0", "--gpus");                                    // zero GPUs
  expect_bad("plan --gpus 7", "--gpus = 7");                                // no layout can use 7
  expect_bad("plan --global-batch 0", "--global-batch");                    // impossible batch
  expect_bad("plan --global-batch 3 --gpus 16 --max-pp 1 --max-cp 1", "--global-batch");
}

TEST(Cli, MalformedConfigJsonExitsTwo) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("tally_bad_config_" + std::to_string(::getpid()) + ".json");
  std::ofstream(path) << R"({"hidden_size": "4096", "num_hidden_layers": 32)";
  expect_bad("memory --model " + path.string(), path.string());
  std::ofstream(path) << R"({"model_type": "llama", "hidden_size": -4096})";
  expect_bad("memory --model " + path.string(), "hidden_size");
  std::filesystem::remove(path);
}

TEST(Cli, HelpOnEveryCommand) {
  for (const char* c : {"memory", "comm", "bubble", "reliability", "plan", "compare"}) {
    const auto r = tally(std::string(c) + " --help");
    EXPECT_EQ(r.rc, 0) << c;
    EXPECT_NE(r.out.find("--json"), std::string::npos) << c;
  }
}

}  // namespace
