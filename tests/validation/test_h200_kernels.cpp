// tally's operator time model against one real GPU (issue 10: "calibrated by micro-benchmarks and
// checked against runs"). Recorded on 2026-12-04 on one NVIDIA H200 SXM (nvidia-smi: 143771 MiB,
// 700 W power limit, driver 580.159.04; PyTorch 2.11.0+cu130):
//   tests/data/h200_probe_{calibration,steps,ops}.json: `python3 bench/gpu/probe.py --out-dir DIR
//     --budget-s 240` (127 s) — a bf16 GEMM grid timed as CUDA-graph replays, a 1 GiB copy, SDPA
//     attention per backend, the memory-bound kernels of a layer, AdamW, the training steps' own
//     GEMMs, and five training steps (two GPT-2-style models, a Llama-3-8B-shaped one with 8
//     layers as recent PyTorch runs it, as torchtitan's Dec 2024 kernels ran it, and compiled);
//   tests/data/h200_power_probe.json: `python3 bench/gpu/warm_probe.py --out-dir DIR --soak-s 20
//     --step` — 8192³ GEMMs in bursts and back to back, the steps' GEMMs again, the Llama step,
//     with nvidia-smi's clock, power and throttle-reason samples (warm_probe.fold_samples);
//   tests/data/h200_cap_probe.json: `python3 bench/gpu/cap_probe.py --out-dir DIR --soak-s 15` —
//     bf16 and fp8 8192³ in bursts and back to back, memory-bound kernels replayed back to back.
// Note [power cap] in core/src/presets.cpp takes three numbers from these files; the tests below
// re-derive them, check what they rest on, and judge the five steps, which no constant was taken
// from.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "fixture.hpp"
#include "tally/core/model_states.hpp"
#include "tally/core/operators.hpp"
#include "tally/core/planner.hpp"
#include "tally/core/presets.hpp"
#include "tally/io/calibration.hpp"

namespace tally::test_h200_kernels {
namespace {

const nlohmann::json& ops() { return fixture("h200_probe_ops.json"); }
const nlohmann::json& power() { return fixture("h200_power_probe.json"); }

GpuSpec h200() { return cluster_preset("h200")->gpu; }

// The preset's GEMM terms as a short benchmark sees them: XLA's fit, no power cap.
GpuSpec h200_burst() {
  GpuSpec g = h200();
  g.kernels.sustained_gemm = 1;
  return g;
}

double gemm_flops(const nlohmann::json& g) {
  return 2.0 * g["m"].get<double>() * g["n"].get<double>() * g["k"].get<double>();
}

// The model's time for one recorded bf16 GEMM (operands and result in bf16).
double predicted(const GpuSpec& gpu, const nlohmann::json& g) {
  const std::int64_t m = g["m"], n = g["n"], k = g["k"];
  const Op op{.name = "gemm", .kind = OpKind::gemm, .m = m, .n = n, .k = k,
              .flops = gemm_flops(g), .bytes = 2.0 * double(m * k + k * n + m * n)};
  return op_seconds(op, gpu, Precision::bf16);
}

double median_ratio(const GpuSpec& gpu, const nlohmann::json& list, double min_flops = 0) {
  std::vector<double> r;
  for (const auto& g : list)
    if (gemm_flops(g) >= min_flops)
      r.push_back(g["seconds_median"].get<double>() / predicted(gpu, g));
  return median(r);
}

double median_tflops(const nlohmann::json& list) {
  std::vector<double> v;
  for (const auto& g : list) v.push_back(gemm_flops(g) / g["seconds_median"].get<double>() / 1e12);
  return median(v);
}

// nvidia-smi's samples ([s since start, SM MHz, memory MHz, W, °C]) between two marks.
std::vector<nlohmann::json> samples_between(double from_s, double to_s) {
  std::vector<nlohmann::json> out;
  for (const auto& s : power()["samples"])
    if (s[0].get<double>() >= from_s && s[0].get<double>() < to_s) out.push_back(s);
  return out;
}

double mark(const std::string& what) {
  for (const auto& m : power()["marks"])
    if (m["what"] == what) return m["since_start_s"];
  ADD_FAILURE() << "no mark " << what;
  return 0;
}

double median_column(const std::vector<nlohmann::json>& rows, int column) {
  std::vector<double> v;
  for (const auto& r : rows) v.push_back(r[column].get<double>());
  return median(v);
}

// Short GEMMs run what XLA's table (the preset's source) says: the probe's graph-timed grid at
// >= 10 GFLOP a median 0.97x the preset's burst time, and 8192³ in bursts at 799 TFLOP/s against
// the preset's 803.5. (Smaller GEMMs replayed back to back run faster than the preset's 2 µs per
// kernel allows; a step's GEMMs are larger.)
TEST(H200Kernels, ShortGemmsAreTheTableThePresetWasFittedTo) {
  const auto& grid_gemms = fixture("h200_probe_calibration.json")["kernels"]["gemm"];
  const double grid = median_ratio(h200_burst(), grid_gemms, 1e10);
  EXPECT_GT(grid, 0.9);
  EXPECT_LT(grid, 1.1);
  const double burst = median_ratio(h200_burst(), power()["burst"]);
  EXPECT_NEAR(burst, 1.0, 0.02);
  std::printf("grid (>= 10 GFLOP) measured / preset burst %.3f; 8192^3 bursts %.0f TFLOP/s, "
              "%.3f of the preset's time\n", grid, median_tflops(power()["burst"]), burst);
}

// Back to back the board holds its 700 W limit (throttle reason 0x4, the software power cap) and
// the SM clock falls from its 1980 MHz boost: 8192³ loses 15 %. The probe's training step runs
// in the same regime, at a clock between the two, where the capped preset puts 8192³ too.
TEST(H200Kernels, BackToBackGemmsRunAtThePowerCap) {
  const double burst = median_tflops(power()["burst"]);
  const double soak = median_tflops(power()["soak"]);
  EXPECT_LT(soak / burst, 0.9);
  const auto soaking = samples_between(mark("soak"), mark("warm layouts"));
  ASSERT_GE(soaking.size(), 50u);
  EXPECT_GT(median_column(soaking, 3), 0.95 * 700);  // W
  EXPECT_LT(median_column(soaking, 1), 0.8 * 1980);  // MHz
  EXPECT_GT(power()["reasons"].value("0x0000000000000004", 0), 50);
  // The Llama step's timed steps: its last 2.5 s (10 steps of 0.25 s after 3 warm-up steps).
  const auto stepping = samples_between(mark("end") - 2.5, mark("end"));
  ASSERT_GE(stepping.size(), 8u);
  EXPECT_GT(median_column(stepping, 3), 0.95 * 700);
  EXPECT_LT(median_column(stepping, 1), 0.9 * 1980);
  // The step's clock lies between the burst's and the soak's, and so does the preset's capped
  // 8192³ throughput: above the soak, below the burst.
  EXPECT_GT(median_column(stepping, 1), median_column(soaking, 1));
  const nlohmann::json cube = {{"m", 8192}, {"n", 8192}, {"k", 8192}};
  const double capped = gemm_flops(cube) / predicted(h200(), cube) / 1e12;
  EXPECT_GT(capped, soak);
  EXPECT_LT(capped, burst);
  std::printf("8192^3: burst %.0f, back to back %.0f TFLOP/s (%.3f), the capped preset %.0f; soak "
              "%.0f MHz %.0f W; step %.0f MHz %.0f W\n", burst, soak, soak / burst, capped,
              median_column(soaking, 1), median_column(soaking, 3), median_column(stepping, 1),
              median_column(stepping, 3));
}

// sustained_gemm is 1 / (the median of measured / burst-predicted over the steps' own 45 GEMMs,
// timed after the steps); the power probe's three later timings of the same GEMMs (cold, after
// the soak, after the grid) land within 5 % of it.
TEST(H200Kernels, PresetTakesTheStepsGemmsAtThePowerCap) {
  const double layouts = median_ratio(h200_burst(), ops()["gemm_layouts"]);
  EXPECT_NEAR(h200().kernels.sustained_gemm, 1 / layouts, 1e-6);
  for (const char* timing : {"cold", "warm", "warm_after_grid"}) {
    const double r = median_ratio(h200_burst(), power()[timing]);
    EXPECT_NEAR(r * h200().kernels.sustained_gemm, 1.0, 0.05) << timing;
    std::printf("%s: measured / burst %.3f\n", timing, r);
  }
  // The H100 (the same die at the same 700 W) is not measured here and takes the H200's factor,
  // for bf16 and fp8 (Note [power cap]).
  const GpuSpec h100 = cluster_preset("h100-80g")->gpu;
  EXPECT_NEAR(h100.kernels.sustained_gemm, 1 / layouts, 1e-6);
  ASSERT_TRUE(h100.fp8_gemm.has_value());
  EXPECT_NEAR(h100.fp8_gemm->sustained_gemm, 1 / layouts, 1e-6);
}

// The preset's attention fractions are SDPA's FlashAttention-2 backend on this GPU, the median
// over the five causal shapes of executed FLOPs (half of 4·b·a·s²·d forward, 2.5× that backward,
// as io's calibration counts them) over peak × time.
TEST(H200Kernels, PresetTakesTheMeasuredFlashAttention2) {
  std::vector<double> fwd, bwd;
  for (const auto& a : ops()["attention"]) {
    if (a["backend"] != "FLASH_ATTENTION" || a.contains("error")) continue;
    const double flops = 4.0 * a["batch"].get<double>() * a["heads"].get<double>() *
                         a["seq"].get<double>() * a["seq"].get<double>() *
                         a["head_dim"].get<double>() / 2;
    fwd.push_back(flops / (989.4e12 * a["forward_seconds"].get<double>()));
    bwd.push_back(2.5 * flops / (989.4e12 * a["backward_seconds"].get<double>()));
  }
  ASSERT_EQ(fwd.size(), 5u);
  EXPECT_NEAR(h200().kernels.attention_forward_fraction, median(fwd), 1e-4);
  EXPECT_NEAR(h200().kernels.attention_backward_fraction, median(bwd), 1e-4);
  // The H100 has the H200's die (Note [Hopper attention] in presets.cpp): the same kernel at the
  // same figures, below the 0.35 forward it had taken from Dao 2023's best H100 shape.
  const KernelPerf h100 = cluster_preset("h100-80g")->gpu.kernels;
  EXPECT_NEAR(h100.attention_forward_fraction, median(fwd), 1e-4);
  EXPECT_NEAR(h100.attention_backward_fraction, median(bwd), 1e-4);
  EXPECT_TRUE(h100.attention_table.empty());  // one figure each: the per-shape table read worse
}

// Note [cuDNN attention] in presets.cpp: both Hopper presets' cuDNN table is SDPA's CUDNN_ATTENTION
// backend on the probe's five shapes, point by point (executed FLOPs as above). PyTorch's default
// backend on this GPU ran at cuDNN's speed, not FlashAttention-2's — on every shape its forward +
// backward lies nearer cuDNN's time than FlashAttention-2's, on a log scale — so the steps that
// ran the default are priced with `cudnn` (H200Steps below).
TEST(H200Kernels, PresetsTakeTheMeasuredCudnnAttention) {
  std::vector<KernelPerf::AttentionFraction> measured;
  std::map<std::string, std::map<std::string, double>> seconds;  // shape → backend → fwd + bwd
  for (const auto& a : ops()["attention"]) {
    if (a.contains("error")) continue;
    const double flops = 4.0 * a["batch"].get<double>() * a["heads"].get<double>() *
                         a["seq"].get<double>() * a["seq"].get<double>() *
                         a["head_dim"].get<double>() / 2;
    const std::string shape = a["seq"].dump() + "/" + a["head_dim"].dump() + "/" +
                              a["kv_heads"].dump();
    seconds[shape][a["backend"]] =
        a["forward_seconds"].get<double>() + a["backward_seconds"].get<double>();
    if (a["backend"] != "CUDNN_ATTENTION") continue;
    const double fwd = a["forward_seconds"], bwd = a["backward_seconds"];
    measured.push_back({.head_dim = a["head_dim"], .seq = a["seq"],
                        .forward = flops / (989.4e12 * fwd),
                        .backward = 2.5 * flops / (989.4e12 * bwd)});
  }
  ASSERT_EQ(measured.size(), 5u);
  for (const char* gpu : {"h200", "h100-80g"}) {
    const KernelPerf k = cluster_preset(gpu)->gpu.kernels;
    ASSERT_EQ(k.cudnn_attention_table.size(), measured.size()) << gpu;
    for (std::size_t i = 0; i < measured.size(); ++i) {
      EXPECT_EQ(k.cudnn_attention_table[i].head_dim, measured[i].head_dim) << gpu << " " << i;
      EXPECT_EQ(k.cudnn_attention_table[i].seq, measured[i].seq) << gpu << " " << i;
      EXPECT_NEAR(k.cudnn_attention_table[i].forward, measured[i].forward, 1e-4) << gpu << i;
      EXPECT_NEAR(k.cudnn_attention_table[i].backward, measured[i].backward, 1e-4) << gpu << i;
    }
  }
  ASSERT_EQ(seconds.size(), 5u);
  for (const auto& [shape, t] : seconds) {
    ASSERT_EQ(t.count("default") + t.count("CUDNN_ATTENTION") + t.count("FLASH_ATTENTION"), 3u);
    EXPECT_LT(std::fabs(std::log(t.at("default") / t.at("CUDNN_ATTENTION"))),
              std::fabs(std::log(t.at("default") / t.at("FLASH_ATTENTION"))))
        << shape;
  }
  // Measured nowhere else: the A100 and Blackwell presets carry no cuDNN table.
  for (const char* gpu : {"a100-80g", "b200", "gb300-nvl72"})
    EXPECT_TRUE(cluster_preset(gpu)->gpu.kernels.cudnn_attention_table.empty()) << gpu;
}

const nlohmann::json& cap() { return fixture("h200_cap_probe.json"); }

// fp8 GEMMs (torch._scaled_mm, 8192³ e4m3, per-tensor scales) lose to the cap what bf16 loses in
// the same run (0.844 and 0.835), so the preset gives the H200's fp8 constants bf16's factor; the
// capped preset then runs 8192³ fp8 within 5 % of its back-to-back figure (1211 against 1236
// TFLOP/s).
TEST(H200Kernels, Fp8GemmsLoseToThePowerCapWhatBf16Loses) {
  const double bf16 = median_tflops(cap()["bf16_soak"]) / median_tflops(cap()["bf16_burst"]);
  const double fp8 = median_tflops(cap()["fp8_soak"]) / median_tflops(cap()["fp8_burst"]);
  EXPECT_LT(bf16, 0.9);
  EXPECT_NEAR(fp8 / bf16, 1.0, 0.03);
  ASSERT_TRUE(h200().fp8_gemm.has_value());
  EXPECT_EQ(h200().fp8_gemm->sustained_gemm, h200().kernels.sustained_gemm);
  const Op gemm{.name = "gemm", .kind = OpKind::gemm, .m = 8192, .n = 8192, .k = 8192,
                .flops = 2.0 * 8192 * 8192 * 8192, .bytes = 3.0 * 8192 * 8192};
  const double predicted_tflops = gemm.flops / op_seconds(gemm, h200(), Precision::fp8) / 1e12;
  EXPECT_NEAR(predicted_tflops / median_tflops(cap()["fp8_soak"]), 1.0, 0.05);
  std::printf("soak / burst: bf16 %.3f, fp8 %.3f; fp8 8192^3 predicted %.0f, back to back %.0f "
              "TFLOP/s\n", bf16, fp8, predicted_tflops, median_tflops(cap()["fp8_soak"]));
}

// The streaming fraction stays the cited 0.85: the probe's 1 GiB copy moved 0.874 of 4.8 TB/s,
// and replayed back to back (no launch gaps) a residual add moves 0.878 and SiLU × gate 0.870 on
// the bytes they must move. (The norms do not: LayerNorm 0.50, RMSNorm 0.65 — docs/ledgers.md §5.
// A copy captured in a CUDA graph becomes a copy-engine transfer, 0.58: not a kernel's figure.)
TEST(H200Kernels, StreamingKernelsRunAtThePresetsFraction) {
  const double copy = fixture("h200_probe_calibration.json")["kernels"]["memory_bytes_per_s"];
  const double hbm = h200().memory_bps * h200().kernels.memory_fraction;
  EXPECT_NEAR(copy / hbm, 1.0, 0.05);
  int checked = 0;
  for (const auto& k : cap()["memory_kernels"]) {
    if (k["op"] != "add" && k["op"] != "silu_mul") continue;
    const double elements = k["shape"][0].get<double>() * k["shape"][1].get<double>();
    // bf16, 2 B an element: add reads two operands and writes one; SiLU × gate runs two kernels,
    // silu(u) (read u, write t) and t · v (read t and v, write the product).
    const double bytes = 2 * elements * (k["op"] == "add" ? 3 : 2 + 3);
    EXPECT_NEAR(bytes / k["seconds"].get<double>() / hbm, 1.0, 0.05) << k["op"];
    ++checked;
  }
  EXPECT_EQ(checked, 2);
}

// Note [norm backward passes]: PyTorch's LayerNorm and RMSNorm backward read x and dy twice (the
// input gradient, then the weight's) and write dx, 5 tensors where the forward moves 2; one pass
// would move 3. The probe's one-call timings (same kernels, same launch conditions, 8192 × 4096
// bf16) put the backward nearer 5/2 of the forward than 3/2, on a log scale, for both norms — and
// the model's eager GPT norm moves 5/2 as much backward as forward.
TEST(H200Kernels, NormBackwardRunsTwoPasses) {
  int checked = 0;
  for (const auto& k : ops()["elementwise"]) {
    if (k["op"] != "layer_norm" && k["op"] != "rms_norm") continue;
    const double ratio = k["backward_seconds"].get<double>() / k["forward_seconds"].get<double>();
    std::printf("  %s backward / forward %.2f (two passes 2.5, one 1.5)\n",
                k["op"].get<std::string>().c_str(), ratio);
    EXPECT_LT(std::fabs(std::log(ratio / 2.5)), std::fabs(std::log(ratio / 1.5))) << k["op"];
    ++checked;
  }
  EXPECT_EQ(checked, 2);
  const ModelSpec m = *model_preset("gpt2-124m");
  double forward = 0, backward = 0;
  for (const Op& op : layer_ops(m, OperatorSetup{.seq = 1024, .kernels = Kernels::eager})) {
    if (op.name == "norm-1") forward = op.bytes;
    if (op.name == "norm-1.backward") backward = op.bytes;
  }
  EXPECT_DOUBLE_EQ(backward / forward, 2.5);
}

// A recorded step as a one-GPU layout: the probe's model, its micro-batch, bf16 with fp32 master
// weights and AdamW, no dropout, PyTorch's eager loss (logits cast to fp32), flash attention with
// the kernel the step ran (the row that names FLASH_ATTENTION FlashAttention-2, the others SDPA's
// default, cuDNN's on this GPU: H200Kernels.PresetsTakeTheMeasuredCudnnAttention); uncompiled steps
// with eager kernels (Note [eager kernels]), the compiled one fused.
PlanEval predict(const nlohmann::json& st, ClusterSpec cluster) {
  ModelSpec m;
  if (st["model"] == "llama") {
    m = *model_preset("llama-3-8b");
    m.layers = st["layers"];
  } else {
    const std::int64_t h = st["hidden"];
    m = ModelSpec{.name = "gpt-probe", .hidden = h, .layers = st["layers"], .heads = st["heads"],
                  .kv_heads = st["heads"], .ffn = 4 * h, .vocab = st["vocab"],
                  .max_positions = st["seq"], .tied_embeddings = true, .linear_bias = true,
                  .mlp = MlpKind::gelu, .norm = NormKind::layernorm,
                  .position = PositionKind::learned};
  }
  m.dropout = false;
  EXPECT_EQ(count_params(m).total(), st["params"].get<double>()) << st["model"];
  const PlanRequest q{.model = m, .cluster = std::move(cluster), .gpus = 1,
                      .global_batch = st["micro_batch"], .seq = st["seq"],
                      .precision = Precision::bf16, .optimizer = Optimizer::adamw,
                      .loss = Loss::eager,
                      .kernels = st["compiled"].get<bool>() ? Kernels::fused : Kernels::eager,
                      .flash_kernel = st.contains("attention_backend") ? FlashKernel::fa2
                                                                       : FlashKernel::cudnn};
  return evaluate_layout(q, Layout{.micro_batch = st["micro_batch"], .grad_accum = 1,
                                   .attention = Attention::flash});
}

std::string label(const nlohmann::json& st) {
  std::string s = std::string(st["model"]) + " h" + std::to_string(st["hidden"].get<int>()) +
                  " L" + std::to_string(st["layers"].get<int>());
  if (st.contains("norm")) s += " composite norm";
  s += st["compiled"].get<bool>() ? ", compiled" : "";
  s += ", " + st["attention"].get<std::string>();
  return s;
}

// The five recorded steps against the h200 preset (the goal for calibrate-then-predict:
// ±15 %; median |error| <= 10 % as the development set asks), each with the attention kernel it
// ran, at the power-capped clock (Note [power cap]): 0.98–1.08, four of five fast — the norms and
// dtype casts run at 0.44–0.65 of HBM bandwidth back to back (h200_cap_probe.json), where the
// model streams them at 0.85. (Priced with FlashAttention-2 throughout at the burst clock, as
// until 2026-12-07, the cuDNN steps read 0.92–1.01 and the median 2.7 %: the slower attention hid
// the fast norms.) Forward + backward is judged apart from the
// optimizer phase, which in the probe also casts the bf16 gradients into fp32 (Megatron
// accumulates them in fp32 and has no such cast).
TEST(H200Steps, PresetPredictsEachStep) {
  std::vector<double> errors;
  for (const auto& st : fixture("h200_probe_steps.json")["steps"]) {
    const PlanEval e = predict(st, *cluster_preset("h200"));
    const double measured = st["seconds_median"];
    const double fb = st["forward_seconds"].get<double>() + st["backward_seconds"].get<double>();
    const double ratio = measured / e.step_s;
    const double fb_ratio = fb / (e.compute_s - e.optimizer_s);
    std::printf("  %-66s measured %.1f ms, predicted %.1f ms: %.3f (forward + backward %.3f)\n",
                label(st).c_str(), measured * 1e3, e.step_s * 1e3, ratio, fb_ratio);
    EXPECT_NEAR(ratio, 1.0, 0.15) << label(st);
    EXPECT_NEAR(fb_ratio, 1.0, 0.15) << label(st);
    errors.push_back(std::fabs(ratio - 1));
  }
  ASSERT_EQ(errors.size(), 5u);
  EXPECT_LE(median(errors), 0.10);
  std::printf("  median |error| %.1f %%\n", 100 * median(errors));
}

// The same steps with the probe's own calibration applied (`--calibration`): its GEMM grid fitted
// (short replays: the boost clock), its power cap from the steps' GEMMs timed after the steps
// (kernels.gemm_sustained: 1 / the median of measured / the fitted burst time, the preset's
// definition on the calibration's own fit), its copy bandwidth, and its attention: the default
// SDPA backend (cuDNN) timed at head dims 64 and 128, one table point per shape (Note [attention
// table]). With one median fraction for all shapes (until 2026-12-04) the four steps that ran the
// default backend read 1.155, 1.096, 1.019 and 1.084 — cuDNN at head dim 64 runs at about half its
// head-dim-128 speed — and this test asked 20 %; with the table each step takes its own head dim
// and sequence, and the test asks the calibrate-then-predict goal, 15 %.
TEST(H200Steps, ProbesOwnCalibrationPredictsTheDefaultBackendSteps) {
  const ClusterSpec cal = io::apply_calibration(
      *cluster_preset("h200"),
      io::parse_calibration(fixture("h200_probe_calibration.json").dump(), "calibration.json"));
  GpuSpec burst = cal.gpu;
  burst.kernels.sustained_gemm = 1;
  const double layouts = median_ratio(burst, ops()["gemm_layouts"]);
  EXPECT_NEAR(cal.gpu.kernels.sustained_gemm, 1 / layouts, 1e-9);
  EXPECT_NEAR(cal.gpu.kernels.sustained_gemm, h200().kernels.sustained_gemm, 0.01);
  for (const auto& st : fixture("h200_probe_steps.json")["steps"]) {
    if (st.contains("attention_backend")) continue;  // the FlashAttention-2 row
    const double ratio = st["seconds_median"].get<double>() / predict(st, cal).step_s;
    std::printf("  %-66s measured / calibrated %.3f\n", label(st).c_str(), ratio);
    EXPECT_NEAR(ratio, 1.0, 0.15) << label(st);
  }
}

}  // namespace
}  // namespace tally::test_h200_kernels
