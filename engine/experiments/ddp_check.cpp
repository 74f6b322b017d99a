// `tally run ddp-check` (ddp_check.hpp): the seed's ddp_check.py, step for step.
#include "tally/engine/experiments/ddp_check.hpp"

#include <ATen/ATen.h>

#include <cmath>
#include <sstream>
#include <string>

#include "comm_torch.hpp"
#include "ddp_torch.hpp"
#include "mlp.hpp"
#include "optimizer_torch.hpp"
#include "tally/core/types.hpp"

namespace tally::engine {

namespace {

constexpr std::int64_t kSamples = 64;          // X = randn(64, 16)
constexpr std::size_t kManualParam = 2;        // "2.weight": the second Linear's weight
constexpr double kLr = 0.1;                    // torch.optim.SGD(lr=0.1)

mlp::Mlp build() {  // the seed's build(): fixed seed → the same initial weights on every rank
  at::manual_seed(1234);
  return mlp::make_mlp({16, 32, 4});
}

// A double as a person would write it ("0.5", "1e-06"), for messages.
double norm_of(const at::Tensor& flat) { return flat.norm().item<double>(); }

std::vector<double> to_vector(const at::Tensor& flat_f64) {
  const at::Tensor c = flat_f64.contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

}  // namespace

void DdpCheckOptions::validate() const {
  if (!(timeout_s > 0 && timeout_s <= 86400))
    throw InvalidInput("--timeout = " + format_number(timeout_s) + ": must be in (0, 86400] s");
  DdpOptions{.bucket_cap_bytes = bucket_cap_bytes}.validate();
}

DdpCheckResult run_ddp_check(const DistEnv& env, const DdpCheckOptions& options) {
  options.validate();
  env.validate();
  if (kSamples % env.world_size != 0)
    throw InvalidInput("WORLD_SIZE = " + std::to_string(env.world_size) +
                       ": ddp-check needs a world size dividing its 64 samples (1, 2, 4, 8, ...) so "
                       "every rank's mean loss weighs the same");
  Comm comm(env, {.timeout_s = options.timeout_s});
  const int k = env.world_size, r = env.rank;

  mlp::Mlp model = build();
  const std::vector<at::Tensor> params = model.parameters();
  DistributedDataParallel ddp(comm, params, {.bucket_cap_bytes = options.bucket_cap_bytes});

  at::manual_seed(7);  // fixed data, reproducible
  const at::Tensor X = at::randn({kSamples, 16});
  const at::Tensor y = at::randint(0, 4, {kSamples}, at::kLong);
  const at::Tensor xb = X.slice(0, r, kSamples, k);  // X[rank::world]: 1/world of the batch
  const at::Tensor yb = y.slice(0, r, kSamples, k);
  mlp::Mlp ref = model.clone();  // ref.load_state_dict(model.state_dict()), before any step

  DdpCheckResult res;
  res.rank = r;
  res.world_size = k;
  res.samples = int(xb.size(0));
  res.parameter_names = model.parameter_names();
  res.manual_param = res.parameter_names[kManualParam];
  res.buckets = ddp.buckets().size();
  if (options.include_gradients) res.initial_parameters = to_vector(mlp::flat_values(params));

  const at::Tensor loss = at::cross_entropy_loss(model.forward(xb), yb);
  loss.backward();  // bucket all-reduces start from the hooks, during this call
  res.local_loss = loss.item<double>();
  // Still this rank's own gradients: DDP writes the average only in finish_gradient_sync().
  res.local_grad_norm = norm_of(mlp::flat_grads(params));
  at::Tensor manual = params[kManualParam].grad().clone();
  ddp.finish_gradient_sync();
  res.ddp_grad_norm = norm_of(mlp::flat_grads(params));

  // ① against one process on the full batch (float32, compared as the seed does).
  const at::Tensor full_loss = at::cross_entropy_loss(ref.forward(X), y);
  full_loss.backward();
  res.full_batch_loss = full_loss.item<double>();
  const std::vector<at::Tensor> ref_params = ref.parameters();
  for (std::size_t i = 0; i < params.size(); ++i)
    res.max_grad_error = std::max(
        res.max_grad_error, (params[i].grad() - ref_params[i].grad()).abs().max().item<double>());

  // ④ by hand: dist.all_reduce(g); g /= world.
  all_reduce(comm, manual);
  manual.div_(k);
  res.manual_all_reduce_error = (manual - params[kManualParam].grad()).abs().max().item<double>();
  if (options.include_gradients) {
    res.averaged_gradients = to_vector(mlp::flat_grads(params));
  }

  // ② one SGD step, then every rank's flat parameters against rank 0's.
  sgd_step(params, kLr);
  at::Tensor flat;
  {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> parts;
    for (const auto& p : params) parts.push_back(p.detach().reshape(-1));
    flat = at::cat(parts);
  }
  at::Tensor rank0_flat = flat.clone();
  broadcast(comm, rank0_flat, 0);
  res.max_param_diff_vs_rank0 = (flat - rank0_flat).abs().max().item<double>();

  res.ddp = ddp.stats();
  res.comm = comm.counters();
  return res;
}

}  // namespace tally::engine
