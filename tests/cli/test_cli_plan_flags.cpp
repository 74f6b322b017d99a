// The plan and compare flags that shape a layout's time or its stages (issue 10): --pp-layers,
// --kernels, --grad-accumulation; and the fine-tuning ledgers on the command line (QLoRA memory,
// --max-seq, plan with a fine-tune method). (Split from test_cli.cpp at the file-size limit.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "run_tally.hpp"

namespace {

using tally::cli_test::expect_bad_input;
using tally::cli_test::json_of;
using tally::cli_test::Run;
using tally::cli_test::tally;

}  // namespace

namespace {

// Issue 10: real pipeline stages on the command line. Llama 3 405B's published split (Dubey et al.
// 2024 §3.3.2: 126 layers on 16 stages, 7 on the first and the last) is accepted and costed; a list
// tally's stages can't express names the one it would use.
TEST(Cli, CompareTakesPipelineStageLayers) {
  const std::string model =
      "compare --model llama-3.1-405b --gpu h100-80g --gpus 1024 --seq 8192 "
      "--tp 8 --pp 16 --micro-batch 1 --zero 1 --recompute full";
  const std::string base = model + " --global-batch 128";
  const auto j = json_of(tally(base + " --pp-layers 7,8,8,8,8,8,8,8,8,8,8,8,8,8,8,7 --json"));
  EXPECT_TRUE(j["options"][0]["eval"].is_object()) << j["options"][0];
  // Any split is a layout. With many micro-batches (global batch 1024: 128 per pipeline) the
  // busiest stage paces the step: a 12-layer stage makes it slower than 7 + 14 × 8 + 7 (whose
  // busiest stage is the last: 7 layers plus the 128k-vocabulary head and loss, about 9 layers'
  // time), by less than 12/8. (At 16 micro-batches on 16 stages fill and drain dominate and
  // splits matter little — the 1F1B simulator agrees.)
  auto step_of = [&](const std::string& list) {
    const auto r = json_of(tally(model + " --global-batch 1024 --pp-layers " + list + " --json"));
    EXPECT_TRUE(r["options"][0]["eval"].is_object()) << r["options"][0];
    return r["options"][0]["eval"];
  };
  const auto even = step_of("7,8,8,8,8,8,8,8,8,8,8,8,8,8,8,7");
  const auto odd = step_of("7,12,8,8,8,8,8,8,8,8,8,8,8,8,8,3");
  const double ratio = odd["step_seconds"].get<double>() / even["step_seconds"].get<double>();
  EXPECT_GT(ratio, 1.2);
  EXPECT_LT(ratio, 12.0 / 8);
  EXPECT_NE(odd["layout"].get<std::string>().find("7,12,8"), std::string::npos);
  // Refused with one line naming the flag: a list that does not hold the model's 126 layers, a
  // stage without a layer, a count that is not --pp.
  const auto sum = tally(base + " --pp-layers 7,8,8,8,8,8,8,8,8,8,8,8,8,8,8,8");
  EXPECT_EQ(sum.rc, 2);
  EXPECT_NE(sum.err.find("--pp-layers"), std::string::npos) << sum.err;
  EXPECT_NE(sum.err.find("127"), std::string::npos) << sum.err;
  EXPECT_NE(sum.err.find("126"), std::string::npos) << sum.err;
  EXPECT_EQ(tally(base + " --pp-layers 0,8,8,8,8,8,8,8,8,8,8,8,8,8,8,14").rc, 2);
  EXPECT_EQ(tally(base + " --pp-layers 8,8").rc, 2);  // 2 stages for --pp 16
}

// Interleaved, --pp-layers names every virtual stage (Note [uneven virtual stages]): torchtitan's
// Llama 3.1 405B run put 126 layers on 8 stages × 2 chunks as 7, 8, …, 8, 7. The plan JSON keeps
// each stage's sum in stage_layers and the list itself in virtual_stage_layers; the interleaved
// bubble is smaller than the same stages' 1F1B. Per-stage entries for --interleave 2 are refused
// with one line saying how many entries it takes.
TEST(Cli, CompareTakesVirtualStageLayers) {
  const std::string base =
      "compare --model llama-3.1-405b --gpu h100-80g --gpus 512 --global-batch 256 --seq 8192 "
      "--tp 8 --pp 8 --sp --zero 1 --micro-batch 1 --recompute full";
  const auto r = tally(base + " --interleave 2 --pp-layers 7,8,8,8,8,8,8,8,8,8,8,8,8,8,8,7 --json");
  ASSERT_EQ(r.rc, 0) << r.err;
  const auto e = json_of(r)["options"][0]["eval"];
  ASSERT_TRUE(e.is_object()) << json_of(r)["options"][0];
  EXPECT_EQ(e["stage_layers"], (std::vector<int>{15, 16, 16, 16, 16, 16, 16, 15}));
  EXPECT_EQ(e["virtual_stage_layers"].size(), 16u);
  EXPECT_EQ(e["virtual_stage_layers"][0], 7);
  const auto flat = json_of(tally(base + " --pp-layers 15,16,16,16,16,16,16,15 --json"));
  const auto f = flat["options"][0]["eval"];
  EXPECT_FALSE(f.contains("virtual_stage_layers"));
  EXPECT_LT(e["bubble_seconds"].get<double>(), f["bubble_seconds"].get<double>());
  const auto bad = tally(base + " --interleave 2 --pp-layers 15,16,16,16,16,16,16,15");
  EXPECT_EQ(bad.rc, 2);
  EXPECT_NE(bad.err.find("--pp-layers"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("16 virtual stages"), std::string::npos) << bad.err;
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
  // Without --pp-layers, 126 layers over 16 × 8 virtual stages take Megatron-Core's slots: (126 +
  // 2) / 128 = 1 layer each, the first and last one lighter (0, 1 × 126, 0). The base line names
  // the split it was costed with, as the JSON does.
  const std::string slots =
      "compare --model llama-3.1-405b --gpu h100-80g --gpus 16384 --global-batch 2048 --seq 8192 "
      "--dp 64 --tp 4 --sp --pp 16 --interleave 8 --cp 4 --micro-batch 1";
  const auto text = tally(slots);
  ASSERT_EQ(text.rc, 0) << text.err;
  const std::size_t at = text.out.find("\n  base ");
  ASSERT_NE(at, std::string::npos) << text.out;
  const std::string base_line = text.out.substr(at + 1, text.out.find('\n', at + 1) - at - 1);
  EXPECT_NE(base_line.find("(virtual stages 0,1×126,0 layers)"), std::string::npos) << text.out;
  const auto s = json_of(tally(slots + " --json"))["options"][0]["eval"];
  ASSERT_TRUE(s.is_object());
  EXPECT_EQ(s["virtual_stage_layers"].size(), 128u);
  EXPECT_EQ(s["virtual_stage_layers"][0], 0);
  EXPECT_EQ(s["virtual_stage_layers"][127], 0);
}

// A choice flag given a value outside its list: exit 2 and one line naming the flag, the value and
// the allowed names.
void expect_choice_error(const std::string& command, const std::string& flag,
                         const std::string& value, const std::string& allowed) {
  expect_bad_input(command + " " + flag + " " + value,
                   {flag + ": '" + value + "' is not one of: " + allowed});
}

// --kernels eager (Note [eager kernels] in core/operators.hpp): torchtitan's uncompiled Llama moves
// more bytes between the same GEMMs, so the same layout takes longer; the FLOPs (hence MFU's
// numerator) and the memory ledger are untouched, and the plan's convention names the choice.
TEST(Cli, EagerKernelsSlowTheStepNotTheMemory) {
  const std::string base =
      "compare --model llama-3-8b --gpu h100-80g --gpus 8 --global-batch 16 --seq 8192 --zero 3 "
      "--micro-batch 2 --recompute op-sac --json";
  const auto fused = json_of(tally(base))["options"][0]["eval"];
  const auto eager = json_of(tally(base + " --kernels eager"))["options"][0]["eval"];
  EXPECT_GT(eager["step_seconds"].get<double>(), fused["step_seconds"].get<double>());
  // At most the HBM time of the added bytes: per token and layer well under 2 MB on 3.35 TB/s.
  const double tokens = 16.0 * 8192 / 8, layers = 32;
  EXPECT_LT(eager["step_seconds"].get<double>() - fused["step_seconds"].get<double>(),
            tokens * layers * 2e6 / (3.35e12 * 0.85));
  EXPECT_EQ(eager["per_gpu_gb"], fused["per_gpu_gb"]);
  EXPECT_LT(eager["mfu"].get<double>(), fused["mfu"].get<double>());
  const auto plan = tally("plan --model llama-3-8b --gpu h100-80g --gpus 8 --global-batch 16 "
                          "--seq 8192 --kernels eager");
  EXPECT_EQ(plan.rc, 0) << plan.err;
  EXPECT_NE(plan.out.find("eager PyTorch kernels"), std::string::npos);
  expect_choice_error("plan --model llama-3-8b", "--kernels", "unfused", "fused, eager, local");
}

// --kernels local and --loss vocab-parallel (Note [local kernels], Note [loss kernels] in
// core/operators.hpp): Megatron-LM's own modules and its unfused loss add memory-bound kernels
// between the same GEMMs, so GPT-3 175B (biases on every linear layer) takes longer, each switch on
// its own and more with both; FLOPs (MFU's numerator) and memory are untouched; the plan's
// convention names both. Low precision needs Transformer Engine's modules: with --kernels local it
// is bad input, in `plan` and in `compare` alike (exit 2, one line naming the flags).
TEST(Cli, MegatronLocalKernelsAndUnfusedLossSlowTheStepNotTheMemory) {
  const std::string base =
      "compare --model gpt3-175b --gpus 64 --global-batch 64 --tp 8 --pp 8 --micro-batch 1 "
      "--zero 1 --recompute full --attention materialized --alternative double-gpus --json";
  auto eval = [&](const std::string& extra) {
    const auto r = tally(base + extra);
    EXPECT_EQ(r.rc, 0) << r.err;
    return json_of(r)["options"][0]["eval"];
  };
  const auto fused = eval(""), local = eval(" --kernels local"),
             loss = eval(" --loss vocab-parallel"),
             both = eval(" --kernels local --loss vocab-parallel");
  const double step = fused["step_seconds"].get<double>();
  EXPECT_GT(local["step_seconds"].get<double>(), step);
  EXPECT_GT(loss["step_seconds"].get<double>(), step);
  EXPECT_GT(both["step_seconds"].get<double>(), local["step_seconds"].get<double>());
  EXPECT_GT(both["step_seconds"].get<double>(), loss["step_seconds"].get<double>());
  // Memory-bound kernels only: a few per cent of a 175B step, not a different run.
  EXPECT_LT(both["step_seconds"].get<double>(), 1.05 * step);
  for (const auto* e : {&local, &loss, &both}) {
    EXPECT_EQ((*e)["per_gpu_gb"], fused["per_gpu_gb"]);
    EXPECT_LT((*e)["mfu"].get<double>(), fused["mfu"].get<double>());
  }
  const auto plan = tally("plan --model gpt3-175b --gpus 64 --global-batch 64 --kernels local "
                          "--loss vocab-parallel");
  EXPECT_EQ(plan.rc, 0) << plan.err;
  EXPECT_NE(plan.out.find("Megatron-LM local modules, unfused vocab-parallel loss"),
            std::string::npos);
  for (const std::string cmd : {"plan", "compare --tp 8 --pp 8"})
    expect_bad_input(cmd + " --model gpt3-175b --gpus 64 --global-batch 64 --gpu h100-80g "
                           "--precision fp8 --kernels local",
                     {"--kernels local: --precision fp8"});
  expect_choice_error("plan --model gpt3-175b", "--loss", "unfused",
                      "fused, vocab-parallel, eager");
}

// --grad-accumulation autograd (Note [gradient accumulation] in core/planner.cpp): PyTorch's
// AccumulateGrad adds each later micro-batch's gradients in a kernel reading both and writing the
// sum. Llama 3 8B (8,030,261,248 parameters, Meta's model card) with bf16 gradients unsharded on
// each of 8 H100s (3.35 TB/s, 0.85 of it streamed; 2 µs per kernel): 4 micro-batches add 3 such
// kernels of 3 × 2 B × N each. One micro-batch adds none; the fused default none either.
TEST(Cli, AutogradGradientAccumulationAddsItsKernels) {
  const std::string base = "compare --model llama-3-8b --gpu h100-80g --gpus 8 --seq 8192 "
                           "--micro-batch 1 --zero 0 --no-overlap-dp --json";
  auto step = [&](const std::string& args) {
    const auto r = tally(base + args);
    EXPECT_EQ(r.rc, 0) << r.err;
    return json_of(r)["options"][0]["eval"]["step_seconds"].get<double>();
  };
  const double kernel_s = 3 * 2.0 * 8030261248.0 / (3.35e12 * 0.85) + 2e-6;
  const double four = step(" --global-batch 32 --grad-accumulation autograd") -
                      step(" --global-batch 32");
  EXPECT_NEAR(four, 3 * kernel_s, 1e-3 * kernel_s);
  EXPECT_DOUBLE_EQ(step(" --global-batch 8 --grad-accumulation autograd"),
                   step(" --global-batch 8"));
  const auto plan = tally("plan --model llama-3-8b --gpu h100-80g --gpus 8 --global-batch 64 "
                          "--seq 8192 --grad-accumulation autograd");
  EXPECT_EQ(plan.rc, 0) << plan.err;
  EXPECT_NE(plan.out.find("micro-batch gradients added by AccumulateGrad"), std::string::npos);
  expect_choice_error("plan --model llama-3-8b", "--grad-accumulation", "hook", "fused, autograd");
}

}  // namespace

namespace {

// Issue 12: `tally memory --method qlora` — the seed's program on Llama-2-7B (r = 8 on q, v):
// PEFT's trainable line, integer counts, NF4 + double quantization's 4.127 bits (QLoRA §3), one-GPU
// only, and targets the layout lacks refused with one line.
TEST(Cli, MemoryQloraLedger) {
  const auto j = json_of(tally("memory --model llama-2-7b --method qlora --json"));
  EXPECT_EQ(j["method"], "qlora");
  EXPECT_TRUE(j["finetune"]["trainable_params"].is_number_integer());
  EXPECT_EQ(j["finetune"]["trainable_params"].get<std::int64_t>(), 32 * 2 * 8 * (4096 + 4096));
  EXPECT_NEAR(j["finetune"]["bits_per_quantized_param"].get<double>(), 4 + 8.0 / 64 + 32.0 / 16384,
              1e-9);
  EXPECT_LT(j["finetune"]["trainable_fraction"].get<double>(), 0.002);
  const auto text = tally("memory --model llama-2-7b --method qlora");
  EXPECT_EQ(text.rc, 0);
  EXPECT_NE(text.out.find("trainable params: 4194304 || all params: 6738415616"), std::string::npos)
      << text.out;
  for (const char* bad : {"memory --model llama-2-7b --method qlora --tp 2 --seq 128",
                          "memory --model gpt2-124m --method lora --lora-targets gate",
                          "memory --model llama-2-7b --method qlora --lora-targets q,x",
                          "memory --model llama-2-7b --method qlora --precision fp32",
                          "memory --model llama-2-7b --lora-rank 16"})
    expect_bad_input(bad);
}

}  // namespace

namespace {

// `--max-seq`: the longest sequence whose report still fits — one token more does not; learned
// positions cap it at the table (GPT-2: 1024); it needs --gpu and excludes --seq.
TEST(Cli, MemoryMaxSeq) {
  const std::string base = "memory --model llama-2-7b --method qlora --recompute full --gpu a100-40g";
  const auto j = json_of(tally(base + " --max-seq --json"));
  ASSERT_TRUE(j["max_seq"].is_number_integer()) << j["max_seq"];
  const std::int64_t T = j["max_seq"];
  EXPECT_GT(T, 4096);
  EXPECT_TRUE(j["capacity"]["fits"].get<bool>());
  const auto at = json_of(tally(base + " --seq " + std::to_string(T) + " --json"));
  EXPECT_NEAR(at["capacity"]["total_gb"].get<double>(), j["capacity"]["total_gb"].get<double>(),
              1e-9);
  const auto over = json_of(tally(base + " --seq " + std::to_string(T + 1) + " --json"));
  EXPECT_FALSE(over["capacity"]["fits"].get<bool>());
  EXPECT_EQ(json_of(tally("memory --model gpt2-124m --gpu a100-80g --max-seq --json"))["max_seq"],
            1024);
  EXPECT_EQ(tally("memory --model llama-2-7b --max-seq").rc, 2);
  EXPECT_EQ(tally(base + " --max-seq --seq 128").rc, 2);
  // States alone too big: a result, not an error.
  const auto none = json_of(tally("memory --model llama-2-70b --gpu a100-40g --max-seq --json"));
  EXPECT_TRUE(none["max_seq"].is_null());
}

// `tally plan --method lora|qlora` (core/finetune_plan.hpp): the seed's QLoRA 7B on a 40 GB card.
// PEFT's trainable count for r = 8 on q and v of Llama-2-7B: 32 layers × 2 × 8 × (4096 + 4096).
TEST(Cli, PlanFineTune) {
  const auto j = json_of(tally("plan --method qlora --model llama-2-7b --gpus 1 --gpu a100-40g "
                               "--global-batch 16 --seq 2048 --json"));
  EXPECT_EQ(j["method"], "qlora");
  EXPECT_EQ(j["trainable_params"], 32 * 2 * 8 * (4096 + 4096));
  ASSERT_TRUE(j["best"].is_object()) << j.dump();
  EXPECT_TRUE(j["best"]["fits"].get<bool>());
  EXPECT_LE(j["best"]["per_gpu_gb"].get<double>(), j["best"]["usable_gb"].get<double>());
  EXPECT_GT(j["best"]["dequant_seconds"].get<double>(), 0);
  EXPECT_GT(j["max_seq"].get<std::int64_t>(), 2048);
  const auto text = tally("plan --method lora --model llama-2-70b --gpus 8 --gpu h100-80g "
                          "--global-batch 64 --seq 4096");
  EXPECT_EQ(text.rc, 0);
  EXPECT_NE(text.out.find("NO CONFIGURATION FITS"), std::string::npos) << text.out;
  // One line, exit 2: LoRA flags with --method full; planner-only flags with a fine-tune.
  for (const char* bad : {"plan --lora-rank 16", "plan --method qlora --max-tp 2",
                          "plan --method qlora --gpus 3 --global-batch 16",
                          "plan --method qlora --precision fp8 --gpu h100-80g"})
    expect_bad_input(bad);
}

}  // namespace

namespace tally::cli_test {
namespace {

// The largest --global-batch, 2^24 sequences, is planned and compared in well under the test's
// deadline (the pipeline's makespan extrapolated past 4096 micro-batches, Note [long pipelines]:
// a step of 524,288 micro-batches took minutes and 16 GB to simulate op by op, and above 2^31 the
// count wrapped to "--micro-batches = 0"). One more is refused in one line.
TEST(Cli, LargestGlobalBatchIsCostedNotHung) {
  expect_bad_input("plan --global-batch 16777217", {"--global-batch", "16777217", "16777216"});
  expect_bad_input("plan --method qlora --global-batch 16777217", {"--global-batch"});
  const auto base = [](std::int64_t global_batch) {
    const auto j = json_of(tally("compare --model llama-2-70b --gpus 64 --dp 8 --tp 1 --pp 8 "
                                 "--micro-batch 4 --global-batch " +
                                 std::to_string(global_batch) + " --json"));
    return j["options"][0]["eval"];
  };
  const auto largest = base(std::int64_t(1) << 24);
  EXPECT_EQ(largest["grad_accum"], (std::int64_t(1) << 24) / (8 * 4));
  // Past the fill and drain, each micro-batch adds the same time, so the bubble (makespan −
  // M × the slowest stage's time) of 524,288 micro-batches is that of 4096, simulated op by op.
  const auto simulated = base(std::int64_t(8) * 4 * 4096);
  EXPECT_EQ(simulated["grad_accum"], 4096);
  EXPECT_GT(simulated["bubble_seconds"].get<double>(), 0);
  EXPECT_NEAR(largest["bubble_seconds"].get<double>(), simulated["bubble_seconds"].get<double>(),
              1e-6 * simulated["bubble_seconds"].get<double>());
  const auto plan =
      tally("plan --method qlora --model llama-2-7b --gpus 8 --global-batch 16777216");
  EXPECT_EQ(plan.rc, 0) << plan.err;
}

}  // namespace
}  // namespace tally::cli_test
