// `tally bench ddp` (bench/ddp.hpp holds the legend and the step-by-step contract that
// bench/ddp_peer.py mirrors for PyTorch's DistributedDataParallel).
#include "tally/engine/bench/ddp.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <sstream>
#include <string>

#include "comm_torch.hpp"
#include "ddp_torch.hpp"
#include "mlp.hpp"
#include "optimizer_torch.hpp"
#include "tally/core/types.hpp"

namespace tally::engine {

namespace {

constexpr std::int64_t kMaxWidth = 65536;
constexpr std::size_t kMinWidths = 2, kMaxWidths = 16;

[[noreturn]] void bad(const std::string& flag, double value, const std::string& allowed) {
  std::ostringstream os;
  os << flag << " = " << value << ": " << allowed;
  throw InvalidInput(os.str());
}

// One rank's fixed data: P batches of B rows, contiguous, made before any timing.
struct RankData {
  std::vector<at::Tensor> x;  // P × [B, d_0] float32
  std::vector<at::Tensor> y;  // P × [B] int64, classes in [0, d_L)
  at::Tensor eval_x, eval_y;  // global batch 0: [k·B, d_0], [k·B]
};

// Step 4 of the header: the same generator calls as the peer's torch.randn / torch.randint.
RankData make_data(const BenchDdpOptions& o, int rank, int k) {
  const std::int64_t B = o.batch_per_rank, global = B * k;
  at::manual_seed(o.seed + 1);
  const at::Tensor X = at::randn({o.data_batches, global, o.widths.front()});
  const at::Tensor Y = at::randint(0, o.widths.back(), {o.data_batches, global}, at::kLong);
  RankData d;
  for (std::int64_t p = 0; p < o.data_batches; ++p) {
    d.x.push_back(X[p].narrow(0, rank * B, B).contiguous());
    d.y.push_back(Y[p].narrow(0, rank * B, B).contiguous());
  }
  d.eval_x = X[0].contiguous();
  d.eval_y = Y[0].contiguous();
  return d;
}

// The optimizer of the options, behind one step() / zero_grad().
class Optimizer {
 public:
  Optimizer(const BenchDdpOptions& o, const std::vector<at::Tensor>& params)
      : params_(params), lr_(o.lr) {
    if (o.optimizer == BenchOptimizer::adam)
      adam_ = std::make_unique<Adam>(params, AdamOptions{.lr = o.lr});
  }
  void step() {
    if (adam_)
      adam_->step();
    else
      sgd_step(params_, lr_);  // torch.optim.SGD(lr), no momentum
  }
  void zero_grad() { engine::zero_grad(params_); }  // set_to_none, as the peer's zero_grad(True)

 private:
  std::vector<at::Tensor> params_;
  double lr_;
  std::unique_ptr<Adam> adam_;
};

// Step 7: loss on global batch 0, checksums, and the largest difference from rank 0's parameters.
void check_result(Comm& comm, const mlp::Mlp& model, const RankData& d, BenchDdpResult& r) {
  at::NoGradGuard no_grad;
  r.final_loss = at::cross_entropy_loss(model.forward(d.eval_x), d.eval_y).item<double>();
  std::vector<at::Tensor> flat_parts;
  for (const at::Tensor& p : model.parameters()) {
    const at::Tensor p64 = p.detach().to(at::kDouble);
    r.param_sum += p64.sum().item<double>();
    r.param_abs_sum += p64.abs().sum().item<double>();
    flat_parts.push_back(p.detach().reshape(-1));
  }
  const at::Tensor flat = at::cat(flat_parts);
  at::Tensor rank0 = flat.clone();
  broadcast(comm, rank0, 0);
  std::vector<double> diff{(flat - rank0).abs().max().item<double>()};
  comm.all_reduce(diff);  // k ≥ 1 non-negative values: zero iff every rank's is zero
  r.max_param_diff_vs_rank0 = diff[0];
}

}  // namespace

std::string_view to_string(BenchOptimizer o) { return o == BenchOptimizer::adam ? "adam" : "sgd"; }

void BenchDdpOptions::validate() const {
  if (widths.size() < kMinWidths || widths.size() > kMaxWidths)
    bad("--widths count", double(widths.size()), "must list 2 to 16 widths (d_0 ... d_L)");
  for (std::int64_t w : widths)
    if (w < 1 || w > kMaxWidth) bad("--widths entry", double(w), "must be in [1, 65536]");
  if (widths.back() < 2) bad("--widths last", double(widths.back()), "the classes: must be >= 2");
  if (batch_per_rank < 1 || batch_per_rank > 65536)
    bad("--batch", double(batch_per_rank), "must be in [1, 65536] samples per rank");
  if (threads < 1 || threads > 256) bad("--threads", threads, "must be in [1, 256]");
  if (warmup_steps < 0 || warmup_steps > 10000) bad("--warmup", warmup_steps, "must be in [0, 10000]");
  if (steps < 1 || steps > 100000) bad("--steps", steps, "must be in [1, 100000]");
  if (data_batches < 1 || data_batches > 1024)
    bad("--data-batches", data_batches, "must be in [1, 1024]");
  if (!(lr > 0) || !std::isfinite(lr)) bad("--lr", lr, "must be finite and > 0");
  if (!(bucket_cap_bytes > 0) || !std::isfinite(bucket_cap_bytes))
    bad("--bucket-mb", bucket_cap_bytes / kMiB, "must be finite and > 0 MiB");
  if (!(first_bucket_cap_bytes > 0) || !std::isfinite(first_bucket_cap_bytes))
    bad("--first-bucket-mb", first_bucket_cap_bytes / kMiB, "must be finite and > 0 MiB");
  if (!(timeout_s > 0 && timeout_s <= 86400)) bad("--timeout", timeout_s, "must be in (0, 86400] s");
}

BenchDdpResult run_bench_ddp(const DistEnv& env, const BenchDdpOptions& o) {
  o.validate();
  env.validate();
  at::set_num_threads(o.threads);  // step 1
  Comm comm(env, {.timeout_s = o.timeout_s});
  const int k = comm.world_size();

  at::manual_seed(o.seed);  // step 2
  const mlp::Mlp model = mlp::make_mlp(o.widths);
  const std::vector<at::Tensor> params = model.parameters();
  DistributedDataParallel ddp(comm, params,  // step 3
                              {.bucket_cap_bytes = o.bucket_cap_bytes,
                               .first_bucket_cap_bytes = o.first_bucket_cap_bytes});
  const RankData data = make_data(o, comm.rank(), k);                                  // step 4
  Optimizer optimizer(o, params);

  // Steps 5 and 6 on the harness: barrier, time one step, the slowest rank's time per step; and
  // this rank's phases of each timed step.
  using clock = std::chrono::steady_clock;
  const auto seconds = [](clock::time_point a, clock::time_point b) {
    return std::chrono::duration<double>(b - a).count();
  };
  std::vector<double> forward_backward, sync_wait, optimizer_s;
  const TimedLoopResult timed = run_timed_loop(
      comm, {.warmup_iters = o.warmup_steps,
             .iters = o.steps,
             .run = [&](int i) {
               const auto t0 = clock::now();
               const std::size_t p = std::size_t(i % o.data_batches);
               const at::Tensor loss = at::cross_entropy_loss(model.forward(data.x[p]), data.y[p]);
               loss.backward();
               const auto t1 = clock::now();
               ddp.finish_gradient_sync();
               const auto t2 = clock::now();
               optimizer.step();
               optimizer.zero_grad();
               if (i >= o.warmup_steps) {
                 forward_backward.push_back(seconds(t0, t1));
                 sync_wait.push_back(seconds(t1, t2));
                 optimizer_s.push_back(seconds(t2, clock::now()));
               }
             }});

  BenchDdpResult r{.world_size = k,
                   .options = o,
                   .parameters = mlp_parameters(o.widths),
                   .buckets = ddp.buckets().size()};
  r.step_times_s = timed.slowest_s;
  r.step = timed.time;
  r.phases = {.forward_backward_s = time_stats(forward_backward).median_s,
              .sync_wait_s = time_stats(sync_wait).median_s,
              .optimizer_s = time_stats(optimizer_s).median_s};
  r.samples_per_s = r.step.median_s > 0 ? double(k * o.batch_per_rank) / r.step.median_s : 0.0;
  r.ddp = ddp.stats();
  check_result(comm, model, data, r);  // step 7
  return r;
}

}  // namespace tally::engine
