// The communication ledger against the seed's worked figures (seed §A2 DP/ZeRO, §A4 TP) and
// DESIGN.md errata 2 and 4, plus property sweeps.
#include "tally/core/comm.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include "tally/core/presets.hpp"

namespace tally::test_comm {
namespace {

double gb(double bytes) { return bytes / kGB; }

constexpr LinkSpec kIB{.bandwidth_bps = 50e9, .latency_s = 0};      // seed: IB 50 GB/s
constexpr LinkSpec kNVLink{.bandwidth_bps = 300e9, .latency_s = 0}; // seed: NVLink 300 GB/s

// seed §A2 (3): S = 2N = 14 GB bf16 gradients, k = 8: V = 2·(7/8)·14 = 24.5 GB per rank,
// 24.5/50 ≈ 0.49 s on IB, 24.5/300 ≈ 0.08 s on NVLink.
TEST(Comm, SeedA2_AllReduce14GBOver8Ranks) {
  const auto ib = collective_cost(Collective::all_reduce, 14e9, 8, kIB);
  EXPECT_DOUBLE_EQ(gb(ib.bytes_per_rank), 24.5);
  EXPECT_EQ(ib.steps, 14);
  EXPECT_NEAR(ib.seconds, 0.49, 0.005);
  EXPECT_NEAR(collective_cost(Collective::all_reduce, 14e9, 8, kNVLink).seconds, 0.08, 0.005);
  EXPECT_NE(ib.convention().find("2S(k-1)/k"), std::string::npos) << ib.convention();
  EXPECT_NE(ib.convention().find("k=8"), std::string::npos) << ib.convention();
}

// seed §A2 (4): reduce-scatter alone (7/8)·14 = 12.25 GB per rank, ≈0.25 s on IB.
TEST(Comm, SeedA2_ReduceScatterAlone12Point25GB) {
  const auto rs = collective_cost(Collective::reduce_scatter, 14e9, 8, kIB);
  EXPECT_DOUBLE_EQ(gb(rs.bytes_per_rank), 12.25);
  EXPECT_EQ(rs.steps, 7);
  EXPECT_NEAR(rs.seconds, 0.245, 1e-12);  // the seed rounds to ≈0.25 s
  EXPECT_DOUBLE_EQ(collective_cost(Collective::all_gather, 14e9, 8, kIB).bytes_per_rank, 12.25e9);
}

TEST(Comm, BroadcastAndP2pMoveSOnce) {
  const LinkSpec l{.bandwidth_bps = 1e9, .latency_s = 1e-5};
  const auto b = collective_cost(Collective::broadcast, 1e9, 4, l);
  EXPECT_DOUBLE_EQ(b.bytes_per_rank, 1e9);
  EXPECT_EQ(b.steps, 3);
  EXPECT_DOUBLE_EQ(b.seconds, 3e-5 + 1.0);
  const auto p = collective_cost(Collective::send_recv, 1e9, 2, l);
  EXPECT_DOUBLE_EQ(p.bytes_per_rank, 1e9);
  EXPECT_EQ(p.steps, 1);
  EXPECT_DOUBLE_EQ(p.seconds, 1e-5 + 1.0);
}

// nccl-tests doc/PERFORMANCE.md: busbw = algbw·2(n−1)/n (all-reduce), (n−1)/n (RS, AG), 1 (bcast).
TEST(Comm, BusBandwidthFactorsAsNcclTests) {
  EXPECT_DOUBLE_EQ(bus_bandwidth(Collective::all_reduce, 100e9, 8), 175e9);
  EXPECT_DOUBLE_EQ(bus_bandwidth(Collective::reduce_scatter, 100e9, 8), 87.5e9);
  EXPECT_DOUBLE_EQ(bus_bandwidth(Collective::all_gather, 100e9, 4), 75e9);
  EXPECT_DOUBLE_EQ(bus_bandwidth(Collective::broadcast, 100e9, 8), 100e9);
  EXPECT_DOUBLE_EQ(bus_bandwidth(Collective::send_recv, 100e9, 2), 100e9);
  // With zero latency the bus bandwidth of every ring collective equals the link bandwidth.
  for (Collective c : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather})
    for (int k : {2, 3, 8, 64}) {
      const auto r = collective_cost(c, 1e9, k, kIB);
      EXPECT_NEAR(r.busbw_bps(), kIB.bandwidth_bps, 1e-3) << to_string(c) << " k=" << k;
    }
}

TEST(Comm, CollectiveNamesRoundTrip) {
  for (const auto& name : allowed_collectives()) {
    const auto c = parse_collective(name);
    ASSERT_TRUE(c.has_value()) << name;
    EXPECT_EQ(to_string(*c), name);
  }
  EXPECT_EQ(to_string(Collective::send_recv), "p2p");
  EXPECT_EQ(parse_collective("all-reduce"), Collective::all_reduce);
  EXPECT_FALSE(parse_collective("allreduce2").has_value());
}

// Property: per-rank ring all-reduce bytes rise towards 2S as k grows, never reaching it; k = 1
// moves nothing; time is monotone in bytes.
TEST(Comm, PropertyAllReduceBytesRiseTowardsTwoS) {
  const double S = 1e9;
  double prev = 0;
  for (int k = 1; k <= 4096; k = k < 16 ? k + 1 : k * 2) {
    const auto r = collective_cost(Collective::all_reduce, S, k, kIB);
    if (k == 1) {
      EXPECT_EQ(r.bytes_per_rank, 0.0);
      EXPECT_EQ(r.seconds, 0.0);
      EXPECT_EQ(r.steps, 0);
    } else {
      EXPECT_GT(r.bytes_per_rank, prev);
    }
    EXPECT_LT(r.bytes_per_rank, 2 * S);
    prev = r.bytes_per_rank;
  }
  EXPECT_GT(prev, 0.999 * 2 * S);
  for (Collective c : {Collective::all_reduce, Collective::reduce_scatter, Collective::all_gather,
                       Collective::broadcast, Collective::send_recv}) {
    EXPECT_EQ(collective_cost(c, 1e9, 1, kIB).bytes_per_rank, 0.0) << to_string(c);
    double t_prev = -1;
    for (double S2 : {0.0, 1.0, 1e3, 1e6, 1e9, 1e12}) {
      const double t = collective_cost(c, S2, 8, {.bandwidth_bps = 1e9, .latency_s = 5e-6}).seconds;
      EXPECT_GT(t, t_prev);
      t_prev = t;
    }
  }
}

TEST(Comm, LinkForGroupStaysOnNvlinkInsideANode) {
  ClusterSpec c;
  c.gpus_per_node = 8;
  c.intra_node = kNVLink;
  c.inter_node = kIB;
  EXPECT_EQ(link_for_group(c, 8, 1).bandwidth_bps, kNVLink.bandwidth_bps);
  EXPECT_EQ(link_for_group(c, 4, 2).bandwidth_bps, kNVLink.bandwidth_bps);
  EXPECT_EQ(link_for_group(c, 2, 8).bandwidth_bps, kIB.bandwidth_bps);
  EXPECT_EQ(link_for_group(c, 16, 1).bandwidth_bps, kIB.bandwidth_bps);
  EXPECT_EQ(link_for_group(c, 1, 64).bandwidth_bps, kNVLink.bandwidth_bps);  // no link used
  EXPECT_THROW(link_for_group(c, 0, 1), InvalidInput);
}

TEST(Comm, RejectsBadCollectiveInput) {
  EXPECT_THROW(collective_cost(Collective::all_reduce, 1e9, 0, kIB), InvalidInput);
  EXPECT_THROW(collective_cost(Collective::all_reduce, -1, 8, kIB), InvalidInput);
  EXPECT_THROW(collective_cost(Collective::all_reduce, 1e9, 8, {.bandwidth_bps = 0}), InvalidInput);
  try {
    collective_cost(Collective::all_reduce, 1e9, 0, kIB);
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("ranks = 0"), std::string::npos) << e.what();
  }
}

// ---- Per-step traffic ------------------------------------------------------------------------

StepTrafficSetup seed_7b(int dp, int zero) {
  return StepTrafficSetup{.params = 7e9, .param_bytes = 2, .grad_bytes = 2, .dp = dp,
                          .zero_stage = zero};
}

// seed §A2 and DESIGN.md erratum 4 (ZeRO paper §7): N = 7e9 bf16, dp = 8. DP all-reduce 24.5 GB;
// ZeRO-1 and ZeRO-2 reduce-scatter 12.25 + all-gather 12.25 = 24.5 GB (not half); ZeRO-3 1.5×.
// The seed's "halves" figure survives only as the reduce-scatter alone, 12.25 GB.
TEST(StepTraffic, Erratum4_ZeroOneAndTwoMoveAsMuchAsDp) {
  const auto dp = step_traffic(seed_7b(8, 0));
  EXPECT_DOUBLE_EQ(gb(dp.dp_total_bytes()), 24.5);
  EXPECT_EQ(dp.dp_grad.collective, Collective::all_reduce);
  EXPECT_EQ(dp.dp_grad.calls, 1);
  EXPECT_EQ(dp.zero_param_gather.bytes_per_rank, 0.0);
  for (int z : {1, 2}) {
    const auto r = step_traffic(seed_7b(8, z));
    EXPECT_DOUBLE_EQ(gb(r.dp_grad.bytes_per_rank), 12.25) << "ZeRO-" << z;
    EXPECT_DOUBLE_EQ(gb(r.zero_param_gather.bytes_per_rank), 12.25) << "ZeRO-" << z;
    EXPECT_DOUBLE_EQ(r.dp_total_bytes(), dp.dp_total_bytes()) << "ZeRO-" << z;
    EXPECT_DOUBLE_EQ(gb(r.reduce_scatter_only_bytes), 12.25);
    EXPECT_DOUBLE_EQ(r.reduce_scatter_only_bytes, 0.5 * dp.dp_total_bytes());  // the seed's claim
  }
  const auto z3 = step_traffic(seed_7b(8, 3));
  EXPECT_DOUBLE_EQ(z3.dp_total_bytes(), 1.5 * dp.dp_total_bytes());
  EXPECT_DOUBLE_EQ(gb(z3.dp_total_bytes()), 36.75);
  EXPECT_EQ(z3.zero_param_gather.calls, 2);
}

// Gradient accumulation without PP: ZeRO-0/1 sync once per step; ZeRO-2/3 shard gradients, so
// their reduce-scatter (and ZeRO-3's gathers) recur every micro-batch.
TEST(StepTraffic, AccumulationOnlyMultipliesShardedStages) {
  for (int z = 0; z <= 3; ++z) {
    auto one = seed_7b(8, z);
    auto four = one;
    four.micro_batches = 4;
    const double a = step_traffic(one).dp_total_bytes(), b = step_traffic(four).dp_total_bytes();
    if (z <= 1) {
      EXPECT_DOUBLE_EQ(b, a) << z;
    } else if (z == 2) {
      EXPECT_DOUBLE_EQ(b, 4 * 12.25e9 + 12.25e9);
    } else {
      EXPECT_DOUBLE_EQ(b, 4 * a);
    }
  }
}

StepTrafficSetup seed_tp(Recompute r, bool sp = false) {
  // seed §A4 TP: B = 4, T = 2048, h = 4096, bf16 activations, t = 8, 32 layers.
  return StepTrafficSetup{.params = 7e9, .hidden = 4096, .layers = 32, .seq_len = 2048,
                          .micro_batch = 4, .tp = 8, .sequence_parallel = sp, .recompute = r};
}

// seed §A4 (3): S = 4·2048·4096·2 = 67,108,864 B ≈ 67 MB; V = 2·(7/8)·S ≈ 117 MB per all-reduce.
// DESIGN.md erratum 2: 2 forward + 2 backward all-reduces ≈ 468 MB per layer, ≈ 15 GB over 32
// layers; the seed's ≈ 700 MB / ≈ 22 GB holds only when full recompute replays the forward two.
TEST(StepTraffic, Erratum2_TpPerLayerAndPerStep) {
  const auto none = step_traffic(seed_tp(Recompute::none));
  EXPECT_DOUBLE_EQ(none.tp.bytes_per_call, 2 * 7.0 / 8 * 67108864.0);
  EXPECT_NEAR(none.tp.bytes_per_call / kMB, 117.4, 0.1);
  EXPECT_EQ(none.tp.calls, 4 * 32);
  EXPECT_NEAR(4 * none.tp.bytes_per_call / kMB, 469.8, 0.1);  // ≈468 MB per layer
  EXPECT_NEAR(gb(none.tp.bytes_per_rank), 15.0, 0.1);
  const auto full = step_traffic(seed_tp(Recompute::full));
  EXPECT_EQ(full.tp.calls, 6 * 32);
  EXPECT_NEAR(6 * full.tp.bytes_per_call / kMB, 704.6, 0.1);  // the seed's ≈700 MB per layer
  EXPECT_NEAR(gb(full.tp.bytes_per_rank), 22.5, 0.1);          // the seed's ≈22 GB
  // Selective recompute replays no TP collective.
  EXPECT_DOUBLE_EQ(step_traffic(seed_tp(Recompute::selective)).tp.bytes_per_rank,
                   none.tp.bytes_per_rank);
}

// Korthikanti et al. 2022 §4.2.2: sequence parallel swaps each all-reduce for all-gather +
// reduce-scatter — same bytes, twice the calls.
TEST(StepTraffic, SequenceParallelSameBytesTwiceTheCalls) {
  const auto ar = step_traffic(seed_tp(Recompute::none));
  const auto sp = step_traffic(seed_tp(Recompute::none, true));
  EXPECT_DOUBLE_EQ(sp.tp.bytes_per_rank, ar.tp.bytes_per_rank);
  EXPECT_EQ(sp.tp.calls, 2 * ar.tp.calls);
  EXPECT_EQ(sp.tp.collective, Collective::all_gather);
  EXPECT_EQ(sp.tp.paired_with, Collective::reduce_scatter);
}

// Megatron-LM's SP column-parallel linear keeps the input's shard and all-gathers it again in
// backward for the weight gradient (Note [SP re-gather] in comm.cpp): one all-gather of S =
// b·s·h·e = 67,108,864 B per column-parallel linear (QKV, MLP fc1), two per layer per micro-batch,
// whatever the recompute; S(t−1)/t = 58,720,256 B each. Seed 7B, t = 8, 32 layers, m = 1.
TEST(StepTraffic, SequenceParallelReGathersEachColumnInputInBackward) {
  for (Recompute rc : {Recompute::none, Recompute::full, Recompute::op_sac}) {
    const auto sp = step_traffic(seed_tp(rc, true));
    EXPECT_EQ(sp.tp_regather.collective, Collective::all_gather);
    EXPECT_EQ(sp.tp_regather.calls, 2 * 32);
    EXPECT_DOUBLE_EQ(sp.tp_regather.bytes_per_call, 58720256.0);
    EXPECT_DOUBLE_EQ(sp.tp_regather.bytes_per_rank, 64 * 58720256.0);
    EXPECT_EQ(sp.tp_regather.group, 8);
    EXPECT_DOUBLE_EQ(sp.total_bytes() - sp.tp.bytes_per_rank - sp.dp_total_bytes(),
                     sp.tp_regather.bytes_per_rank);
    // Without SP every rank keeps the whole input: nothing to re-gather.
    EXPECT_EQ(step_traffic(seed_tp(rc)).tp_regather.calls, 0);
  }
  auto mb = seed_tp(Recompute::none, true);  // 4 micro-batches on a stage of 8 layers
  mb.pp = 4;
  mb.micro_batches = 4;
  EXPECT_EQ(step_traffic(mb).tp_regather.calls, 2 * 8 * 4);
}

TEST(StepTraffic, PipelineSendsActivationAndGradientPerMicroBatch) {
  auto s = seed_tp(Recompute::none);
  s.tp = 1;
  s.pp = 4;
  s.micro_batches = 8;
  const auto r = step_traffic(s);
  EXPECT_DOUBLE_EQ(r.pp.bytes_per_call, 67108864.0);
  EXPECT_EQ(r.pp.calls, 16);
  EXPECT_DOUBLE_EQ(r.pp.bytes_per_rank, 2 * 67108864.0 * 8);
  s.tp = 8;
  s.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(step_traffic(s).pp.bytes_per_call, 67108864.0 / 8);
  // TP calls count only the layers of one stage: 32/4 = 8 layers × 4 × m = 8.
  EXPECT_EQ(step_traffic(s).tp.calls, 2 * 4 * 8 * 8);
}

// Interleaved 1F1B (Narayanan 2021 §2.2.2: "the amount of communication also increases by v"):
// with v = 3 chunks per stage a middle stage sends each micro-batch's activation forward and its
// gradient backward once per chunk, 2·v·m sends of the same size (measured by tally run 3d / pp:
// an interleaved stage's sends counted per call, engine/experiments/three_d.cpp).
TEST(StepTraffic, InterleavedPipelineSendsVTimesAsOften) {
  auto s = seed_tp(Recompute::none);
  s.tp = 1;
  s.pp = 4;
  s.micro_batches = 8;
  s.interleave = 3;
  const auto r = step_traffic(s);
  EXPECT_DOUBLE_EQ(r.pp.bytes_per_call, 67108864.0);
  EXPECT_EQ(r.pp.calls, 2 * 3 * 8);
  EXPECT_DOUBLE_EQ(r.pp.bytes_per_rank, 2 * 3 * 8 * 67108864.0);
  s.pp = 1;
  EXPECT_THROW(step_traffic(s), InvalidInput);  // chunks need stages
  s.pp = 4;
  s.interleave = 0;
  EXPECT_THROW(step_traffic(s), InvalidInput);
}

// Note [PP scatter/gather]: Megatron-LM's p2p_communication.py (de7dc40f88) splits each PP tensor
// into t equal 1-D chunks, sends one per TP rank and all-gathers them on the receiving stage
// (Narayanan 2021 §4.1). S = 4 · 2048 · 4096 · 2 B = 67,108,864 (the test above); t = 8: each rank
// sends S/8 = 8,388,608 B per call and its ring all-gather sends 7S/8 = 58,720,256 B.
TEST(StepTraffic, PipelineScatterGatherSendsOneTpShareAndGathersTheRest) {
  auto s = seed_tp(Recompute::none);
  s.pp = 4;
  s.micro_batches = 8;
  s.pp_scatter_gather = true;
  auto r = step_traffic(s);
  EXPECT_DOUBLE_EQ(r.pp.bytes_per_call, 8388608.0);
  EXPECT_EQ(r.pp.calls, 16);
  EXPECT_EQ(r.pp_gather.collective, Collective::all_gather);
  EXPECT_EQ(r.pp_gather.group, 8);
  EXPECT_EQ(r.pp_gather.stride, 1);
  EXPECT_EQ(r.pp_gather.calls, 16);
  EXPECT_DOUBLE_EQ(r.pp_gather.bytes_per_call, 58720256.0);
  EXPECT_DOUBLE_EQ(r.pp_gather.bytes_per_rank, 16 * 58720256.0);
  EXPECT_NE(r.convention().find("scatter/gather"), std::string::npos);
  // The total counts the gather: a rank sends S/8 + 7S/8 = S per transfer, as many bytes as
  // without the optimisation, but only S/8 of them leave the node.
  s.pp_scatter_gather = false;
  const auto whole = step_traffic(s);
  EXPECT_DOUBLE_EQ(whole.pp.bytes_per_call, 67108864.0);
  EXPECT_EQ(whole.pp_gather.calls, 0);
  EXPECT_DOUBLE_EQ(r.total_bytes(), whole.total_bytes());
  EXPECT_EQ(whole.convention().find("scatter/gather"), std::string::npos);
  // Interleaved: both v times as often.
  s.pp_scatter_gather = true;
  s.interleave = 3;
  r = step_traffic(s);
  EXPECT_EQ(r.pp.calls, 48);
  EXPECT_EQ(r.pp_gather.calls, 48);
  s.interleave = 1;
  // Megatron-LM 2022 (cfd2e21607) skips it under SP (already 1/t) and when t does not divide the
  // elements (1 · 2047 · 4100 = 8,392,700 = 4 mod 8); with t = 1 there is nothing to split.
  s.sequence_parallel = true;
  r = step_traffic(s);
  EXPECT_DOUBLE_EQ(r.pp.bytes_per_call, 67108864.0 / 8);
  EXPECT_EQ(r.pp_gather.calls, 0);
  s.sequence_parallel = false;
  s.micro_batch = 1;
  s.seq_len = 2047;
  s.hidden = 4100;
  r = step_traffic(s);
  EXPECT_DOUBLE_EQ(r.pp.bytes_per_call, 2047.0 * 4100 * 2);
  EXPECT_EQ(r.pp_gather.calls, 0);
  s = seed_tp(Recompute::none);
  s.pp = 4;
  s.tp = 1;
  s.pp_scatter_gather = true;
  r = step_traffic(s);
  EXPECT_DOUBLE_EQ(r.pp.bytes_per_call, 67108864.0);
  EXPECT_EQ(r.pp_gather.calls, 0);
}

// Note [tied embedding under PP]: GPT-3's word embedding (V 51200, h 12288) split over t = 8 holds
// 78,643,200 elements per rank; in bf16 S = 157,286,400 B, and an all-reduce of the two end stages
// sends 2S(2−1)/2 = S per rank, once per step. Ranks are ordered tp-cp-dp-pp, so the first and the
// last of p = 4 stages sit (p − 1)·t·d = 3 · 8 · 2 = 48 ranks apart.
TEST(StepTraffic, TiedEmbeddingGradientAllReducedBetweenTheEndStages) {
  StepTrafficSetup s{.params = 175e9, .hidden = 12288, .layers = 96, .seq_len = 2048,
                     .micro_batch = 1, .micro_batches = 8, .dp = 2, .tp = 8, .pp = 4,
                     .tied_embedding_elements = 51200.0 * 12288 / 8};
  auto r = step_traffic(s);
  EXPECT_EQ(r.pp_embedding.collective, Collective::all_reduce);
  EXPECT_EQ(r.pp_embedding.calls, 1);
  EXPECT_EQ(r.pp_embedding.group, 2);
  EXPECT_EQ(r.pp_embedding.stride, 48);
  EXPECT_DOUBLE_EQ(r.pp_embedding.bytes_per_call, 157286400.0);
  EXPECT_DOUBLE_EQ(r.pp_embedding.bytes_per_rank, 157286400.0);
  const double with = r.total_bytes();
  s.tied_embedding_elements = 0;  // untied (Llama): nothing to exchange
  EXPECT_EQ(step_traffic(s).pp_embedding.calls, 0);
  EXPECT_DOUBLE_EQ(with - step_traffic(s).total_bytes(), 157286400.0);
  s.tied_embedding_elements = 51200.0 * 12288 / 8;
  s.pp = 1;  // one stage holds the only copy
  EXPECT_EQ(step_traffic(s).pp_embedding.calls, 0);
  s.tied_embedding_elements = -1;
  EXPECT_THROW(step_traffic(s), InvalidInput);
  // What the planner and `tally comm` pass: GPT-3's 50257 × 12288 split over 8; Llama's untied.
  EXPECT_DOUBLE_EQ(megatron_tied_embedding_elements(*model_preset("gpt3-175b"), 8),
                   50257.0 * 12288 / 8);
  EXPECT_EQ(megatron_tied_embedding_elements(*model_preset("llama-2-7b"), 8), 0);
  EXPECT_THROW(megatron_tied_embedding_elements(*model_preset("gpt3-175b"), 0), InvalidInput);
}

// Ring attention: per layer per micro-batch (c−1) K,V sends forward, 2(c−1) backward.
TEST(StepTraffic, ContextParallelRingOfKV) {
  auto s = seed_tp(Recompute::none);
  s.tp = 1;
  s.cp = 4;
  s.kv_hidden = 1024;  // 8 kv heads × 128
  const auto r = step_traffic(s);
  const double block = 2.0 * 4 * (2048 / 4) * 1024 * 2;  // K and V of one s/c block
  EXPECT_DOUBLE_EQ(r.cp.bytes_per_call, block);
  EXPECT_EQ(r.cp.calls, 3 * 3 * 32);
  EXPECT_DOUBLE_EQ(r.cp.bytes_per_rank, 3 * 3 * 32 * block);
  EXPECT_EQ(r.dp_grad.group, 4);  // gradients reduce over dp × cp
  s.kv_hidden = 0;
  EXPECT_THROW(step_traffic(s), InvalidInput);
}

TEST(StepTraffic, SingleRankMovesNothing) {
  const auto r = step_traffic(StepTrafficSetup{.params = 7e9});
  EXPECT_EQ(r.total_bytes(), 0.0);
  EXPECT_EQ(r.items().size(), 12u);
  for (const auto& it : r.items()) EXPECT_EQ(it.calls, 0.0) << to_string(it.kind);
}

TEST(StepTraffic, ConventionAndTimes) {
  const auto r = step_traffic(seed_7b(8, 2));
  EXPECT_NE(r.convention().find("ZeRO-2"), std::string::npos) << r.convention();
  EXPECT_NE(r.convention().find("k=dp*cp=8"), std::string::npos) << r.convention();
  EXPECT_NEAR(traffic_seconds(r.dp_grad, kIB), 0.245, 1e-9);
  const auto tp = step_traffic(seed_tp(Recompute::none));
  const LinkSpec nv{.bandwidth_bps = 300e9, .latency_s = 5e-6};
  EXPECT_DOUBLE_EQ(traffic_seconds(tp.tp, nv),
                   128 * 14 * 5e-6 + tp.tp.bytes_per_rank / 300e9);
}

TEST(StepTraffic, RejectsBadInput) {
  auto s = seed_7b(0, 0);
  EXPECT_THROW(step_traffic(s), InvalidInput);
  s = seed_7b(8, 4);
  try {
    step_traffic(s);
    ADD_FAILURE();
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("zero = 4"), std::string::npos) << e.what();
  }
  s = seed_tp(Recompute::none);
  s.hidden = 0;
  EXPECT_THROW(step_traffic(s), InvalidInput);
  EXPECT_THROW(step_traffic(StepTrafficSetup{}), InvalidInput);
}

// traffic_seconds with per-kind host links (CollectiveLinks; Note [sharded collectives] in
// engine/bench/allreduce.cpp), counted by hand on a 4-rank group: an all-gather or reduce-scatter
// is 3 steps (k − 1) and a paired item (SP) splits its calls evenly between its two kinds; a kind
// without a link, and an all-reduce always, is priced as traffic_seconds on the cluster.
TEST(StepTraffic, HostLinksPriceEachKindOnItsOwnFit) {
  ClusterSpec host;
  host.intra_node = {.bandwidth_bps = 1e9, .latency_s = 1e-5};
  host.gpus_per_node = 4;
  const LinkSpec rs{.bandwidth_bps = 2e8, .latency_s = 2e-3}, ag{.bandwidth_bps = 4e8,
                                                                 .latency_s = 7e-4};
  const double B = 3e5;  // bytes a rank sends per call
  TrafficItem sp{.kind = TrafficKind::tp, .collective = Collective::all_gather,
                 .paired_with = Collective::reduce_scatter, .group = 4, .calls = 6,
                 .bytes_per_call = B, .bytes_per_rank = 6 * B};
  const auto on = [B](const LinkSpec& l) { return 3 * l.latency_s + B / l.bandwidth_bps; };
  EXPECT_NEAR(traffic_seconds(sp, host, {.reduce_scatter = rs, .all_gather = ag}),
              3 * on(rs) + 3 * on(ag), 1e-15);
  // Without links: the cluster's own price, whatever the pairing.
  EXPECT_DOUBLE_EQ(traffic_seconds(sp, host, {}), traffic_seconds(sp, host));
  EXPECT_NEAR(traffic_seconds(sp, host, {}), 6 * on(host.intra_node), 1e-15);
  // One kind linked: the other half of the calls stays on the cluster.
  EXPECT_NEAR(traffic_seconds(sp, host, {.all_gather = ag}), 3 * on(host.intra_node) + 3 * on(ag),
              1e-15);
  TrafficItem gather = sp;
  gather.paired_with.reset();
  EXPECT_NEAR(traffic_seconds(gather, host, {.reduce_scatter = rs, .all_gather = ag}), 6 * on(ag),
              1e-15);
  TrafficItem reduce = gather;
  reduce.collective = Collective::all_reduce;
  EXPECT_DOUBLE_EQ(traffic_seconds(reduce, host, {.reduce_scatter = rs, .all_gather = ag}),
                   traffic_seconds(reduce, host));
  gather.calls = 0;
  EXPECT_EQ(traffic_seconds(gather, host, {.all_gather = ag}), 0);
  gather.calls = 1;
  EXPECT_THROW(traffic_seconds(gather, host, {.all_gather = LinkSpec{.bandwidth_bps = 0}}),
               InvalidInput);
}

}  // namespace
}  // namespace tally::test_comm
