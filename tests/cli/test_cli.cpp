// End-to-end tests of the `tally` binary: the JSON interface contracts of issue 2 / 5, the text
// reports' convention lines, and exit code 2 with one line naming the flag for each class of bad
// input. Figures asserted here come from the seed (cited) — the CLI must print what core computes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "run_tally.hpp"

namespace {

using tally::cli_test::expect_bad_input;
using tally::cli_test::json_of;
using tally::cli_test::Run;
using tally::cli_test::tally;

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
  // Korthikanti 2022 with flash attention (as in test_planner.cpp's derivation): L(34sbh + 4asb)
  // + sbh (embedding dropout) + 4sbh (final norm, LM-head input) + 4sbV (fp32 logits), with
  // h 4096, L 32, a 32, V 32000, s 2048, b 4.
  const double sbh = 2048.0 * 4 * 4096;
  const double act_gb = (32 * (34 * sbh + 4 * 32 * 2048.0 * 4) + 5 * sbh + 4 * 2048.0 * 4 * 32000) / 1e9;
  EXPECT_NEAR(j["items_gb"]["activations"].get<double>(), act_gb, 1e-6);
  EXPECT_NEAR(j["total_gb"].get<double>(), 26.25 + act_gb, 1e-6);
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
  EXPECT_TRUE(j["n_params"].is_number_integer()) << j["n_params"];  // a count, not 6.7e9 as a float
}

// Seed §A2: S = 14 GB, k = 8 → 24.5 GB per rank, 0.49 s at 50 GB/s.
// Note [JSON text for a file] (cli/flags.hpp): --model, --gpu and --calibration also take the file's
// text itself (what `tally serve`'s page sends); the answer is the file's, and a message names the
// text as the file it stands for.
TEST(Cli, ModelAndGpuTakeTheFilesText) {
  auto run = [](std::vector<std::string> args) {
    args.insert(args.begin(), TALLY_BIN);
    return tally::subprocess::run_command(args, 50);
  };
  auto text_of = [](const std::string& path) {
    std::ifstream f(path);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  };
  const std::string model = std::string(TALLY_TEST_DATA) + "/llama-2-7b.json";
  const std::string cluster = std::string(TALLY_TEST_DATA) + "/cluster-custom.json";
  const auto by_file = run({"memory", "--model", model, "--seq", "2048", "--gpu", cluster, "--json"});
  const auto by_text = run({"memory", "--model", text_of(model), "--seq", "2048", "--gpu",
                            "  " + text_of(cluster), "--json"});
  ASSERT_EQ(by_file.exit_code, 0) << by_file.err;
  ASSERT_EQ(by_text.exit_code, 0) << by_text.err;
  EXPECT_EQ(by_text.out, by_file.out);
  EXPECT_NE(by_text.out.find("\"gpu\": \"my-a100\""), std::string::npos);
  const auto bad = run({"plan", "--model", R"({"model_type": "llama", "hidden_size": 0})"});
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_EQ(bad.err.rfind("tally: error: config.json: hidden_size = 0: ", 0), 0u) << bad.err;
  const auto cal = run({"plan", "--calibration", "{"});
  EXPECT_EQ(cal.exit_code, 2);
  EXPECT_EQ(cal.err.rfind("tally: error: calibration.json: not valid JSON: ", 0), 0u) << cal.err;
}

TEST(Cli, CommCollectiveJsonContract) {
  const auto j = json_of(tally("comm --collective all-reduce --size-gb 14 --ranks 8 "
                               "--bandwidth-gbps 50 --json"));
  EXPECT_NEAR(j["bytes_per_rank"].get<double>(), 24.5e9, 1);
  EXPECT_NEAR(j["seconds"].get<double>(), 0.49, 1e-9);
}

// Seed §A4 (TP): B=4, T=2048, h=4096, t=8 → ≈15 GB per step over 32 layers without recompute,
// ≈22 GB with full recompute (DESIGN.md erratum 2).
// Issue 9, units people cannot misread: the value carries its unit; B is a byte, b a bit. One
// NDR InfiniBand NIC is 400 Gb/s = 50 GB/s; 512 MiB = 2^29 bytes; the seed's checkpoint, 112 GB at
// 2 GB/s, takes 56 s. The old unit-in-the-name flags are aliases into the same value.
TEST(Cli, QuantitiesCarryTheirUnits) {
  const auto bits = json_of(tally("comm --collective all-reduce --size 512MiB --ranks 8 "
                                  "--bandwidth 400Gb/s --json"));
  EXPECT_EQ(bits["bandwidth_bytes_per_s"].get<double>(), 50e9);
  EXPECT_EQ(bits["size_bytes"].get<double>(), 536870912.0);
  const auto alias = json_of(tally("comm --collective all-reduce --size-gb 0.536870912 --ranks 8 "
                                   "--bandwidth-gbps 50 --json"));
  EXPECT_EQ(alias["seconds"].get<double>(), bits["seconds"].get<double>());
  const auto rel = json_of(tally("reliability --gpus 8 --state-size 112GB --write-bandwidth 16Gb/s "
                                 "--json"));
  EXPECT_DOUBLE_EQ(rel["save_seconds"].get<double>(), 56.0);
  const auto plan = json_of(tally("plan --write-bandwidth 2GB/s --checkpoint-size 112GB --json"));
  EXPECT_DOUBLE_EQ(plan["reliability"]["save_seconds"].get<double>(), 56.0);
  // A bare number, a bit where a byte is meant, both spellings at once: exit 2, one line.
  for (const char* bad : {"comm --collective all-reduce --size 14 --ranks 8 --bandwidth 50GB/s",
                          "comm --collective all-reduce --size 14Gb --ranks 8 --bandwidth 50GB/s",
                          "comm --collective all-reduce --size 14GB --ranks 8 --bandwidth 50",
                          "comm --collective all-reduce --size 14GB --ranks 8 --bandwidth 50GB/s "
                          "--bandwidth-gbps 50",
                          "reliability --gpus 8 --state-size 1GB --write-bandwidth 1b/s",
                          "reliability --gpus 8"}) {
    const auto r = tally(bad);
    EXPECT_EQ(r.rc, 2) << bad << "\n" << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << bad << "\n" << r.err;
  }
}

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

// Note [PP scatter/gather]: GPT-3 175B (h 12288), b 1, s 2048, bf16: S = 2048 · 12288 · 2 =
// 50,331,648 B per PP tensor; with t = 8 each rank sends S/8 = 6,291,456 B and all-gathers
// 7S/8 = 44,040,192 B, 2m = 8 times a step; without the flag it sends S and gathers nothing.
TEST(Cli, CommPpScatterGatherSplitsEachSend) {
  const std::string layout = "comm --model gpt3-175b --tp 8 --pp 8 --micro-batch 1 --grad-accum 4";
  const auto on = json_of(tally(layout + " --pp-scatter-gather --json"));
  const auto off = json_of(tally(layout + " --json"));
  auto item = [](const nlohmann::json& j, const char* kind) {
    for (const auto& it : j["items"])
      if (it["kind"] == kind) return it;
    return nlohmann::json();
  };
  EXPECT_TRUE(on["pp_scatter_gather"].get<bool>());
  EXPECT_FALSE(off["pp_scatter_gather"].get<bool>());
  EXPECT_DOUBLE_EQ(item(on, "pp")["bytes_per_call"].get<double>(), 6291456.0);
  EXPECT_DOUBLE_EQ(item(on, "pp-gather")["bytes_per_call"].get<double>(), 44040192.0);
  EXPECT_EQ(item(on, "pp-gather")["calls"].get<double>(), 8.0);
  EXPECT_EQ(item(on, "pp-gather")["collective"], "all-gather");
  EXPECT_DOUBLE_EQ(item(off, "pp")["bytes_per_call"].get<double>(), 50331648.0);
  EXPECT_EQ(item(off, "pp-gather")["calls"].get<double>(), 0.0);
  EXPECT_NE(on["convention"].get<std::string>().find("scatter/gather"), std::string::npos);
  // The plan's convention line says so too.
  const auto plan = tally("plan --model gpt3-175b --gpus 64 --global-batch 64 --pp-scatter-gather");
  EXPECT_EQ(plan.rc, 0) << plan.err;
  EXPECT_NE(plan.out.find("PP sends scattered over TP"), std::string::npos) << plan.out;
}

// Note [error band]: the plan's "expect" line names whose runs its band comes from, and says so when
// no published run checks the GPU. The figures on that line are the plan's own JSON band (which
// tests/validation pins to the published rows), printed with three decimals.
TEST(Cli, PlanBandNamesTheRunsBehindIt) {
  const auto expect_line = [](const std::string& args, const std::string& runs) {
    SCOPED_TRACE(args);
    const auto text = tally(args);
    EXPECT_EQ(text.rc, 0) << text.err;
    const auto band = json_of(tally(args + " --json"))["error_band"];
    char range[64];
    std::snprintf(range, sizeof range, "%.3f–%.3f×",
                  band["measured_over_predicted_low"].get<double>(),
                  band["measured_over_predicted_high"].get<double>());
    EXPECT_NE(text.out.find("(" + runs + " took " + range), std::string::npos) << text.out;
  };
  // The default plan (ZeRO-1 data parallelism alone) is judged by FSDP runs, a model-parallel
  // plan on the same GPU by Megatron-LM's (Note [error band], LayoutFamily).
  expect_line("plan", "llm-foundry FSDP runs on A100");
  expect_line("plan --model gpt3-175b --gpus 1024 --global-batch 1536", "Megatron-LM runs on A100");
  expect_line("plan --gpu b200", "Megatron-Bridge runs on B200/B300/GB200/GB300");
  const std::string own = std::string(TALLY_TEST_DATA) + "/../../../docs/clusters/rtx-4090.json";
  expect_line("plan --gpu " + own, "no published run on this GPU; torchtitan runs on H100/H200");
}

// Interleaved stages (Narayanan 2021 §2.2.2): v = 3 chunks send 3× the PP bytes of v = 1. Seed 7B,
// s 2048, b 1, h 4096, bf16: one send = 2048·4096·2 B; a middle stage sends 2·v·m of them.
TEST(Cli, CommInterleavedPipelineSendsVTimesAsOften) {
  auto pp_item = [](const nlohmann::json& j) {
    for (const auto& it : j["items"])
      if (it["kind"] == "pp") return it;
    return nlohmann::json();
  };
  const auto v1 = pp_item(json_of(tally("comm --model seed-7b --pp 4 --grad-accum 8 --json")));
  const auto v3 = pp_item(json_of(tally("comm --model seed-7b --pp 4 --grad-accum 8 "
                                        "--interleave 3 --json")));
  ASSERT_TRUE(v1.is_object() && v3.is_object());
  EXPECT_EQ(v1["calls"].get<double>(), 2 * 8);
  EXPECT_EQ(v3["calls"].get<double>(), 2 * 3 * 8);
  EXPECT_DOUBLE_EQ(v3["bytes_per_call"].get<double>(), 2048.0 * 4096 * 2);
  const auto bad = tally("comm --model seed-7b --interleave 2");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("--interleave = 2: needs --pp > 1"), std::string::npos) << bad.err;
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
  // The seed's accounting (communication on the critical path), as its plan 1 reasons.
  const auto j = json_of(tally("plan --no-overlap-dp --no-overlap-param-gather "
                               "--recompute-policies none,selective,full --json"));
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
  expect_bad_input(args, {names});
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
  expect_bad("memory --params 7e9 --precision fp4", "--precision");
  expect_bad("bubble --pp 0 --micro-batches 4", "--pp");
  expect_bad("plan --gpus 0", "--gpus");                                    // zero GPUs
  expect_bad("plan --gpus 67", "--gpus = 67");                              // no layout can use 67
  expect_bad("plan --global-batch 0", "--global-batch");                    // impossible batch
  // 2^24 × 1024 = 17,179,869,184 GPUs: refused, not an int overflowing into "stride = 0" (found
  // by scripts/fuzz_cli.py under UBSan).
  expect_bad("comm --model deepseek-v3 --dp 16777216 --tp 1024 --seq 1",
             "--dp x --tp x --pp x --cp = 17179869184: must be at most 16777216 GPUs");
  expect_bad("plan --global-batch 3 --gpus 16 --max-pp 1 --max-cp 1", "--global-batch");
  expect_bad("plan --overlap-slowdown 1.5", "--overlap-slowdown");          // outside [0, 1]
  expect_bad("plan --flash-kernel fa3", "--flash-kernel");                  // fa2 | fa1 | cudnn
  // cuDNN's attention is measured on Hopper only (Note [cuDNN attention]): refused on the A100.
  expect_bad("plan --flash-kernel cudnn", "--flash-kernel cudnn");
}

// Note [flash kernel generations] on the command line: `--flash-kernel fa1` is echoed in the
// request with the other kernel choices and named in the convention, and the same layout (the
// default plan's) is slower than under the default fa2.
TEST(Cli, PlanFlashKernelIsAnInput) {
  const std::string base = "compare --model seed-7b --gpus 8 --zero 1 --micro-batch 4 --json";
  const auto v2 = json_of(tally(base));
  const auto v1 = json_of(tally(base + " --flash-kernel fa1"));
  const double s2 = v2["options"][0]["eval"]["step_seconds"];
  const double s1 = v1["options"][0]["eval"]["step_seconds"];
  EXPECT_GT(s1, s2);
  const auto plan = json_of(tally("plan --flash-kernel fa1 --kernels eager --json"));
  EXPECT_EQ(plan["request"]["flash_kernel"], "fa1");
  EXPECT_EQ(plan["request"]["kernels"], "eager");
  EXPECT_EQ(plan["request"]["loss"], "fused");
  EXPECT_EQ(plan["request"]["grad_accumulation"], "fused");
  EXPECT_NE(plan["convention"].get<std::string>().find("FlashAttention-1-class"),
            std::string::npos);
  EXPECT_EQ(json_of(tally("plan --json"))["request"]["flash_kernel"], "fa2");
  // cuDNN's fused attention on Hopper (Note [cuDNN attention]): echoed, named, and faster than
  // FlashAttention-2 there.
  const std::string h100 = base + " --gpu h100-80g";
  const double sc = json_of(tally(h100 + " --flash-kernel cudnn"))["options"][0]["eval"]
                                                                    ["step_seconds"];
  EXPECT_LT(sc, json_of(tally(h100))["options"][0]["eval"]["step_seconds"].get<double>());
  const auto cudnn = json_of(tally("plan --gpu h100-80g --flash-kernel cudnn --json"));
  EXPECT_EQ(cudnn["request"]["flash_kernel"], "cudnn");
  EXPECT_NE(cudnn["convention"].get<std::string>().find("cuDNN"), std::string::npos);
}

// Note [overlap contention]: the plan says how much slower the kernels beside a hidden collective
// run (Lee et al. 2025's 18.9 % by default), and --overlap-slowdown 0 (the ideal overlap) can only
// make a layout's step shorter: a ZeRO-3 layout's gathers hide behind compute on NVLink.
TEST(Cli, PlanOverlapSlowdownIsAnInput) {
  const auto text = tally("plan");
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_NE(text.out.find("kernels beside a hidden collective 18.9 % slower"), std::string::npos)
      << text.out;
  const std::string base = "compare --model seed-7b --gpus 8 --zero 3 --micro-batch 4 "
                           "--alternative double-gpus --json";
  const auto slowed = nlohmann::json::parse(tally(base).out);
  const auto ideal = nlohmann::json::parse(tally(base + " --overlap-slowdown 0").out);
  const double s = slowed["options"][0]["eval"]["step_seconds"];
  const double i = ideal["options"][0]["eval"]["step_seconds"];
  EXPECT_LT(i, s);
  EXPECT_GT(i, 0.9 * s);  // σ/(1 + σ) of the hidden gathers, not the step
  EXPECT_NE(tally("plan --overlap-slowdown 0").out.find("collective 0 % slower"),
            std::string::npos);
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
  for (const char* c : {"memory", "comm", "bubble", "reliability", "plan", "compare", "explain"}) {
    const auto r = tally(std::string(c) + " --help");
    EXPECT_EQ(r.rc, 0) << c;
    EXPECT_NE(r.out.find("--json"), std::string::npos) << c;
  }
}

// Note [version] (cli/version.cpp): one line naming the commit; where the source is a git checkout,
// a commit git knows there: HEAD, or one before it where the binary was built and commits came
// after (a docs-only commit does not rebuild anything until the next build).
TEST(Cli, VersionNamesTheCommit) {
  const auto r = tally("--version");
  EXPECT_EQ(r.rc, 0) << r.err;
  std::smatch m;
  const std::regex line(R"(tally, commit ([0-9a-f]{7,40}|unknown)(-dirty)?\n)");
  ASSERT_TRUE(std::regex_match(r.out, m, line)) << r.out;
  const std::string git = std::string("git -C '") + TALLY_SOURCE_DIR + "' ";
  if (tally::subprocess::run_command({"/bin/sh", "-c", git + "rev-parse HEAD"}, 20).exit_code != 0)
    GTEST_SKIP() << "no git checkout to compare with: " << r.out;
  const auto known = tally::subprocess::run_command(
      {"/bin/sh", "-c", git + "merge-base --is-ancestor '" + m[1].str() + "' HEAD"}, 20);
  EXPECT_EQ(known.exit_code, 0) << r.out << "is not HEAD nor a commit before it\n" << known.err;
}

// One line of a `--help` text, read in order: the name of the subcommand it lists, if it is an
// entry of the "Subcommands:" section (`listing` carries that state from line to line). Names
// may start with a digit (`run 3d`).
std::optional<std::string> subcommand_entry(const std::string& line, bool& listing) {
  static const std::regex entry(R"(^  ([a-z0-9][a-z0-9-]*)\s)");
  std::smatch m;
  if (line.rfind("Subcommands:", 0) == 0) listing = true;
  else if (line.empty()) listing = false;
  else if (listing && std::regex_search(line, m, entry)) return m[1].str();
  return std::nullopt;
}

// The engine's commands' subcommands as `tally <group> --help` lists them (tally-engine's own
// registry), in its order.
std::vector<std::string> listed_subcommands(const std::string& group) {
  std::istringstream in(tally(group + " --help").out);
  std::vector<std::string> names;
  bool listing = false;
  for (std::string line; std::getline(in, line);)
    if (auto name = subcommand_entry(line, listing)) names.push_back(*name);
  return names;
}

bool engine_built();

// `tally --help` comes from the planner binary, which does not link the engine and names the
// engine's experiments and benchmarks by hand (cli/main.cpp, register_engine_stubs); each one
// tally-engine registers must be named there, so the top-level help never hides a command.
TEST(Cli, HelpNamesEveryEngineCommand) {
  if (!engine_built()) GTEST_SKIP() << "tally-engine not built: no list to compare";
  const std::string top = tally("--help").out;
  for (const std::string group : {"run", "bench"}) {
    const auto line_at = top.find("\n  " + group + " ");
    ASSERT_NE(line_at, std::string::npos) << group << "\n" << top;
    const std::string line = top.substr(line_at + 1, top.find('\n', line_at + 1) - line_at - 1);
    const std::vector<std::string> names = listed_subcommands(group);
    EXPECT_GE(names.size(), group == "run" ? 15u : 4u) << group;
    for (const std::string& name : names)
      EXPECT_TRUE(std::regex_search(line, std::regex("[ :,]" + name + "[,( ]")))
          << "`tally --help` does not name `" << group << " " << name << "`:\n" << line;
  }
}

// ---- Issue 8 (hardening), command line: items 8, 9 and 10 ------------------------------------
// Every run of tally here costs a process start, which is ~1 s where tally links libtorch (the
// engine build), so the sweeps below are tables and --help reads, not value × flag products.

// An interval as the messages print it: "[0.001, 1]", "(0, 86400]".
const std::regex kInterval(R"([\[(][-+0-9.e]+, [-+0-9.e]+[\])])");

// The engine's commands (`launch`, `run …`, `bench …`) run: tally-engine was built beside tally
// (Note [two executables] in cli/main.cpp).
bool engine_built() {
  return std::filesystem::exists(std::filesystem::path(TALLY_BIN).parent_path() / "tally-engine");
}

// Item 8: the flags the issue found reading NaN as "use the default" (exit 0, default result).
// Each now refuses it: exit 2, one line naming the flag, the value and the allowed interval.
const std::vector<std::pair<std::string, std::string>> kIssueFlags = {
    {"plan", "--utilisation"},
    {"plan", "--failure-rate"},
    {"plan", "--write-gbps"},
    {"plan", "--checkpoint-gb"},
    {"plan", "--tokens"},
    {"plan", "--days"},
    {"comm --collective all-reduce --size-gb 1 --ranks 8 --bandwidth-gbps 50", "--latency-us"},
    {"comm --collective all-reduce --size-gb 1 --ranks 8", "--bandwidth-gbps"},
    {"reliability --gpus 8 --state-gb 100", "--interval-hours"},
    {"bubble --pp 4 --micro-batches 8", "--forward-ms"},
    {"compare", "--utilisation"},
};

void expect_refused(const std::string& command, const std::string& flag, const std::string& value) {
  const std::string args = command + " " + flag + " " + value;
  const std::string line = expect_bad_input(args, {flag, "'" + value + "'"});
  EXPECT_TRUE(std::regex_search(line, kInterval)) << args << "\n" << line;
}

TEST(CliHardening, NanIsRefusedNotReadAsTheDefault) {
  for (const auto& [command, flag] : kIssueFlags) expect_refused(command, flag, "nan");
  // Flags that had a default rather than a sentinel took NaN too; any spelling strtod reads.
  expect_refused("reliability --gpus 8 --state-gb 100", "--failure-rate", "NaN");
  expect_refused("reliability --gpus 8 --state-gb 100", "--write-gbps", "-nan");
  expect_refused("plan", "--headroom", "NAN");
  if (engine_built()) {  // run/bench flags go through the same check
    expect_refused("run checkpoint --dir /tmp/x", "--lr", "nan");
    expect_refused("bench allreduce", "--sizes-mb", "nan");
    expect_bad_input("launch --nproc 1 --timeout nan -- true", {"--timeout", "'nan'"});
  }
}

TEST(CliHardening, InfinityAndOverflowAreRefused) {
  const char* values[] = {"inf", "-inf", "1e999", "-1e999", "infinity"};
  std::size_t i = 0;
  for (const auto& [command, flag] : kIssueFlags) expect_refused(command, flag, values[i++ % 5]);
  // Integer flags: not an integer, so refused by the parser (flag, value and range named).
  expect_bad_input("plan --gpus nan", {"--gpus", "nan", "range"});
  expect_bad_input("bubble --pp 1e999 --micro-batches 8", {"--pp", "1e999", "range"});
}

// Item 8, every numeric flag: each floating-point option of every command (the engine's run and
// bench commands too when built) carries the finite-interval check, which --help shows as
// "FLOAT:in [lo, hi]" ("FLOAT:finite, …" where the engine checks the range itself: launch
// --timeout). CLI::Range, which lets NaN through, shows "FLOAT in [lo - hi]" instead.
TEST(CliHardening, EveryFloatingPointFlagHasTheFiniteCheck) {
  const std::regex float_flag(R"(^\s+(--[a-z0-9-]+) FLOAT\b)");
  const std::regex checked(R"(FLOAT(?: \.\.\.)?:(in [\[(][^,]+, [^\])]+[\])]|finite, ))");
  int commands = 0, floats = 0;
  bool visited_3d = false;
  std::vector<std::string> todo = {""};
  while (!todo.empty()) {  // every command and subcommand, from the "Subcommands:" sections
    const std::string command = todo.back();
    todo.pop_back();
    std::istringstream in(tally(command + " --help").out);
    std::string line;
    bool listing = false;
    while (std::getline(in, line)) {
      std::smatch m;
      if (auto name = subcommand_entry(line, listing)) {
        todo.push_back(command.empty() ? *name : command + " " + *name);
        visited_3d = visited_3d || todo.back() == "run 3d";
        ++commands;
      } else if (std::regex_search(line, m, float_flag)) {
        ++floats;
        EXPECT_TRUE(std::regex_search(line, checked)) << command << " " << m[1] << ":\n" << line;
      }
    }
  }
  EXPECT_GE(commands, 6);
  EXPECT_GE(floats, 30);  // reliability 8, plan 8, compare 8, comm 3, bubble 3 without the engine
  // A name starting with a digit is walked too (the walk once skipped `run 3d`'s flags).
  if (engine_built()) {
    EXPECT_TRUE(visited_3d) << "run 3d not reached";
  }
}

// Item 8: "was it given" comes from the parser. A value equal to an old sentinel is a value:
// --forward-ms 0 adds times of 0 ms (0 once meant "not given"); --latency-us, once ignored
// without --bandwidth-gbps, sets α on the preset's link.
TEST(CliHardening, GivenComesFromTheParserNotASentinel) {
  const auto b = json_of(tally("bubble --pp 4 --micro-batches 8 --forward-ms 0 --json"));
  ASSERT_TRUE(b.contains("total_time_s")) << b.dump();
  EXPECT_EQ(b["total_time_s"].get<double>(), 0.0);
  EXPECT_FALSE(json_of(tally("bubble --pp 4 --micro-batches 8 --json")).contains("total_time_s"));

  const auto c = json_of(tally("comm --collective all-reduce --size-gb 1 --ranks 8 "
                               "--latency-us 250 --json"));
  EXPECT_DOUBLE_EQ(c["latency_s"].get<double>(), 250e-6);

  // compare's base: --dp and --grad-accum derived unless given (B 256 over dp 8 × b 4 → 8) ...
  const auto base = json_of(tally("compare --json"))["options"][0]["eval"];
  EXPECT_EQ(base["dp"], 8);
  EXPECT_EQ(base["grad_accum"], 256 / (8 * 4));
  // ... and used when given: dp 4 × tp 2 = 8 GPUs, grad-accum 16 → B = 4 · 4 · 16 = 256.
  const auto given = json_of(tally("compare --dp 4 --tp 2 --grad-accum 16 --json"))["options"][0];
  EXPECT_EQ(given["eval"]["dp"], 4);
  EXPECT_EQ(given["eval"]["grad_accum"], 16);
}

// Item 9: an empty value is bad input (exit 2, one line naming the flag), never "not given", for
// every flag that takes a value: a file, a preset, a count, a number or a choice.
TEST(CliHardening, EmptyValuesAreBadInput) {
  std::vector<std::pair<std::string, std::string>> cases = {
      {"plan --params ''", "--params"},
      {"plan --calibration ''", "--calibration"},
      {"plan --model ''", "--model"},
      {"plan --gpu ''", "--gpu"},
      {"memory --params 7e9 --gpu ''", "--gpu"},
      {"memory --params ''", "--params"},
      {"comm --model seed-7b --calibration ''", "--calibration"},
      {"comm --collective '' --size-gb 1 --ranks 8", "--collective"},
      {"compare --dp ''", "--dp"},
      {"reliability --gpus 8 --state-gb ''", "--state-gb"},
      {"bubble --pp 4 --micro-batches 8 --unit ''", "--unit"},
  };
  if (engine_built()) {
    cases.push_back({"run checkpoint --dir ''", "--dir"});
    cases.push_back({"run fault-drill --work-dir ''", "--work-dir"});
    cases.push_back({"bench allreduce --calibration-out ''", "--calibration-out"});
  }
  for (const auto& [args, flag] : cases) expect_bad_input(args, {flag});
}

// A number printed as inf or nan (fmt writes "inf", "-inf", "nan", "-nan"). The plan's failure
// criteria mention "NaN" in words, which is not a figure, hence lower case only.
bool prints_non_finite(const std::string& s) {
  return std::regex_search(s, std::regex(R"((^|[^A-Za-z_])-?(inf|nan)([^A-Za-z_]|$))"));
}

// Item 10: λ = 0 means no failure is expected and reliability needs no checkpoint interval: said
// in words, JSON null beside "no_failures_expected": true, never inf. A λ so small that 1/(G·λ)
// overflows a double is the same case.
TEST(CliHardening, ZeroFailureRateIsReportedInWords) {
  const std::string words =
      "no failures expected: no checkpoint interval is needed for reliability";
  for (const char* rate : {"0", "1e-310"}) {
    const std::string args = std::string("reliability --gpus 1 --state-gb 1e-9 --failure-rate ") +
                             rate + " --interval-hours 2 --days 3";
    const auto text = tally(args);
    EXPECT_EQ(text.rc, 0) << text.err;
    EXPECT_NE(text.out.find(words), std::string::npos) << text.out;
    EXPECT_FALSE(prints_non_finite(text.out)) << text.out;

    const auto j = json_of(tally(args + " --json"));
    EXPECT_EQ(j["no_failures_expected"], true);
    for (const char* k : {"mtbf_hours", "young_interval_hours", "daly_interval_hours",
                          "recommended_interval_hours"}) {
      ASSERT_TRUE(j.contains(k)) << k;
      EXPECT_TRUE(j[k].is_null()) << k << " = " << j[k];
    }
    // No failure: no rework and no checkpoint, so nothing is lost; at a 2 h interval only the
    // save, C/T = (1 B / 1e9 B/s) / (2 · 3600 s) — the default 1 GB/s per node, one node; over 3
    // days, no failure.
    EXPECT_EQ(j["overhead_fraction"].get<double>(), 0.0);
    EXPECT_NEAR(j["overhead_fraction_at_interval"].get<double>(), 1.0 / 1e9 / 7200, 1e-25);
    EXPECT_EQ(j["expected_failures"].get<double>(), 0.0);
  }
  // With failures the flag is false and the figures are numbers: 1 / (8192 · λ) h with the
  // default λ of Llama 3's fleet, 419 unexpected interruptions / (54 days · 24 h · 16,384 GPUs).
  const auto f = json_of(tally("reliability --gpus 8192 --state-gb 112 --json"));
  EXPECT_EQ(f["no_failures_expected"], false);
  EXPECT_NEAR(f["mtbf_hours"].get<double>(), 1 / (8192 * 419.0 / (54 * 24 * 16384)), 1e-9);

  const auto plan = tally("plan --failure-rate 0 --days 30");
  EXPECT_EQ(plan.rc, 0) << plan.err;
  EXPECT_NE(plan.out.find(words), std::string::npos) << plan.out;
  EXPECT_FALSE(prints_non_finite(plan.out)) << plan.out;
  const auto p = json_of(tally("plan --failure-rate 0 --days 30 --json"))["reliability"];
  EXPECT_EQ(p["no_failures_expected"], true);
  for (const char* k : {"mtbf_hours", "interval_hours", "young_interval_hours",
                        "daly_interval_hours"})
    EXPECT_TRUE(p[k].is_null()) << k;
  EXPECT_EQ(p["expected_failures"].get<double>(), 0.0);
  EXPECT_EQ(json_of(tally("plan --json"))["reliability"]["no_failures_expected"], false);
}

// Item 10, every other output path: the floating-point flags of each ledger command set to the
// ends of their intervals, in combinations that put every pair of flags at opposite ends at least
// once (flag i takes its upper end in run (b, c) iff bit b of i, xor c, is set: two flags differ
// in some bit). Every report must be printed without inf or nan; a figure that is not finite
// stops the command (exit 2) instead, which here would be a case to handle like λ = 0.
struct EdgeCase {
  const char* command;
  const char* base;
};

class CliEdges : public ::testing::TestWithParam<EdgeCase> {};

TEST_P(CliEdges, NoInfOrNanAtTheEndsOfEveryInterval) {
  const auto [command, base] = GetParam();
  struct Bounded { std::string name, lo, hi; };
  std::vector<Bounded> flags;
  std::istringstream in(tally(std::string(command) + " --help").out);
  std::string line;
  const std::regex bounded(R"(^\s+(--[a-z0-9-]+) FLOAT:in ([\[(])([^,]+), ([^\])]+)([\])]))");
  // An open end is not a value: take the value just inside it.
  auto end = [](const std::string& at, const std::string& other, bool open) {
    if (!open) return at;
    const double a = std::stod(at), b = std::stod(other);
    std::ostringstream os;
    os.precision(17);
    os << a + (b - a) * 1e-9;
    return os.str();
  };
  while (std::getline(in, line)) {
    std::smatch m;
    // --tokens excludes --days; --lora-* need --method lora|qlora; flags in `base` stay as given.
    if (std::regex_search(line, m, bounded) && m[1] != "--tokens" &&
        !(m[1].str().rfind("--lora-", 0) == 0 &&
          std::string(base).find("--method") == std::string::npos) &&
        std::string(base).find(m[1].str() + " ") == std::string::npos)
      flags.push_back({m[1], end(m[3], m[4], m[2] == "("), end(m[4], m[3], m[5] == ")")});
  }
  int bits = 1;
  while ((std::size_t(1) << bits) < flags.size()) ++bits;
  for (int b = 0; b < bits; ++b)
    for (int c = 0; c < 2; ++c) {
      std::string args = std::string(command) + " " + base;
      for (std::size_t i = 0; i < flags.size(); ++i)
        args += " " + flags[i].name + " " + ((((i >> b) & 1) ^ c) ? flags[i].hi : flags[i].lo);
      const auto r = tally(args);
      EXPECT_EQ(r.rc, 0) << args << "\n" << r.err;
      EXPECT_FALSE(prints_non_finite(r.out)) << args << "\n" << r.out;
    }
}

INSTANTIATE_TEST_SUITE_P(
    Ledgers, CliEdges,
    ::testing::Values(EdgeCase{"memory", "--model seed-7b --seq 2048 --gpu h100-80g"},
                      EdgeCase{"memory", "--model seed-7b --seq 2048 --gpu h100-80g --method qlora"},
                      EdgeCase{"comm", "--collective all-reduce --size-gb 1 --ranks 8"},
                      EdgeCase{"comm", "--model seed-7b --dp 2 --tp 2 --pp 2 --seq 2048"},
                      EdgeCase{"bubble", "--pp 4 --micro-batches 8"},
                      EdgeCase{"reliability", "--gpus 8 --state-gb 100 --days 1"},
                      EdgeCase{"plan", "--days 1"},
                      EdgeCase{"compare", ""}));

}  // namespace

namespace {

// Issue 10 "Also": `tally memory --gpu` and `tally plan` answer "does it fit" with one core check
// (Note [does it fit]): the same layout gives the same total, usable memory and verdict.
TEST(Cli, MemoryAndPlanAgreeOnWhatFits) {
  const auto plan = json_of(tally("plan --no-overlap-dp --no-overlap-param-gather --json"));
  ASSERT_TRUE(plan["best"].contains("recompute"));
  const auto& b = plan["best"];
  const std::string args =
      "memory --model seed-7b --seq 2048 --gpu a100-80g --json --dp " + b["dp"].dump() +
      " --zero " + b["zero"].dump() + " --micro-batch " + b["micro_batch"].dump() +
      " --micro-batches " + b["grad_accum"].dump() +
      " --recompute " + b["recompute"].get<std::string>();
  const auto mem = json_of(tally(args));
  const auto& cap = mem["capacity"];
  EXPECT_NEAR(cap["total_gb"].get<double>(), b["per_gpu_gb"].get<double>(), 1e-9) << args;
  EXPECT_NEAR(cap["usable_gb"].get<double>(), b["usable_gb"].get<double>(), 1e-9);
  EXPECT_EQ(cap["fits"], b["fits"]);
  // Note [reserved memory]: held = allocated × 1.115 + 300 MiB by default, in both reports.
  for (const auto* j : {&cap, &b}) {
    const double allocated = (*j)["allocated_gb"].get<double>();
    EXPECT_NEAR((*j)["allocator_gb"].get<double>(), 0.115 * allocated, 1e-9);
    EXPECT_NEAR((*j)["runtime_gb"].get<double>(), 300 * 1048576.0 / 1e9, 1e-9);
  }
  EXPECT_NEAR(b["per_gpu_gb"].get<double>(),
              b["allocated_gb"].get<double>() * 1.115 + 300 * 1048576.0 / 1e9, 1e-9);
}

}  // namespace
