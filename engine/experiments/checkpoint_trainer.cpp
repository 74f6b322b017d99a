// One rank's training state in `tally run checkpoint` (checkpoint_trainer.hpp).
#include "checkpoint_trainer.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "comm_torch.hpp"
#include "rng_state.hpp"
#include "tally/core/model_states.hpp"
#include "tally/core/types.hpp"
#include "run_helpers.hpp"

namespace tally::engine::checkpoint_run {

namespace {
constexpr std::uint64_t kDataSeedSalt = 0x5EEDDA7A5EEDDA7AULL;  // data generator ≠ model generator

void assign_flat(const std::vector<at::Tensor>& params, const at::Tensor& flat) {
  at::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (const auto& p_const : params) {
    at::Tensor p = p_const;
    p.copy_(flat.narrow(0, offset, p.numel()).view_as(p));
    offset += p.numel();
  }
}

bool bit_equal(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == cb.nbytes() && std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

}  // namespace


fs::path normalized(const fs::path& dir) {
  fs::path p = dir.lexically_normal();
  if (p.filename().empty() && p.has_parent_path()) p = p.parent_path();
  return p;
}

at::Tensor flat_params(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> parts;
  for (const auto& p : params) parts.push_back(p.detach().reshape(-1));
  return at::cat(parts);
}

Dataset make_dataset(const CheckpointRunOptions& o) {
  at::Generator gen = at::detail::createCPUGenerator(o.seed ^ kDataSeedSalt);
  Dataset d;
  d.x = at::randn({o.dataset_samples, o.widths.front()}, gen);
  const at::Tensor teacher = at::randn({o.widths.front(), o.widths.back()}, gen);
  d.y = at::matmul(d.x, teacher).argmax(1);
  return d;
}

Trainer::Trainer(const CheckpointRunOptions& options, int world_size, int rank)
    : o(options), k(world_size), r(rank), dir(normalized(options.dir)),
      schedule{.lr = options.lr,
               .min_lr = options.min_lr,
               .warmup_steps = options.warmup_steps,
               .total_steps = options.schedule_steps},
      stream(options.seed, options.dataset_samples) {
  at::manual_seed(o.seed);
  model = mlp::make_mlp(o.widths);
  params = model.parameters();
  const std::vector<std::string> names = model.parameter_names();
  for (std::size_t i = 0; i < params.size(); ++i) {
    layout.emplace_back(names[i], params[i].sizes().vec());
    n_params += params[i].numel();
  }
  adam = Adam(params, {.lr = o.lr});
  data = make_dataset(o);
}

std::vector<std::int64_t> Trainer::batch_indices(std::int64_t position) {
  std::vector<std::int64_t> idx(std::size_t(o.global_batch));
  for (std::int64_t i = 0; i < o.global_batch; ++i) idx[std::size_t(i)] = stream.at(position + i);
  return idx;
}

std::vector<FlatGroupData> Trainer::groups() const {
  return {{kGroups[0], layout, flat_params(params)},
          {kGroups[1], layout, adam.flat_m()},
          {kGroups[2], layout, adam.flat_v()}};
}

io::CheckpointIndex Trainer::state_index() const {
  io::CheckpointIndex x;
  x.step = step;
  x.consumed_samples = consumed;
  x.seed = o.seed;
  x.rng_state = generator_state_hex();
  x.lr_schedule = schedule.state_at(step);
  return x;
}

void Trainer::check_compatible(const io::CheckpointIndex& x) const {
  const std::string source = (dir / "index.json").string();
  if (x.seed != o.seed)
    throw InvalidInput("--seed = " + std::to_string(o.seed) + " vs " + source + " seed = " +
                       std::to_string(x.seed) + ": a resume keeps the run's seed");
  const io::LrScheduleState want = schedule.state_at(x.step);
  if (!same_schedule(want, x.lr_schedule))
    throw InvalidInput(source + ": lr_schedule (" + x.lr_schedule.name + ", lr " +
                       format_number(x.lr_schedule.base_lr) + ", warm-up " +
                       std::to_string(x.lr_schedule.warmup_steps) + ", " +
                       std::to_string(x.lr_schedule.total_steps) + " steps, min " +
                       format_number(x.lr_schedule.min_lr) + ") vs this run's (" + want.name + ", " +
                       format_number(want.base_lr) + ", " + std::to_string(want.warmup_steps) + ", " +
                       std::to_string(want.total_steps) + ", " + format_number(want.min_lr) +
                       "): pass the checkpoint's --lr/--warmup/--schedule-steps/--min-lr");
  const io::FlatGroup want_group =
      io::make_flat_group(kGroups[0], io::TensorDType::f32, layout, x.world_size);
  for (const std::string& name : kGroups) {
    const io::FlatGroup& g = *x.find_group(name);
    bool same = g.numel == want_group.numel && g.tensors.size() == want_group.tensors.size();
    for (std::size_t i = 0; same && i < g.tensors.size(); ++i)
      same = g.tensors[i].name == want_group.tensors[i].name &&
             g.tensors[i].shape == want_group.tensors[i].shape &&
             g.tensors[i].offset == want_group.tensors[i].offset;
    if (!same)
      throw InvalidInput(source + ": group \"" + name + "\" holds " + std::to_string(g.numel) +
                         " elements in " + std::to_string(g.tensors.size()) +
                         " tensors vs this model's " + std::to_string(want_group.numel) + " in " +
                         std::to_string(want_group.tensors.size()) +
                         ": the checkpoint is of another model (--widths)");
  }
}

std::optional<LoadOutcome> Trainer::load(Comm& comm) {
  std::optional<LoadOutcome> loaded = load_sharded(comm, dir, kGroups);
  if (!loaded) return loaded;
  check_compatible(loaded->index);
  assign_flat(params, loaded->flats[0]);
  adam.load_moments(loaded->flats[1], loaded->flats[2]);
  adam.set_steps(loaded->index.step);
  set_generator_state_hex(loaded->index.rng_state, (dir / "index.json").string() + ": rng_state");
  step = loaded->index.step;
  consumed = loaded->index.consumed_samples;
  return loaded;
}

StepRecord Trainer::take_step(DistributedDataParallel& ddp, Comm& comm,
                              const std::vector<std::int64_t>& batch, const std::function<void()>& mid_step) {
  const std::int64_t t = step + 1;
  const std::int64_t a = o.grad_accum, rows = o.global_batch / k, micro = rows / a;
  const at::Tensor idx =
      at::from_blob(const_cast<std::int64_t*>(batch.data()), {o.global_batch}, at::kLong)
          .slice(0, r, o.global_batch, k)
          .clone();
  // Masks for the whole global batch, so every rank draws the same numbers (one generator state,
  // the same whatever k and a).
  std::vector<at::Tensor> masks;
  if (o.dropout > 0) {
    const double keep = 1 - o.dropout;
    for (std::size_t l = 1; l + 1 < o.widths.size(); ++l)
      masks.push_back(at::empty({o.global_batch, o.widths[l]}, at::kFloat)
                          .bernoulli_(keep)
                          .slice(0, r, o.global_batch, k)
                          .div_(keep));
  }
  double rank_loss = 0;  // the mean of this rank's micro-batch means
  for (std::int64_t j = 0; j < a; ++j) {
    const at::Tensor micro_idx = idx.narrow(0, j * micro, micro);
    std::vector<at::Tensor> micro_masks;
    for (const at::Tensor& m : masks) micro_masks.push_back(m.narrow(0, j * micro, micro));
    at::Tensor loss = at::cross_entropy_loss(
        model.forward(data.x.index_select(0, micro_idx), micro_masks),
        data.y.index_select(0, micro_idx));
    if (j == 0 && mid_step) mid_step();
    if (a > 1) loss = loss / double(a);  // the gradient of the mean over the a micro-batches
    rank_loss += loss.item<double>();
    if (j + 1 < a) {
      auto no_sync = ddp.no_sync();
      loss.backward();
    } else {
      loss.backward();
    }
  }
  ddp.finish_gradient_sync();
  StepRecord rec;
  rec.step = t;
  rec.grad_norm = mlp::flat_grads(params).norm().item<double>();
  rec.lr = schedule.lr_at(t);
  adam.step_at(rec.lr);
  zero_grad(params);
  std::vector<double> global_loss = {rank_loss};
  comm.all_reduce(global_loss, ReduceOp::average);
  rec.loss = global_loss[0];
  step = t;
  consumed += o.global_batch;
  rec.consumed_samples = consumed;
  rec.end_unix_s = unix_now();
  return rec;
}

std::pair<double, double> Trainer::reference_loss_and_grad_norm() {
  const std::int64_t n = std::min(kConsistencySamples, o.dataset_samples);
  const at::Tensor loss = at::cross_entropy_loss(model.forward(data.x.narrow(0, 0, n), {}),
                                                 data.y.narrow(0, 0, n));
  const std::vector<at::Tensor> grads = torch::autograd::grad({loss}, params);
  std::vector<at::Tensor> flat;
  for (const at::Tensor& g : grads) flat.push_back(g.reshape(-1));
  return {loss.item<double>(), at::cat(flat).norm().item<double>()};
}

void Trainer::perturb_weights() {
  at::NoGradGuard no_grad;
  float* w = params.front().data_ptr<float>();
  std::uint32_t bits = 0;
  std::memcpy(&bits, w, sizeof bits);
  bits ^= 1u << 15;  // a mantissa bit: the weight changes by 2^-8 of itself
  std::memcpy(w, &bits, sizeof bits);
}

bool Trainer::is_save_step(std::int64_t s) const {
  return s == o.steps || (o.save_every > 0 && s % o.save_every == 0);
}

RoundTrip Trainer::roundtrip(Comm& comm) {
  RoundTrip rt;
  rt.done = true;
  const at::Tensor p0 = flat_params(params).clone(), m0 = adam.flat_m().clone(),
                   v0 = adam.flat_v().clone();
  const std::string rng0 = generator_state_hex();
  const io::LrScheduleState schedule0 = schedule.state_at(step);
  rt.step_saved = step;
  rt.consumed_saved = consumed;
  rt.seed_saved = o.seed;
  {
    at::NoGradGuard no_grad;
    for (const auto& p_const : params) at::Tensor(p_const).zero_();
    adam.load_moments(at::zeros_like(m0), at::zeros_like(v0));
  }
  step = consumed = 0;
  const std::optional<LoadOutcome> loaded = load(comm);
  TALLY_INVARIANT(loaded.has_value());
  const at::Tensor p1 = flat_params(params);
  rt.params_bit_exact = bit_equal(p0, p1);
  const at::Tensor m1 = adam.flat_m(), v1 = adam.flat_v();
  rt.optimizer_bit_exact = bit_equal(m0, m1) && bit_equal(v0, v1);
  rt.max_abs_diff = std::max({(p0 - p1).abs().max().item<double>(),
                              (m0 - m1).abs().max().item<double>(),
                              (v0 - v1).abs().max().item<double>()});
  const io::CheckpointIndex& x = loaded->index;
  rt.step_read = x.step;
  rt.consumed_read = x.consumed_samples;
  rt.seed_read = x.seed;
  rt.rng_state_equal = x.rng_state == rng0;
  rt.lr_schedule_equal = same_schedule(x.lr_schedule, schedule0);
  for (const io::ShardFile& f : x.files) rt.shard_bytes_on_disk += double(fs::file_size(dir / f.name));
  rt.index_bytes_on_disk = double(fs::file_size(dir / "index.json")) +
                           double(fs::file_size(dir / kIndexChecksumName));
  // The prediction: core's fp32 Adam model states (params + grads + m + v) without the grads.
  const ModelStateResult ms =
      model_states(double(n_params), {.precision = Precision::fp32, .optimizer = Optimizer::adam});
  rt.predicted_bytes = ms.bytes.total() - ms.bytes.grads;
  rt.full_copy_bytes = double(k) * rt.predicted_bytes;
  rt.convention = ms.convention() + " | saved: params + m + v, gradients not saved";
  return rt;
}

}  // namespace tally::engine::checkpoint_run
