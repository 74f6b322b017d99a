// The NCCL collective model (core/src/comm_nccl.cpp, Note [NCCL collective model]) against
// nccl-tests figures, and the ledger's MoE, ZeRO-under-PP and float8 items by hand. (Split from
// test_comm.cpp at the file-size limit.)
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tally/core/comm.hpp"
#include "tally/core/presets.hpp"

namespace tally::test_comm_collectives {
namespace {

constexpr LinkSpec kIB50{.bandwidth_bps = 50e9, .latency_s = 0};  // seed: IB 50 GB/s

// Note [NCCL collective model] against nccl-tests figures quoted by NCCL's maintainers.
TEST(CommNccl, BusBandwidthOfWholeNodesOneRailAndNvlink) {
  const ClusterSpec c = *cluster_preset("a100-80g");
  const double S = 8e9;  // latency is < 0.5 % of the time
  auto busbw = [&](int group, int stride) {
    const double bytes = collective_bytes_per_rank(Collective::all_reduce, S, group);
    return bytes / collective_seconds(Collective::all_reduce, bytes, group, stride, c);
  };
  // DGX A100, 8 × HDR per node: "we measure 192GB/s AllReduce BusBW" (NVIDIA/nccl#812).
  EXPECT_NEAR(busbw(32, 1) / 1e9, 192, 1);
  // One member per node (DP over TP 8) rides its own 200 Gb/s NIC: "24GB/s is the peak
  // performance per 200G NIC" (NVIDIA/nccl-tests#119).
  EXPECT_NEAR(busbw(16, 8) / 1e9, 24, 0.1);
  // Inside one node: "~230GB/s" on A100 NVLink (NVIDIA/nccl-tests#149).
  EXPECT_NEAR(busbw(8, 1) / 1e9, 230, 0.5);
  // Two members per node (stride 4) own two rails: 48 GB/s.
  EXPECT_NEAR(busbw(16, 4) / 1e9, 48, 0.1);
}

// The flat ring of the seed costs a node-spanning group at one NIC; NCCL's rings use all eight.
TEST(CommNccl, FlatRingIsTheSeedsModel) {
  ClusterSpec c = *cluster_preset("a100-80g");
  const double bytes = collective_bytes_per_rank(Collective::all_reduce, 8e9, 32);
  const double nccl = collective_seconds(Collective::all_reduce, bytes, 32, 1, c);
  c.comm_model = CommModel::flat_ring;
  const double flat = collective_seconds(Collective::all_reduce, bytes, 32, 1, c);
  EXPECT_NEAR(flat, 62 * 14e-6 + bytes / 25e9, 1e-12);
  EXPECT_NEAR(flat / nccl, 192.0 / 25, 0.1);
}

// An NVLink domain larger than a host (GB200 NVL72: 72 GPUs, hosts of 4): a 64-rank group stays
// on NVLink, where on 8-GPU hosts (B200) the same group crosses 8 nodes; a 144-rank group spans two
// racks, whose 72 members each drive their own NIC: busbw = min(NVLink, 72 · 1 · NIC) by the note.
TEST(CommNccl, RackScaleNvlinkDomain) {
  const ClusterSpec rack = *cluster_preset("gb200-nvl72"), hgx = *cluster_preset("b200");
  const double S = 8e9;
  auto seconds = [&](const ClusterSpec& c, int group) {
    const double bytes = collective_bytes_per_rank(Collective::all_reduce, S, group);
    return collective_seconds(Collective::all_reduce, bytes, group, 1, c);
  };
  const double nvlink = 900e9 * 370.0 / 450;  // NVLink 5 per direction × Hopper's ring fraction
  // 64 ranks in one rack: 2·63 ring steps at 3.4 µs and 2S·63/64 bytes over NVLink.
  EXPECT_NEAR(seconds(rack, 64), 126 * 3.4e-6 + 2 * S * 63 / 64 / nvlink, 1e-12);
  EXPECT_GT(seconds(hgx, 64), 1.6 * seconds(rack, 64));  // 8 × 50 GB/s NICs per host
  // 144 ranks over two racks: 2 network steps at 14 µs, 284 NVLink steps, and the bytes at
  // min(NVLink, 72 members × 1 NIC × 50 GB/s × 0.94).
  EXPECT_NEAR(seconds(rack, 144),
              2 * 14e-6 + 284 * 3.4e-6 + 2 * S * 143 / 144 / std::min(nvlink, 72 * 50e9 * 0.94),
              1e-12);
  EXPECT_EQ(link_for_group(rack, 72).bandwidth_bps, rack.intra_node.bandwidth_bps);
  EXPECT_EQ(link_for_group(rack, 73).bandwidth_bps, rack.inter_node.bandwidth_bps);
  // A domain must hold whole hosts.
  ClusterSpec bad = rack;
  bad.nvlink_domain = 70;
  EXPECT_THROW(bad.validate(), InvalidInput);
}

// NCCL's ring latency (src/graph/tuning.cc): 2(n−1) network steps of an all-reduce over n nodes at
// the network latency, the rest at NVLink latency.
TEST(CommNccl, LatencySplitsIntraAndInterNodeSteps) {
  const ClusterSpec c = *cluster_preset("h100-80g");
  const double t = collective_seconds(Collective::all_reduce, 0, 32, 1, c);  // 4 nodes of 8
  EXPECT_NEAR(t, 6 * 14e-6 + (62 - 6) * 3.4e-6, 1e-15);
  EXPECT_DOUBLE_EQ(collective_seconds(Collective::all_reduce, 0, 1, 1, c), 0);
}

// All-to-all as a pairwise exchange (Thakur, Rabenseifner & Gropp 2005 §4): each rank keeps 1/k
// of the buffer it scatters and sends the rest, one peer per step; nccl-tests' alltoall busbw
// factor is (n−1)/n.
TEST(Collectives, AllToAllIsAPairwiseExchange) {
  EXPECT_DOUBLE_EQ(collective_bytes_per_rank(Collective::all_to_all, 8e6, 8), 7e6);
  EXPECT_EQ(collective_steps(Collective::all_to_all, 8), 7);
  EXPECT_EQ(collective_steps(Collective::all_to_all, 1), 0);
  EXPECT_DOUBLE_EQ(bus_bandwidth(Collective::all_to_all, 80e9, 8), 70e9);
  EXPECT_EQ(parse_collective("all-to-all"), Collective::all_to_all);
  EXPECT_EQ(parse_collective("alltoall"), Collective::all_to_all);
  const auto c = collective_cost(Collective::all_to_all, 8e6, 8, kIB50);
  EXPECT_DOUBLE_EQ(c.seconds, 7e6 / 50e9);
  EXPECT_NE(c.convention().find("pairwise all-to-all"), std::string::npos) << c.convention();
}

// Mixtral 8x7B (32 MoE layers, top-2, h 4096; routed experts 45,097,156,608 of 46,702,792,704
// params) on dp 8 with EP 4, b 1, s 4096, one micro-batch, bf16, no recompute:
//   all-to-all: 4 per layer × 32 layers = 128 calls of S(ep−1)/ep, S = 4096·2·4096·2 B;
//   dense gradients: all-reduce over 8 of S = 2·1,605,636,096 B;
//   expert gradients: all-reduce over 8/4 = 2 ranks (stride 4) of S = 2·45,097,156,608/4 B.
TEST(StepTraffic, ExpertParallelMixtralByHand) {
  const double n = 46702792704.0, routed = 45097156608.0;
  const StepTrafficSetup s{.params = n, .hidden = 4096, .layers = 32, .seq_len = 4096, .dp = 8,
                           .ep = 4, .expert_share = routed / n, .moe_layers = 32,
                           .experts_per_token = 2};
  const auto r = step_traffic(s);
  const double a2a = 4096.0 * 2 * 4096 * 2;
  EXPECT_EQ(r.ep.collective, Collective::all_to_all);
  EXPECT_EQ(r.ep.group, 4);
  EXPECT_DOUBLE_EQ(r.ep.calls, 128);
  EXPECT_DOUBLE_EQ(r.ep.bytes_per_call, a2a * 3 / 4);
  const double dense = 2 * (n - routed), expert = 2 * routed / 4;
  EXPECT_NEAR(r.dp_grad.bytes_per_rank, 2 * dense * 7 / 8, 1);
  EXPECT_EQ(r.expert_grad.group, 2);
  EXPECT_EQ(r.expert_grad.stride, 4);
  EXPECT_NEAR(r.expert_grad.bytes_per_rank, 2 * expert * 1 / 2, 1);
  EXPECT_NEAR(r.total_bytes(), 128 * a2a * 3 / 4 + 2 * dense * 7 / 8 + expert, 64);
  // Full recompute replays the forward pair; a capacity factor pads every slot; SP with TP 2
  // dispatches each rank's half of the sequence.
  StepTrafficSetup full = s;
  full.recompute = Recompute::full;
  EXPECT_DOUBLE_EQ(step_traffic(full).ep.calls, 192);
  StepTrafficSetup padded = s;
  padded.capacity_factor = 1.25;
  EXPECT_DOUBLE_EQ(step_traffic(padded).ep.bytes_per_call, 1.25 * a2a * 3 / 4);
  StepTrafficSetup sp = s;
  sp.tp = 2;
  sp.sequence_parallel = true;
  EXPECT_DOUBLE_EQ(step_traffic(sp).ep.bytes_per_call, a2a / 2 * 3 / 4);
  EXPECT_EQ(step_traffic(sp).ep.stride, 2);
  // ZeRO-1 shards the experts over their own data-parallel group.
  StepTrafficSetup z1 = s;
  z1.zero_stage = 1;
  const auto rz = step_traffic(z1);
  EXPECT_NEAR(rz.expert_param_gather.bytes_per_rank, expert / 2, 1);
  EXPECT_NEAR(rz.zero_param_gather.bytes_per_rank, dense * 7 / 8, 1);
  // EP comes out of dp × cp, and needs experts.
  StepTrafficSetup bad = s;
  bad.ep = 3;
  EXPECT_THROW(step_traffic(bad), InvalidInput);
  bad = s;
  bad.expert_share = 0;
  EXPECT_THROW(step_traffic(bad), InvalidInput);
}

// Expert TP (Note [expert tensor parallelism]; Megatron-Core's dispatcher: A2A over EP, then AG
// over expert TP; RS over expert TP, then A2A) for Mixtral on tp 2 + SP × dp 8, b 1, s 4096, one
// micro-batch, bf16, no recompute. Each rank routes its sequence half, T_r = 2048 tokens:
//   all-to-all S = 2048 · 2 · 4096 · 2 B = 33,554,432 B per call, S(ep−1)/ep sent, 128 calls;
//   TP: Mixtral has no shared experts, so under SP a MoE layer keeps only the attention pair:
//     4 calls per layer × 32 = 128, S(t−1)/t = 16,777,216 B of S = 4096 · 4096 · 2;
//   ETP 1 × EP 8: no expert-TP collective; experts' DP 16 / 8 = 2 ranks, 8 apart, all-reducing
//     S = 2 · 45,097,156,608 / 8 B;
//   ETP 2 × EP 4: the ETP pair all-gathers its dispatched copies and reduce-scatters the outputs,
//     4 calls per MoE layer of S(e_t−1)/e_t = 33,554,432 B (S = 2 ranks' copies); EP 2 apart.
TEST(StepTraffic, ExpertTensorParallelMixtralByHand) {
  const double n = 46702792704.0, routed = 45097156608.0;
  const double a2a = 2048.0 * 2 * 4096 * 2;
  StepTrafficSetup s{.params = n, .hidden = 4096, .layers = 32, .seq_len = 4096, .dp = 8, .tp = 2,
                     .sequence_parallel = true, .ep = 8, .etp = 1, .expert_share = routed / n,
                     .moe_layers = 32, .experts_per_token = 2};
  auto r = step_traffic(s);
  EXPECT_EQ(r.ep.group, 8);
  EXPECT_EQ(r.ep.stride, 1);
  EXPECT_DOUBLE_EQ(r.ep.calls, 128);
  EXPECT_DOUBLE_EQ(r.ep.bytes_per_call, a2a * 7 / 8);
  EXPECT_DOUBLE_EQ(r.expert_tp.calls, 0);
  EXPECT_DOUBLE_EQ(r.tp.calls, 128);
  EXPECT_DOUBLE_EQ(r.tp.bytes_per_call, 4096.0 * 4096 * 2 / 2);
  EXPECT_EQ(r.expert_grad.group, 2);
  EXPECT_EQ(r.expert_grad.stride, 8);
  EXPECT_NEAR(r.expert_grad.bytes_per_rank, 2 * routed / 8, 1);
  EXPECT_NEAR(r.dp_grad.bytes_per_rank, 2 * (2 * (n - routed) / 2) * 7 / 8, 1);

  s.etp = 2;
  s.ep = 4;
  r = step_traffic(s);
  EXPECT_EQ(r.ep.stride, 2);
  EXPECT_DOUBLE_EQ(r.ep.bytes_per_call, a2a * 3 / 4);
  EXPECT_EQ(r.expert_tp.group, 2);
  EXPECT_EQ(r.expert_tp.stride, 1);
  EXPECT_EQ(r.expert_tp.collective, Collective::all_gather);
  EXPECT_EQ(r.expert_tp.paired_with, Collective::reduce_scatter);
  EXPECT_DOUBLE_EQ(r.expert_tp.calls, 128);
  EXPECT_DOUBLE_EQ(r.expert_tp.bytes_per_call, a2a);
  EXPECT_EQ(r.expert_grad.group, 2);
  EXPECT_NEAR(r.expert_grad.bytes_per_rank, 2 * routed / 8, 1);
  // SP's backward re-gather: only the attention's QKV input (a MoE layer without shared experts
  // has no column-parallel MLP), one per layer, 32 of S(t−1)/t = 4096 · 4096 B.
  EXPECT_DOUBLE_EQ(r.tp_regather.calls, 32);
  EXPECT_DOUBLE_EQ(r.tp_regather.bytes_per_call, 4096.0 * 4096);
  EXPECT_NEAR(r.total_bytes(), 128 * a2a * 3 / 4 + 128 * a2a + 128 * 4096.0 * 4096 +
                                   32 * 4096.0 * 4096 + 2 * (n - routed) * 7 / 8 + 2 * routed / 8,
              64);
  // Full recompute replays the forward pair; shared experts keep the MLP-side TP pair under SP.
  StepTrafficSetup full = s;
  full.recompute = Recompute::full;
  EXPECT_DOUBLE_EQ(step_traffic(full).expert_tp.calls, 192);
  StepTrafficSetup shared = s;
  shared.shared_experts = true;
  EXPECT_DOUBLE_EQ(step_traffic(shared).tp.calls, 256);
  // TP without SP (e_t = t): every TP rank holds the tokens already, nothing to gather; the TP
  // all-reduces sum the partial outputs (4 per layer).
  StepTrafficSetup no_sp = s;
  no_sp.sequence_parallel = false;
  EXPECT_DOUBLE_EQ(step_traffic(no_sp).expert_tp.calls, 0);
  EXPECT_DOUBLE_EQ(step_traffic(no_sp).tp.calls, 128);
  // Refused: ETP 1 under TP 2 without SP; ETP × EP not dividing tp × dp = 16.
  no_sp.etp = 1;
  EXPECT_THROW(step_traffic(no_sp), InvalidInput);
  StepTrafficSetup bad = s;
  bad.etp = 1;
  bad.ep = 32;
  EXPECT_THROW(step_traffic(bad), InvalidInput);
  bad.ep = 16;  // ETP 1 × EP 16 is a regrouping of the 16 ranks
  EXPECT_NO_THROW(step_traffic(bad));
}

// Note [NCCL collective model] for an all-to-all that leaves the NVLink domain: 16 ranks on two
// 8-GPU hosts; each rank sends 1/15 of its bytes to every peer, 8 of them over its own NIC and 7
// over NVLink, all at once: the NIC part paces it, after one network latency and 7 NVLink steps.
TEST(CommNccl, AllToAllAcrossHostsRunsOnEachRanksOwnRail) {
  const ClusterSpec c = *cluster_preset("h100-80g");
  const double bytes = 15e6, per_peer = 1e6;
  const double nic = c.inter_node.bandwidth_bps * c.inter_bus_fraction;  // one NIC per GPU
  const double nvl = c.intra_node.bandwidth_bps * c.intra_bus_fraction;
  const double expect = c.inter_node.latency_s + 7 * c.intra_node.latency_s +
                        std::max(8 * per_peer / nic, 7 * per_peer / nvl);
  EXPECT_DOUBLE_EQ(collective_seconds(Collective::all_to_all, bytes, 16, 1, c), expect);
  // Inside one host it is a plain NVLink exchange.
  EXPECT_DOUBLE_EQ(collective_seconds(Collective::all_to_all, 7e6, 8, 1, c),
                   7 * c.intra_node.latency_s + 7e6 / nvl);
}

// Note [node-limited routing] (DeepSeek-V3 §2.1.2 and §3.2.2): EP 64 over 8 H100 hosts (stride 1),
// top-8, each token to at most M = 4 nodes. A rank scatters S = 64e6 B (its own 1e6 share
// included), sends 63e6. Plain: 56 peers on other hosts, 56e6 over its NIC, 7e6 over NVLink.
// Node-limited: each token crosses once per remote target node, min(4, 8, 8) = 4 targets of which
// 4·7/8 remote, against 8·7/8 copies plain: 28e6 over the NIC; every copy not already on its
// expert's GPU moves over NVLink once, S·7/8 = 56e6. The NIC part still paces it, half as long.
TEST(CommNccl, NodeLimitedRoutingSendsEachTokenOncePerNode) {
  const ClusterSpec c = *cluster_preset("h100-80g");
  const double bytes = 63e6;
  const RouteLimit m4{.max_nodes = 4, .copies_per_token = 8};
  const AllToAllSplit plain = all_to_all_split(bytes, 64, 1, c);
  EXPECT_EQ(plain.domains, 8);
  EXPECT_EQ(plain.members_per_domain, 8);
  EXPECT_DOUBLE_EQ(plain.inter_node_bytes, 56e6);
  EXPECT_DOUBLE_EQ(plain.intra_node_bytes, 7e6);
  const AllToAllSplit limited = all_to_all_split(bytes, 64, 1, c, m4);
  EXPECT_DOUBLE_EQ(limited.inter_node_bytes, 28e6);
  EXPECT_DOUBLE_EQ(limited.intra_node_bytes, 56e6);
  const double nic = c.inter_node.bandwidth_bps * c.inter_bus_fraction;  // one NIC per GPU
  const double nvl = c.intra_node.bandwidth_bps * c.intra_bus_fraction;
  ASSERT_GT(28e6 / nic, 56e6 / nvl);
  const double latency = c.inter_node.latency_s + 7 * c.intra_node.latency_s;
  EXPECT_DOUBLE_EQ(collective_seconds(Collective::all_to_all, bytes, 64, 1, c, m4),
                   latency + 28e6 / nic);
  EXPECT_DOUBLE_EQ(collective_seconds(Collective::all_to_all, bytes, 64, 1, c),
                   latency + 56e6 / nic);
  // A limit at or beyond the copies (M = 8 of top-8) saves no NIC bytes; inside a host, or under
  // the flat ring (every byte on the slowest link), it changes nothing.
  EXPECT_DOUBLE_EQ(all_to_all_split(bytes, 64, 1, c, {.max_nodes = 8, .copies_per_token = 8})
                       .inter_node_bytes, 56e6);
  EXPECT_DOUBLE_EQ(collective_seconds(Collective::all_to_all, 7e6, 8, 1, c, m4),
                   collective_seconds(Collective::all_to_all, 7e6, 8, 1, c));
  ClusterSpec flat = c;
  flat.comm_model = CommModel::flat_ring;
  EXPECT_DOUBLE_EQ(collective_seconds(Collective::all_to_all, bytes, 64, 1, flat, m4),
                   collective_seconds(Collective::all_to_all, bytes, 64, 1, flat));
  // The ledger carries the limit on its all-to-all item, and refuses a negative one.
  StepTrafficSetup s{.params = 671e9, .hidden = 7168, .layers = 61, .seq_len = 4096, .dp = 64,
                     .ep = 64, .expert_share = 0.97, .moe_layers = 58, .experts_per_token = 8,
                     .max_route_nodes = 4};
  EXPECT_EQ(step_traffic(s).ep.route.max_nodes, 4);
  EXPECT_EQ(step_traffic(s).ep.route.copies_per_token, 8);
  s.max_route_nodes = -1;
  EXPECT_THROW(step_traffic(s), InvalidInput);
}

// DeepSeek-V3's multi-token-prediction module in the ledger (Note [MTP in the ledger]): L = 61
// layers, 58 of them MoE, one module of one MoE layer on the last stage, m = 16 micro-batches. By
// hand: at p = 1 the stage is the whole model, 58 + 1 MoE layers: 4 · 59 · 16 = 3776 all-to-alls
// (without the module 4 · 58 · 16 = 3712); TP 2 without SP, 2 all-reduces per attention block and
// 2 per MLP, 4 · (61 + 1) · 16 = 3968. At p = 4 the ⌈61/4⌉ = 16-layer stages stay the busiest
// (the last holds 61 − 3 · 16 = 13 + 1): 4 · 16 · 58/61 · 16 all-to-alls either way. At p = 2 with
// two modules the last stage holds 61 − 31 = 30 + 2 = 32 > 31 layers: 4 · (30 · 58/61 + 2) · 16.
TEST(StepTraffic, MultiTokenPredictionModulesOnTheLastStage) {
  StepTrafficSetup s{.params = 671e9, .hidden = 7168, .layers = 61, .seq_len = 4096,
                     .micro_batches = 16, .dp = 64, .ep = 64, .expert_share = 0.97,
                     .moe_layers = 58, .experts_per_token = 8, .shared_experts = true,
                     .mtp_layers = 1};
  EXPECT_DOUBLE_EQ(step_traffic(s).ep.calls, 3776);
  EXPECT_NE(step_traffic(s).ep.formula.find("with its MTP modules"), std::string::npos);
  s.mtp_layers = 0;
  EXPECT_DOUBLE_EQ(step_traffic(s).ep.calls, 3712);
  EXPECT_EQ(step_traffic(s).ep.formula.find("MTP"), std::string::npos);
  StepTrafficSetup t = s;
  t.mtp_layers = 1;
  t.dp = 32;
  t.tp = 2;
  t.ep = 32;
  EXPECT_DOUBLE_EQ(step_traffic(t).tp.calls, 3968);
  s.pp = 4;
  const double busiest = 4 * 16 * 58.0 / 61 * 16;
  EXPECT_DOUBLE_EQ(step_traffic(s).ep.calls, busiest);
  s.mtp_layers = 1;
  EXPECT_DOUBLE_EQ(step_traffic(s).ep.calls, busiest);
  s.pp = 2;
  s.mtp_layers = 2;
  EXPECT_DOUBLE_EQ(step_traffic(s).ep.calls, 4 * (30 * 58.0 / 61 + 2) * 16);
  // A caller that names the busiest stage counts the modules itself; a negative count is refused.
  s.busiest_stage_layers = 31;
  EXPECT_THROW(step_traffic(s), InvalidInput);
  s.busiest_stage_layers = 0;
  s.mtp_layers = -1;
  EXPECT_THROW(step_traffic(s), InvalidInput);
}

// A group of 12 on 8-GPU hosts (stride 1): ranks 0–7 share one host, 8–11 the next. A rank of the
// 4-member host sends 8 of its 11 peer messages over its NIC, more than any rank of the full host
// (4): the collective waits for it. (Averaging the members over the hosts, 6 per host, would have
// sent 6 over the NIC.)
TEST(CommNccl, AllToAllOverAPartialHostIsPacedByItsSmallestDomain) {
  const ClusterSpec c = *cluster_preset("h100-80g");
  const double per_peer = 1e6, bytes = 11 * per_peer;
  const double nic = c.inter_node.bandwidth_bps * c.inter_bus_fraction;
  const double nvl = c.intra_node.bandwidth_bps * c.intra_bus_fraction;
  ASSERT_GT(8 * per_peer / nic, 7 * per_peer / nvl);  // the NIC part paces
  const double expect = c.inter_node.latency_s + 7 * c.intra_node.latency_s + 8 * per_peer / nic;
  EXPECT_DOUBLE_EQ(collective_seconds(Collective::all_to_all, bytes, 12, 1, c), expect);
}

// ZeRO-2 under pipeline parallelism: torch.distributed.pipelining runs every backward of an FSDP
// stage without gradient sync and reduce-scatters once after the last (stage.py at 0138610331c9,
// backward_maybe_with_nosync / _post_backward; DeepSpeed refuses ZeRO-2 with PP). Without PP,
// DeepSpeed's stage 2 reduces every micro-batch. The parameter all-gather is once per step in both.
TEST(StepTraffic, ZeroTwoUnderPipelineReducesOncePerStep) {
  StepTrafficSetup s{.params = 8e9, .hidden = 4096, .layers = 32, .seq_len = 4096,
                     .micro_batches = 8, .dp = 4, .pp = 1, .zero_stage = 2};
  EXPECT_DOUBLE_EQ(step_traffic(s).dp_grad.calls, 8);
  EXPECT_DOUBLE_EQ(step_traffic(s).zero_param_gather.calls, 1);
  s.pp = 4;
  const StepTraffic t = step_traffic(s);
  EXPECT_DOUBLE_EQ(t.dp_grad.calls, 1);
  EXPECT_DOUBLE_EQ(t.zero_param_gather.calls, 1);
  // S = 2 bytes · 8e9 / 4 stages = 4e9 bytes; a reduce-scatter over 4 ranks sends 3/4 of it.
  EXPECT_DOUBLE_EQ(t.dp_grad.bytes_per_rank, 4e9 * 3 / 4);
  EXPECT_NE(t.dp_grad.formula.find("once per step"), std::string::npos) << t.dp_grad.formula;
}

// ZeRO-3 under pipeline parallelism (torchtitan's FSDP with torch.distributed.pipelining): the stage
// is gathered once and its gradients reduce-scattered once per step, whatever the micro-batches.
TEST(StepTraffic, ZeroThreeUnderPipelineGathersOncePerStep) {
  StepTrafficSetup s{.params = 8e9, .hidden = 4096, .layers = 32, .seq_len = 4096,
                     .micro_batches = 8, .dp = 4, .pp = 1, .zero_stage = 3};
  EXPECT_DOUBLE_EQ(step_traffic(s).zero_param_gather.calls, 16);  // forward and backward, 8 × 2
  EXPECT_DOUBLE_EQ(step_traffic(s).dp_grad.calls, 8);
  s.pp = 4;
  EXPECT_DOUBLE_EQ(step_traffic(s).zero_param_gather.calls, 1);
  EXPECT_DOUBLE_EQ(step_traffic(s).dp_grad.calls, 1);
  EXPECT_NE(step_traffic(s).zero_param_gather.formula.find("once per step"), std::string::npos);
}

// Note [fp8 all-gather]: torchao's FSDP float8 all-gather moves 1 B per Float8Linear weight where
// bf16 moves 2. Llama 3 8B by hand (config.json: h 4096, kv 1024, f 14336, 32 layers, V 128256):
// per layer q 4096², k and v 4096·1024, o 4096², gate, up, down 4096·14336 each = 218,103,808
// linear weights, 6,979,321,856 in 32 layers, of N = 8,030,261,248 (the rest: two 128256 × 4096
// embeddings and the norms). On 8 GPUs, ZeRO-3, one micro-batch: each gather S = 2N − L bytes
// instead of 2N (0.565×), sent S·7/8 per rank, twice; the gradients still 2N·7/8.
TEST(StepTraffic, Float8AllGatherHalvesTheLinearWeightsOnly) {
  const double N = 8030261248.0;
  const double L = 32 * (2 * 4096.0 * 4096 + 2 * 4096.0 * 1024 + 3 * 4096.0 * 14336);
  EXPECT_DOUBLE_EQ(L, 6979321856.0);
  const double tol = 1e-12 * N;  // f = L/N and back: rounding only
  StepTrafficSetup st{.params = N, .param_bytes = 2, .grad_bytes = 2, .dp = 8, .zero_stage = 3};
  const auto bf16 = step_traffic(st);
  st.fp8_gather_share = L / N;
  const auto fp8 = step_traffic(st);
  EXPECT_NEAR(fp8.zero_param_gather.bytes_per_call, (2 * N - L) * 7 / 8, tol);
  EXPECT_NEAR(fp8.zero_param_gather.bytes_per_rank, 2 * (2 * N - L) * 7 / 8, tol);
  EXPECT_NEAR(fp8.zero_param_gather.bytes_per_call / bf16.zero_param_gather.bytes_per_call,
              0.5654, 1e-4);
  EXPECT_EQ(fp8.zero_param_gather.calls, bf16.zero_param_gather.calls);
  EXPECT_DOUBLE_EQ(fp8.dp_grad.bytes_per_rank, 2 * N * 7 / 8);  // gradients stay bf16
  EXPECT_NE(fp8.convention().find("float8"), std::string::npos) << fp8.convention();
  EXPECT_NE(fp8.zero_param_gather.formula.find("1 B*f"), std::string::npos);
  EXPECT_EQ(bf16.convention().find("float8"), std::string::npos);
  // Routed experts apart (EP 2 over 8): the dense item's share is f/(1 − e); the experts' gather is
  // untouched. N 1e9, e 0.5, f 0.3: the dense gather S = 2·0.2e9 + 1·0.3e9 = 0.7e9.
  StepTrafficSetup moe{.params = 1e9, .param_bytes = 2, .grad_bytes = 2, .hidden = 4096,
                       .layers = 1, .seq_len = 4096, .dp = 8, .zero_stage = 3, .ep = 2,
                       .expert_share = 0.5, .moe_layers = 1};
  const auto moe_bf16 = step_traffic(moe);
  moe.fp8_gather_share = 0.3;
  const auto moe_fp8 = step_traffic(moe);
  EXPECT_NEAR(moe_fp8.zero_param_gather.bytes_per_call, 0.7e9 * 7 / 8, 1e-3);
  EXPECT_DOUBLE_EQ(moe_fp8.expert_param_gather.bytes_per_call,
                   moe_bf16.expert_param_gather.bytes_per_call);
  // Never more than the non-expert weights, only where parameters are gathered (ZeRO >= 1), only
  // for fp8; torchao's switch only at ZeRO-3 (fp8_gather).
  moe.fp8_gather_share = 0.6;
  EXPECT_THROW(step_traffic(moe), InvalidInput);
  st.zero_stage = 0;
  EXPECT_THROW(step_traffic(st), InvalidInput);
  EXPECT_THROW(require_float8_all_gather(Precision::mxfp8), InvalidInput);
  EXPECT_NO_THROW(require_float8_all_gather(Precision::fp8));
  const ModelSpec llama = *model_preset("llama-3-8b");
  for (int zero : {0, 1, 2})
    EXPECT_EQ(fp8_gather(llama, Precision::fp8, zero, /*fsdp_float8_all_gather=*/true, false).share,
              0.0) << zero;
  EXPECT_NEAR(fp8_gather(llama, Precision::fp8, 3, true, false).share, L / N, 1e-15);
}

// Note [fp8 parameters]: Megatron-Core's --fp8-param-gather all-gathers the per-tensor fp8
// weights, 1 B per linear weight element, routed experts included, at ZeRO-1 (the distributed
// optimizer's gather after the step) as at ZeRO-3; MXFP8's gather stays bf16. By hand, N 1e9 with
// routed experts e = 0.5 and dense linear weights f = 0.3 of N, 8 ranks, one micro-batch:
//   experts not apart (EP 1): one gather of S = 2·0.2e9 + 1·(0.3e9 + 0.5e9) = 1.2e9 B, S·7/8 sent;
//   EP 2 (experts apart, expert DP 4): dense S = 2·0.2e9 + 1·0.3e9 = 0.7e9, S·7/8; experts
//   S = 1·0.5e9/2 = 0.25e9 over 4 ranks, S·3/4 — bf16 would send 0.5e9·3/4.
TEST(StepTraffic, MegatronFp8ParametersGatherEveryLinearWeightInFloat8) {
  StepTrafficSetup st{.params = 1e9, .param_bytes = 2, .fp8_gather_share = 0.3,
                      .fp8_gather_experts = true, .grad_bytes = 2, .hidden = 4096, .layers = 1,
                      .seq_len = 4096, .dp = 8, .zero_stage = 1, .expert_share = 0.5,
                      .moe_layers = 1};
  const auto one = step_traffic(st);
  EXPECT_NEAR(one.zero_param_gather.bytes_per_call, 1.2e9 * 7 / 8, 1e-3);
  EXPECT_EQ(one.zero_param_gather.calls, 1);
  EXPECT_DOUBLE_EQ(one.dp_grad.bytes_per_call, 2e9 * 7 / 8);  // gradients stay bf16
  EXPECT_NE(one.convention().find("routed experts included"), std::string::npos);
  st.ep = 2;
  const auto apart = step_traffic(st);
  EXPECT_NEAR(apart.zero_param_gather.bytes_per_call, 0.7e9 * 7 / 8, 1e-3);
  EXPECT_NEAR(apart.expert_param_gather.bytes_per_call, 0.25e9 * 3 / 4, 1e-3);
  st.fp8_gather_experts = false;
  EXPECT_NEAR(step_traffic(st).expert_param_gather.bytes_per_call, 0.5e9 * 3 / 4, 1e-3);
  // The switch: per-tensor fp8 at ZeRO >= 1 gathers the linear weights and the experts; MXFP8
  // and ZeRO-0 gather nothing in float8.
  const ModelSpec mixtral = *model_preset("mixtral-8x7b");
  const Fp8Gather g = fp8_gather(mixtral, Precision::fp8, 1, false, true);
  EXPECT_DOUBLE_EQ(g.share, float8_gather_share(mixtral));
  EXPECT_TRUE(g.experts);
  for (const auto& [p, zero] : {std::pair{Precision::mxfp8, 1}, std::pair{Precision::fp8, 0}}) {
    const Fp8Gather none = fp8_gather(mixtral, p, zero, false, true);
    EXPECT_EQ(none.share, 0.0);
    EXPECT_FALSE(none.experts);
  }
  EXPECT_THROW(require_fp8_param_gather(Precision::nvfp4), InvalidInput);
  EXPECT_THROW(require_fp8_param_gather(Precision::bf16), InvalidInput);
  EXPECT_NO_THROW(require_fp8_param_gather(Precision::mxfp8));
}

}  // namespace
}  // namespace tally::test_comm_collectives
