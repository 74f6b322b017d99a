// `tally run grad-accum` (grad_accum.hpp): the seed's grads_of() on tally's DDP, float64.
#include "tally/engine/experiments/grad_accum.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <numeric>
#include <sstream>
#include <string>

#include "comm_torch.hpp"
#include "ddp_torch.hpp"
#include "mlp.hpp"
#include "optimizer_torch.hpp"
#include "tally/core/types.hpp"

namespace tally::engine {

namespace {

constexpr std::int64_t kAccumSamples = 64;
constexpr int kWindow = 5;  // ④: mean of the first and of the last 5 step losses

// One rank's slice of the data and its K micro-batches.
struct Shard {
  at::Tensor x, y;  // rows rank, rank + k, ...
  int K = 1;
  at::Tensor micro_x(int j) const { return x.slice(0, j, x.size(0), K); }
  at::Tensor micro_y(int j) const { return y.slice(0, j, y.size(0), K); }
};

// The seed's grads_of() through DDP: micro-batches 0..K−2 backward inside no_sync(), the last one
// synchronizes. Returns the flat averaged gradient and counts the backward calls.
at::Tensor grads_of(DistributedDataParallel& ddp, const mlp::Mlp& model, const Shard& s, int K,
                    bool normalize, std::int64_t* backward_calls = nullptr,
                    double* loss_sum = nullptr) {
  const std::vector<at::Tensor>& params = ddp.parameters();
  zero_grad(params);
  const Shard micro{.x = s.x, .y = s.y, .K = K};
  for (int j = 0; j < K; ++j) {
    const at::Tensor loss = at::cross_entropy_loss(model.forward(micro.micro_x(j)), micro.micro_y(j));
    const at::Tensor scaled = normalize ? loss / K : loss;  // normalize by the effective batch
    if (j + 1 < K) {
      auto scope = ddp.no_sync();
      scaled.backward();
    } else {
      scaled.backward();
    }
    if (backward_calls != nullptr) *backward_calls += 1;
    if (loss_sum != nullptr) *loss_sum += loss.item<double>() / K;
  }
  ddp.finish_gradient_sync();
  return mlp::flat_grads(params);
}

// A double as a person would write it ("0.5", "1e-06"), for messages.
double max_abs(const at::Tensor& t) { return t.abs().max().item<double>(); }

}  // namespace

void GradAccumOptions::validate(int world_size) const {
  if (!(timeout_s > 0 && timeout_s <= 86400))
    throw InvalidInput("--timeout = " + format_number(timeout_s) + ": must be in (0, 86400] s");
  if (micro_batches < 1 || micro_batches > kAccumSamples)
    throw InvalidInput("--micro-batches = " + std::to_string(micro_batches) +
                       ": must be in [1, 64]");
  if (steps < 2 * kWindow || steps > 100000)
    throw InvalidInput("--steps = " + std::to_string(steps) +
                       ": must be in [10, 100000] (the loss check compares the first and last 5)");
  if (counted_steps < 1 || counted_steps > steps)
    throw InvalidInput("--counted-steps = " + std::to_string(counted_steps) + ": must be in [1, " +
                       std::to_string(steps) + "] (--steps)");
  if (!(lr > 0) || !std::isfinite(lr))
    throw InvalidInput("--lr = " + format_number(lr) + ": must be finite and > 0");
  DdpOptions{.bucket_cap_bytes = bucket_cap_bytes}.validate();
  if (kAccumSamples % (std::int64_t(world_size) * micro_batches) != 0)
    throw InvalidInput("WORLD_SIZE × --micro-batches = " + std::to_string(world_size) + " × " +
                       std::to_string(micro_batches) +
                       " does not divide the 64 samples: micro-batches of unequal size would "
                       "not average to the full-batch gradient");
}

GradAccumResult run_grad_accum(const DistEnv& env, const GradAccumOptions& options) {
  env.validate();
  options.validate(env.world_size);
  Comm comm(env, {.timeout_s = options.timeout_s});
  const int k = env.world_size, r = env.rank, K = options.micro_batches;

  at::manual_seed(1234);
  const mlp::Mlp model = mlp::make_mlp({16, 32, 4}, at::kDouble);
  DistributedDataParallel ddp(comm, model.parameters(),
                              {.bucket_cap_bytes = options.bucket_cap_bytes});
  at::manual_seed(7);
  const at::Tensor X = at::randn({kAccumSamples, 16}).to(at::kDouble);
  const at::Tensor y = at::randint(0, 4, {kAccumSamples}, at::kLong);
  const Shard shard{.x = X.slice(0, r, kAccumSamples, k), .y = y.slice(0, r, kAccumSamples, k),
                    .K = K};

  GradAccumResult res;
  res.rank = r;
  res.world_size = k;
  res.micro_batches = K;
  res.micro_batch_samples = int(kAccumSamples / (k * K));
  res.counted_steps = options.counted_steps;
  res.buckets = ddp.buckets().size();

  // ① and ②: gradients only, no step.
  const at::Tensor g_acc = grads_of(ddp, model, shard, K, /*normalize=*/true);
  const at::Tensor g_big = grads_of(ddp, model, shard, 1, /*normalize=*/true);
  const at::Tensor g_raw = grads_of(ddp, model, shard, K, /*normalize=*/false);
  mlp::Mlp ref = model.clone();  // one process, every row at once
  at::cross_entropy_loss(ref.forward(X), y).backward();
  const at::Tensor g_full = mlp::flat_grads(ref.parameters());
  res.max_accum_vs_big_batch = max_abs(g_acc - g_big);
  res.max_accum_vs_full_batch = max_abs(g_acc - g_full);
  res.unnormalized_relative_error = max_abs(g_raw - K * g_big) / max_abs(K * g_big);

  // ③ ④ ⑤: training; the counters cover exactly this window.
  ddp.reset_stats();
  comm.reset_counters();
  std::vector<double> losses;
  for (int step = 0; step < options.steps; ++step) {
    double loss = 0;
    grads_of(ddp, model, shard, K, /*normalize=*/true, &res.backward_calls, &loss);
    sgd_step(ddp.parameters(), options.lr);
    res.optimizer_steps += 1;  // the step counter the seed wraps around optimizer.step
    losses.push_back(loss);
    if (step + 1 == options.counted_steps) {
      res.optimizer_steps_counted = res.optimizer_steps;
      res.backward_calls_counted = res.backward_calls;
      res.ddp_backward_passes_counted = ddp.stats().backward_passes;
    }
  }
  res.ddp = ddp.stats();
  res.comm_all_reduce_calls = comm.counters()[Collective::all_reduce].calls;
  res.gradient_bytes_per_optimizer_step = res.ddp.gradient_bytes_sent / double(res.optimizer_steps);

  // The global loss of each step: one all-reduce, after the counters were read.
  at::Tensor loss_t = at::tensor(losses, at::kDouble);
  all_reduce(comm, loss_t, ReduceOp::average);
  res.step_losses.assign(loss_t.data_ptr<double>(), loss_t.data_ptr<double>() + loss_t.numel());
  const auto& L = res.step_losses;
  res.first5_mean_loss = std::accumulate(L.begin(), L.begin() + kWindow, 0.0) / kWindow;
  res.last5_mean_loss = std::accumulate(L.end() - kWindow, L.end(), 0.0) / kWindow;
  return res;
}

}  // namespace tally::engine
