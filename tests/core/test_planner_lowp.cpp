// The planner under the low-precision recipes (core/planner.hpp; types.hpp Note [low precision]):
// the fp8 weight copies, their dependence on the GPU (Note [fp8 operand layouts]) and torchao's
// FSDP float8 all-gather (Note [fp8 all-gather], comm.cpp). Apart from test_planner.cpp, which
// holds the seed's plans and the search, to keep each file under 800 lines.
#include <gtest/gtest.h>

#include <string>

#include "tally/core/planner.hpp"
#include "tally/core/presets.hpp"

namespace tally::test_planner_lowp {
namespace {

// A low-precision plan: fp8 on H100 makes the step faster and adds the weight copies; the GPU
// must have the format's tensor cores (one line naming --precision otherwise).
TEST(Planner, LowPrecisionRecipes) {
  PlanRequest req{.model = *model_preset("llama-3-8b"), .cluster = *cluster_preset("h100-80g"),
                  .gpus = 8, .global_batch = 64, .seq = 8192};
  const Layout l{.dp = 8, .zero = 1, .micro_batch = 1, .grad_accum = 8};
  const PlanEval bf16 = evaluate_layout(req, l);
  req.precision = Precision::fp8;
  const PlanEval fp8 = evaluate_layout(req, l);
  EXPECT_LT(fp8.step_s, bf16.step_s);
  EXPECT_GT(fp8.step_s, bf16.step_s / 2);  // attention, norms, head and optimizer stay
  EXPECT_GT(fp8.states.low_precision, 0);
  // Delayed scaling's amax histories: 32 layers × 4 GEMMs × 20,500 B (Note [low precision]).
  EXPECT_DOUBLE_EQ(fp8.states.scaling_metadata, 128 * 20500.0);
  EXPECT_DOUBLE_EQ(fp8.scaled_gemms, 128);
  EXPECT_DOUBLE_EQ(
      fp8.states.total() - fp8.states.low_precision - fp8.states.scaling_metadata,
      bf16.states.total());
  // The linears' saved inputs in fp8: h + f fewer bytes per token and layer (Activations.
  // LowPrecisionRecipesSaveQuantizedLinearInputs), 8192 tokens × 32 layers, one micro-batch held.
  EXPECT_DOUBLE_EQ(bf16.activation_bytes - fp8.activation_bytes, 32 * 8192.0 * (4096 + 14336));
  EXPECT_LE(fp8.mfu, 1.0);  // against the fp8 peak
  req.precision = Precision::nvfp4;
  try {
    evaluate_layout(req, l);
    ADD_FAILURE() << "nvfp4 on an H100";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("--precision nvfp4"), std::string::npos) << e.what();
  }
  req.cluster = *cluster_preset("b200");
  EXPECT_NO_THROW(evaluate_layout(req, l));
}

// Note [fp8 operand layouts]: the same fp8 plan on a B200 keeps one weight copy where the GPU
// reports compute capability 10.0 and two where it reports 9.0 — the copies halve, nothing else in
// the state ledger moves; the casts write one copy, so the step is no slower; the label says it.
TEST(Planner, BlackwellKeepsOneFp8WeightCopy) {
  PlanRequest req{.model = *model_preset("llama-3-8b"), .cluster = *cluster_preset("b200"),
                  .gpus = 8, .global_batch = 64, .seq = 8192, .precision = Precision::fp8};
  const Layout l{.dp = 8, .zero = 1, .micro_batch = 1, .grad_accum = 8};
  const PlanEval one = evaluate_layout(req, l);
  req.cluster.gpu.compute_capability = 90;
  const PlanEval two = evaluate_layout(req, l);
  // 6,979,321,856 linear weights (test_model.cpp, Float8GatherShareIsTheNonExpertLinears), whole
  // on every rank under ZeRO-1: 1 B each, against 2.
  EXPECT_DOUBLE_EQ(one.states.low_precision, 6979321856.0);
  EXPECT_DOUBLE_EQ(two.states.low_precision, 2 * 6979321856.0);
  EXPECT_DOUBLE_EQ(two.states.total() - one.states.total(), 6979321856.0);
  EXPECT_LT(one.compute_s, two.compute_s);
  EXPECT_EQ(one.comm_bytes_per_gpu, two.comm_bytes_per_gpu);
  EXPECT_NE(plan_convention(req).find("its transpose"), std::string::npos);
  req.cluster.gpu.compute_capability = 100;
  EXPECT_NE(plan_convention(req).find("the weight alone"), std::string::npos)
      << plan_convention(req);
}

// Note [fp8 all-gather]: with torchao's FSDP float8 all-gather a ZeRO-3 layout gathers each linear
// weight in 1 B instead of 2. Llama 3 8B on 8 H100s, ZeRO-3, 2 micro-batches: the gathers run for
// forward and backward of each, 4 calls, each 6,979,321,856 · 7/8 B lighter; the gradients and the
// memory ledger do not move; a ZeRO-1 layout (no FSDP gather) does not either.
TEST(Planner, Float8AllGatherLightensZeroThreeGathers) {
  PlanRequest req{.model = *model_preset("llama-3-8b"), .cluster = *cluster_preset("h100-80g"),
                  .gpus = 8, .global_batch = 16, .seq = 8192, .precision = Precision::fp8};
  const Layout z3{.dp = 8, .zero = 3, .micro_batch = 1, .grad_accum = 2,
                  .recompute = Recompute::full};
  const PlanEval bf16_gather = evaluate_layout(req, z3);
  req.fsdp_float8_all_gather = true;
  const PlanEval fp8_gather = evaluate_layout(req, z3);
  EXPECT_NEAR(bf16_gather.comm_bytes_per_gpu - fp8_gather.comm_bytes_per_gpu,
              4 * 6979321856.0 * 7 / 8, 1e-3);
  EXPECT_LT(fp8_gather.dp_s, bf16_gather.dp_s);
  EXPECT_LE(fp8_gather.step_s, bf16_gather.step_s);
  EXPECT_EQ(fp8_gather.total_bytes, bf16_gather.total_bytes);
  Layout z1 = z3;
  z1.zero = 1;
  const double z1_on = evaluate_layout(req, z1).comm_bytes_per_gpu;
  EXPECT_NE(plan_convention(req).find("enable_fsdp_float8_all_gather"), std::string::npos)
      << plan_convention(req);
  req.fsdp_float8_all_gather = false;
  EXPECT_EQ(evaluate_layout(req, z1).comm_bytes_per_gpu, z1_on);
  EXPECT_EQ(plan_convention(req).find("enable_fsdp_float8_all_gather"), std::string::npos);
  req.fsdp_float8_all_gather = true;
  req.precision = Precision::bf16;
  EXPECT_THROW(evaluate_layout(req, z3), InvalidInput);
}

}  // namespace
}  // namespace tally::test_planner_lowp
