// `tally bench ddp`: data-parallel training step time with tally's DistributedDataParallel
// (engine/runtime/ddp_torch.hpp), measured so that PyTorch's own DDP (bench/ddp_peer.py) can be run
// with the same settings and compared line for line (issue 3: "tally must be no slower").
//
// Legend: k = ranks, B = samples per rank per step, widths = {d_0, ..., d_L} of the MLP
// (mlp.hpp: L Linear layers with ReLU between, nn.Linear's init), N = parameters,
// W = warm-up steps, S = timed steps, P = distinct global batches cycled through.
//
// What every rank does (bench/ddp_peer.py does the same, line for line):
//   1. torch threads = `threads` (at::set_num_threads; the peer torch.set_num_threads). Debian's
//      libtorch hands float32 matrix products to OpenBLAS, whose own thread pool ignores that
//      setting: it reads OPENBLAS_NUM_THREADS, which bench/ddp_vs_pytorch.sh sets to `threads`
//      for both sides;
//   2. manual_seed(seed); model = make_mlp(widths) in float32 — the same weights as Python's
//      manual_seed(seed); nn.Sequential(Linear, ReLU, ...);
//   3. DDP over the parameters (broadcast from rank 0; buckets of bucket_cap_bytes, the first in
//      reduction order closed at first_bucket_cap_bytes: PyTorch's plan from its second iteration
//      on, ddp.hpp; the peer sets dist._DEFAULT_FIRST_BUCKET_BYTES to the same value);
//   4. manual_seed(seed + 1); X = randn(P, k·B, d_0), y = randint(0, d_L, (P, k·B)); rank r's
//      batch p is rows [r·B, (r+1)·B) of X[p], y[p] (contiguous copies made before timing);
//   5. for step i in [0, W + S): barrier; t0; loss = cross_entropy(model(x_i), y_i) (mean over
//      the rank's B rows); backward (bucket all-reduces start from the hooks); finish the gradient
//      sync; optimizer step; zero_grad (set_to_none); t1. Batch i is i mod P;
//   6. the step time of step i is the max over ranks of t1 − t0 (all-gathered after the loop, so
//      the exchange never disturbs the timing: nccl-tests' slowest rank, as bench allreduce);
//      median, p10, p90 (linear interpolation between order statistics, numpy's default), min and
//      max over the S timed steps;
//   7. correctness, in the same run: final_loss = cross-entropy of the trained model on all k·B
//      rows of global batch 0 (no grad, every rank alike); param_sum = Σ over parameters of their
//      float64 sums and param_abs_sum = the same of |p|; max_param_diff_vs_rank0 = max |p − p₀|
//      against rank 0's broadcast parameters (0: the replicas stayed equal).
// samples_per_s = k·B / median step time (global samples per second).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tally/engine/bench/harness.hpp"
#include "tally/engine/ddp.hpp"
#include "tally/core/mlp_step.hpp"
#include "tally/engine/dist_env.hpp"

namespace tally::engine {

enum class BenchOptimizer { sgd, adam };
std::string_view to_string(BenchOptimizer o);  // "sgd", "adam"

struct BenchDdpOptions {
  // Note [default bench model]: 512 → 1024 → 1024 → 1024 → 16, N = 2.64 M parameters (10.6 MB of
  // float32 gradients per step); at B = 32 on this 2-core box a step's matrix products and its
  // all-reduce are of the same order, so both compute and communication count.
  std::vector<std::int64_t> widths = {512, 1024, 1024, 1024, 16};
  std::int64_t batch_per_rank = 32;        // B
  double bucket_cap_bytes = kDdpBucketBytes;  // PyTorch's bucket_cap_mb = 25
  double first_bucket_cap_bytes = kDdpFirstBucketBytes;  // dist._DEFAULT_FIRST_BUCKET_BYTES
  int threads = 1;                         // torch intra-op threads per rank
  std::int64_t seed = 1234;                // model init; the data uses seed + 1
  BenchOptimizer optimizer = BenchOptimizer::sgd;
  double lr = 0.01;                        // SGD without momentum, or Adam's defaults with lr
  int warmup_steps = 3;                    // W
  int steps = 20;                          // S
  int data_batches = 4;                    // P
  double timeout_s = 60;                   // rendezvous and every collective
  // Throws InvalidInput naming the flag and value: 2..16 widths each in [1, 65536]; B in
  // [1, 65536]; threads in [1, 256]; W in [0, 10000]; S in [1, 100000]; P in [1, 1024];
  // lr finite > 0; bucket sizes finite > 0; 0 < timeout <= 86400.
  void validate() const;
};

// This rank's phases of a timed step, medians over the timed steps: forward + backward (the
// bucket hooks pack gradients and start all-reduces), the wait in finish_gradient_sync (what the
// all-reduces did not hide), optimizer step + zero_grad. They sum to about the step's time.
struct DdpPhases {
  double forward_backward_s = 0, sync_wait_s = 0, optimizer_s = 0;
};

struct BenchDdpResult {
  int world_size = 1;
  BenchDdpOptions options;
  std::int64_t parameters = 0;          // N
  std::size_t buckets = 0;              // tally's plan for bucket_cap_bytes
  std::vector<double> step_times_s;     // per timed step, the slowest rank's
  TimeStats step;                       // over step_times_s (harness.hpp)
  DdpPhases phases;                     // rank 0's in results (each rank has its own)
  double samples_per_s = 0;             // k·B / step.median_s
  double final_loss = 0;                // see the header comment, step 7
  double param_sum = 0;
  double param_abs_sum = 0;
  double max_param_diff_vs_rank0 = 0;
  DdpStats ddp;                         // over all W + S steps
  bool replicas_equal() const { return max_param_diff_vs_rank0 == 0; }
};

// Runs the benchmark on this rank over its own Comm. Every rank returns the same result. Throws
// InvalidInput for bad env / options, CommError when the group fails.
BenchDdpResult run_bench_ddp(const DistEnv& env, const BenchDdpOptions& options);

}  // namespace tally::engine
