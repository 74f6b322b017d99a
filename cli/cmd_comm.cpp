// `tally comm`: one collective under the α–β model, or the per-step traffic ledger of a layout.
#include <fmt/core.h>

#include <memory>
#include <optional>

#include "commands.hpp"
#include "common.hpp"
#include "tally/core/comm.hpp"
#include "tally/core/hardware.hpp"
#include "tally/core/model.hpp"

namespace tally::cli {

namespace {

struct CommOptions {
  OutputOptions out;
  ModelOptions model;
  ClusterOptions cluster;
  // One collective (Note [numbers on the command line]: unset = not typed).
  std::optional<std::string> collective;
  std::optional<double> size_bytes, bandwidth_bps, latency_us;  // bytes, bytes/s, µs
  std::optional<int> ranks;
  int dp = 1, tp = 1, pp = 1, cp = 1, ep = 1, zero = 0;
  std::optional<int> etp;  // unset: --tp
  int max_route_nodes = 0;
  int interleave = 1;  // v, model chunks per pipeline stage
  double capacity_factor = 1;
  bool sp = false, fsdp_float8_all_gather = false, fp8_param_gather = false,
       pp_scatter_gather = false;
  std::int64_t seq = 2048, micro_batch = 1, grad_accum = 1;
  std::string precision = "bf16", recompute = "none";
};

void run_collective(const CommOptions& o) {
  if (!o.size_bytes || !o.ranks) throw InvalidInput("--collective needs --size (or --size-gb) and --ranks");
  // β (and α) from the flags, else the --gpu preset's link for a ring of --ranks; --latency-us
  // alone replaces the preset link's α.
  LinkSpec link;
  if (o.bandwidth_bps)
    link = LinkSpec{.bandwidth_bps = *o.bandwidth_bps, .latency_s = 0};
  else
    link = link_for_group(resolve_cluster(o.cluster), *o.ranks, 1);
  if (o.latency_us) link.latency_s = *o.latency_us * 1e-6;
  const Collective kind = *parse_collective(*o.collective);
  const CollectiveCost r = collective_cost(kind, *o.size_bytes, *o.ranks, link);
  const nlohmann::json j = {{"command", "comm"},
                            {"convention", r.convention()},
                            {"collective", std::string(to_string(kind))},
                            {"size_bytes", r.size_bytes},
                            {"ranks", r.ranks},
                            {"bandwidth_bytes_per_s", link.bandwidth_bps},
                            {"latency_s", link.latency_s},
                            {"bytes_per_rank", r.bytes_per_rank},
                            {"bytes_per_rank_gb", in_gb(r.bytes_per_rank)},
                            {"steps", r.steps},
                            {"seconds", r.seconds},
                            {"algbw_bytes_per_s", r.algbw_bps()},
                            {"busbw_bytes_per_s", r.busbw_bps()}};
  require_finite(j);  // Note [no inf or nan in output], for the text report too
  if (o.out.json) {
    print_json(j);
    return;
  }
  const SizeUnit u = o.out.size_unit();
  fmt::print("tally comm  [{}]\n", r.convention());
  fmt::print("  S = {} over k = {} ranks at {:g} GB/s, α = {:g} µs\n", size_str(r.size_bytes, u),
             r.ranks, link.bandwidth_bps / kGB, link.latency_s * 1e6);
  fmt::print("  bytes per rank {:>14}\n", size_str(r.bytes_per_rank, u, 3));
  fmt::print("  time           {:>12.4f} s   ({} steps × α + bytes/β)\n", r.seconds, r.steps);
  fmt::print("  algbw / busbw  {:>9.2f} / {:.2f} GB/s\n", r.algbw_bps() / kGB, r.busbw_bps() / kGB);
}

void run_step(const CommOptions& o) {
  const ModelSpec m = *resolve_model(o.model);
  if (m.params_only && (o.tp > 1 || o.pp > 1 || o.cp > 1 || o.ep > 1))
    throw InvalidInput("--tp/--pp/--cp/--ep traffic needs an architecture: give --model, not "
                       "--params");
  const int etp = o.etp.value_or(o.tp);
  check_expert_split(m, ParallelLayout{.dp = o.dp, .tp = o.tp, .pp = o.pp, .cp = o.cp}, o.ep, etp,
                     o.sp);
  if (o.interleave > 1 && o.pp == 1)
    throw InvalidInput("--interleave = " + std::to_string(o.interleave) +
                       ": needs --pp > 1 (chunks of a pipeline stage)");
  const ClusterSpec c = resolve_cluster(o.cluster);
  const Precision precision = precision_from(o.precision);
  if (o.fsdp_float8_all_gather) require_float8_all_gather(precision);
  if (o.fsdp_float8_all_gather && o.zero != 3)
    throw InvalidInput("--fsdp-float8-all-gather: --zero = " + std::to_string(o.zero) +
                       ": FSDP's float8 all-gather needs --zero 3");
  if (o.fp8_param_gather) require_fp8_param_gather(precision);
  const double elem = dtype_bytes(precision);
  const Fp8Gather fp8 =
      fp8_gather(m, precision, o.zero, o.fsdp_float8_all_gather, o.fp8_param_gather);
  const StepTrafficSetup setup{
      .params = state_params(m), .param_bytes = elem, .fp8_gather_share = fp8.share,
      .fp8_gather_experts = fp8.experts, .grad_bytes = elem, .act_bytes = elem,
      .hidden = m.hidden, .layers = m.layers, .seq_len = o.seq, .micro_batch = o.micro_batch,
      .micro_batches = o.grad_accum, .dp = o.dp, .tp = o.tp, .pp = o.pp, .cp = o.cp,
      .interleave = o.interleave, .pp_scatter_gather = o.pp_scatter_gather,
      .tied_embedding_elements = megatron_tied_embedding_elements(m, o.tp),
      .zero_stage = o.zero, .sequence_parallel = o.sp, .recompute = recompute_from(o.recompute),
      .kv_hidden = m.kv_heads * m.head_dim(), .ep = o.ep, .etp = etp,
      .expert_share = routed_expert_share(m), .moe_layers = m.moe_layers(),
      .experts_per_token = m.experts_per_token, .capacity_factor = o.capacity_factor,
      .shared_experts = m.shared_experts > 0, .mtp_layers = int(m.mtp_layers),
      .max_route_nodes = o.max_route_nodes};
  const StepTraffic t = step_traffic(setup);
  const SizeUnit u = o.out.size_unit();
  nlohmann::json items = nlohmann::json::array();
  double total_s = 0;
  struct Row { TrafficItem item; LinkSpec link; double seconds; AllToAllSplit split; };
  std::vector<Row> rows;
  for (const auto& it : t.items()) {
    const LinkSpec link = link_for_group(c, it.group, it.stride);
    const double s = it.calls > 0 ? traffic_seconds(it, link) : 0.0;
    total_s += s;
    // An all-to-all's bytes by where they go (Note [node-limited routing]).
    const AllToAllSplit split = it.collective == Collective::all_to_all && it.calls > 0
                                    ? all_to_all_split(it.bytes_per_call, it.group, it.stride, c,
                                                       it.route)
                                    : AllToAllSplit{};
    rows.push_back({it, link, s, split});
  }
  for (const auto& r : rows) {
    nlohmann::json item = {{"kind", std::string(to_string(r.item.kind))},
                           {"collective", std::string(to_string(r.item.collective))},
                           {"group", r.item.group},
                           {"calls", r.item.calls},
                           {"bytes_per_call", r.item.bytes_per_call},
                           {"bytes_per_rank", r.item.bytes_per_rank},
                           {"gb_per_rank", in_gb(r.item.bytes_per_rank)},
                           {"link_bandwidth_bytes_per_s", r.link.bandwidth_bps},
                           {"seconds", r.seconds},
                           {"formula", r.item.formula}};
    if (r.item.collective == Collective::all_to_all) {
      item["inter_node_bytes_per_rank"] = r.item.calls * r.split.inter_node_bytes;
      item["intra_node_bytes_per_rank"] = r.item.calls * r.split.intra_node_bytes;
      item["nodes"] = r.split.domains;
      item["max_route_nodes"] = r.item.route.max_nodes;
    }
    items.push_back(item);
  }
  const nlohmann::json j = {{"command", "comm"},
                            {"model", m.name},
                            {"convention", t.convention()},
                            {"items", items},
                            {"bytes_per_rank", t.total_bytes()},
                            {"dp_total_bytes", t.dp_total_bytes()},
                            {"seed_reduce_scatter_only_bytes", t.reduce_scatter_only_bytes},
                            {"fsdp_float8_all_gather", o.fsdp_float8_all_gather},
                            {"fp8_param_gather", o.fp8_param_gather},
                            {"pp_scatter_gather", t.pp_gather.calls > 0},
                            {"fp8_gather_experts", t.setup.fp8_gather_experts},
                            {"fp8_gather_share", t.setup.fp8_gather_share},
                            {"seconds_unoverlapped", total_s}};
  require_finite(j);  // Note [no inf or nan in output], for the text report too
  if (o.out.json) {
    print_json(j);
    return;
  }
  fmt::print("tally comm — {} per optimizer step  [{}]\n", m.name, t.convention());
  fmt::print("  {:<18} {:<15} {:>5} {:>9} {:>14} {:>10} {:>10}\n", "item", "collective", "k",
             "calls", "bytes/rank", "link GB/s", "time s");
  for (const auto& r : rows) {
    if (r.item.calls == 0) continue;
    fmt::print("  {:<18} {:<15} {:>5} {:>9g} {:>14} {:>10g} {:>10.4f}\n", to_string(r.item.kind),
               to_string(r.item.collective), r.item.group, r.item.calls,
               size_str(r.item.bytes_per_rank, u, 3), r.link.bandwidth_bps / kGB, r.seconds);
    fmt::print("  {:<18} {}\n", "", r.item.formula);
    if (r.item.collective == Collective::all_to_all && r.split.domains > 1)
      fmt::print("  {:<18} across {} nodes: {} to other nodes, {} inside{}\n", "",
                 r.split.domains, size_str(r.item.calls * r.split.inter_node_bytes, u, 3),
                 size_str(r.item.calls * r.split.intra_node_bytes, u, 3),
                 r.item.route.max_nodes > 0
                     ? fmt::format(" (each token to at most {} nodes, once each: DeepSeek-V3 "
                                   "node-limited routing)",
                                   r.item.route.max_nodes)
                     : "");
  }
  fmt::print("  {:<18} {:>46} {:>21.4f}\n", "total", size_str(t.total_bytes(), u, 3), total_s);
  if (o.zero >= 1 && o.dp > 1)
    fmt::print("  note: the seed's \"ZeRO-2 halves communication\" counts only the gradient "
               "reduce-scatter ({}); the parameter all-gather after the sharded update brings "
               "ZeRO-1/2 back to ≈2S (DESIGN.md erratum 4).\n",
               size_str(t.reduce_scatter_only_bytes, u, 3));
}

}  // namespace

void register_comm(CLI::App& app) {
  auto o = std::make_shared<CommOptions>();
  auto* cmd = app.add_subcommand(
      "comm", "communication: one collective (--collective) or the per-step ledger (--model)");
  add_output_flags(cmd, o->out);
  add_model_flags(cmd, o->model);
  add_cluster_flags(cmd, o->cluster);
  cmd->add_option("--collective", o->collective, "all-reduce | reduce-scatter | all-gather | "
                                                 "broadcast | p2p | all-to-all")
      ->check(one_of(allowed_collectives()));
  add_size_flag(cmd, "--size", "--size-gb", o->size_bytes, "S: full tensor size", 1e-3, 1e18);
  cmd->add_option("--ranks", o->ranks, "k: ranks in the collective")->check(CLI::Range(1, 1 << 24));
  add_bandwidth_flag(cmd, "--bandwidth", "--bandwidth-gbps", o->bandwidth_bps,
                     "β: per-GPU link bandwidth (default: the --gpu preset's link)",
                     kBandwidthBpsBounds.lo, kBandwidthBpsBounds.hi);
  cmd->add_option("--latency-us", o->latency_us,
                  "α: latency per ring step, µs (default: 0 with --bandwidth, else the --gpu "
                  "preset's link)")
      ->check(finite_in(kLatencySBounds.lo * 1e6, kLatencySBounds.hi * 1e6));
  cmd->add_option("--dp", o->dp, "data-parallel degree")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--tp", o->tp, "tensor-parallel degree")->check(CLI::Range(1, 1024));
  cmd->add_option("--pp", o->pp, "pipeline stages")->check(CLI::Range(1, 1024));
  cmd->add_option("--cp", o->cp, "context-parallel degree")->check(CLI::Range(1, 1024));
  cmd->add_option("--interleave", o->interleave,
                  "model chunks per pipeline stage (interleaved 1F1B: v times the PP sends)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--ep", o->ep,
                  "expert-parallel degree (MoE; EP x ETP regroups tp × cp × dp: must divide it, "
                  "EP the experts)")
      ->check(CLI::Range(1, 1 << 20));
  add_etp_flag(cmd, o->etp);
  add_route_flag(cmd, o->max_route_nodes);
  cmd->add_option("--capacity-factor", o->capacity_factor,
                  "MoE: expert slots as a multiple of the balanced share (1 = dropless, balanced)")
      ->check(finite_in(1, 64))
      ->capture_default_str();
  cmd->add_option("--zero", o->zero, "ZeRO stage 0-3")->check(CLI::Range(0, 3));
  add_fsdp_float8_flag(cmd, o->fsdp_float8_all_gather);
  add_fp8_param_gather_flag(cmd, o->fp8_param_gather);
  cmd->add_flag("--sp", o->sp, "sequence parallelism");
  add_pp_scatter_gather_flag(cmd, o->pp_scatter_gather);
  cmd->add_option("--seq", o->seq, "sequence length")->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 24))->capture_default_str();
  cmd->add_option("--micro-batch", o->micro_batch, "micro-batch size")->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 20));
  cmd->add_option("--grad-accum", o->grad_accum, "micro-batches per optimizer step")->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 20));
  cmd->add_option("--precision", o->precision, kPrecisionHelp)
      ->check(one_of(precision_names()))
      ->capture_default_str();
  cmd->add_option("--recompute", o->recompute, "none | selective (Megatron: attention core) | full | save-matmuls (PyTorch "
                  "selective checkpointing: matmul outputs saved) | op-sac (torchtitan's op-level "
                  "SAC: every other matmul's output saved)")
      ->check(one_of(allowed_recomputes()))
      ->capture_default_str();
  cmd->callback([o] {
    if (o->collective)
      run_collective(*o);
    else if (o->model.model || o->model.params)
      run_step(*o);
    else
      throw InvalidInput("comm: give --collective (one collective) or --model/--params (per step)");
  });
}

}  // namespace tally::cli
