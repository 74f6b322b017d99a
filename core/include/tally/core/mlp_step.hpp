// The step time of the engine's own training runs (`tally run zero`, `tally bench ddp`) predicted
// by the operator model on a calibrated host — issue 10's loop closed on a machine without GPUs:
// calibrate (`tally bench gemm|memory|allreduce`), predict here, measure with the engine, compare.
//
// Legend: d_0 … d_L = the MLP's widths (L Linear layers, ReLU between; engine/runtime/mlp.hpp),
// B = rows per rank per step, k = ranks, N = Σ_l (d_l·d_{l+1} + d_{l+1}) parameters, n_u = one
// layer's, e = 4 bytes (fp32), c = cores, t = threads per rank.
//
// Note [host step model]
//   compute      mlp_ops: per layer the forward GEMM B × d_{l+1}, k = d_l (bias fused, as
//                at::linear's addmm), ReLU (not after the last layer), and backward: dgrad
//                (except layer 0, whose input needs no gradient), wgrad, bias gradient (a
//                reduction over B rows), ReLU backward; cross-entropy (log-softmax + NLL, three
//                passes over B × d_L forward, two backward). Timed by op_seconds (core/roofline)
//                on a GEMM table timed with cold caches, as the step runs them (Note [cold-cache
//                GEMMs], engine/bench/kernels.hpp), one process alone (timing them side by side,
//                as k ranks compute, predicted no better: Note [side-by-side kernels]).
//   gradients    the engine's passes over gradient buffers, per strategy (engine/runtime), a copy
//                into another buffer counted 3 streams (read, read for ownership, write: the
//                write-allocate traffic STREAM's 2-word copy leaves out; this host's bench memory
//                runs copy_ at 1.46–1.76× add_'s time per counted stream), a fill (zero_,
//                at::zeros) 2 (read for ownership, write; bench memory's zero_ column:
//                1.33–1.57× add_'s time per counted stream):
//                  DP (zero_stage0.cpp, bench ddp: ddp.cpp pack) mul_out into the bucket: 3N
//                  ZeRO-1 grad_.zero_() 2N; AccumulateGrad into it (g += g_new) 3N (reduced and
//                         gathered in place: no staging copy)
//                  ZeRO-2 at::zeros 2N; AccumulateGrad 3N; copy_ of the shard 3N/k
//                  ZeRO-3 Gloo's copy of each gathered unit into its buffer, forward and
//                         backward: 6N; copy_ of each gradient shard 3N/k; and autograd's way
//                         into the unit's flat leaf (zero_stage3.cpp: the parameters are
//                         narrow().view() views of it): per parameter view SliceBackward0's
//                         at::zeros(n_u) and copy_ of its slice (libtorch 1.13 slice_backward,
//                         TensorShape.cpp), then the InputBuffer sums the V full-size gradients
//                         (V − 1 adds): (2V + 3 + 3(V − 1))·n_u, 10 n_u for a Linear's weight
//                         and bias — 10N a step
//                (elements; each is read or written once: a "stream").
//   optimizer    torch.optim.Adam's single-tensor step, as engine/runtime/optimizer.cpp writes
//                it: m.mul_ 2, add_ 3, v.mul_ 2, addcmul_ 3, sqrt 2, div_ 2, add_ 2, addcdiv_ 4 —
//                20 streams per element it updates (N for DP, N/k sharded); SGD p.add_ 3.
//                Each is one kernel per parameter tensor (and per 2^20-element chunk).
//   memory       streams × e bytes at the host's DRAM streaming bandwidth (`tally bench memory`:
//                a.add_(b) over its largest working set, the calibration's memory_bytes_per_s).
//                Not the in-cache figure of the same curve, although the step's buffers would fit
//                a large cache: between two passes over a buffer the step's GEMMs stream the rest
//                of the model through the caches. (Measured: bench ddp's SGD step, 3 streams over
//                2.64 M parameters, ran at 55 GB/s where the in-cache add_ reached 112–148 GB/s and
//                the 256 MiB one 57 GB/s.) Each kernel call also pays a fixed cost: the
//                calibration's memory_overhead_s (a.add_ on 16 floats, 0.3 µs here), not the
//                GEMM fit's 10 µs (Note [memory kernel overhead], core/src/operators.cpp).
//   comm         collective_cost on the host's calibrated α–β link (`tally bench allreduce` at
//                the same k): DP one all-reduce per bucket; ZeRO-1/2 a reduce-scatter and an
//                all-gather of S = 4N; ZeRO-3 per layer two all-gathers and a reduce-scatter of
//                4n_u. Each on the fit of the implementation that runs it (Note
//                [per-implementation links] below). After the compute, not beside it — but for
//                DP's buckets under overlap_gradients (overlap, below): `run zero` calls each
//                collective from the step's own thread. Not counted: a rank's wait inside a
//                collective for the last rank to arrive (compute jitter between ranks); `run
//                zero` measures it apart (arrival_wait, Note [arrival wait] in the engine's
//                comm.cpp), so its collectives are compared with this term without it.
//   contention   k·t > c: the compute and memory terms stretch by k·t/c (time-sliced cores); the
//                α–β fit was measured at the same k, so it already includes it.
//   overlap      with overlap_gradients (bench ddp: the engine's DDP launches each bucket's
//                all-reduce from the autograd hooks and waits after the backward, as PyTorch's
//                does), comm is exposed by Note [planner overlap]'s rule
//                (gradient_reduction_exposed_s, core/planner.hpp): the last bucket whole, the rest
//                beside the backward's kernels (contention × their time) with the planner's σ.
//                On this host that is no copy engine but Gloo's threads sending while the rank
//                computes (2026-12-05: bench ddp's sync wait 7.2 ms at k = 2 against 14.0 ms of
//                all-reduce, its forward + backward 1.2 ms longer than at k = 1). Those threads
//                take the compute's cores, so the host hides far less than a GPU's σ = 0.189
//                implies; with a calibration that measured it, σ is the host's own (Note [host
//                overlap], engine/bench/allreduce.cpp).
// total = contention · (compute + gradients + optimizer) + exposed comm.
//
// Note [per-implementation links]
//   The engine's runs call two implementations: Gloo's collectives (bench ddp's reducer, run
//   zero's all-gathers: engine/runtime/comm.cpp) and tally's ring (run zero's all-reduce and
//   reduce-scatter). On this host they differ most in latency: at k = 4 the ring's fitted α made
//   run zero's all-gathers 1.9–2.0 ms a step where Gloo's own fit gives 1.2 (2026-12-05 report,
//   docs/ledgers.md §5). So a setup may name each one's link — `reduce_link` for all-reduce and
//   reduce-scatter, `all_gather_link` for all-gathers — as io::fitted_link refits them from a
//   calibration's labelled points; an unset one is the host's intra_node link. A reduce-scatter
//   and an all-gather are each half an all-reduce's steps and bytes, but a call after compute
//   pays this host's fixed cost whole (Note [sharded collectives] in engine/bench/allreduce.cpp):
//   where the calibration timed them as the run calls them, `reduce_scatter_link` and
//   `all_gather_link` are their own fits (unset reduce_scatter_link = reduce_link).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tally/core/hardware.hpp"
#include "tally/core/operators.hpp"
#include "tally/core/types.hpp"

namespace tally {

struct MlpStepSetup {
  std::vector<std::int64_t> widths;   // d_0 … d_L
  std::int64_t rows = 1;              // B, per rank
  int ranks = 1;                      // k
  int zero_stage = 0;                 // 0 = DP (the reducer), 1–3 ZeRO
  Optimizer optimizer = Optimizer::adam;  // adam or sgd
  std::vector<double> bucket_bytes;   // DP's buckets; empty = one bucket of 4N
  int threads_per_rank = 1;           // t
  int cores = 1;                      // c
  // Note [per-implementation links]: unset = the host's intra_node link.
  std::optional<LinkSpec> reduce_link;          // all-reduce (and reduce-scatter, unless below)
  std::optional<LinkSpec> reduce_scatter_link;  // reduce-scatter; unset = reduce_link
  std::optional<LinkSpec> all_gather_link;      // all-gather
  // DP's buckets reduced while the backward continues (Note [host step model], overlap); the
  // buckets in bucket_bytes are in reduction order, the last one exposed whole.
  bool overlap_gradients = false;
  // σ of Note [overlap contention] for that overlap: how much slower the kernels beside a
  // collective run. Unset = the planner's GPU figure kOverlapSlowdown; a host calibration measures
  // its own (Note [host overlap], engine/bench/allreduce.cpp: io::overlap_slowdown). In [0, 1000].
  std::optional<double> overlap_slowdown;
  void validate() const;              // InvalidInput naming the field
};

struct MlpStepTime {
  double compute_s = 0;               // mlp_ops
  double gradient_s = 0;              // gradient-buffer passes
  double optimizer_s = 0;
  double comm_s = 0;                  // every collective, one after another
  double comm_exposed_s = 0;          // on the critical path: comm_s, less what overlap hides
  bool overlapped = false;            // comm_exposed_s came from the overlap rule
  double overlap_slowdown = 0;        // the σ that rule used (0 when not overlapped)
  double contention = 1;              // max(1, k·t/c)
  double memory_bps = 0;              // the host's streaming bandwidth used
  LinkSpec reduce_link, reduce_scatter_link, all_gather_link;  // comm's links (k >= 2)
  double total_s = 0;
  std::string convention() const;     // one line: what is summed, and the assumptions
};

// The MLP's parameter tensors in registration order (nn.Sequential's 0.weight, 0.bias, 2.weight,
// …): d_l·d_{l+1} and d_{l+1} elements per layer l. The one sizing of the engine's MLP.
std::vector<std::int64_t> mlp_tensor_sizes(const std::vector<std::int64_t>& widths);
// N of Note [host step model]: the sum of mlp_tensor_sizes.
std::int64_t mlp_parameters(const std::vector<std::int64_t>& widths);

// The engine's Adam walks each parameter in chunks of this many elements (engine/runtime/
// optimizer_torch.hpp: its temporaries stay under 8 MiB); each chunk is one call of each kernel.
inline constexpr std::int64_t kAdamChunkElements = std::int64_t(1) << 20;
// The engine's optimizer kernels over one parameter tensor (or flat buffer) of n elements: Adam's
// eight (20 streams per element) per 2^20-element chunk, SGD's one (Note [host step model]).
void host_optimizer_ops(Optimizer o, std::int64_t n, std::vector<Op>& out);
// Σ op_seconds in fp32: the host's kernels one after another.
double host_ops_seconds(const std::vector<Op>& ops, const GpuSpec& gpu);
// The MLP's forward and backward kernels on B rows (act_bytes per element).
std::vector<Op> mlp_ops(const std::vector<std::int64_t>& widths, std::int64_t rows,
                        double act_bytes = 4);
// host: a calibrated host cluster (io::host_cluster: its gpu the CPU, peak = the best measured
// GEMM, memory_bps the DRAM streaming bandwidth, fp32).
MlpStepTime predict_mlp_step(const MlpStepSetup& s, const ClusterSpec& host);

}  // namespace tally
