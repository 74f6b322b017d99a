// The seed's model_state_gb acceptance criteria ①–⑥ (seed §A1/§A5 code block, 验收标准), plus
// property sweeps. N = 7e9 and the GB figures come from the seed's tables.
#include "tally/core/model_states.hpp"

#include <gtest/gtest.h>

namespace tally::test_model_states {
namespace {

double gb(double bytes) { return bytes / kGB; }

ModelStateResult run(double n, Precision p, Optimizer o, int stage = 0, int k = 1) {
  return model_states(n, StateSetup{.precision = p, .optimizer = o, .zero_stage = stage,
                                    .shard_degree = k});
}

// ① mixed Adam and fp32 Adam both 112 GB (±0.5); mixed itemized exactly 14/14/28/28/28.
TEST(ModelStates, Seed1_MixedAndFp32AdamBoth112GB) {
  const auto mixed = run(7e9, Precision::bf16, Optimizer::adam);
  const auto fp32 = run(7e9, Precision::fp32, Optimizer::adam);
  EXPECT_NEAR(gb(mixed.bytes.total()), 112.0, 0.5);
  EXPECT_NEAR(gb(fp32.bytes.total()), 112.0, 0.5);
  EXPECT_DOUBLE_EQ(gb(mixed.bytes.params), 14.0);
  EXPECT_DOUBLE_EQ(gb(mixed.bytes.grads), 14.0);
  EXPECT_DOUBLE_EQ(gb(mixed.bytes.m), 28.0);
  EXPECT_DOUBLE_EQ(gb(mixed.bytes.v), 28.0);
  EXPECT_DOUBLE_EQ(gb(mixed.bytes.master), 28.0);
}

// ② fp32 has master == 0: same total, different composition.
TEST(ModelStates, Seed2_Fp32HasNoMasterCopy) {
  const auto mixed = run(7e9, Precision::bf16, Optimizer::adam);
  const auto fp32 = run(7e9, Precision::fp32, Optimizer::adam);
  EXPECT_EQ(fp32.bytes.master, 0.0);
  EXPECT_DOUBLE_EQ(fp32.bytes.total(), mixed.bytes.total());
  EXPECT_NE(fp32.bytes.params, mixed.bytes.params);
  EXPECT_DOUBLE_EQ(gb(fp32.bytes.params), 28.0);
}

// ③ 8-bit Adam: 70 GB, exactly 37.5 % less than 112.
TEST(ModelStates, Seed3_EightBitAdamSaves37Point5Percent) {
  const auto mixed = run(7e9, Precision::bf16, Optimizer::adam);
  const auto q8 = run(7e9, Precision::bf16, Optimizer::adam8bit);
  EXPECT_DOUBLE_EQ(gb(q8.bytes.total()), 70.0);
  EXPECT_DOUBLE_EQ(1.0 - q8.bytes.total() / mixed.bytes.total(), 0.375);
}

// ④ k = 8: ZeRO-1/2/3 38.5 / 26.25 / 14 (±0.05); N = 13e9: DP 208, ZeRO-1 71.5, ZeRO-3 26.
TEST(ModelStates, Seed4_ZeroStagesAtK8) {
  EXPECT_NEAR(gb(run(7e9, Precision::bf16, Optimizer::adam, 1, 8).bytes.total()), 38.5, 0.05);
  EXPECT_NEAR(gb(run(7e9, Precision::bf16, Optimizer::adam, 2, 8).bytes.total()), 26.25, 0.05);
  EXPECT_NEAR(gb(run(7e9, Precision::bf16, Optimizer::adam, 3, 8).bytes.total()), 14.0, 0.05);
  EXPECT_NEAR(gb(run(13e9, Precision::bf16, Optimizer::adam, 0, 8).bytes.total()), 208.0, 0.05);
  EXPECT_NEAR(gb(run(13e9, Precision::bf16, Optimizer::adam, 1, 8).bytes.total()), 71.5, 0.05);
  EXPECT_NEAR(gb(run(13e9, Precision::bf16, Optimizer::adam, 3, 8).bytes.total()), 26.0, 0.05);
}

// The seed's ZeRO table itemized (seed §A5 table): ZeRO-2 = 14 + 1.75 + 3.5 + 3.5 + 3.5.
TEST(ModelStates, ZeroTwoItemizedAsSeedTable) {
  const auto r = run(7e9, Precision::bf16, Optimizer::adam, 2, 8);
  EXPECT_DOUBLE_EQ(gb(r.bytes.params), 14.0);
  EXPECT_DOUBLE_EQ(gb(r.bytes.grads), 1.75);
  EXPECT_DOUBLE_EQ(gb(r.bytes.m), 3.5);
  EXPECT_DOUBLE_EQ(gb(r.bytes.v), 3.5);
  EXPECT_DOUBLE_EQ(gb(r.bytes.master), 3.5);
}

// ⑤ sgd: m = v = 0, 8N total in mixed precision (2 + 2 + 4 master).
TEST(ModelStates, Seed5_SgdHasNoMoments) {
  const auto r = run(7e9, Precision::bf16, Optimizer::sgd);
  EXPECT_EQ(r.bytes.m, 0.0);
  EXPECT_EQ(r.bytes.v, 0.0);
  EXPECT_DOUBLE_EQ(r.bytes.total(), 8.0 * 7e9);
  const auto mom = run(7e9, Precision::bf16, Optimizer::sgd_momentum);
  EXPECT_DOUBLE_EQ(mom.bytes.m, 4.0 * 7e9);
  EXPECT_EQ(mom.bytes.v, 0.0);
}

// ⑥ the convention names precision, optimizer, master weights and sharding stage and degree.
TEST(ModelStates, Seed6_ConventionNamesEveryChoice) {
  const auto r = run(7e9, Precision::bf16, Optimizer::adam, 2, 8);
  const std::string c = convention_with_unit(r.convention(), SizeUnit::GB);
  EXPECT_NE(c.find("bf16"), std::string::npos) << c;
  EXPECT_NE(c.find("adam"), std::string::npos) << c;
  EXPECT_NE(c.find("master fp32 counted"), std::string::npos) << c;
  EXPECT_NE(c.find("ZeRO-2 k=8"), std::string::npos) << c;
  EXPECT_NE(c.find("GB (1e9 B)"), std::string::npos) << c;
  const auto f = run(7e9, Precision::fp32, Optimizer::sgd);
  EXPECT_NE(f.convention().find("master none"), std::string::npos) << f.convention();
  EXPECT_NE(f.convention().find("no sharding"), std::string::npos) << f.convention();
  EXPECT_NE(convention_with_unit(f.convention(), SizeUnit::GiB).find("GiB"), std::string::npos);
  // Two setups with equal totals must still have different labels.
  EXPECT_NE(run(7e9, Precision::fp32, Optimizer::adam).convention(),
            run(7e9, Precision::bf16, Optimizer::adam).convention());
}

// Property: per-GPU state ZeRO-3 <= ZeRO-2 <= ZeRO-1 <= DP, and non-increasing in k.
TEST(ModelStates, PropertyMonotoneInStageAndDegree) {
  for (Precision p : {Precision::fp32, Precision::bf16, Precision::fp16})
    for (Optimizer o : {Optimizer::adam, Optimizer::adam8bit, Optimizer::sgd,
                        Optimizer::sgd_momentum})
      for (int k : {1, 2, 3, 4, 7, 8, 64, 1024}) {
        double prev = 1e300;
        for (int s = 0; s <= 3; ++s) {
          const double t = run(1e9, p, o, s, k).bytes.total();
          EXPECT_LE(t, prev * (1 + 1e-12)) << "stage " << s << " k " << k;
          prev = t;
          if (k > 1 && s > 0) {
            EXPECT_LE(t, run(1e9, p, o, s, k - 1).bytes.total());
          }
        }
      }
}

TEST(ModelStates, StageThreeIsSixteenNOverK) {
  for (int k : {1, 2, 3, 8, 512})
    EXPECT_DOUBLE_EQ(run(7e9, Precision::bf16, Optimizer::adam, 3, k).bytes.total(),
                     16.0 * 7e9 / k);
}

// Note [fp8 parameters]: Megatron-Core's fp8 parameters hold no bf16 copy of the linear weights.
// By hand, N 1e9 of which 0.9e9 linear weights, ZeRO-1 over 8: params 2 B × 0.1e9 = 0.2e9 (the
// norms and embeddings); grads 2e9; master, m, v 4e9/8 each; the copies 2.0625 × 0.9e9 (MXFP8) or
// 2 × 0.9e9 (per-tensor fp8 on Hopper, weight and transpose) — 1.5e9 + 0.2e9 + 2e9 + copies in
// all, 1.8e9 B less than without. ZeRO-3 shards the remaining params with the rest.
TEST(ModelStates, Fp8ParametersHoldNoBf16CopyOfTheLinearWeights) {
  StateSetup s{.precision = Precision::mxfp8, .optimizer = Optimizer::adam, .zero_stage = 1,
               .shard_degree = 8, .gemm_weight_share = 0.9, .fp8_param_gather = true};
  const auto mx = model_states(1e9, s);
  EXPECT_NEAR(mx.bytes.params, 0.2e9, 1e-3);
  EXPECT_DOUBLE_EQ(mx.bytes.grads, 2e9);
  EXPECT_DOUBLE_EQ(mx.bytes.master, 0.5e9);
  EXPECT_NEAR(mx.bytes.low_precision, 2.0625 * 0.9e9, 1e-3);
  EXPECT_NEAR(mx.bytes.total(), 1.5e9 + 0.2e9 + 2e9 + 2.0625 * 0.9e9, 1e-3);
  s.fp8_param_gather = false;
  EXPECT_NEAR(model_states(1e9, s).bytes.total() - mx.bytes.total(), 1.8e9, 1e-3);
  s = {.precision = Precision::fp8, .optimizer = Optimizer::adam, .zero_stage = 3,
       .shard_degree = 8, .gemm_weight_share = 0.9, .compute_capability = 90,
       .fp8_param_gather = true};
  const auto fp8 = model_states(1e9, s);
  EXPECT_NEAR(fp8.bytes.params, 0.2e9 / 8, 1e-3);
  EXPECT_NEAR(fp8.bytes.low_precision, 2 * 0.9e9 / 8, 1e-3);
  EXPECT_NE(fp8.convention().find("--fp8-param-gather"), std::string::npos) << fp8.convention();
  for (Precision p : {Precision::bf16, Precision::nvfp4, Precision::fp32}) {
    s.precision = p;
    EXPECT_THROW(model_states(1e9, s), InvalidInput) << to_string(p);
  }
}

TEST(ModelStates, RejectsBadInput) {
  EXPECT_THROW(run(0, Precision::bf16, Optimizer::adam), InvalidInput);
  EXPECT_THROW(run(-1, Precision::bf16, Optimizer::adam), InvalidInput);
  EXPECT_THROW(run(7e9, Precision::bf16, Optimizer::adam, 4, 8), InvalidInput);
  EXPECT_THROW(run(7e9, Precision::bf16, Optimizer::adam, 1, 0), InvalidInput);
}

}  // namespace
}  // namespace tally::test_model_states

#include "tally/core/sharding.hpp"

namespace tally::test_model_states {
namespace {
// The sharding rule covers [0, numel) exactly, in rank order, sizes differing by at most one.
TEST(Sharding, SpansTileTheRange) {
  for (std::int64_t n : {0, 1, 7, 8, 1000003})
    for (int k : {1, 2, 3, 4, 8}) {
      std::int64_t next = 0;
      for (int r = 0; r < k; ++r) {
        const ShardSpan s = shard_span(n, k, r);
        EXPECT_EQ(s.offset, next);
        EXPECT_TRUE(s.count == n / k || s.count == n / k + 1);
        next += s.count;
      }
      EXPECT_EQ(next, n);
    }
}
// Expert parallelism (Note [expert parallelism]): Mixtral 8x7B, N = 46,702,792,704 of which the
// routed experts are 32 layers × 8 experts × 3·4096·14336 = 45,097,156,608 (HF's count). Mixed
// Adam, ZeRO-1 over dp = 8 with EP 4: the other 1,605,636,096 params keep params and grads
// (2 + 2 B) and shard m, v, master (12 B) over 8; each GPU holds 2 of the 8 experts,
// 11,274,289,152 params, whose 12 B shard over the expert-data-parallel group of 8/4 = 2.
TEST(ModelStates, ExpertParallelSplitsTheRoutedExperts) {
  const double n = 46702792704.0, routed = 45097156608.0;
  const StateSetup s{.precision = Precision::bf16, .optimizer = Optimizer::adam, .zero_stage = 1,
                     .shard_degree = 8, .ep = 4, .expert_share = routed / n};
  const auto r = model_states(n, s);
  const double dense = n - routed, expert = routed / 4;
  EXPECT_NEAR(r.bytes.params, 2 * (dense + expert), 1);
  EXPECT_NEAR(r.bytes.m, 4 * (dense / 8 + expert / 2), 1);
  EXPECT_NEAR(r.bytes.total(), dense * (4 + 12.0 / 8) + expert * (4 + 12.0 / 2), 16);
  EXPECT_NEAR(r.local_params, dense + expert, 1);
  EXPECT_NEAR(r.updated_params, dense / 8 + expert / 2, 1);
  EXPECT_NE(r.convention().find("EP 4"), std::string::npos) << r.convention();
  // ZeRO-0: nothing sharded, but the experts are still split over EP.
  const auto z0 = model_states(n, StateSetup{.shard_degree = 8, .ep = 4, .expert_share = routed / n});
  EXPECT_NEAR(z0.bytes.total(), 16 * (dense + expert), 16);
  // EP must come out of the data-parallel ranks, and needs experts to split.
  EXPECT_THROW(model_states(n, StateSetup{.shard_degree = 6, .ep = 4, .expert_share = 0.9}),
               InvalidInput);
  EXPECT_THROW(model_states(n, StateSetup{.shard_degree = 8, .ep = 2, .expert_share = 0}),
               InvalidInput);
  // EP 1 is the dense ledger, whatever the share.
  EXPECT_DOUBLE_EQ(model_states(n, StateSetup{.zero_stage = 1, .shard_degree = 8,
                                              .expert_share = routed / n})
                       .bytes.total(),
                   model_states(n, StateSetup{.zero_stage = 1, .shard_degree = 8}).bytes.total());
}

// Expert TP other than TP (Note [expert rank groups]: Megatron-Core's
// --expert-tensor-parallel-size) for Mixtral on tp 2 × dp 8 (16 GPUs), ZeRO-1, mixed Adam. The
// ledger gets N/2 per GPU (TP 2).
//   ETP 1 × EP 8: each GPU holds one whole expert per layer, 45,097,156,608 / 8 = 5,637,144,576
//     params, their 12 B sharded over the expert DP 16 / (1·8) = 2; the other 1,605,636,096 / 2 =
//     802,818,048 over dp 8.
//   ETP 2 × EP 2 (ETP = TP): half of 4 of the 8 experts, 45,097,156,608 / 4 = 11,274,289,152,
//     expert DP 16 / 4 = 4.
TEST(ModelStates, ExpertTensorParallelismSplitsTheExpertsItsOwnWay) {
  const double n = 46702792704.0, routed = 45097156608.0;
  const double dense = (n - routed) / 2;
  const StateSetup one{.zero_stage = 1, .shard_degree = 8, .ep = 8, .tp = 2, .etp = 1,
                       .expert_share = routed / n};
  const auto r1 = model_states(n / 2, one);
  EXPECT_EQ(one.expert_shard_degree(), 2);
  EXPECT_NEAR(r1.local_params, dense + 5637144576.0, 1);
  EXPECT_NEAR(r1.bytes.m, 4 * (dense / 8 + 5637144576.0 / 2), 1);
  EXPECT_NEAR(r1.bytes.total(), dense * (4 + 12.0 / 8) + 5637144576.0 * (4 + 12.0 / 2), 16);
  EXPECT_NE(r1.convention().find("ETP 1"), std::string::npos) << r1.convention();
  StateSetup two = one;
  two.etp = 0;  // = tp
  two.ep = 2;
  const auto r2 = model_states(n / 2, two);
  EXPECT_EQ(two.expert_shard_degree(), 4);
  EXPECT_NEAR(r2.local_params, dense + 11274289152.0, 1);
  EXPECT_NEAR(r2.updated_params, dense / 8 + 11274289152.0 / 4, 1);
  // ETP 1 with EP 1 keeps whole experts on every GPU of a TP pair: twice the expert parameters.
  StateSetup whole = one;
  whole.ep = 1;
  EXPECT_NEAR(model_states(n / 2, whole).local_params, dense + routed, 1);
  // ETP × EP regroups TP × DP: 3 × 1 does not divide 16; a dense model has no experts to split.
  StateSetup bad = one;
  bad.ep = 3;
  EXPECT_THROW(model_states(n / 2, bad), InvalidInput);
  bad = one;
  bad.ep = 1;
  bad.expert_share = 0;
  EXPECT_THROW(model_states(n / 2, bad), InvalidInput);
}

// An fp8 recipe is bf16 mixed Adam (16 B per parameter) plus 2 B per linear weight for its fp8
// copy and transpose; with 95 % of 7e9 parameters in linear layers that is 13.3 GB more. ZeRO-1
// and ZeRO-2 leave the copies whole (they are built from the full local weights); ZeRO-3 shards
// them with the parameters.
TEST(ModelStates, LowPrecisionRecipesAddWeightCopies) {
  const StateSetup fp8{.precision = Precision::fp8, .gemm_weight_share = 0.95};
  const auto r = model_states(7e9, fp8);
  EXPECT_DOUBLE_EQ(r.bytes.low_precision, 2 * 0.95 * 7e9);
  EXPECT_DOUBLE_EQ(r.bytes.total() - r.bytes.low_precision,
                   model_states(7e9, StateSetup{.precision = Precision::bf16}).bytes.total());
  StateSetup z2 = fp8, z3 = fp8;
  z2.zero_stage = 2;
  z2.shard_degree = 8;
  z3.zero_stage = 3;
  z3.shard_degree = 8;
  EXPECT_DOUBLE_EQ(model_states(7e9, z2).bytes.low_precision, 2 * 0.95 * 7e9);
  EXPECT_DOUBLE_EQ(model_states(7e9, z3).bytes.low_precision, 2 * 0.95 * 7e9 / 8);
  StateSetup nv = fp8;
  nv.precision = Precision::nvfp4;
  EXPECT_DOUBLE_EQ(model_states(7e9, nv).bytes.low_precision, 1.125 * 0.95 * 7e9);
  EXPECT_NE(model_states(7e9, nv).convention().find("NVFP4"), std::string::npos);
}

// Note [fp8 operand layouts]: on compute capability 10.0 (B200) TE keeps the fp8 weight alone,
// 1 B per linear weight — 0.95 · 7e9 B, half Hopper's; MXFP8 keeps both copies there, 2.0625 B.
// The label says which copies were counted and why.
TEST(ModelStates, BlackwellKeepsOneFp8WeightCopy) {
  StateSetup s{.precision = Precision::fp8, .gemm_weight_share = 0.95, .compute_capability = 100};
  const auto b200 = model_states(7e9, s);
  EXPECT_DOUBLE_EQ(b200.per_param.low_precision, 1.0);
  EXPECT_DOUBLE_EQ(b200.bytes.low_precision, 0.95 * 7e9);
  EXPECT_NE(b200.convention().find("the weight alone"), std::string::npos) << b200.convention();
  EXPECT_NE(b200.convention().find("10.0"), std::string::npos) << b200.convention();
  s.compute_capability = 90;
  const auto h100 = model_states(7e9, s);
  EXPECT_DOUBLE_EQ(h100.bytes.low_precision, 2 * 0.95 * 7e9);
  EXPECT_NE(h100.convention().find("its transpose"), std::string::npos) << h100.convention();
  EXPECT_DOUBLE_EQ(h100.bytes.total() - b200.bytes.total(), 0.95 * 7e9);  // nothing else moves
  s.precision = Precision::mxfp8;
  s.compute_capability = 100;
  EXPECT_DOUBLE_EQ(model_states(7e9, s).bytes.low_precision, 2 * (1 + 1.0 / 32) * 0.95 * 7e9);
  s.compute_capability = -1;
  EXPECT_THROW(model_states(7e9, s), InvalidInput);
}

// fp8 delayed scaling's metadata (Note [low precision]): Llama 3 8B's 32 layers × 4 linear GEMMs =
// 128 GEMMs, each 5 fp32 amax histories of 1024 entries and 5 fp32 scales: 128 · 20,500 B; with
// Megatron-Core's history of 1, 128 · 40 B. Module buffers: ZeRO-3 does not shard them; MXFP8 and
// NVFP4 (block scales, no history) keep none.
TEST(ModelStates, DelayedScalingKeepsAmaxHistories) {
  StateSetup s{.precision = Precision::fp8, .gemm_weight_share = 0.87, .scaled_gemms = 128};
  const auto r = model_states(8e9, s);
  EXPECT_DOUBLE_EQ(r.bytes.scaling_metadata, 128 * 20500.0);
  EXPECT_DOUBLE_EQ(r.bytes.total() - r.bytes.scaling_metadata,
                   model_states(8e9, StateSetup{.precision = Precision::fp8,
                                                .gemm_weight_share = 0.87})
                       .bytes.total());
  EXPECT_NE(r.convention().find("amax history 1024"), std::string::npos) << r.convention();
  s.amax_history = 1;
  EXPECT_DOUBLE_EQ(model_states(8e9, s).bytes.scaling_metadata, 128 * 40.0);
  s.zero_stage = 3;
  s.shard_degree = 8;
  EXPECT_DOUBLE_EQ(model_states(8e9, s).bytes.scaling_metadata, 128 * 40.0);
  s.precision = Precision::mxfp8;
  EXPECT_EQ(model_states(8e9, s).bytes.scaling_metadata, 0.0);
  s.precision = Precision::fp8;
  s.amax_history = 0;
  EXPECT_THROW(model_states(8e9, s), InvalidInput);
}

}  // namespace
}  // namespace tally::test_model_states
