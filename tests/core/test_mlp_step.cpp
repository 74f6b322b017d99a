// core/mlp_step: the engine runs' step-time model (Note [host step model]), checked against hand
// counts on a host whose kernels run exactly at peak (η = 1, no overhead), so every term is
// FLOPs / peak, streams · 4 B / bandwidth or α·steps + bytes/β, summed here independently.
#include "tally/core/mlp_step.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>

#include "ideal_host.hpp"
#include "tally/core/planner.hpp"
#include "tally/core/roofline.hpp"
#include "tally/core/types.hpp"

namespace tally::test_mlp_step {
namespace {

// N = Σ d_l·d_{l+1} + d_{l+1}: zero.hpp's Note [default ZeRO model] states 1,577,455 for
// 512 → 1021 → 1021 → 10; bench ddp's 512 → 1024 → 1024 → 1024 → 16 by hand: 525,312 +
// 2 · 1,049,600 + 16,400 = 2,640,912 (ddp.hpp: "N = 2.64 M").
TEST(MlpStep, ParameterCounts) {
  EXPECT_EQ(mlp_parameters({512, 1021, 1021, 10}), 1'577'455);
  EXPECT_EQ(mlp_parameters({512, 1024, 1024, 1024, 16}), 2'640'912);
  // nn.Sequential's registration order: 0.weight (d_1 × d_0), 0.bias, 2.weight, 2.bias.
  EXPECT_EQ(mlp_tensor_sizes({6, 5, 4}), (std::vector<std::int64_t>{30, 5, 20, 4}));
}

// Forward 2·B·Σ d_l·d_{l+1}; backward twice that less layer 0's dgrad (its input needs none).
TEST(MlpStep, GemmFlopsAreForwardPlusTwoBackwardLessTheFirstDgrad) {
  const std::vector<std::int64_t> w = {6, 5, 4, 3};
  const std::int64_t B = 7;
  const double sum = 6 * 5 + 5 * 4 + 4 * 3;
  double fwd = 0, bwd = 0;
  int gemms = 0;
  for (const Op& op : mlp_ops(w, B)) {
    if (op.kind != OpKind::gemm) continue;
    ++gemms;
    (op.pass == Pass::forward ? fwd : bwd) += op.flops;
  }
  EXPECT_EQ(gemms, 3 + 3 + 2);
  EXPECT_DOUBLE_EQ(fwd, 2.0 * B * sum);
  EXPECT_DOUBLE_EQ(bwd, 2 * 2.0 * B * sum - 2.0 * B * 6 * 5);
}

using test::ideal_host;

// ZeRO-1 at k = 2 on widths 8 → 6 → 4, B = 3, every term by hand.
TEST(MlpStep, ZeroOneStepIsTheSumOfItsTerms) {
  const double peak = 1e9, W = 2e9, alpha = 1e-5, beta = 1e8;
  const std::vector<std::int64_t> w = {8, 6, 4};
  const std::int64_t B = 3;
  const int k = 2;
  const double N = 8 * 6 + 6 + 6 * 4 + 4;  // 82
  MlpStepSetup s{.widths = w, .rows = B, .ranks = k, .zero_stage = 1, .cores = 2};
  const MlpStepTime t = predict_mlp_step(s, ideal_host(peak, alpha, beta, W));

  // Each GEMM costs max(FLOPs/peak, bytes/W) (roofline): forward B × 6 (k 8), B × 4 (k 6);
  // wgrad 6 × 8 (k B), 4 × 6 (k B); dgrad of layer 1 only, B × 6 (k 4). The elementwise kernels:
  // relu 2·B·6 streams forward and 3·B·6 backward, cross-entropy 3·B·4 + 2·B·4, the bias
  // gradients (B·6 + 6) + (B·4 + 4).
  struct G { double m, n, kk; };
  const G gemms[] = {{3, 6, 8}, {3, 4, 6}, {6, 8, 3}, {4, 6, 3}, {3, 6, 4}};
  double gemm_s = 0;
  for (const G& g : gemms)
    gemm_s += std::max(2 * g.m * g.n * g.kk / peak, 4 * (g.m * g.kk + g.kk * g.n + g.m * g.n) / W);
  const double elementwise = 2 * B * 6 + 3 * B * 6 + 3 * B * 4 + 2 * B * 4 + (B * 6 + 6) +
                             (B * 4 + 4);
  EXPECT_NEAR(t.compute_s, gemm_s + 4 * elementwise / W, 1e-15);
  // ZeRO-1 gradients: zero_ 2N (a fill: read for ownership, write), accumulate 3N (reduced and
  // gathered in place); Adam 20·⌈N/k⌉ streams.
  EXPECT_NEAR(t.gradient_s, 4 * (2 * N + 3 * N) / W, 1e-15);
  EXPECT_NEAR(t.optimizer_s, 4 * 20 * 41 / W, 1e-15);
  // Reduce-scatter and all-gather of S = 4N: (k − 1) steps and S(k − 1)/k bytes each.
  const double S = 4 * N;
  EXPECT_NEAR(t.comm_s, 2 * (alpha * 1 + S / 2 / beta), 1e-15);
  EXPECT_EQ(t.contention, 1);
  EXPECT_NEAR(t.total_s, t.compute_s + t.gradient_s + t.optimizer_s + t.comm_s, 1e-15);
}

// Four ranks of one thread on two cores: compute and memory stretch 2×; comm does not (its α–β
// was measured at the same k). DP's buckets each pay an all-reduce's latency.
TEST(MlpStep, ContentionAndBuckets) {
  const ClusterSpec host = ideal_host(1e9, 1e-5, 1e8, 2e9);
  MlpStepSetup s{.widths = {8, 6, 4}, .rows = 3, .ranks = 4, .zero_stage = 0,
                 .optimizer = Optimizer::sgd, .cores = 2};
  const MlpStepTime one = predict_mlp_step(s, host);
  EXPECT_EQ(one.contention, 2);
  EXPECT_NEAR(one.total_s, 2 * (one.compute_s + one.gradient_s + one.optimizer_s) + one.comm_s,
              1e-15);
  const double N = 82, S = 4 * N;
  EXPECT_NEAR(one.comm_s, 1e-5 * 6 + 2 * S * 3 / 4 / 1e8, 1e-15);  // 2(k−1) steps
  s.bucket_bytes = {100, S - 100};
  const MlpStepTime two = predict_mlp_step(s, host);
  EXPECT_NEAR(two.comm_s - one.comm_s, 1e-5 * 6, 1e-15);
  // SGD: p.add_(g) is 3 streams per parameter; DP's pack, a copy into the bucket, 3 streams per
  // gradient (read, read for ownership, write).
  EXPECT_NEAR(one.optimizer_s, 4 * 3 * N / 2e9, 1e-15);
  EXPECT_NEAR(one.gradient_s, 4 * 3 * N / 2e9, 1e-15);
}

// Note [memory kernel overhead]: where the host measured a streaming kernel's fixed cost apart,
// streaming kernels pay it and GEMMs keep the GEMM fit's; unset, both pay the GEMM's. SGD on
// {8, 6, 4} is one p.add_ per parameter tensor: 4 kernels of 3 streams.
TEST(MlpStep, MemoryKernelsTakeTheirOwnOverhead) {
  const double W = 2e9, N = 82, gemm_oh = 1e-5, mem_oh = 3e-7;
  ClusterSpec one = ideal_host(1e9, 1e-5, 1e8, W);
  one.gpu.kernels.kernel_overhead_s = gemm_oh;
  ClusterSpec apart = one;
  apart.gpu.kernels.memory_overhead_s = mem_oh;
  const MlpStepSetup s{.widths = {8, 6, 4}, .rows = 3, .optimizer = Optimizer::sgd};
  const MlpStepTime a = predict_mlp_step(s, one), b = predict_mlp_step(s, apart);
  EXPECT_NEAR(a.optimizer_s, 4 * gemm_oh + 4 * 3 * N / W, 1e-15);
  EXPECT_NEAR(b.optimizer_s, 4 * mem_oh + 4 * 3 * N / W, 1e-15);
  // Forward and backward: 5 GEMMs keep 1e-5 each; each streaming kernel saves the difference.
  int streaming = 0, gemms = 0;
  for (const Op& op : mlp_ops(s.widths, s.rows)) (op.kind == OpKind::memory ? streaming : gemms)++;
  EXPECT_EQ(gemms, 5);
  ASSERT_GT(streaming, 0);
  EXPECT_NEAR(a.compute_s - b.compute_s, streaming * (gemm_oh - mem_oh), 1e-15);
  // Out of range: named.
  apart.gpu.kernels.memory_overhead_s = 2.0;
  EXPECT_THROW(
      {
        try {
          validate_kernel_perf(apart.gpu);
        } catch (const InvalidInput& e) {
          EXPECT_NE(std::string(e.what()).find("memory_overhead_s"), std::string::npos);
          throw;
        }
      },
      InvalidInput);
}

// ZeRO-3's gradient passes per unit (one Linear: weight and bias), by hand from Note [host step
// model], each copy into another buffer 3 streams and each fill 2: the gathered unit copied into
// its buffer forward and backward (6 n_u), autograd's SliceBackward0 for each of the two views (a
// zeroed n_u buffer, 2 streams, and its slice copied in, 3 streams of the parameter's elements),
// the two full-size gradients summed (3 n_u), the rank's gradient shard copied out (3⌈n_u/k⌉).
TEST(MlpStep, ZeroThreeGradientPasses) {
  const double W = 2e9;
  MlpStepSetup s{.widths = {8, 6, 4}, .rows = 3, .ranks = 2, .zero_stage = 3, .cores = 2};
  const MlpStepTime t = predict_mlp_step(s, ideal_host(1e9, 1e-5, 1e8, W));
  const double n0 = 8 * 6 + 6, n1 = 6 * 4 + 4;  // 54, 28
  const double streams = 6 * (n0 + n1) + 2 * 2 * (n0 + n1) + 3 * (48 + 6) + 3 * (24 + 4) +
                         3 * (n0 + n1) + 3 * (27 + 14);
  EXPECT_NEAR(t.gradient_s, 4 * streams / W, 1e-15);
}

// Note [per-implementation links]: all-gathers go on all_gather_link, all-reduce and
// reduce-scatter on reduce_link; an unset one is the host's intra_node (α 1e-5, β 1e8). Widths
// 8 → 6 → 4 (n_0 = 54, n_1 = 28, N = 82), k = 4: every collective by hand.
TEST(MlpStep, EachCollectiveOnItsImplementationsLink) {
  const ClusterSpec host = ideal_host(1e9, 1e-5, 1e8, 2e9);
  const LinkSpec ring{.bandwidth_bps = 4e8, .latency_s = 3e-5};
  const LinkSpec gloo{.bandwidth_bps = 2e8, .latency_s = 7e-6};
  const auto comm = [&](int stage, std::optional<LinkSpec> reduce,
                        std::optional<LinkSpec> gather) {
    MlpStepSetup s{.widths = {8, 6, 4}, .rows = 3, .ranks = 4, .zero_stage = stage, .cores = 4,
                   .reduce_link = reduce, .all_gather_link = gather};
    return predict_mlp_step(s, host).comm_s;
  };
  // Reduce-scatter and all-gather of S bytes at k = 4: 3 steps and 3S/4 bytes per rank each;
  // all-reduce twice both.
  const auto half = [](const LinkSpec& l, double S) {
    return 3 * l.latency_s + 0.75 * S / l.bandwidth_bps;
  };
  const LinkSpec intra = host.intra_node;
  const double S = 4 * 82.0, u0 = 4 * 54.0, u1 = 4 * 28.0;
  EXPECT_NEAR(comm(0, ring, gloo), 2 * half(ring, S), 1e-15);
  EXPECT_NEAR(comm(1, ring, gloo), half(ring, S) + half(gloo, S), 1e-15);
  EXPECT_NEAR(comm(2, ring, std::nullopt), half(ring, S) + half(intra, S), 1e-15);
  EXPECT_NEAR(comm(2, std::nullopt, gloo), half(intra, S) + half(gloo, S), 1e-15);
  // ZeRO-3: per unit two all-gathers (forward, backward) and a reduce-scatter.
  EXPECT_NEAR(comm(3, ring, gloo),
              2 * half(gloo, u0) + half(ring, u0) + 2 * half(gloo, u1) + half(ring, u1), 1e-15);
  EXPECT_NEAR(comm(3, std::nullopt, std::nullopt),
              3 * half(intra, u0) + 3 * half(intra, u1), 1e-15);
  // A link out of range is refused, naming it.
  try {
    comm(1, LinkSpec{.bandwidth_bps = 0, .latency_s = 0}, gloo);
    ADD_FAILURE() << "no throw";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("reduce_link.bandwidth_bps"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(comm(1, ring, LinkSpec{.bandwidth_bps = 1e8, .latency_s = 2}), InvalidInput);

  // Note [sharded collectives]: the reduce-scatter on its own link where one is given; the
  // all-reduce (DP) stays on reduce_link.
  const LinkSpec rs{.bandwidth_bps = 3e8, .latency_s = 5e-5};
  const auto with_rs = [&](int stage) {
    MlpStepSetup s{.widths = {8, 6, 4}, .rows = 3, .ranks = 4, .zero_stage = stage, .cores = 4,
                   .reduce_link = ring, .reduce_scatter_link = rs, .all_gather_link = gloo};
    return predict_mlp_step(s, host);
  };
  EXPECT_NEAR(with_rs(0).comm_s, 2 * half(ring, S), 1e-15);
  EXPECT_NEAR(with_rs(1).comm_s, half(rs, S) + half(gloo, S), 1e-15);
  EXPECT_NEAR(with_rs(3).comm_s,
              2 * half(gloo, u0) + half(rs, u0) + 2 * half(gloo, u1) + half(rs, u1), 1e-15);
  EXPECT_EQ(with_rs(1).reduce_scatter_link.latency_s, rs.latency_s);
  EXPECT_EQ(predict_mlp_step({.widths = {8, 6, 4}, .rows = 3, .ranks = 4, .zero_stage = 1,
                              .cores = 4, .reduce_link = ring},
                             host)
                .reduce_scatter_link.bandwidth_bps,
            ring.bandwidth_bps);  // unset: the reduce link's
  try {
    MlpStepSetup bad{.widths = {8, 6, 4}, .rows = 3, .ranks = 4, .zero_stage = 1, .cores = 4,
                     .reduce_scatter_link = LinkSpec{.bandwidth_bps = 1e3, .latency_s = 0}};
    predict_mlp_step(bad, host);
    ADD_FAILURE() << "no throw";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("reduce_scatter_link.bandwidth_bps"), std::string::npos)
        << e.what();
  }
}

// overlap_gradients (bench ddp: buckets reduced from the autograd hooks): the last bucket exposed
// whole, the rest beside the backward's kernels — Note [planner overlap]'s rule, counted here by
// hand on widths 8 → 6 → 4, B = 3, k = 2 (ideal host: each kernel max(FLOPs/peak, bytes/W)).
TEST(MlpStep, DdpBucketsOverlapTheBackward) {
  const double peak = 1e9, W = 2e9, alpha = 1e-5, beta = 1e8;
  const ClusterSpec host = ideal_host(peak, alpha, beta, W);
  const double B = 3, S = 4 * 82.0;
  MlpStepSetup s{.widths = {8, 6, 4}, .rows = 3, .ranks = 2, .zero_stage = 0,
                 .optimizer = Optimizer::sgd, .bucket_bytes = {100, S - 100}, .cores = 2};
  const MlpStepTime plain = predict_mlp_step(s, host);
  EXPECT_FALSE(plain.overlapped);
  EXPECT_EQ(plain.comm_exposed_s, plain.comm_s);
  s.overlap_gradients = true;
  const MlpStepTime t = predict_mlp_step(s, host);
  EXPECT_TRUE(t.overlapped);
  // The backward: wgrad 6 × 8 and 4 × 6 (k B), dgrad B × 6 (k 4); relu backward 3·B·6 streams,
  // cross-entropy backward 2·B·4, bias gradients (B·6 + 6) + (B·4 + 4).
  struct G { double m, n, kk; };
  double window = 0;
  for (const G& g : {G{6, 8, B}, G{4, 6, B}, G{B, 6, 4}})
    window += std::max(2 * g.m * g.n * g.kk / peak, 4 * (g.m * g.kk + g.kk * g.n + g.m * g.n) / W);
  window += 4 * (3 * B * 6 + 2 * B * 4 + (B * 6 + 6) + (B * 4 + 4)) / W;
  // All-reduce at k = 2: 2 steps of α and b bytes per rank.
  const double first = 2 * alpha + 100 / beta, last = 2 * alpha + (S - 100) / beta;
  EXPECT_NEAR(t.comm_s, first + last, 1e-15);
  const double sigma = kOverlapSlowdown;
  EXPECT_NEAR(t.comm_exposed_s, last + std::max(first - window, first * sigma / (1 + sigma)),
              1e-15);
  EXPECT_LT(t.comm_exposed_s, t.comm_s);
  EXPECT_NEAR(t.total_s, t.compute_s + t.gradient_s + t.optimizer_s + t.comm_exposed_s, 1e-15);
  EXPECT_EQ(t.overlap_slowdown, kOverlapSlowdown);
  // A host's own σ (Note [host overlap]): σ = 3 hides a quarter of the first bucket at most.
  s.overlap_slowdown = 3.0;
  const MlpStepTime h = predict_mlp_step(s, host);
  EXPECT_EQ(h.overlap_slowdown, 3.0);
  EXPECT_NEAR(h.comm_exposed_s, last + std::max(first - window, first * 0.75), 1e-15);
  s.overlap_slowdown = -0.1;
  EXPECT_THROW(predict_mlp_step(s, host), InvalidInput);
  s.overlap_slowdown.reset();
  // One bucket: it is the last, so nothing hides; the ZeRO stages' collectives never overlap.
  s.bucket_bytes.clear();
  EXPECT_EQ(predict_mlp_step(s, host).comm_exposed_s, predict_mlp_step(s, host).comm_s);
  s.bucket_bytes = {100, S - 100};
  s.optimizer = Optimizer::adam;
  s.zero_stage = 1;
  const MlpStepTime z = predict_mlp_step(s, host);
  EXPECT_EQ(z.comm_exposed_s, z.comm_s);
  EXPECT_FALSE(z.overlapped);
}

TEST(MlpStep, RefusesWhatTheEngineCannotRun) {
  const ClusterSpec host = ideal_host(1e9, 0, 1e8, 1e9);
  EXPECT_THROW(predict_mlp_step({.widths = {8}}, host), InvalidInput);
  EXPECT_THROW(predict_mlp_step({.widths = {8, 4}, .zero_stage = 2, .optimizer = Optimizer::sgd},
                                host),
               InvalidInput);
  EXPECT_THROW(predict_mlp_step({.widths = {8, 4}, .rows = 0}, host), InvalidInput);
}

}  // namespace
}  // namespace tally::test_mlp_step
