// Note [NCCL collective model]: what a collective costs on a cluster of NVLink domains and NIC
// rails (collective_seconds, traffic_seconds on a ClusterSpec, all_to_all_split). Split from
// comm.cpp at the file-size limit; the ledger items those functions cost stay there.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "tally/core/comm.hpp"

namespace tally {

// Note [NCCL collective model] (ClusterSpec::comm_model == CommModel::nccl)
// A "node" here is one NVLink domain (ClusterSpec::nvlink_domain_size: a host, or a rack of hosts
// on one NVLink switch fabric such as GB200 NVL72), and g its GPU count; rails are NICs per GPU.
// NCCL runs a collective over a group that spans nodes as rings (one per channel) through every
// member: the hops inside a node go over NVLink, the hops between nodes over the NICs of the
// members at each node boundary, each channel on its own rail. So the inter-node traffic of one
// node is one rank's worth, carried by all the rails the group's members own there, and the per-
// rank bus bandwidth is
//     busbw = min(B_nvlink · f_intra, q · (nics/g) · B_nic · f_inter)   (q > 1 members per node)
//     busbw = (nics/g) · B_nic · f_inter                                 (q = 1: one per node)
// with q = g / stride members of the group per node (rank order puts a group's members stride
// apart), g GPUs per node and f the achieved bus-bandwidth fractions nccl-tests measures. A DGX
// A100 node (8 HDR NICs) gives min(230, 8 · 24) = 192 GB/s, the all-reduce busbw NCCL's
// maintainers report for it (NVIDIA/nccl#812); a group with one member per node (DP over TP 8)
// gets one NIC, 24 GB/s. A group inside a node runs at B_nvlink · f_intra. Time per call =
// bytes per rank / busbw (the ring's bytes, 2S(k−1)/k for all-reduce) + latency: NCCL's ring model
// (src/graph/tuning.cc) charges 2(n−1) network steps of an all-reduce over n nodes at the network
// latency and the other 2(k−1) − 2(n−1) steps at the NVLink latency (n−1 and k−1 − (n−1) for the
// other collectives).
namespace {

struct GroupPath {
  double bus_bps = 0;
  int nodes = 1;
  bool crosses_nodes = false;
  int members_per_domain = 1;  // q: the group's members in one full NVLink domain
  double rail_bps = 0;         // (nics/g) · B_nic · f_inter: one member's own rails
};

GroupPath group_path(const ClusterSpec& c, int group, int stride) {
  const int g = c.nvlink_domain_size();  // "node" of the note: one NVLink domain
  GroupPath p;
  const double intra = c.intra_node.bandwidth_bps * c.intra_bus_fraction;
  if (group <= 1 || std::int64_t(group) * stride <= g) {
    p.bus_bps = intra;
    return p;
  }
  const int q = std::clamp(stride < g ? g / stride : 1, 1, group);  // members per domain
  // NICs per GPU, from the host's NICs (a rack domain's GPUs keep their own hosts' NICs).
  const int host = c.gpus_per_node;
  const double rails = (c.nics_per_node > 0 ? c.nics_per_node : host) / double(host);
  p.rail_bps = rails * c.inter_node.bandwidth_bps * c.inter_bus_fraction;
  const double inter = q * p.rail_bps;
  p.bus_bps = q > 1 ? std::min(intra, inter) : inter;
  p.nodes = (group + q - 1) / q;
  p.members_per_domain = q;
  p.crosses_nodes = true;
  return p;
}

}  // namespace

// Note [node-limited routing]
// DeepSeek-V3 (Liu et al. 2024, §2.1.2) sends each token to at most M nodes (M = 4, §4.2): the
// router picks the M nodes whose experts' top K_r/M affinities sum highest, then the top-K_r
// experts among them (Megatron-Core 0.14: moe_router_num_groups = the EP group's nodes,
// moe_router_group_topk = M). Its dispatch kernels (§3.2.2; DeepEP) send a token once over IB to
// the GPU of the same in-node index on each target node, which forwards it over NVLink to the
// GPUs holding its experts. For a rank of a group spanning n NVLink domains of q members, with S
// the buffer it scatters (k copies per token) and balanced routing:
//   plain all-to-all (no limit): S(n−1)/n to other domains, S(q−1)/(nq) inside its own;
//   node-limited: each token crosses once per remote target domain — min(M, n, k) target domains,
//     the sender's own among them with probability min(M, n)/n under balance, counted as the
//     bound M (the chosen domains may hold fewer of the k experts) — so S·(min(M, n, k)/k)·(n−1)/n
//     goes to other domains, while every copy not already on its expert's GPU moves over NVLink
//     once, at the source or after the hop: S(q−1)/q.
// The saving needs a dispatcher that sends a token once per node (DeepSeek's, DeepEP — Megatron-
// Core's flex dispatcher); Megatron-Core's all-to-all dispatcher sends every copy, and group-
// limited routing then leaves the expected inter-node bytes as they are (k/n of the copies land on
// the sender's node either way). Under the flat-ring model all bytes ride the slowest link and the
// limit changes nothing; under the NCCL model the slower of the two parts paces the exchange.
namespace {

struct A2aParts {
  double inter = 0, intra = 0;
};

// One member of a domain of `members` in a group of `group` over `domains` domains.
A2aParts a2a_parts(double bytes_per_rank, int group, int members, int domains,
                   const RouteLimit& route) {
  const double per_peer = bytes_per_rank / double(group - 1);
  if (route.max_nodes <= 0)
    return {.inter = per_peer * (group - members), .intra = per_peer * (members - 1)};
  const double S = per_peer * group;  // the scattered buffer, the rank's own share included
  const double reach = double(std::min<std::int64_t>(
      {std::int64_t(route.max_nodes), std::int64_t(domains), route.copies_per_token}));
  return {.inter = per_peer * (group - members) * reach / double(route.copies_per_token),
          .intra = S * double(members - 1) / double(members)};
}

}  // namespace

AllToAllSplit all_to_all_split(double bytes_per_rank, int group, int stride,
                               const ClusterSpec& cluster, const RouteLimit& route) {
  require_int(group >= 1, "group", group, "must be >= 1");
  require_int(stride >= 1, "stride", stride, "must be >= 1");
  AllToAllSplit r;
  if (group <= 1) return r;
  const GroupPath p = group_path(cluster, group, stride);
  if (!p.crosses_nodes) {
    r.intra_node_bytes = bytes_per_rank;
    r.members_per_domain = group;
    return r;
  }
  const A2aParts parts = a2a_parts(bytes_per_rank, group, p.members_per_domain, p.nodes, route);
  r.inter_node_bytes = parts.inter;
  r.intra_node_bytes = parts.intra;
  r.domains = p.nodes;
  r.members_per_domain = p.members_per_domain;
  return r;
}

double collective_seconds(Collective c, double bytes_per_rank, int group, int stride,
                          const ClusterSpec& cluster, const RouteLimit& route) {
  require_int(group >= 1, "group", group, "must be >= 1");
  require_int(stride >= 1, "stride", stride, "must be >= 1");
  if (cluster.comm_model == CommModel::flat_ring) {
    const LinkSpec link = link_for_group(cluster, group, stride);
    return collective_steps(c, group) * link.latency_s + bytes_per_rank / link.bandwidth_bps;
  }
  const GroupPath p = group_path(cluster, group, stride);
  const int steps = collective_steps(c, group);
  if (c == Collective::all_to_all && p.crosses_nodes) {
    // Pairwise exchange, every pair at once: a rank's messages to the q_i − 1 peers in its domain
    // go over NVLink, those to the k − q_i outside over its own rails; the slower part paces it,
    // and the slowest rank paces the collective. Full domains hold q members; when q does not
    // divide k the last holds the rest, whose members send the most over their rails. One network
    // latency (all peers in flight) plus the in-domain steps.
    // With node-limited routing (Note [node-limited routing]) fewer bytes cross, more forward.
    const int q = p.members_per_domain;
    const double nvl = cluster.intra_node.bandwidth_bps * cluster.intra_bus_fraction;
    auto pace = [&](int members) {
      const A2aParts parts = a2a_parts(bytes_per_rank, group, members, p.nodes, route);
      return std::max(parts.inter / p.rail_bps, parts.intra / nvl);
    };
    const int rest = group % q;
    return cluster.inter_node.latency_s + (q - 1) * cluster.intra_node.latency_s +
           std::max(pace(q), rest > 0 ? pace(rest) : 0.0);
  }
  int inter_steps = 0;
  if (p.crosses_nodes)
    inter_steps = c == Collective::send_recv ? 1
                  : c == Collective::all_reduce ? 2 * (p.nodes - 1)
                                                : p.nodes - 1;
  inter_steps = std::min(inter_steps, steps);
  return (steps - inter_steps) * cluster.intra_node.latency_s +
         inter_steps * cluster.inter_node.latency_s + bytes_per_rank / p.bus_bps;
}

double traffic_seconds(const TrafficItem& item, const ClusterSpec& cluster) {
  if (item.calls <= 0) return 0.0;
  return item.calls * collective_seconds(item.collective, item.bytes_per_call, item.group,
                                         item.stride, cluster, item.route);
}

double traffic_seconds(const TrafficItem& item, const ClusterSpec& cluster,
                       const CollectiveLinks& links) {
  if (item.calls <= 0) return 0.0;
  const auto one_call = [&](Collective c) {
    const std::optional<LinkSpec>& link = c == Collective::reduce_scatter ? links.reduce_scatter
                                          : c == Collective::all_gather   ? links.all_gather
                                                                          : std::nullopt;
    if (!link)
      return collective_seconds(c, item.bytes_per_call, item.group, item.stride, cluster,
                                item.route);
    require_real(link->bandwidth_bps > 0, "link bandwidth_bps", link->bandwidth_bps,
                 "must be > 0 bytes/s");
    require_real(link->latency_s >= 0, "link latency_s", link->latency_s, "must be >= 0 s");
    return collective_steps(c, item.group) * link->latency_s +
           item.bytes_per_call / link->bandwidth_bps;
  };
  if (!item.paired_with) return item.calls * one_call(item.collective);
  return item.calls / 2 * (one_call(item.collective) + one_call(*item.paired_with));
}

}  // namespace tally
