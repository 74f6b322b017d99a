// The low-precision recipes' kernels in layer_ops (Note [low-precision casts], core/src/
// lowp_ops.cpp): the quantize kernels of fp8, MXFP8 and NVFP4 counted by hand from Transformer
// Engine's and torchao's code, the fp8 GEMM constants, and the weight casts Transformer Engine
// caches. (Split from tests/core/test_operators.cpp, the operator header's main test, at the file-
// size limit.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tally/core/operators.hpp"
#include "tally/core/presets.hpp"
#include "tally/core/roofline.hpp"

namespace tally::test_operators_lowp {
namespace {

// Bytes of the kernel named `name` in `ops` (a failure, and 0, when there is none).
double bytes_of(const std::vector<Op>& ops, std::string_view name) {
  const auto it =
      std::find_if(ops.begin(), ops.end(), [&](const Op& op) { return op.name == name; });
  EXPECT_NE(it, ops.end()) << name;
  return it == ops.end() ? 0.0 : it->bytes;
}

// GpuSpec::fp8_gemm: the B200's fp8 (and MXFP8) GEMMs take the constants fitted to its measured
// fp8 table (presets.cpp), bf16 ones keep theirs. Worked for a 4096³ GEMM on 148 SMs: 256 × 128
// tiles, 512 of them in ⌈512/148⌉ = 4 waves, q = 512/592; every halved tile loses more to its
// 0.60 than it gains in quantisation; k/(k + k½) = 4096/6144; fraction 0.998162, under the 0.7288
// ceiling; plus 2 µs.
TEST(Operators, Fp8GemmsRunOnTheirMeasuredConstants) {
  const GpuSpec b200 = cluster_preset("b200")->gpu;
  const Op gemm{.name = "qkv", .kind = OpKind::gemm, .m = 4096, .n = 4096, .k = 4096,
                .flops = 2.0 * 4096 * 4096 * 4096};
  const double eta = 0.998162 * (512.0 / 592) * (4096.0 / 6144);
  for (Precision p : {Precision::fp8, Precision::mxfp8})
    EXPECT_NEAR(op_seconds(gemm, b200, p), gemm.flops / (4.5e15 * eta) + 2e-6, 1e-9)
        << to_string(p);
  // bf16 on the same GPU keeps bf16's constants.
  EXPECT_NEAR(op_seconds(gemm, b200, Precision::bf16),
              gemm.flops / (2.25e15 * gemm_efficiency(b200.kernels, 4096, 4096, 4096)) + 2e-6,
              1e-12);
  // Hopper (presets.cpp hopper_fp8_kernels): bf16's shape terms with the fraction 0.759049 set
  // from published torch._scaled_mm tables. 4096³ on 132 SMs: 512 tiles of 256 × 128 in
  // ⌈512/132⌉ = 4 waves, q = 512/528 (a halved tile doubles the tiles and waves, and costs 0.70);
  // k/(k + k½) = 4096/4608; under the 1520/1978.9 ceiling; plus 2 µs. bf16 keeps its own, on
  // both Hopper parts at the H200's measured power-capped clock (Note [power cap], presets.cpp:
  // 1/1.128136 of the burst figure), fp8 and bf16 alike.
  for (const char* name : {"h100-80g", "h200"}) {
    const double capped = 1 / 1.128136;
    const GpuSpec h = cluster_preset(name)->gpu;
    const double eta_h = 0.759049 * (512.0 / 528) * (4096.0 / 4608) * capped;
    EXPECT_NEAR(op_seconds(gemm, h, Precision::fp8), gemm.flops / (1978.9e12 * eta_h) + 2e-6,
                1e-9)
        << name;
    EXPECT_NEAR(op_seconds(gemm, h, Precision::bf16),
                gemm.flops / (989.4e12 * gemm_efficiency(h.kernels, 4096, 4096, 4096) * capped) +
                    2e-6,
                1e-12)
        << name;
  }
}

// Note [low-precision casts]: the quantize kernels of one Llama 3 8B layer (h 4096, q 4096, kv
// 2·1024, f 14336; T = 2·4096 tokens, no TP), each summed here by hand from the per-element bytes
// the note cites (bf16 e = 2): GEMM by GEMM its input X = T·k, weight W = k·n, output gradient
// G = T·n.
struct LinearShape {
  const char* name;
  double k, n;
};
constexpr double kT = 2 * 4096.0, kH = 4096, kF = 14336;
constexpr LinearShape kLlama8bLinears[] = {
    {"qkv", kH, 4096 + 2 * 1024}, {"out-proj", 4096, kH}, {"mlp-gate-up", kH, 2 * kF},
    {"mlp-down", kF, kH}};

std::map<std::string, double> quantize_bytes_by_name(const std::vector<Op>& ops, Pass pass) {
  std::map<std::string, double> out;
  for (const Op& op : ops)
    if (op.pass == pass && std::string_view(op.name).find(".quantize-") != std::string_view::npos)
      out[std::string(op.name)] += op.bytes;
  for (const Op& op : ops)
    if (op.pass == pass && std::string_view(op.name).ends_with(".transpose-copies"))
      out[std::string(op.name)] += op.bytes;
  return out;
}

TEST(Operators, QuantizeKernelsOfALlamaLayerByHand) {
  const ModelSpec m = *model_preset("llama-3-8b");
  const OperatorSetup base{.seq = 4096, .micro_batch = 2, .dropout = false};
  auto with = [&](Precision p, Kernels k) {
    OperatorSetup s = base;
    s.recipe = p;
    s.kernels = k;
    return layer_ops(m, s);
  };
  // Per element, bf16 in: fp8 (TE) reads 2 and writes e4m3 twice (row-wise and its transpose);
  // a LayerNormLinear's input (qkv, gate-up) comes out of the norm in fp8, and the transpose
  // reads 1 and writes 1. MXFP8 writes two 1-byte copies with a 1-byte scale per 32. NVFP4 X and
  // G: amax pass, row-wise pass and the Hadamard-cast pass each read 2, two 0.5-byte copies with
  // a 1-byte scale per 16; W: amax and one pass, 2 reads.
  const double mx = 2 + 2 * (1 + 1.0 / 32), fp4_xg = 3 * 2 + 2 * (0.5 + 1.0 / 16),
               fp4_w = 2 * 2 + 2 * (0.5 + 1.0 / 16);
  // torchao eager, per cast: abs 2+2, max 2, to(float32) 2+4, × scale 4+4, clamp 4+4,
  // to(float8) 4+1; each mm copies its transposed fp8 operand (1+1).
  const double ao = (2 + 2) + 2 + (2 + 4) + (4 + 4) + (4 + 4) + (4 + 1);
  EXPECT_DOUBLE_EQ(ao, 33);
  struct Case {
    Precision p;
    Kernels k;
  };
  for (const Case c : {Case{Precision::fp8, Kernels::fused}, Case{Precision::fp8, Kernels::eager},
                       Case{Precision::mxfp8, Kernels::fused},
                       Case{Precision::nvfp4, Kernels::fused}}) {
    SCOPED_TRACE(std::string(to_string(c.p)) + (c.k == Kernels::eager ? " eager" : " fused"));
    const auto ops = with(c.p, c.k);
    const auto fwd = quantize_bytes_by_name(ops, Pass::forward);
    const auto bwd = quantize_bytes_by_name(ops, Pass::backward);
    std::map<std::string, double> want_fwd, want_bwd;
    for (const LinearShape& g : kLlama8bLinears) {
      const std::string n = g.name;
      const double X = kT * g.k, W = g.k * g.n, G = kT * g.n;
      const bool ln_linear = n == "qkv" || n == "mlp-gate-up";
      const double projections = n == "qkv" ? 3 : n == "mlp-gate-up" ? 2 : 1;
      if (c.p == Precision::fp8 && c.k == Kernels::fused) {
        want_fwd[n + ".quantize-input"] = (ln_linear ? 1 + 1 : 2 + 1 + 1) * X;
        want_fwd[n + ".quantize-weight"] = (2 + 1 + 1) * W;
        want_bwd[n + ".quantize-grad"] = (2 + 1 + 1) * G;
      } else if (c.p == Precision::fp8) {
        want_fwd[n + ".quantize-input"] = projections * ao * X;  // wq, wk, wv each cast x
        want_fwd[n + ".quantize-weight"] = ao * W;
        want_bwd[n + ".quantize-grad"] = ao * G;
        want_bwd[n + ".transpose-copies"] = 2 * (projections * X + W + G);
      } else if (c.p == Precision::mxfp8) {
        want_fwd[n + ".quantize-input"] = mx * X;
        want_fwd[n + ".quantize-weight"] = mx * W;
        want_bwd[n + ".quantize-grad"] = mx * G;
      } else {
        want_fwd[n + ".quantize-input"] = fp4_xg * X;
        want_fwd[n + ".quantize-weight"] = fp4_w * W;
        want_bwd[n + ".quantize-grad"] = fp4_xg * G;
      }
    }
    EXPECT_EQ(fwd.size(), want_fwd.size());
    EXPECT_EQ(bwd.size(), want_bwd.size());
    for (const auto& [n, b] : want_fwd) EXPECT_DOUBLE_EQ(fwd.count(n) ? fwd.at(n) : -1, b) << n;
    for (const auto& [n, b] : want_bwd) EXPECT_DOUBLE_EQ(bwd.count(n) ? bwd.at(n) : -1, b) << n;
    // The norms of TE's LayerNormLinears write fp8: read 2 + write 1 instead of 2 + 2.
    const double norm = bytes_of(ops, "norm-1");
    const bool te_fp8 = c.p == Precision::fp8 && c.k == Kernels::fused;
    EXPECT_DOUBLE_EQ(norm, (te_fp8 ? 3 : c.k == Kernels::eager ? 36 : 4) * kT * kH);
    EXPECT_DOUBLE_EQ(bytes_of(ops, "norm-2"), norm);
  }
}

// A recipe only adds kernels: every kernel of the bf16 list is there unchanged, in the same
// order (the norms of TE's fused fp8 LayerNormLinears aside), and bf16, fp16, fp32 add none —
// so a run without a low-precision recipe keeps its kernels to the bit.
TEST(Operators, RecipesAddKernelsAndLeaveTheOthersAlone) {
  for (const char* model : {"llama-3-8b", "mixtral-8x7b", "deepseek-v3"}) {
    const ModelSpec m = *model_preset(model);
    for (Recompute rc : {Recompute::none, Recompute::full}) {
      OperatorSetup s{.seq = 4096, .micro_batch = 1, .tp = 8, .sequence_parallel = true,
                      .recompute = rc, .dropout = false, .ep = m.is_moe() ? 8 : 1};
      const auto bf16 = layer_ops(m, s);
      s.recipe = Precision::fp16;
      const auto fp16 = layer_ops(m, s);
      ASSERT_EQ(fp16.size(), bf16.size()) << model;
      for (std::size_t i = 0; i < bf16.size(); ++i)
        EXPECT_TRUE(fp16[i].name == bf16[i].name && fp16[i].bytes == bf16[i].bytes &&
                    fp16[i].flops == bf16[i].flops) << model << " " << bf16[i].name;
      for (Precision p : {Precision::fp8, Precision::mxfp8, Precision::nvfp4})
        for (Kernels k : {Kernels::fused, Kernels::eager}) {
          SCOPED_TRACE(std::string(model) + " " + std::string(to_string(p)));
          s.recipe = p;
          s.kernels = k;
          OperatorSetup plain = s;
          plain.recipe = Precision::bf16;
          const auto ref = layer_ops(m, plain);
          const auto ops = layer_ops(m, s);
          ASSERT_GT(ops.size(), ref.size());
          for (std::size_t i = 0; i < ref.size(); ++i) {
            EXPECT_EQ(ops[i].name, ref[i].name);
            EXPECT_EQ(ops[i].flops, ref[i].flops);
            if (!ops[i].name.starts_with("norm-") || ops[i].pass == Pass::backward) {
              EXPECT_EQ(ops[i].bytes, ref[i].bytes) << ops[i].name;
            }
          }
          for (std::size_t i = ref.size(); i < ops.size(); ++i) {
            EXPECT_EQ(ops[i].kind, OpKind::memory) << ops[i].name;
            EXPECT_GT(ops[i].bytes, 0) << ops[i].name;
          }
        }
      s.recipe = Precision::bf16;
      s.kernels = Kernels::fused;
    }
  }
  OperatorSetup fp32{.seq = 512, .act_bytes = 4, .recipe = Precision::fp32};
  EXPECT_NO_THROW(layer_ops(*model_preset("llama-3-8b"), fp32));
  fp32.recipe = Precision::fp8;  // a recipe's activations are bf16
  EXPECT_THROW(layer_ops(*model_preset("llama-3-8b"), fp32), InvalidInput);
}

// Sequence parallelism: the column-parallel inputs and the row-parallel output gradients are
// quantized on the rank's T/t rows and gathered in the format. Llama 3 70B (h 8192, f 28672) at
// t = 8, T = 8192: per rank qkv is T × (8192 + 2·1024)/8, out-proj k = 1024, gate-up n = 7168,
// down k = 3584.
TEST(Operators, SequenceParallelQuantizesBeforeTheGather) {
  const ModelSpec m = *model_preset("llama-3-70b");
  OperatorSetup s{.seq = 8192, .micro_batch = 1, .tp = 8, .sequence_parallel = true,
                  .dropout = false, .recipe = Precision::fp8};
  const double T = 8192, h = 8192, Tn = T / 8;
  auto fp8 = layer_ops(m, s);
  const auto fwd = quantize_bytes_by_name(fp8, Pass::forward);
  const auto bwd = quantize_bytes_by_name(fp8, Pass::backward);
  // TE fp8: the norm writes the fp8 shard (nothing more forward), the gathered T rows are
  // transposed in backward (1 read + 1 write); out-proj's gradient cast row-wise on T/t rows
  // (2 read + 1 write), gathered, transposed (1 + 1).
  EXPECT_EQ(fwd.count("qkv.quantize-input"), 0u);
  EXPECT_DOUBLE_EQ(bwd.at("qkv.transpose-copies"), 2 * T * h);
  EXPECT_DOUBLE_EQ(bytes_of(fp8, "norm-1"), 3 * Tn * h);
  EXPECT_DOUBLE_EQ(fwd.at("out-proj.quantize-input"), 4 * T * 1024);  // not gathered
  EXPECT_DOUBLE_EQ(bwd.at("out-proj.quantize-grad"), 3 * Tn * h);
  EXPECT_DOUBLE_EQ(bwd.at("out-proj.transpose-copies"), 2 * T * h);
  EXPECT_DOUBLE_EQ(bwd.at("mlp-down.quantize-grad"), 3 * Tn * h);
  EXPECT_DOUBLE_EQ(bwd.at("qkv.quantize-grad"), 4 * T * (8192 + 2048) / 8);
  // torchao eager with TP: PrepareFloat8ModuleInput casts x once, on the shard; wq, wk, wv each
  // copy the gathered fp8 x transposed.
  s.kernels = Kernels::eager;
  const auto eager = quantize_bytes_by_name(layer_ops(m, s), Pass::forward);
  EXPECT_DOUBLE_EQ(eager.at("qkv.quantize-input"), 33 * Tn * h);
  EXPECT_DOUBLE_EQ(eager.at("mlp-gate-up.quantize-input"), 33 * Tn * h);
  // MXFP8 quantizes both copies on the shard and gathers them.
  s.kernels = Kernels::fused;
  s.recipe = Precision::mxfp8;
  const auto mx = layer_ops(m, s);
  EXPECT_DOUBLE_EQ(quantize_bytes_by_name(mx, Pass::forward).at("qkv.quantize-input"),
                   (2 + 2 * (1 + 1.0 / 32)) * Tn * h);
  EXPECT_EQ(quantize_bytes_by_name(mx, Pass::backward).count("qkv.transpose-copies"), 0u);
}

// Note [fp8 operand layouts]: on compute capability 10.0 TE's per-tensor fp8 keeps no transposes —
// a cast reads 2 and writes 1 (Hopper 2 + 1 + 1), the fused norm's fp8 output is not transposed
// (Hopper 1 + 1) nor are SP's gathered rows (Hopper 2·T·h); MXFP8 writes both copies on either GPU.
TEST(Operators, BlackwellFp8CastsWriteOneCopy) {
  const ModelSpec m = *model_preset("llama-3-70b");
  OperatorSetup s{.seq = 8192, .micro_batch = 1, .dropout = false, .recipe = Precision::fp8,
                  .compute_capability = 100};
  const double T = 8192, h = 8192;
  auto q = [&](Pass p) { return quantize_bytes_by_name(layer_ops(m, s), p); };
  EXPECT_EQ(q(Pass::forward).count("qkv.quantize-input"), 0u);
  EXPECT_DOUBLE_EQ(q(Pass::forward).at("out-proj.quantize-weight"), (2 + 1) * h * h);
  EXPECT_DOUBLE_EQ(q(Pass::backward).at("mlp-down.quantize-grad"), (2 + 1) * T * h);
  s.tp = 8;
  s.sequence_parallel = true;
  EXPECT_EQ(q(Pass::backward).count("qkv.transpose-copies"), 0u);
  EXPECT_DOUBLE_EQ(q(Pass::backward).at("out-proj.quantize-grad"), 3 * T / 8 * h);  // as Hopper
  s.recipe = Precision::mxfp8;
  const auto blackwell = q(Pass::forward);
  s.compute_capability = 90;
  EXPECT_EQ(q(Pass::forward), blackwell);
}

// Replays cast again: full recompute replays every forward cast; op SAC the casts of the three
// GEMMs it replays (k, out-proj, w3), the k projection's input and weight among them.
TEST(Operators, ReplayedGemmsQuantizeTheirOperandsAgain) {
  const ModelSpec m = *model_preset("llama-3-8b");
  OperatorSetup s{.seq = 4096, .micro_batch = 1, .recompute = Recompute::full, .dropout = false,
                  .recipe = Precision::mxfp8};
  const auto ops = layer_ops(m, s);
  EXPECT_EQ(quantize_bytes_by_name(ops, Pass::recompute),
            quantize_bytes_by_name(ops, Pass::forward));
  s.recompute = Recompute::op_sac;
  const auto sac = quantize_bytes_by_name(layer_ops(m, s), Pass::recompute);
  const double mx = 2 + 2 * (1 + 1.0 / 32), T = 4096, h = 4096;
  EXPECT_EQ(sac.size(), 6u);
  EXPECT_DOUBLE_EQ(sac.at("k-proj.quantize-input"), mx * T * h);
  EXPECT_DOUBLE_EQ(sac.at("k-proj.quantize-weight"), mx * h * 1024);
  EXPECT_DOUBLE_EQ(sac.at("mlp-up.quantize-weight"), mx * h * 14336);
}

// The step time grows by exactly the quantize kernels' roofline time: on a B200 under MXFP8 (no
// fused norm changes) one layer's time goes up by Σ bytes / (HBM · 0.85) plus the fixed cost of
// each of the 12 kernels (4 GEMMs × input, weight, gradient); the bytes summed by hand as above.
TEST(Operators, QuantizeKernelsAddTheirRooflineTime) {
  const ModelSpec m = *model_preset("llama-3-8b");
  const GpuSpec b200 = cluster_preset("b200")->gpu;
  OperatorSetup s{.seq = 4096, .micro_batch = 2, .dropout = false};
  const OpsTime plain = time_ops(layer_ops(m, s), b200, Precision::mxfp8);
  s.recipe = Precision::mxfp8;
  const OpsTime cast = time_ops(layer_ops(m, s), b200, Precision::mxfp8);
  const double mx = 2 + 2 * (1 + 1.0 / 32);
  double fwd = 0, bwd = 0;
  for (const LinearShape& g : kLlama8bLinears) {
    fwd += mx * (kT * g.k + g.k * g.n);
    bwd += mx * kT * g.n;
  }
  const double bw = b200.memory_bps * 0.85, launch = b200.kernels.kernel_overhead_s;
  EXPECT_NEAR(cast.forward_s - plain.forward_s, fwd / bw + 8 * launch, 1e-12);
  EXPECT_NEAR(cast.backward_s - plain.backward_s, bwd / bw + 4 * launch, 1e-12);
  EXPECT_DOUBLE_EQ(cast.flops, plain.flops);
}

// Weight casts are timed apart (OpsTime::weight_cast_*), so the planner can count Transformer
// Engine's once per step (Note [low-precision casts]: TE caches the quantized weight across a
// step's micro-batches; torchao's eager fp8 casts in every forward). On the B200 under MXFP8 each
// of the 4 GEMMs' weights costs mx·k·n bytes at 0.85 of HBM plus one kernel's fixed cost; a full
// recompute casts them again in the replay.
TEST(Operators, WeightCastsAreTimedApartAndCachedByTransformerEngine) {
  const ModelSpec m = *model_preset("llama-3-8b");
  const GpuSpec b200 = cluster_preset("b200")->gpu;
  OperatorSetup s{.seq = 4096, .micro_batch = 2, .dropout = false, .recipe = Precision::mxfp8};
  const double mx = 2 + 2 * (1 + 1.0 / 32);
  const double bw = b200.memory_bps * 0.85, launch = b200.kernels.kernel_overhead_s;
  double weights = 0;
  for (const LinearShape& g : kLlama8bLinears) weights += mx * g.k * g.n / bw + launch;
  const OpsTime once = time_ops(layer_ops(m, s), b200, Precision::mxfp8);
  EXPECT_NEAR(once.weight_cast_forward_s, weights, 1e-12);
  EXPECT_NEAR(once.weight_cast_s, weights, 1e-12);
  s.recompute = Recompute::full;
  const OpsTime replayed = time_ops(layer_ops(m, s), b200, Precision::mxfp8);
  EXPECT_NEAR(replayed.weight_cast_forward_s, weights, 1e-12);
  EXPECT_NEAR(replayed.weight_cast_s, 2 * weights, 1e-12);
  EXPECT_DOUBLE_EQ(time_ops(layer_ops(m, OperatorSetup{.seq = 4096, .dropout = false}), b200,
                            Precision::bf16)
                       .weight_cast_s,
                   0.0);

  auto cached = [](Precision p, Kernels k) {
    return weight_casts_cached(OperatorSetup{.seq = 8, .kernels = k, .recipe = p});
  };
  EXPECT_TRUE(cached(Precision::fp8, Kernels::fused));     // TE
  EXPECT_FALSE(cached(Precision::fp8, Kernels::eager));    // torchao: every forward
  EXPECT_TRUE(cached(Precision::mxfp8, Kernels::eager));   // TE's kernels either way
  EXPECT_TRUE(cached(Precision::nvfp4, Kernels::fused));
  EXPECT_FALSE(cached(Precision::bf16, Kernels::fused));   // nothing to cast
}

}  // namespace
}  // namespace tally::test_operators_lowp
