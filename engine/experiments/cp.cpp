// `tally run cp` (cp.hpp): ring attention against single-process causal attention and core's CP
// ledger.
#include "tally/engine/experiments/cp.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include "comm_torch.hpp"
#include "ring_attention.hpp"
#include "tally/core/gpt_step.hpp"
#include "tally/core/model.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/process_groups.hpp"
#include "run_helpers.hpp"

namespace tally::engine {

namespace {



// The whole problem, drawn from the seed on every rank alike.
struct Problem {
  at::Tensor q, k, v, dout;  // (B, a, s, d), (B, g, s, d) ×2, (B, a, s, d); float64
};

Problem draw(const CpOptions& o) {
  at::manual_seed(std::int64_t(o.seed));
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  return {at::randn({o.batch, o.heads, o.seq, o.head_dim}, f64),
          at::randn({o.batch, o.kv_heads, o.seq, o.head_dim}, f64),
          at::randn({o.batch, o.kv_heads, o.seq, o.head_dim}, f64),
          at::randn({o.batch, o.heads, o.seq, o.head_dim}, f64)};
}

// The single-process reference: softmax(QKᵀ/√d + causal mask)·V written out plainly (no blocks,
// no online softmax), with K,V heads repeated for GQA, and its gradients by torch autograd for
// the loss Σ out∘dout (so the output gradient is dout).
struct Reference {
  at::Tensor out, dq, dk, dv;
};

Reference reference(const Problem& p) {
  at::Tensor q = p.q.clone().requires_grad_(true);
  at::Tensor k = p.k.clone().requires_grad_(true);
  at::Tensor v = p.v.clone().requires_grad_(true);
  const std::int64_t groups = q.size(1) / k.size(1), s = q.size(2);
  const at::Tensor ke = k.repeat_interleave(groups, 1), ve = v.repeat_interleave(groups, 1);
  const at::Tensor future = at::ones({s, s}, at::kBool).triu(1);
  const at::Tensor scores = at::matmul(q, ke.transpose(-2, -1)) / std::sqrt(double(q.size(3)));
  const at::Tensor out =
      at::matmul(at::softmax(scores.masked_fill(future, -std::numeric_limits<double>::infinity()), -1), ve);
  (out * p.dout).sum().backward();
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

// This rank's two chunks of a (B, heads, s, d) tensor, concatenated along the sequence.
at::Tensor local(const at::Tensor& x, const std::array<int, 2>& chunks, std::int64_t n) {
  return at::cat({x.narrow(2, chunks[0] * n, n), x.narrow(2, chunks[1] * n, n)}, 2).contiguous();
}

double rel_diff(const at::Tensor& got, const at::Tensor& want) {
  return (got - want).abs().max().item<double>() / want.abs().max().item<double>();
}

StepTraffic predict(const CpOptions& o, int c, double act_bytes) {
  return step_traffic({.params = 1,  // no weights in the attention core; the DP items are unused
                       .param_bytes = act_bytes,
                       .grad_bytes = act_bytes,
                       .act_bytes = act_bytes,
                       .hidden = o.heads * o.head_dim,
                       .layers = 1,
                       .seq_len = o.seq,
                       .micro_batch = o.batch,
                       .micro_batches = 1,
                       .cp = c,
                       .kv_hidden = o.kv_heads * o.head_dim});
}

struct Sent {
  std::int64_t calls = 0;
  double bytes = 0;
};
Sent sent(const Comm& c) {
  const CollectiveCounter& s = c.counters()[Collective::send_recv];
  return {s.calls, s.bytes_sent};
}

// float64: one forward and backward against the reference; the CP Comm's sends counted.
void check_f64(const CpOptions& o, Comm& cp, const Problem& p, const Reference& ref,
               CpVariant& v) {
  const std::int64_t n = o.seq / (2 * cp.world_size());
  const std::array<int, 2> mine = cp_chunks(v.balance, cp.world_size(), cp.rank());
  const at::Tensor q = local(p.q, mine, n), k = local(p.k, mine, n), vv = local(p.v, mine, n);
  RingAttentionWork work;
  cp.reset_counters();
  const RingForward f = ring_attention_forward(cp, v.balance, q, k, vv, work);
  v.forward_sends_f64 = sent(cp).calls;
  const RingGrads g = ring_attention_backward(cp, v.balance, q, k, vv, f, local(p.dout, mine, n), work);
  v.sends_f64 = sent(cp).calls;
  v.bytes_f64 = sent(cp).bytes;
  v.out_rel_diff = rel_diff(f.out, local(ref.out, mine, n));
  v.dq_rel_diff = rel_diff(g.dq, local(ref.dq, mine, n));
  v.dk_rel_diff = rel_diff(g.dk, local(ref.dk, mine, n));
  v.dv_rel_diff = rel_diff(g.dv, local(ref.dv, mine, n));
}

// fp32: `repeats` timed layers; bytes from the first, block pairs from its forward.
void time_f32(const CpOptions& o, Comm& world, Comm& cp, const Problem& p, CpVariant& v,
              bool progress) {
  const int c = cp.world_size();
  const std::int64_t n = o.seq / (2 * c);
  const std::array<int, 2> mine = cp_chunks(v.balance, c, cp.rank());
  const at::Tensor q = local(p.q, mine, n).to(at::kFloat), k = local(p.k, mine, n).to(at::kFloat),
                   vv = local(p.v, mine, n).to(at::kFloat),
                   dout = local(p.dout, mine, n).to(at::kFloat);
  double forward_pairs = 0;
  for (int i = 0; i < o.repeats; ++i) {
    RingAttentionWork work;
    cp.reset_counters();
    const auto t0 = std::chrono::steady_clock::now();
    const RingForward f = ring_attention_forward(cp, v.balance, q, k, vv, work);
    if (i == 0) forward_pairs = double(work.block_pairs);
    (void)ring_attention_backward(cp, v.balance, q, k, vv, f, dout, work);
    v.layer_seconds.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (i == 0) v.bytes_f32 = sent(cp).bytes;
    v.compute_s += work.compute_s / o.repeats;
    v.shift_s += work.shift_s / o.repeats;
    if (progress)
      std::fprintf(stderr, "cp c=%d %s: layer %d/%d forward+backward %.4f s (compute %.4f s, "
                   "ring shifts %.4f s)\n",
                   c, std::string(to_string(v.balance)).c_str(), i + 1, o.repeats,
                   v.layer_seconds.back(), work.compute_s, work.shift_s);
  }
  // Every rank's figures, on the world group (the CP Comm's counters stay the ring's).
  std::vector<double> mine_stats = {forward_pairs, v.compute_s}, all(2 * std::size_t(c));
  world.all_gather(mine_stats, all);
  for (int r = 0; r < c; ++r) {
    v.block_pairs.push_back(all[2 * std::size_t(r)]);
    v.compute_s_by_rank.push_back(all[2 * std::size_t(r) + 1]);
    v.predicted_block_pairs.push_back(double(cp_causal_block_pairs(v.balance, c, r)));
  }
  if (!o.host) return;
  // Note [engine ring attention]: the attention core alone, as ring_attention_forward and
  // ring_attention_backward run it here (the operands arrive contiguous: no wrapper copy).
  const ModelSpec m{.name = "cp attention", .hidden = o.heads * o.head_dim, .layers = 1,
                    .heads = o.heads, .kv_heads = o.kv_heads, .ffn = 1, .vocab = 2,
                    .max_positions = o.seq};
  const OperatorSetup s{.seq = o.seq, .micro_batch = o.batch, .cp = c, .act_bytes = 4};
  const int threads = o.threads > 0 ? o.threads : at::get_num_threads();
  const double contention = std::max(1.0, double(world.world_size()) * threads / o.host_cores);
  for (int r = 0; r < c; ++r) {
    const RingAttentionTime t =
        predict_ring_attention(m, s, ring_blocks(v.balance, c, r), *o.host, contention);
    v.predicted_compute_s_by_rank.push_back(t.forward_s + t.backward_s);
  }
}

double max_over_min(const std::vector<double>& x) {
  if (x.empty()) return 0;
  const auto [lo, hi] = std::minmax_element(x.begin(), x.end());
  return *lo > 0 ? *hi / *lo : 0;
}

}  // namespace

void CpOptions::validate(int world_size) const {
  const int c = cp == 0 ? world_size : cp;
  require(c >= 1 && c == world_size, "--cp", c,
          "must equal the world size " + std::to_string(world_size) +
              " (tally run cp runs one CP group over every rank)");
  require(batch >= 1 && batch <= 1024, "--micro-batch", batch, "must be in [1, 1024]");
  require(heads >= 1 && heads <= 1024, "--heads", heads, "must be in [1, 1024]");
  require(kv_heads >= 1 && heads % kv_heads == 0, "--kv-heads", kv_heads,
          "must divide --heads = " + std::to_string(heads) + " (allowed: " + divisors_of(heads) + ")");
  require(head_dim >= 1 && head_dim <= 1024, "--head-dim", head_dim, "must be in [1, 1024]");
  require(seq >= 2 && seq % 2 == 0 && seq <= (1 << 20), "--seq", seq,
          "must be even and in [2, 1048576] (the causal split cuts it into 2c chunks)");
  require(seq % (2 * std::int64_t(c)) == 0, "--cp", c,
          "must split --seq = " + std::to_string(seq) + " into 2c equal chunks (allowed: " +
              divisors_of(seq / 2) + ")");
  // The reference holds the whole B·a·s² score matrix (and autograd's copies of it).
  const double score_elements = double(batch) * double(heads) * double(seq) * double(seq);
  require(score_elements <= double(1 << 26), "--seq", seq,
          "the single-process reference's B x a x s^2 = " + format_number(score_elements) +
              " scores must stay <= 67108864 (lower --seq, --heads or --micro-batch)");
  require(repeats >= 1 && repeats <= 10000, "--repeats", repeats, "must be in [1, 10000]");
  if (!(timeout_s > 0 && timeout_s <= 86400))
    throw InvalidInput("--timeout = " + format_number(timeout_s) + ": must be in (0, 86400] s");
  require(threads >= 0 && threads <= 1024, "--threads", threads, "must be in [0, 1024]");
}

double CpVariant::median_layer_seconds() const {
  if (layer_seconds.empty()) return 0;
  std::vector<double> s = layer_seconds;
  std::sort(s.begin(), s.end());
  return s.size() % 2 ? s[s.size() / 2] : (s[s.size() / 2 - 1] + s[s.size() / 2]) / 2;
}
double CpVariant::block_pair_imbalance() const { return max_over_min(block_pairs); }
double CpVariant::predicted_block_pair_imbalance() const {
  return max_over_min(predicted_block_pairs);
}
double CpVariant::compute_imbalance() const { return max_over_min(compute_s_by_rank); }

std::vector<CpCheck> cp_checks(const CpResult& r) {
  std::vector<CpCheck> out;
  auto rel = [&](std::string what, double measured, double predicted, double tol) {
    const double d = predicted == 0 ? std::abs(measured) : std::abs(measured - predicted) / std::abs(predicted);
    out.push_back({std::move(what), measured, predicted, tol, d <= tol});
  };
  for (const CpVariant& v : r.variants) {
    const std::string b = std::string(to_string(v.balance)) + " ";
    rel(b + "output f64 vs single-process (max relative difference)", v.out_rel_diff, 0, kCpF64Tolerance);
    rel(b + "dQ f64 vs single-process", v.dq_rel_diff, 0, kCpF64Tolerance);
    rel(b + "dK f64 vs single-process", v.dk_rel_diff, 0, kCpF64Tolerance);
    rel(b + "dV f64 vs single-process", v.dv_rel_diff, 0, kCpF64Tolerance);
    rel(b + "bytes per layer f64", v.bytes_f64, v.predicted_f64.cp.bytes_per_rank, 0);
    rel(b + "sends per layer f64", double(v.sends_f64), v.predicted_f64.cp.calls, 0);
    rel(b + "forward sends per layer f64", double(v.forward_sends_f64), r.world_size - 1, 0);
    rel(b + "bytes per layer fp32", v.bytes_f32, v.predicted_f32.cp.bytes_per_rank, 0);
    for (std::size_t i = 0; i < v.block_pairs.size(); ++i)
      rel(b + "block pairs of CP rank " + std::to_string(i), v.block_pairs[i],
          v.predicted_block_pairs[i], 0);
  }
  return out;
}

bool cp_ok(const CpResult& r) {
  for (const CpCheck& c : cp_checks(r))
    if (!c.ok) return false;
  return true;
}

CpResult run_cp(const DistEnv& env, const CpOptions& options) {
  env.validate();
  options.validate(env.world_size);
  if (options.threads > 0) at::set_num_threads(options.threads);
  CpResult r{.options = options, .rank = env.rank, .world_size = env.world_size};
  r.options.cp = env.world_size;
  Comm world(env, {.timeout_s = options.timeout_s});
  ProcessGroups groups(world, ParallelLayout{.cp = env.world_size});
  const Problem p = draw(options);
  const Reference ref = reference(p);
  for (const CpBalance b : {CpBalance::zigzag, CpBalance::contiguous}) {
    CpVariant v{.balance = b};
    check_f64(options, groups.cp(), p, ref, v);
    time_f32(options, world, groups.cp(), p, v, env.rank == 0);
    v.predicted_f64 = predict(options, env.world_size, 8);
    v.predicted_f32 = predict(options, env.world_size, 4);
    r.variants.push_back(std::move(v));
  }
  world.barrier();  // no rank tears its groups down while a peer still shifts
  return r;
}

}  // namespace tally::engine
