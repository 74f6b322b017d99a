// `tally run checkpoint` (tally/engine/experiments/checkpoint.hpp): DDP training of a small MLP with Adam,
// sharded checkpoints through sharded_checkpoint.hpp, exact resume, fault injection.
#include "tally/engine/experiments/checkpoint.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <sstream>
#include <system_error>

#include "comm_torch.hpp"
#include "ddp_torch.hpp"
#include "mlp.hpp"
#include "rank_liveness.hpp"
#include "sharded_checkpoint.hpp"
#include "tally/core/model_states.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/comm.hpp"

namespace tally::engine {

namespace fs = std::filesystem;

namespace {

// torch.optim.Adam's defaults.
constexpr double kBeta1 = 0.9;
constexpr double kBeta2 = 0.999;
constexpr double kEps = 1e-8;
constexpr const char* kScheduleName = "warmup-cosine";
constexpr std::uint64_t kDataSeedSalt = 0x5EEDDA7A5EEDDA7AULL;  // data generator ≠ model generator
constexpr double kLostRankProbe_s = 1.0;  // Note [liveness locks]: how long to look for the dead
const std::vector<std::string> kGroups = {"params", "adam.m", "adam.v"};

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// "<dir>" without a trailing separator, so <dir>.ranks names a sibling.
fs::path normalized(const fs::path& dir) {
  fs::path p = dir.lexically_normal();
  if (p.filename().empty() && p.has_parent_path()) p = p.parent_path();
  return p;
}

// ---- the sample stream (Note [sample stream]) ----

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

class SampleStream {
 public:
  SampleStream(std::uint64_t seed, std::int64_t n) : seed_(seed), n_(n) {}
  std::int64_t at(std::int64_t position) {
    const std::int64_t epoch = position / n_;
    if (epoch != epoch_) shuffle(epoch);
    return perm_[std::size_t(position % n_)];
  }

 private:
  // Fisher–Yates; the modulo's bias (< n / 2^64) is immaterial here.
  void shuffle(std::int64_t epoch) {
    perm_.resize(std::size_t(n_));
    std::iota(perm_.begin(), perm_.end(), std::int64_t{0});
    std::uint64_t state = seed_;
    state = splitmix64(state) ^ (std::uint64_t(epoch) * 0xD1B54A32D192ED03ULL);
    for (std::int64_t i = n_ - 1; i > 0; --i) {
      const auto j = std::int64_t(splitmix64(state) % std::uint64_t(i + 1));
      std::swap(perm_[std::size_t(i)], perm_[std::size_t(j)]);
    }
    epoch_ = epoch;
  }
  std::uint64_t seed_;
  std::int64_t n_;
  std::int64_t epoch_ = -1;
  std::vector<std::int64_t> perm_;
};

// ---- data, model, optimizer, schedule ----

struct Dataset {
  at::Tensor x;  // [n, widths[0]] float32
  at::Tensor y;  // [n] int64 class labels
};

Dataset make_dataset(const CheckpointRunOptions& o) {
  at::Generator gen = at::detail::createCPUGenerator(o.seed ^ kDataSeedSalt);
  Dataset d;
  d.x = at::randn({o.dataset_samples, o.widths.front()}, gen);
  const at::Tensor teacher = at::randn({o.widths.front(), o.widths.back()}, gen);
  d.y = at::matmul(d.x, teacher).argmax(1);
  return d;
}

// The MLP's forward pass with dropout masks (already scaled by 1/(1 − p)) after each hidden ReLU.
at::Tensor forward(const mlp::Mlp& m, const at::Tensor& x, const std::vector<at::Tensor>& masks) {
  at::Tensor h = x;
  for (std::size_t l = 0; l < m.weights.size(); ++l) {
    h = at::linear(h, m.weights[l], m.biases[l]);
    if (l + 1 < m.weights.size()) {
      h = at::relu(h);
      if (!masks.empty()) h = h * masks[l];
    }
  }
  return h;
}

// Adam over flat fp32 m and v (torch.optim.Adam with amsgrad = false, weight_decay = 0); step t
// is 1-based, the learning rate comes from the schedule.
struct FlatAdam {
  at::Tensor m, v;  // [N] float32
  void step(const std::vector<at::Tensor>& params, std::int64_t t, double lr) {
    at::NoGradGuard no_grad;
    const double bias_correction1 = 1 - std::pow(kBeta1, double(t));
    const double bias_correction2_sqrt = std::sqrt(1 - std::pow(kBeta2, double(t)));
    std::int64_t offset = 0;
    for (const at::Tensor& p_const : params) {
      at::Tensor p = p_const;
      const std::int64_t n = p.numel();
      at::Tensor mm = m.narrow(0, offset, n).view_as(p);
      at::Tensor vv = v.narrow(0, offset, n).view_as(p);
      const at::Tensor& g = p.grad();
      mm.mul_(kBeta1).add_(g, 1 - kBeta1);
      vv.mul_(kBeta2).addcmul_(g, g, 1 - kBeta2);
      const at::Tensor denom = (vv.sqrt() / bias_correction2_sqrt).add_(kEps);
      p.addcdiv_(mm, denom, -lr / bias_correction1);
      offset += n;
    }
  }
};

// Learning rate of step t (1-based): lr·t/W for t ≤ W, then cosine from lr down to min_lr at
// t = T (schedule_steps), min_lr after.
double lr_at(const CheckpointRunOptions& o, std::int64_t t) {
  if (t <= 0) return 0;
  if (t <= o.warmup_steps) return o.lr * double(t) / double(o.warmup_steps);
  if (t >= o.schedule_steps) return o.min_lr;
  const double progress =
      double(t - o.warmup_steps) / double(std::max<std::int64_t>(1, o.schedule_steps - o.warmup_steps));
  return o.min_lr + (o.lr - o.min_lr) * 0.5 * (1 + std::cos(M_PI * progress));
}

io::LrScheduleState schedule_state(const CheckpointRunOptions& o, std::int64_t step) {
  return {.name = kScheduleName,
          .step = step,
          .base_lr = o.lr,
          .lr = lr_at(o, step),
          .warmup_steps = o.warmup_steps,
          .total_steps = o.schedule_steps,
          .min_lr = o.min_lr};
}

bool same_schedule(const io::LrScheduleState& a, const io::LrScheduleState& b) {
  return a.name == b.name && a.step == b.step && a.base_lr == b.base_lr && a.lr == b.lr &&
         a.warmup_steps == b.warmup_steps && a.total_steps == b.total_steps && a.min_lr == b.min_lr;
}

at::Tensor flat_params(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> parts;
  for (const auto& p : params) parts.push_back(p.detach().reshape(-1));
  return at::cat(parts);
}

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

// ---- the default generator's state as hex (index.json's rng_state) ----

std::string generator_state_hex() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get_state();
  }
  static constexpr char kHex[] = "0123456789abcdef";
  const auto* p = state.data_ptr<std::uint8_t>();
  std::string hex;
  hex.reserve(std::size_t(state.numel()) * 2);
  for (std::int64_t i = 0; i < state.numel(); ++i) {
    hex += kHex[p[i] >> 4];
    hex += kHex[p[i] & 15];
  }
  return hex;
}

void set_generator_state_hex(const std::string& hex, const fs::path& dir) {
  const std::string source = (dir / "index.json").string() + ": rng_state";
  const auto digit = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  if (hex.empty() || hex.size() % 2 != 0)
    throw InvalidInput(source + " = " + std::to_string(hex.size()) +
                       " characters: must be the hex of torch's CPU generator state");
  at::Tensor state = at::empty({std::int64_t(hex.size() / 2)}, at::kByte);
  auto* p = state.data_ptr<std::uint8_t>();
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0)
      throw InvalidInput(source + ": character " + std::to_string(i) +
                         " is not a lower-case hex digit");
    p[i / 2] = std::uint8_t(hi * 16 + lo);
  }
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  try {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  } catch (const c10::Error& e) {
    throw InvalidInput(source + " (" + std::to_string(hex.size() / 2) +
                       " bytes): torch rejects it: " + e.what_without_backtrace());
  }
}

// ---- SIGTERM: finish reporting, then stop ----
//
// `tally launch` SIGTERMs the surviving ranks as soon as one dies. A survivor is then usually
// blocked in a collective whose CommError arrives within milliseconds (the dead peer's sockets
// closed); dying on SIGTERM would lose the report naming the lost rank. So SIGTERM only sets a
// flag, checked between steps; the launcher's SIGKILL after its grace period still bounds it.

volatile std::sig_atomic_t g_term_requested = 0;
extern "C" void on_sigterm(int) { g_term_requested = 1; }

class TermSignalFlag {
 public:
  TermSignalFlag() {
    g_term_requested = 0;
    struct sigaction sa{};
    sa.sa_handler = on_sigterm;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, &previous_);
  }
  ~TermSignalFlag() { sigaction(SIGTERM, &previous_, nullptr); }
  TermSignalFlag(const TermSignalFlag&) = delete;
  TermSignalFlag& operator=(const TermSignalFlag&) = delete;
  bool requested() const { return g_term_requested != 0; }

 private:
  struct sigaction previous_{};
};

// ---- the default directory (Note [default checkpoint directory]) ----

// Rank 0's `text` on every rank. The Comm carries numbers: the length, then one byte per double
// (exact).
std::string broadcast_text(Comm& comm, const std::string& text) {
  std::vector<double> length = {double(text.size())};
  comm.broadcast(length, 0);
  std::vector<double> bytes(static_cast<std::size_t>(length[0]));
  if (comm.rank() == 0)
    for (std::size_t i = 0; i < text.size(); ++i)
      bytes[i] = double(static_cast<unsigned char>(text[i]));
  if (!bytes.empty()) comm.broadcast(bytes, 0);
  std::string out;
  for (double b : bytes) out.push_back(static_cast<char>(static_cast<unsigned char>(b)));
  return out;
}

// Rank 0 makes the directory, every rank learns its path and checks that it sees it.
fs::path shared_temp_directory(Comm& comm) {
  const int r = comm.rank(), k = comm.world_size();
  std::string made;
  std::exception_ptr error;
  if (r == 0) {
    try {
      made = make_temp_directory("tally-checkpoint").string();  // < PATH_MAX bytes
    } catch (...) {
      error = std::current_exception();
    }
  }
  const fs::path dir = broadcast_text(comm, made);  // empty: rank 0 failed
  std::error_code ec;
  std::vector<double> seen = {!dir.empty() && fs::is_directory(dir, ec) ? 1.0 : 0.0};
  comm.all_reduce(seen, ReduceOp::sum);
  if (error) std::rethrow_exception(error);
  if (dir.empty())
    throw std::runtime_error("rank " + std::to_string(r) +
                             ": rank 0 could not make a temporary checkpoint directory (its "
                             "message says why): pass --dir");
  if (seen[0] != double(k)) {
    if (r == 0) fs::remove_all(dir, ec);
    throw InvalidInput("rank " + std::to_string(r) + ": the temporary checkpoint directory " +
                       dir.string() + " that rank 0 made is seen by " +
                       std::to_string(std::int64_t(seen[0])) + " of " + std::to_string(k) +
                       " ranks (are they on other hosts?): pass --dir on a file system every "
                       "rank shares");
  }
  return dir;
}

// ---- one rank's training state ----

struct Trainer {
  const CheckpointRunOptions& o;
  int k = 1, r = 0;
  fs::path dir;
  mlp::Mlp model;
  std::vector<at::Tensor> params;
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> layout;  // name, shape
  std::int64_t n_params = 0;
  FlatAdam adam;
  Dataset data;
  SampleStream stream;
  std::int64_t step = 0;      // optimizer steps completed
  std::int64_t consumed = 0;  // position in the sample stream

  Trainer(const CheckpointRunOptions& options, int world_size, int rank)
      : o(options), k(world_size), r(rank), dir(normalized(options.dir)),
        stream(options.seed, options.dataset_samples) {
    at::manual_seed(o.seed);
    model = mlp::make_mlp(o.widths);
    params = model.parameters();
    const std::vector<std::string> names = model.parameter_names();
    for (std::size_t i = 0; i < params.size(); ++i) {
      layout.emplace_back(names[i], params[i].sizes().vec());
      n_params += params[i].numel();
    }
    adam = {at::zeros({n_params}, at::kFloat), at::zeros({n_params}, at::kFloat)};
    data = make_dataset(o);
  }

  std::vector<std::int64_t> batch_indices(std::int64_t position) {
    std::vector<std::int64_t> idx(std::size_t(o.global_batch));
    for (std::int64_t i = 0; i < o.global_batch; ++i) idx[std::size_t(i)] = stream.at(position + i);
    return idx;
  }

  std::vector<FlatGroupData> groups() const {
    return {{kGroups[0], layout, flat_params(params)},
            {kGroups[1], layout, adam.m},
            {kGroups[2], layout, adam.v}};
  }

  io::CheckpointIndex state_index() const {
    io::CheckpointIndex x;
    x.step = step;
    x.consumed_samples = consumed;
    x.seed = o.seed;
    x.rng_state = generator_state_hex();
    x.lr_schedule = schedule_state(o, step);
    return x;
  }

  // The checkpoint must be of this model and this run's configuration: the same tensors, seed and
  // schedule. Anything else would silently change the experiment.
  void check_compatible(const io::CheckpointIndex& x) const {
    const std::string source = (dir / "index.json").string();
    if (x.seed != o.seed)
      throw InvalidInput("--seed = " + std::to_string(o.seed) + " vs " + source + " seed = " +
                         std::to_string(x.seed) + ": a resume keeps the run's seed");
    const io::LrScheduleState want = schedule_state(o, x.step);
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

  // Loads dir's checkpoint into params, m, v, the generator, step and consumed. nullopt: none.
  std::optional<LoadOutcome> load(Comm& comm) {
    std::optional<LoadOutcome> loaded = load_sharded(comm, dir, kGroups);
    if (!loaded) return loaded;
    check_compatible(loaded->index);
    assign_flat(params, loaded->flats[0]);
    adam.m.copy_(loaded->flats[1]);
    adam.v.copy_(loaded->flats[2]);
    set_generator_state_hex(loaded->index.rng_state, dir);
    step = loaded->index.step;
    consumed = loaded->index.consumed_samples;
    return loaded;
  }

  // One optimizer step; `mid_step` runs after the forward pass (fault injection).
  StepRecord take_step(DistributedDataParallel& ddp, Comm& comm,
                       const std::vector<std::int64_t>& batch, const std::function<void()>& mid_step) {
    const std::int64_t t = step + 1;
    const at::Tensor idx =
        at::from_blob(const_cast<std::int64_t*>(batch.data()), {o.global_batch}, at::kLong)
            .slice(0, r, o.global_batch, k)
            .clone();
    const at::Tensor x = data.x.index_select(0, idx);
    const at::Tensor y = data.y.index_select(0, idx);
    // Masks for the whole global batch, so every rank draws the same numbers (one generator state).
    std::vector<at::Tensor> masks;
    if (o.dropout > 0) {
      const double keep = 1 - o.dropout;
      for (std::size_t l = 1; l + 1 < o.widths.size(); ++l)
        masks.push_back(at::empty({o.global_batch, o.widths[l]}, at::kFloat)
                            .bernoulli_(keep)
                            .slice(0, r, o.global_batch, k)
                            .div_(keep));
    }
    const at::Tensor loss = at::cross_entropy_loss(forward(model, x, masks), y);
    if (mid_step) mid_step();
    loss.backward();
    ddp.finish_gradient_sync();
    StepRecord rec;
    rec.step = t;
    rec.grad_norm = mlp::flat_grads(params).norm().item<double>();
    rec.lr = lr_at(o, t);
    adam.step(params, t, rec.lr);
    mlp::zero_grad(params);
    std::vector<double> global_loss = {loss.item<double>()};
    comm.all_reduce(global_loss, ReduceOp::average);
    rec.loss = global_loss[0];
    step = t;
    consumed += o.global_batch;
    rec.consumed_samples = consumed;
    rec.end_unix_s = unix_now();
    return rec;
  }

  bool is_save_step(std::int64_t s) const {
    return s == o.steps || (o.save_every > 0 && s % o.save_every == 0);
  }

  // ①②③ right after the save of the current state.
  RoundTrip roundtrip(Comm& comm) {
    RoundTrip rt;
    rt.done = true;
    const at::Tensor p0 = flat_params(params).clone(), m0 = adam.m.clone(), v0 = adam.v.clone();
    const std::string rng0 = generator_state_hex();
    const io::LrScheduleState schedule0 = schedule_state(o, step);
    rt.step_saved = step;
    rt.consumed_saved = consumed;
    rt.seed_saved = o.seed;
    {
      at::NoGradGuard no_grad;
      for (const auto& p_const : params) at::Tensor(p_const).zero_();
      adam.m.zero_();
      adam.v.zero_();
    }
    step = consumed = 0;
    const std::optional<LoadOutcome> loaded = load(comm);
    TALLY_INVARIANT(loaded.has_value());
    const at::Tensor p1 = flat_params(params);
    rt.params_bit_exact = bit_equal(p0, p1);
    rt.optimizer_bit_exact = bit_equal(m0, adam.m) && bit_equal(v0, adam.v);
    rt.max_abs_diff = std::max({(p0 - p1).abs().max().item<double>(),
                                (m0 - adam.m).abs().max().item<double>(),
                                (v0 - adam.v).abs().max().item<double>()});
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
};

}  // namespace

fs::path make_temp_directory(std::string_view prefix) {
  std::string path = (fs::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
  if (::mkdtemp(path.data()) == nullptr)
    throw std::system_error(errno, std::generic_category(), path + ": mkdtemp");
  return path;
}

std::vector<std::int64_t> sample_indices(std::uint64_t seed, std::int64_t dataset_samples,
                                         std::int64_t position, std::int64_t count) {
  if (dataset_samples < 1 || position < 0 || count < 0)
    throw InvalidInput("sample_indices: dataset_samples = " + std::to_string(dataset_samples) +
                       ", position = " + std::to_string(position) + ", count = " +
                       std::to_string(count) + ": need n >= 1, position >= 0, count >= 0");
  SampleStream stream(seed, dataset_samples);
  std::vector<std::int64_t> out;
  for (std::int64_t i = 0; i < count; ++i) out.push_back(stream.at(position + i));
  return out;
}

std::string_view to_string(FaultPhase p) {
  switch (p) {
    case FaultPhase::none: return "none";
    case FaultPhase::mid_step: return "mid-step";
    case FaultPhase::after_shard: return "after-shard";
  }
  return "?";
}

std::optional<FaultPhase> parse_fault_phase(std::string_view s) {
  for (FaultPhase p : {FaultPhase::none, FaultPhase::mid_step, FaultPhase::after_shard})
    if (s == to_string(p)) return p;
  return std::nullopt;
}

std::string_view to_string(CheckpointEvent::Kind k) {
  switch (k) {
    case CheckpointEvent::Kind::started: return "started";
    case CheckpointEvent::Kind::batch: return "batch";
    case CheckpointEvent::Kind::saved: return "saved";
    case CheckpointEvent::Kind::fault_injected: return "fault_injected";
    case CheckpointEvent::Kind::comm_failure: return "comm_failure";
  }
  return "?";
}

void CheckpointRunOptions::validate(int world_size) const {
  const auto bad = [](const std::string& flag, const std::string& value, const std::string& rule) {
    throw InvalidInput(flag + " = " + value + ": " + rule);
  };
  const auto i = [](std::int64_t v) { return std::to_string(v); };
  if (steps < 1 || steps > 1'000'000) bad("--steps", i(steps), "must be in [1, 1000000]");
  if (save_every < 0) bad("--save-every", i(save_every), "must be >= 0 (0 = only after the last step)");
  if (consumed_samples_override < -1)
    bad("--consumed-samples-override", i(consumed_samples_override), "must be >= 0 (-1 = keep)");
  if (batches_to_record < 0 || batches_to_record > 1000)
    bad("--record-batches", std::to_string(batches_to_record), "must be in [0, 1000]");
  if (widths.size() < 2 || widths.size() > 16)
    bad("--widths", std::to_string(widths.size()) + " widths", "must be 2 to 16 layer widths");
  for (std::int64_t w : widths)
    if (w < 1 || w > 4096) bad("--widths", i(w), "every width must be in [1, 4096]");
  if (dataset_samples < 1 || dataset_samples > 1'000'000)
    bad("--samples", i(dataset_samples), "must be in [1, 1000000]");
  if (global_batch < 1 || global_batch > 65536)
    bad("--batch", i(global_batch), "must be in [1, 65536]");
  if (global_batch % world_size != 0)
    bad("--batch", i(global_batch),
        "must be divisible by WORLD_SIZE = " + std::to_string(world_size) +
            " (every rank's mean then weighs the same)");
  if (!(dropout >= 0 && dropout < 1)) bad("--dropout", format_number(dropout), "must be in [0, 1)");
  if (!(lr > 0 && lr <= 1e6)) bad("--lr", format_number(lr), "must be in (0, 1e6]");
  if (!(min_lr >= 0 && min_lr <= lr)) bad("--min-lr", format_number(min_lr), "must be in [0, --lr]");
  if (warmup_steps < 1) bad("--warmup", i(warmup_steps), "must be >= 1 step");
  if (schedule_steps <= warmup_steps)
    bad("--schedule-steps", i(schedule_steps), "must be > --warmup = " + i(warmup_steps));
  if (!(timeout_s > 0 && timeout_s <= 86400)) bad("--timeout", format_number(timeout_s), "must be in (0, 86400] s");
  if (fault.rank != -1) {
    if (fault.rank < 0 || fault.rank >= world_size)
      bad("--kill-rank", std::to_string(fault.rank),
          "must be in [0, WORLD_SIZE = " + std::to_string(world_size) + ") or -1 (none)");
    if (fault.step < 1 || fault.step > steps)
      bad("--kill-at-step", i(fault.step), "must be in [1, --steps = " + i(steps) + "]");
    if (fault.phase == FaultPhase::none)
      bad("--kill-phase", "none", "must be mid-step or after-shard with --kill-rank");
    if (fault.phase == FaultPhase::after_shard && fault.step != steps &&
        !(save_every > 0 && fault.step % save_every == 0))
      bad("--kill-at-step", i(fault.step),
          "with --kill-phase after-shard it must be a save step (a multiple of --save-every, or "
          "--steps)");
  }
}

CheckpointRunResult run_checkpoint(const DistEnv& env, const CheckpointRunOptions& options,
                                   const std::function<void(const CheckpointEvent&)>& on_event) {
  env.validate();
  options.validate(env.world_size);
  const int k = env.world_size, r = env.rank;
  const auto emit = [&](CheckpointEvent e) {
    e.rank = r;
    if (e.unix_s == 0) e.unix_s = unix_now();
    if (on_event) on_event(e);
    return e;
  };
  TermSignalFlag term;
  // No directory given: a temporary one, agreed over the Comm (Note [default checkpoint
  // directory]), which then has to come first.
  CheckpointRunOptions o = options;
  const bool temporary = o.dir.empty();
  fs::path temp_root;
  std::unique_ptr<Comm> comm_first;
  if (temporary) {
    comm_first = std::make_unique<Comm>(env, CommOptions{.timeout_s = o.timeout_s});
    temp_root = shared_temp_directory(*comm_first);
    o.dir = temp_root / "ckpt";
  }
  // Before the Comm, so its descriptor is closed before the sockets (Note [liveness locks]).
  fs::path ranks_dir = normalized(o.dir);
  ranks_dir += ".ranks";
  RankLiveness liveness(ranks_dir, r, k);
  const std::unique_ptr<Comm> comm_owner =
      temporary ? std::move(comm_first)
                : std::make_unique<Comm>(env, CommOptions{.timeout_s = o.timeout_s});
  Comm& comm = *comm_owner;

  Trainer t(o, k, r);
  CheckpointRunResult res;
  res.rank = r;
  res.world_size = k;
  res.n_params = t.n_params;
  res.dir = t.dir;
  res.dir_temporary = temporary;
  const auto fault_here = [&](FaultPhase phase, std::int64_t s) {
    return o.fault.rank == r && o.fault.phase == phase && o.fault.step == s;
  };
  const auto die = [&](FaultPhase phase, std::int64_t s) {
    emit({.kind = CheckpointEvent::Kind::fault_injected, .step = s,
          .consumed_samples = t.consumed, .phase = phase});
    ::kill(::getpid(), SIGKILL);
  };
  std::int64_t current_step = 0;  // the step being taken or saved, for the failure message
  try {
    // 1. Start: fresh, or from dir's checkpoint.
    if (o.resume) {
      if (const std::optional<LoadOutcome> loaded = t.load(comm)) {
        res.resumed = true;
        res.loaded_world_size = loaded->index.world_size;
        res.checkpoint_consumed_samples = loaded->index.consumed_samples;
        res.load_s = loaded->seconds;
        res.loaded_params_crc32c = crc32c_of(flat_params(t.params));
        res.loaded_optimizer_crc32c = crc32c_of(at::cat({t.adam.m, t.adam.v}));
        if (t.step > o.steps)
          throw InvalidInput("--steps = " + std::to_string(o.steps) + " vs the checkpoint's step " +
                             std::to_string(t.step) + ": must be at least the step resumed from");
        if (o.consumed_samples_override >= 0) {  // ④: the deliberately broken resume
          t.consumed = o.consumed_samples_override;
          res.consumed_overridden = true;
        }
      }
    }
    res.start_step = t.step;
    res.start_consumed_samples = t.consumed;
    emit({.kind = CheckpointEvent::Kind::started, .step = t.step, .consumed_samples = t.consumed,
          .dir = t.dir, .dir_temporary = temporary, .resumed = res.resumed,
          .loaded_world_size = res.loaded_world_size,
          .checkpoint_consumed_samples = res.checkpoint_consumed_samples, .seconds = res.load_s});

    // 2. Train.
    DistributedDataParallel ddp(comm, t.params);
    bool saved_last = false;
    while (t.step < o.steps) {
      if (term.requested())
        throw std::runtime_error("rank " + std::to_string(r) + ": stopped by SIGTERM after step " +
                                 std::to_string(t.step) +
                                 " (the launcher stops every rank when one fails or times out)");
      current_step = t.step + 1;
      const std::vector<std::int64_t> batch = t.batch_indices(t.consumed);
      if (std::int64_t(res.batch_steps.size()) < o.batches_to_record) {
        res.batch_steps.push_back(current_step);
        res.batch_indices.push_back(batch);
        emit({.kind = CheckpointEvent::Kind::batch, .step = current_step,
              .consumed_samples = t.consumed, .sample_indices = batch});
      }
      std::function<void()> mid_step;
      if (fault_here(FaultPhase::mid_step, current_step))
        mid_step = [&] { die(FaultPhase::mid_step, current_step); };
      res.steps.push_back(t.take_step(ddp, comm, batch, mid_step));
      saved_last = false;
      if (t.is_save_step(t.step)) {
        AfterShardHook after_shard;
        if (fault_here(FaultPhase::after_shard, t.step))
          after_shard = [&] { die(FaultPhase::after_shard, t.step); };
        const SaveOutcome s = save_sharded(comm, t.dir, t.state_index(), t.groups(), after_shard);
        res.saves.push_back(emit({.kind = CheckpointEvent::Kind::saved, .step = t.step,
                                  .consumed_samples = t.consumed, .seconds = s.seconds,
                                  .shard_bytes = s.shard_bytes}));
        saved_last = true;
      }
    }

    // 3. ①②③ on the last save, then the end state.
    current_step = t.step;
    if (o.roundtrip_check && saved_last) res.roundtrip = t.roundtrip(comm);
    res.final_step = t.step;
    res.final_consumed_samples = t.consumed;
    res.params_crc32c = crc32c_of(flat_params(t.params));
    res.optimizer_crc32c = crc32c_of(at::cat({t.adam.m, t.adam.v}));
    comm.barrier();  // every rank is done with the directory
  } catch (const CommError& e) {
    liveness.mark_failed();
    const std::vector<int> lost = liveness.lost_ranks(kLostRankProbe_s);
    std::string who;
    for (int q : lost) who += (who.empty() ? "" : ", ") + std::to_string(q);
    // The Comm's message starts "rank r: " too; say it once.
    std::string what = e.what();
    if (const std::string self = "rank " + std::to_string(r) + ": "; what.rfind(self, 0) == 0)
      what.erase(0, self.size());
    const std::string message =
        "rank " + std::to_string(r) + ": " +
        (lost.empty() ? "no rank has exited (a hung peer or a network failure)"
                      : std::string(lost.size() == 1 ? "lost rank " : "lost ranks ") + who) +
        " at step " + std::to_string(current_step) + ": " + what;
    emit({.kind = CheckpointEvent::Kind::comm_failure, .step = current_step,
          .consumed_samples = t.consumed, .lost_ranks = lost, .message = message});
    throw CommError(e.op(), lost.empty() ? e.peer_rank() : lost.front(), message);
  }
  if (r == 0) liveness.remove_all();
  if (r == 0 && temporary && !o.keep_dir) {  // every rank is past the final barrier
    std::error_code ec;
    fs::remove_all(temp_root, ec);
    res.dir_removed = !ec;
  }
  return res;
}

}  // namespace tally::engine
