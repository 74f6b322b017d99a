// Ring attention (ring_attention.hpp): Note [ring attention], Note [ring shift without deadlock].
#include "ring_attention.hpp"

#include <ATen/ATen.h>

#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

#include "comm_torch.hpp"
#include "tally/core/types.hpp"
#include "run_helpers.hpp"

namespace tally::engine {

namespace {

using Clock = std::chrono::steady_clock;


// Tags of the three shifts, so a message can only match its own kind.
constexpr int kTagForwardKv = 1, kTagBackwardKv = 2, kTagBackwardDkv = 3;

// out to rank r+1, in from rank r−1 (Note [ring shift without deadlock]); in and out distinct.
void ring_shift(Comm& cp, const at::Tensor& out, at::Tensor& in, int tag, RingAttentionWork& w) {
  const int c = cp.world_size(), r = cp.rank();
  const int next = (r + 1) % c, prev = (r + c - 1) % c;
  const auto t0 = Clock::now();
  if (r % 2 == 0) {
    send(cp, out, next, tag);
    recv(cp, in, prev, tag);
  } else {
    recv(cp, in, prev, tag);
    send(cp, out, next, tag);
  }
  w.shift_s += seconds_since(t0);
}

// How a (query chunk, key chunk) pair is masked under causal attention, from global chunk indices.
enum class PairMask { whole, diagonal, skipped };
PairMask pair_mask(int query_chunk, int key_chunk) {
  return key_chunk > query_chunk    ? PairMask::skipped
         : key_chunk == query_chunk ? PairMask::diagonal
                                    : PairMask::whole;
}

// Shapes and the pieces every pair needs.
struct Geometry {
  std::int64_t n = 0;       // tokens per chunk
  std::int64_t groups = 1;  // a/g query heads per K,V head
  double scale = 1;         // 1/√d
  at::Tensor above;         // (n, n) bool: the diagonal pair's masked entries (key after query)
  std::array<int, 2> mine{};
};

Geometry geometry(const Comm& cp, CpBalance balance, const at::Tensor& q, const at::Tensor& k) {
  TALLY_INVARIANT(q.dim() == 4 && k.dim() == 4 && q.size(2) % 2 == 0 && q.size(2) == k.size(2));
  TALLY_INVARIANT(k.size(1) > 0 && q.size(1) % k.size(1) == 0);
  Geometry g;
  g.n = q.size(2) / 2;
  g.groups = q.size(1) / k.size(1);
  g.scale = 1.0 / std::sqrt(double(q.size(3)));
  g.above = at::ones({g.n, g.n}, q.options().dtype(at::kBool)).triu(1);
  g.mine = cp_chunks(balance, cp.world_size(), cp.rank());
  return g;
}

at::Tensor chunk(const at::Tensor& x, int i, std::int64_t n) { return x.narrow(2, i * n, n); }

// GQA: K,V head h serves query heads [h·G, (h+1)·G) (Llama's repeat_kv), and its gradient is the
// sum over them.
at::Tensor expand_heads(const at::Tensor& x, std::int64_t groups) {
  return groups == 1 ? x : x.repeat_interleave(groups, 1);
}
at::Tensor fold_heads(const at::Tensor& x, std::int64_t groups) {
  if (groups == 1) return x;
  return x.view({x.size(0), x.size(1) / groups, groups, x.size(2), x.size(3)}).sum(2);
}

// Scores of one pair, scaled and masked.
at::Tensor scores(const Geometry& g, const at::Tensor& qb, const at::Tensor& kb, PairMask mask) {
  at::Tensor s = at::matmul(qb, kb.transpose(-2, -1)).mul_(g.scale);
  if (mask == PairMask::diagonal) s.masked_fill_(g.above, -std::numeric_limits<double>::infinity());
  return s;
}

}  // namespace

RingForward ring_attention_forward(Comm& cp, CpBalance balance, const at::Tensor& q,
                                   const at::Tensor& k, const at::Tensor& v,
                                   RingAttentionWork& work) {
  const Geometry g = geometry(cp, balance, q, k);
  const int c = cp.world_size(), r = cp.rank();
  const std::int64_t B = q.size(0), a = q.size(1), d = q.size(3);
  // Running state of each query chunk: row max m, row sum ℓ, unnormalised output acc.
  std::array<at::Tensor, 2> m, l, acc;
  for (int i = 0; i < 2; ++i) {
    m[i] = at::full({B, a, g.n}, -std::numeric_limits<double>::infinity(), q.options());
    l[i] = at::zeros({B, a, g.n}, q.options());
    acc[i] = at::zeros({B, a, g.n, d}, q.options());
  }
  at::Tensor kv = at::stack({k, v}).contiguous();  // (2, B, g, 2n, d): one message per shift
  at::Tensor next = at::empty_like(kv);
  for (int j = 0; j < c; ++j) {
    if (j + 1 < c) ring_shift(cp, kv, next, kTagForwardKv, work);
    const auto t0 = Clock::now();
    const std::array<int, 2> theirs = cp_chunks(balance, c, (r + c - j) % c);
    for (int qi = 0; qi < 2; ++qi)
      for (int ki = 0; ki < 2; ++ki) {
        const PairMask mask = pair_mask(g.mine[qi], theirs[ki]);
        if (mask == PairMask::skipped) continue;
        const at::Tensor kb = expand_heads(chunk(kv[0], ki, g.n), g.groups);
        const at::Tensor vb = expand_heads(chunk(kv[1], ki, g.n), g.groups);
        const at::Tensor s = scores(g, chunk(q, qi, g.n), kb, mask);
        const at::Tensor m_new = at::maximum(m[qi], std::get<0>(s.max(-1)));
        const at::Tensor alpha = at::exp(m[qi] - m_new);  // 0 while m is still −∞
        const at::Tensor p = at::exp(s - m_new.unsqueeze(-1));
        l[qi] = l[qi] * alpha + p.sum(-1);
        acc[qi] = acc[qi] * alpha.unsqueeze(-1) + at::matmul(p, vb);
        m[qi] = m_new;
        ++work.block_pairs;
      }
    work.compute_s += seconds_since(t0);
    std::swap(kv, next);
  }
  const auto t0 = Clock::now();
  RingForward f;
  f.out = at::cat({acc[0] / l[0].unsqueeze(-1), acc[1] / l[1].unsqueeze(-1)}, 2);
  f.lse = at::cat({m[0] + at::log(l[0]), m[1] + at::log(l[1])}, 2);
  work.compute_s += seconds_since(t0);
  return f;
}

RingGrads ring_attention_backward(Comm& cp, CpBalance balance, const at::Tensor& q,
                                  const at::Tensor& k, const at::Tensor& v,
                                  const RingForward& fwd, const at::Tensor& dout,
                                  RingAttentionWork& work) {
  const Geometry g = geometry(cp, balance, q, k);
  const int c = cp.world_size(), r = cp.rank();
  auto t0 = Clock::now();
  const at::Tensor D = (dout * fwd.out).sum(-1);  // (B, a, 2n)
  at::Tensor dq = at::zeros_like(q);
  at::Tensor kv = at::stack({k, v}).contiguous();
  at::Tensor next = at::empty_like(kv);
  at::Tensor own = at::zeros_like(kv);       // dK,dV of this rank's block from its own queries
  at::Tensor travel = at::zeros_like(kv);    // dK,dV of the visiting block, on its way home
  at::Tensor arriving = at::empty_like(kv);
  work.compute_s += seconds_since(t0);
  for (int j = 0; j < c; ++j) {
    if (j > 0) {
      ring_shift(cp, kv, next, kTagBackwardKv, work);
      std::swap(kv, next);
    }
    t0 = Clock::now();
    at::Tensor& target = j == 0 ? own : travel;
    const std::array<int, 2> theirs = cp_chunks(balance, c, (r + c - j) % c);
    for (int qi = 0; qi < 2; ++qi)
      for (int ki = 0; ki < 2; ++ki) {
        const PairMask mask = pair_mask(g.mine[qi], theirs[ki]);
        if (mask == PairMask::skipped) continue;
        const at::Tensor qb = chunk(q, qi, g.n), dob = chunk(dout, qi, g.n);
        const at::Tensor kb = expand_heads(chunk(kv[0], ki, g.n), g.groups);
        const at::Tensor vb = expand_heads(chunk(kv[1], ki, g.n), g.groups);
        const at::Tensor p =
            at::exp(scores(g, qb, kb, mask) - chunk(fwd.lse, qi, g.n).unsqueeze(-1));
        const at::Tensor dp = at::matmul(dob, vb.transpose(-2, -1));
        const at::Tensor ds = p * (dp - chunk(D, qi, g.n).unsqueeze(-1));
        chunk(dq, qi, g.n).add_(at::matmul(ds, kb), g.scale);
        chunk(target[0], ki, g.n).add_(fold_heads(at::matmul(ds.transpose(-2, -1), qb), g.groups),
                                       g.scale);
        chunk(target[1], ki, g.n).add_(fold_heads(at::matmul(p.transpose(-2, -1), dob), g.groups));
        ++work.block_pairs;
      }
    work.compute_s += seconds_since(t0);
    if (j > 0) {
      // Pass the visiting block's dK,dV on; take the next one's (after the last step: our own).
      ring_shift(cp, travel, arriving, kTagBackwardDkv, work);
      std::swap(travel, arriving);
    }
  }
  t0 = Clock::now();
  if (c > 1) own.add_(travel);
  RingGrads grads{.dq = dq, .dk = own[0], .dv = own[1]};
  work.compute_s += seconds_since(t0);
  return grads;
}

}  // namespace tally::engine
