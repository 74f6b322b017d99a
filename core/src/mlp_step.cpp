#include "tally/core/mlp_step.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "tally/core/comm.hpp"
#include "tally/core/planner.hpp"
#include "tally/core/roofline.hpp"

namespace tally {

namespace {

using i64 = std::int64_t;
constexpr double kFp32 = 4;

// Note [host step model]: streams per element of each optimizer kernel.
constexpr double kAdamStreams[] = {2, 3, 2, 3, 2, 2, 2, 4};
constexpr double kSgdStreams[] = {3};
// A copy_ (or an out-of-place write) into another buffer: the source read, the destination's
// lines read for ownership, then written — 3 streams where STREAM counts 2 (write-allocate
// traffic, McCalpin's STREAM FAQ). This host agrees: bench memory's copy_ takes 1.46–1.76× add_'s
// time per counted stream from 4 to 256 MiB (Note [host step model]).
constexpr double kCopyStreams = 3;
// A fill (zero_, at::zeros) by the same rule: the lines read for ownership, then written — 2
// streams where the bytes written are 1. On this host (2026-12-06) bench memory's zero_ took
// 1.33–1.57× add_'s time per counted stream from 4 to 256 MiB (copy_ 1.36–1.42× per its 2), and
// PyTorch 1.13's zero_ after a cache flush 1.43–1.84× (copy_ 2.75–3.12× per 1): nearer 2 than 1.
constexpr double kFillStreams = 2;

// One streaming kernel of `streams` passes over n fp32 elements.
Op stream_op(std::string_view name, double streams, double n) {
  return Op{.name = name, .kind = OpKind::memory, .pass = Pass::backward,
            .bytes = streams * kFp32 * n};
}

}  // namespace

void host_optimizer_ops(Optimizer o, i64 n, std::vector<Op>& out) {
  if (o == Optimizer::sgd) {
    for (double s : kSgdStreams) out.push_back(stream_op("sgd", s, double(n)));
    return;
  }
  for (i64 i0 = 0; i0 < n; i0 += kAdamChunkElements)
    for (double s : kAdamStreams)
      out.push_back(stream_op("adam", s, double(std::min(kAdamChunkElements, n - i0))));
}

double host_ops_seconds(const std::vector<Op>& ops, const GpuSpec& gpu) {
  double t = 0;
  for (const Op& op : ops) t += op_seconds(op, gpu, Precision::fp32);
  return t;
}

void MlpStepSetup::validate() const {
  require_int(widths.size() >= 2 && widths.size() <= 64, "widths", i64(widths.size()),
              "must list 2..64 layer widths");
  for (i64 w : widths) require_int(w >= 1 && w <= (i64(1) << 20), "width", w, "must be in [1, 1048576]");
  require_int(rows >= 1 && rows <= (i64(1) << 24), "rows", rows, "must be in [1, 16777216]");
  require_int(ranks >= 1 && ranks <= 4096, "ranks", ranks, "must be in [1, 4096]");
  require_int(zero_stage >= 0 && zero_stage <= 3, "zero_stage", zero_stage, "must be 0..3");
  require_int(optimizer == Optimizer::adam || optimizer == Optimizer::sgd, "optimizer",
              int(optimizer), "must be adam or sgd");
  require_int(zero_stage == 0 || optimizer == Optimizer::adam, "optimizer", int(optimizer),
              "ZeRO stages run Adam");
  for (double b : bucket_bytes)
    require_real(std::isfinite(b) && b > 0, "bucket_bytes", b, "must be > 0");
  require_int(threads_per_rank >= 1 && threads_per_rank <= 1024, "threads_per_rank",
              threads_per_rank, "must be in [1, 1024]");
  require_int(cores >= 1 && cores <= 65536, "cores", cores, "must be in [1, 65536]");
  if (overlap_slowdown)
    require_real(*overlap_slowdown >= 0 && *overlap_slowdown <= 1000, "overlap_slowdown",
                 *overlap_slowdown, "must be in [0, 1000]");
  for (const auto& [name, link] : {std::pair{"reduce_link", &reduce_link},
                                   std::pair{"reduce_scatter_link", &reduce_scatter_link},
                                   std::pair{"all_gather_link", &all_gather_link}}) {
    if (!*link) continue;
    const LinkSpec& l = **link;
    const std::string field(name);
    require_real(l.bandwidth_bps >= kBandwidthBpsBounds.lo &&
                     l.bandwidth_bps <= kBandwidthBpsBounds.hi,
                 field + ".bandwidth_bps", l.bandwidth_bps, "must be in [1e6, 1e15] bytes/s");
    require_real(l.latency_s >= kLatencySBounds.lo && l.latency_s <= kLatencySBounds.hi,
                 field + ".latency_s", l.latency_s, "must be in [0, 1] s");
  }
}

std::vector<i64> mlp_tensor_sizes(const std::vector<i64>& widths) {
  std::vector<i64> sizes;
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    sizes.push_back(widths[l] * widths[l + 1]);
    sizes.push_back(widths[l + 1]);
  }
  return sizes;
}

i64 mlp_parameters(const std::vector<i64>& widths) {
  i64 n = 0;
  for (i64 t : mlp_tensor_sizes(widths)) n += t;
  return n;
}

std::vector<Op> mlp_ops(const std::vector<i64>& widths, i64 rows, double e) {
  std::vector<Op> ops;
  const std::size_t layers = widths.size() - 1;
  const auto gemm = [&](std::string_view name, Pass pass, i64 m, i64 n, i64 k) {
    ops.push_back(Op{.name = name, .kind = OpKind::gemm, .pass = pass, .m = m, .n = n, .k = k,
                     .flops = 2.0 * double(m) * double(n) * double(k),
                     .bytes = e * (double(m) * k + double(k) * n + double(m) * n)});
  };
  const auto memory = [&](std::string_view name, Pass pass, double bytes) {
    ops.push_back(Op{.name = name, .kind = OpKind::memory, .pass = pass, .bytes = bytes});
  };
  for (std::size_t l = 0; l < layers; ++l) {
    const i64 in = widths[l], out = widths[l + 1];
    gemm("linear", Pass::forward, rows, out, in);
    if (l + 1 < layers) memory("relu", Pass::forward, 2 * e * double(rows * out));
  }
  const double logits = e * double(rows * widths.back());
  memory("cross-entropy", Pass::forward, 3 * logits);
  memory("cross-entropy.backward", Pass::backward, 2 * logits);
  for (std::size_t l = layers; l-- > 0;) {
    const i64 in = widths[l], out = widths[l + 1];
    if (l + 1 < layers) memory("relu.backward", Pass::backward, 3 * e * double(rows * out));
    gemm("linear.wgrad", Pass::backward, out, in, rows);        // dW = dYᵀ·X
    memory("bias.grad", Pass::backward, e * double(rows * out + out));
    if (l > 0) gemm("linear.dgrad", Pass::backward, rows, in, out);  // dX = dY·W
  }
  return ops;
}

MlpStepTime predict_mlp_step(const MlpStepSetup& s, const ClusterSpec& host) {
  s.validate();
  const int k = s.ranks;
  const i64 n = mlp_parameters(s.widths);
  const double N = double(n);
  const double shard = std::ceil(N / k);  // the largest rank's shard_span
  // ZeRO-3's units: one layer each, its weight and bias.
  const std::vector<i64> tensors = mlp_tensor_sizes(s.widths);
  std::vector<i64> units;
  for (std::size_t i = 0; i + 1 < tensors.size(); i += 2) units.push_back(tensors[i] + tensors[i + 1]);
  MlpStepTime t;

  const GpuSpec& cpu = host.gpu;
  t.memory_bps = cpu.memory_bps * cpu.kernels.memory_fraction;

  t.compute_s = host_ops_seconds(mlp_ops(s.widths, s.rows), cpu);

  std::vector<Op> grads;
  switch (s.zero_stage) {
    case 0: grads.push_back(stream_op("pack", kCopyStreams, N)); break;
    case 1:
      grads = {stream_op("zero", kFillStreams, N), stream_op("accumulate", 3, N)};
      break;
    case 2:
      grads = {stream_op("zeros", kFillStreams, N), stream_op("accumulate", 3, N),
               stream_op("shard-copy", kCopyStreams, shard)};
      break;
    default:
      for (std::size_t u = 0; u < units.size(); ++u) {
        const double nu = double(units[u]);
        grads.push_back(stream_op("gather-copy", 2 * kCopyStreams, nu));
        // Autograd's way into the flat leaf (Note [host step model]): each of the unit's two
        // parameter views (weight, bias) gets a zeroed n_u gradient with its slice copied in,
        // and the two are summed.
        for (std::size_t p = 2 * u; p < 2 * u + 2; ++p) {
          grads.push_back(stream_op("slice-backward-zeros", kFillStreams, nu));
          grads.push_back(stream_op("slice-backward-copy", kCopyStreams, double(tensors[p])));
        }
        grads.push_back(stream_op("view-gradient-sum", 3, nu));
        grads.push_back(stream_op("shard-copy", kCopyStreams, std::ceil(nu / k)));
      }
  }
  t.gradient_s = host_ops_seconds(grads, cpu);

  std::vector<Op> opt;
  if (s.zero_stage == 0) {
    for (i64 n_tensor : tensors) host_optimizer_ops(s.optimizer, n_tensor, opt);
  } else if (s.zero_stage < 3) {
    host_optimizer_ops(s.optimizer, i64(shard), opt);
  } else {
    for (i64 nu : units) host_optimizer_ops(s.optimizer, (nu + k - 1) / k, opt);
  }
  t.optimizer_s = host_ops_seconds(opt, cpu);

  if (k > 1) {
    t.reduce_link = s.reduce_link.value_or(host.intra_node);
    t.reduce_scatter_link = s.reduce_scatter_link.value_or(t.reduce_link);
    t.all_gather_link = s.all_gather_link.value_or(host.intra_node);
    const auto add = [&](Collective c, double bytes) {
      const LinkSpec& link = c == Collective::all_gather       ? t.all_gather_link
                             : c == Collective::reduce_scatter ? t.reduce_scatter_link
                                                               : t.reduce_link;
      t.comm_s += collective_cost(c, bytes, k, link).seconds;
    };
    if (s.zero_stage == 0) {
      if (s.bucket_bytes.empty()) add(Collective::all_reduce, kFp32 * N);
      for (double b : s.bucket_bytes) add(Collective::all_reduce, b);
    } else if (s.zero_stage < 3) {
      add(Collective::reduce_scatter, kFp32 * N);
      add(Collective::all_gather, kFp32 * N);
    } else {
      for (i64 nu : units) {
        const double bytes = kFp32 * double(nu);
        add(Collective::all_gather, bytes);
        add(Collective::all_gather, bytes);
        add(Collective::reduce_scatter, bytes);
      }
    }
  }
  t.contention = std::max(1.0, double(k) * s.threads_per_rank / s.cores);
  t.comm_exposed_s = t.comm_s;
  if (s.overlap_gradients && s.zero_stage == 0 && k > 1) {
    std::vector<Op> backward = mlp_ops(s.widths, s.rows);
    std::erase_if(backward, [](const Op& op) { return op.pass != Pass::backward; });
    const double backward_s = host_ops_seconds(backward, cpu);
    const double last = collective_cost(Collective::all_reduce,
                                        s.bucket_bytes.empty() ? kFp32 * N : s.bucket_bytes.back(),
                                        k, t.reduce_link)
                            .seconds;
    t.overlapped = true;
    t.overlap_slowdown = s.overlap_slowdown.value_or(kOverlapSlowdown);
    t.comm_exposed_s = gradient_reduction_exposed_s(t.comm_s, last, t.contention * backward_s,
                                                    t.overlap_slowdown);
  }
  t.total_s = t.contention * (t.compute_s + t.gradient_s + t.optimizer_s) + t.comm_exposed_s;
  return t;
}

std::string MlpStepTime::convention() const {
  return "operator model on the calibrated host: contention x (GEMM roofline + streaming passes at " +
         format_number(memory_bps / 1e9) + " GB/s) + alpha-beta collectives" +
         (overlapped ? " exposed beside the backward (last bucket whole, the rest with sigma " +
                           format_number(overlap_slowdown) + "; Note [planner overlap])"
                     : ", no overlap");
}

}  // namespace tally
