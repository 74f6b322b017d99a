// `tally run qlora`: the runner (qlora.hpp). It only runs and measures; the checks are in
// qlora_checks.cpp and the report in cli/run_qlora.cpp.
#include "tally/engine/experiments/qlora.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <optional>
#include <random>
#include <set>

#include "optimizer_torch.hpp"
#include "qlora_internal.hpp"
#include "tally/core/presets.hpp"
#include "tally/engine/temp_directory.hpp"
#include "tally/io/files.hpp"
#include "tally/io/safetensors.hpp"
#include "run_helpers.hpp"

namespace tally::engine {

namespace {

using Clock = std::chrono::steady_clock;

void say(const QloraOptions& o, const std::string& line) {
  if (o.progress) o.progress(line);
}

}  // namespace

std::string_view to_string(StepPhase p) {
  switch (p) {
    case StepPhase::forward: return "forward";
    case StepPhase::head_backward: return "loss + LM head backward";
    case StepPhase::blocks_backward: return "blocks' backward (recompute + adapter gradients)";
    case StepPhase::optimizer_step: return "optimizer step";
  }
  return "?";
}

double SeqRun::tokens() const { return double(seq) * double(micro_batch); }

double SeqRun::median_step_seconds() const {
  if (step_seconds.empty()) return 0;
  std::vector<double> v = step_seconds;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double SeqRun::tokens_per_s() const {
  const double s = median_step_seconds();
  return s > 0 ? tokens() / s : 0.0;
}

double SeqRun::peak_bytes_per_token() const { return double(peak_allocated_bytes) / tokens(); }

double SeqRun::activation_bytes_per_token(double static_bytes) const {
  return (double(peak_allocated_bytes) - static_bytes) / tokens();
}

GptConfig QloraOptions::run_model() const {
  GptConfig c = model;
  c.seq = learn_seq;
  for (std::int64_t s : seqs) c.seq = std::max(c.seq, s);
  return c;
}

LlamaConfig QloraOptions::llama_model() const {
  return {.hidden = model.hidden, .layers = model.layers, .heads = model.heads,
          .kv_heads = kv_heads > 0 ? kv_heads : model.heads,
          .ffn = ffn > 0 ? ffn : llama_ffn(model.hidden), .vocab = model.vocab,
          .micro_batch = model.micro_batch};
}

ModelSpec QloraOptions::run_spec() const {
  return arch == Arch::llama ? llama_model_spec(llama_model()) : gpt_model_spec(run_model());
}

void QloraOptions::validate() const {
  if (seqs.size() < 3)
    throw InvalidInput("--seq: " + std::to_string(seqs.size()) +
                       " lengths: criterion ③ fits a line over at least three");
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i] < 1 || seqs[i] > 1 << 16)
      throw InvalidInput("--seq = " + std::to_string(seqs[i]) + ": must be in [1, 65536]");
    if (i > 0 && seqs[i] <= seqs[i - 1])
      throw InvalidInput("--seq: " + std::to_string(seqs[i]) + " after " +
                         std::to_string(seqs[i - 1]) + ": the lengths must rise");
  }
  if (steps < 1 || steps > 1000)
    throw InvalidInput("--steps = " + std::to_string(steps) + ": must be in [1, 1000]");
  if (learn_steps < 10 || learn_steps > 100000)
    throw InvalidInput("--learn-steps = " + std::to_string(learn_steps) +
                       ": must be in [10, 100000] (the check compares the first 5 with the last 5)");
  if (learn_seq < 2 || learn_seq > 1 << 16)
    throw InvalidInput("--learn-seq = " + std::to_string(learn_seq) + ": must be in [2, 65536]");
  if (!(lr > 0 && lr < 1))
    throw InvalidInput("--lr = " + format_number(lr) + ": must be in (0, 1)");
  if (threads < 0)
    throw InvalidInput("--threads = " + std::to_string(threads) + ": must be >= 0 (0 = default)");
  if (arch == Arch::gpt && (kv_heads != 0 || ffn != 0))
    throw InvalidInput(std::string(kv_heads != 0 ? "--kv-heads" : "--ffn") +
                       " applies to --arch llama (GPT-2's layout has a_kv = a and f = 4C)");
  if (kv_heads < 0 || ffn < 0)
    throw InvalidInput(std::string(kv_heads < 0 ? "--kv-heads = " + std::to_string(kv_heads)
                                                : "--ffn = " + std::to_string(ffn)) +
                       ": must be >= 1 (0 = the default)");
  if (arch == Arch::llama) llama_model().validate();
  else run_model().validate();
  require_runnable(lora, run_spec());
  if (lora.optimizer != Optimizer::adam)
    throw InvalidInput("--optimizer " + std::string(to_string(lora.optimizer)) +
                       ": the run trains the adapters with Adam");
}

ActivationSetup qlora_activation_setup(const QloraOptions& o, const ModelSpec& spec,
                                       std::int64_t seq, Precision act) {
  ActivationSetup a{.seq = seq,
                    .micro_batch = o.model.micro_batch,
                    .recompute = o.checkpoint ? Recompute::full : Recompute::none,
                    .attention = Attention::materialized,
                    .dropout = false,
                    .act_bytes = act == Precision::fp32 ? 4.0 : 2.0,
                    .eager_loss = true};
  LoraSetup s = o.lora;
  s.compute = act;
  add_lora_activations(spec, s, a);
  return a;
}

namespace {

// Note [synthetic task]
// A fixed random successor over K = min(64, V) token ids: x₀ is drawn uniformly from them and
// x_{i+1} = succ(x_i), succ a random permutation of the K ids; the targets are the sequence moved
// one place. A frozen random GPT puts ≈ ln V nats on it; the adapters learn first that only K ids
// occur (→ ln K) and then each id's successor (→ 0), so the loss falls within a few dozen steps.
// Every batch is made before the tracking allocator's scope begins: it is data, not model memory.
struct Batch {
  torch::Tensor idx, targets;  // (B, T) int64
};

class SyntheticTask {
 public:
  SyntheticTask(std::int64_t vocab, std::uint64_t seed) : rng_(seed) {
    const std::int64_t k = std::min<std::int64_t>(64, vocab);
    std::vector<std::int64_t> ids(static_cast<std::size_t>(vocab));
    for (std::int64_t i = 0; i < vocab; ++i) ids[std::size_t(i)] = i;
    std::shuffle(ids.begin(), ids.end(), rng_);
    ids_.assign(ids.begin(), ids.begin() + k);
    succ_.resize(std::size_t(vocab), 0);
    std::vector<std::int64_t> perm = ids_;
    std::shuffle(perm.begin(), perm.end(), rng_);
    for (std::size_t i = 0; i < ids_.size(); ++i) succ_[std::size_t(ids_[i])] = perm[i];
  }
  Batch batch(std::int64_t B, std::int64_t T) {
    torch::Tensor seq = torch::empty({B, T + 1}, torch::kLong);
    auto* p = seq.data_ptr<std::int64_t>();
    for (std::int64_t b = 0; b < B; ++b) {
      std::int64_t x = ids_[std::uniform_int_distribution<std::size_t>(0, ids_.size() - 1)(rng_)];
      for (std::int64_t t = 0; t <= T; ++t) {
        p[b * (T + 1) + t] = x;
        x = succ_[std::size_t(x)];
      }
    }
    return {seq.narrow(1, 0, T).contiguous(), seq.narrow(1, 1, T).contiguous()};
  }

 private:
  std::mt19937_64 rng_;
  std::vector<std::int64_t> ids_, succ_;
};

std::uint32_t checksum(const torch::Tensor& t) {
  const torch::Tensor c = t.contiguous();
  return io::crc32c({reinterpret_cast<const std::byte*>(c.data_ptr()), std::size_t(c.nbytes())});
}

// The fp32 model the LoRA model is built from, by layout: gpt.hpp's or llama.hpp's
// initialisation from the seed.
struct SourceNet {
  Gpt gpt{nullptr};
  Llama llama{nullptr};
  SourceNet(const QloraOptions& o, std::uint64_t seed) {
    torch::manual_seed(seed);
    if (o.arch == Arch::llama)
      llama = Llama(o.llama_model());
    else
      gpt = Gpt(o.run_model());
  }
  SourceModel weights() const { return gpt ? source_of(gpt) : source_of(llama); }
  double loss(const Batch& b) {
    torch::NoGradGuard no_grad;
    return (gpt ? gpt->forward(b.idx, b.targets) : llama->forward(b.idx, b.targets)).item<double>();
  }
};

double eval_loss(const LoraModel& m, const Batch& b) {
  torch::NoGradGuard no_grad;
  return m.forward(b.idx, b.targets, /*train=*/false).item<double>();
}

// One training step, each phase's peak into `phase_peaks` (max over calls).
double train_step(const LoraModel& model, Adam& adam, const Batch& b, TrackingAllocatorScope& scope,
                  std::vector<std::int64_t>& phase_peaks) {
  const auto mark = [&](StepPhase p) {
    auto& slot = phase_peaks[std::size_t(p)];
    slot = std::max(slot, scope.counters().peak_allocated_bytes);
    scope.reset_peak();
  };
  adam.zero_grad();
  scope.reset_peak();
  bool head_done = false;
  torch::Tensor loss = model.forward(b.idx, b.targets, /*train=*/true, [&] {
    mark(StepPhase::head_backward);
    head_done = true;
  });
  mark(StepPhase::forward);
  loss.backward();
  if (!head_done) mark(StepPhase::head_backward);
  mark(StepPhase::blocks_backward);
  adam.step();
  mark(StepPhase::optimizer_step);
  return loss.item<double>();
}

}  // namespace

QloraResult run_qlora(const QloraOptions& o) {
  o.validate();
  const auto t_start = Clock::now();
  QloraResult r;
  r.options = o;
  r.model = o.run_model();
  r.spec = o.run_spec();
  r.ledger = finetune_ledger(r.spec, o.lora);
  r.spec_7b = *model_preset("llama-2-7b");
  LoraSetup seed_7b = o.lora;
  seed_7b.compute = Precision::bf16;  // the seed's bnb_4bit_compute_dtype
  r.ledger_7b = finetune_ledger(r.spec_7b, seed_7b);
  if (o.threads > 0) torch::set_num_threads(o.threads);
  const std::int64_t B = r.model.micro_batch;

  // Data first (Note [synthetic task]): the sweep's, the learning run's and one evaluation batch.
  SyntheticTask task(r.model.vocab, o.seed + 1);
  std::vector<std::vector<Batch>> sweep;
  for (std::int64_t T : o.seqs) {
    sweep.emplace_back();
    for (int s = 0; s < o.steps; ++s) sweep.back().push_back(task.batch(B, T));
  }
  std::vector<Batch> learn;
  for (int s = 0; s < o.learn_steps; ++s) learn.push_back(task.batch(B, o.learn_seq));
  const Batch eval = task.batch(B, o.learn_seq);
  // --save-adapters' directory is kept; a temporary one goes however the run ends.
  WorkDirectory adapters(o.save_adapters.value_or(std::filesystem::path()), "tally-qlora",
                         /*keep=*/false, TempOwner::launcher);
  const std::filesystem::path& adapter_dir = adapters.path();

  {
    TrackingAllocatorScope scope;
    const LoraModelOptions mo{.lora = o.lora, .checkpoint = o.checkpoint};
    std::optional<LoraModel> model;
    say(o, "qlora: building " + r.spec.name + " (" + std::string(to_string(o.lora.method)) +
               ", compute " + std::string(to_string(o.lora.compute)) + ")");
    {
      SourceNet source(o, o.seed);
      r.quant.loss_fp32 = source.loss(eval);
      const SourceModel weights = source.weights();
      model.emplace(weights, mo);
      r.quant.loss_converted = eval_loss(*model, eval);
      if (o.lora.method == FineTune::qlora) {
        say(o, "qlora: quantization checks");
        r.quant.ran = true;
        double err2 = 0, sum2 = 0;
        for (std::size_t l = 0; l < weights.blocks.size(); ++l)
          for (const SourceLinear& w : weights.blocks[l].linears)
            check_quantized(w.weight, model->blocks()[l].linear(w.target).base, r.quant, err2,
                            sum2);
        r.quant.rel_rms_error = sum2 > 0 ? std::sqrt(err2 / sum2) : 0;
        r.quant.code_points_exact = code_points_round_trip(o.lora);
        // The transient of the largest matrix in the compute dtype, as the allocator sees it.
        const LoraLinear* largest = nullptr;
        const auto size = [](const LoraLinear* l) { return l->base.out * l->base.in; };
        for (const auto& [target, lin] : model->blocks()[0].linears())
          if (largest == nullptr || size(lin) > size(largest)) {
            largest = lin;
            r.quant.dequantized_module = std::string(module_name(target));
          }
        const std::int64_t before = scope.counters().allocated_bytes;
        [[maybe_unused]] const torch::Tensor w = largest->base.weight(model->compute_dtype());
        r.quant.dequantized_layer_bytes = double(scope.counters().allocated_bytes - before);
      }
    }  // the fp32 source is freed here
    const LoraModel::Bytes bytes = model->bytes();
    r.quantized_weight_bytes = bytes.quantized_weights;
    r.constant_bytes = bytes.constants;
    r.frozen_bytes = bytes.frozen;
    r.adapter_bytes = bytes.adapters;
    r.quantized_params = bytes.quantized_params;
    r.frozen_params = bytes.frozen_params;
    r.trainable_params = bytes.trainable_params;
    r.memory.after_model_bytes = scope.counters().allocated_bytes;
    std::vector<std::pair<std::string, std::uint32_t>> frozen_crc;
    for (const auto& [name, t] : model->named_frozen()) frozen_crc.emplace_back(name, checksum(t));

    std::optional<Adam> adam;
    adam.emplace(model->adapter_parameters(), AdamOptions{.lr = o.lr});
    r.adapter_optimizer_bytes = adam->m_bytes() + adam->v_bytes();
    r.memory.after_optimizer_bytes = scope.counters().allocated_bytes;

    // ③ ④: the sweep.
    for (std::size_t i = 0; i < o.seqs.size(); ++i) {
      SeqRun run{.seq = o.seqs[i], .micro_batch = B};
      run.phase_peak_bytes.assign(std::size(kStepPhases), 0);
      run.predicted_activations =
          activations(r.spec, qlora_activation_setup(o, r.spec, run.seq, o.lora.compute));
      run.predicted_activations_7b =
          activations(r.spec_7b, qlora_activation_setup(o, r.spec_7b, run.seq, Precision::bf16));
      scope.empty_cache();  // each T starts from the live blocks (torch.cuda.empty_cache)
      for (int s = 0; s < o.steps; ++s) {
        say(o, "qlora: T = " + std::to_string(run.seq) + ", step " + std::to_string(s + 1) +
                   " of " + std::to_string(o.steps));
        const auto t0 = Clock::now();
        run.losses.push_back(train_step(*model, *adam, sweep[i][std::size_t(s)], scope,
                                        run.phase_peak_bytes));
        run.step_seconds.push_back(seconds_since(t0));
        if (i == 0 && s == 0) {
          r.memory.after_step_bytes = scope.counters().allocated_bytes;
          for (const auto& p : model->adapter_parameters())
            r.adapter_grad_bytes += p.grad().defined() ? double(p.grad().nbytes()) : 0.0;
        }
      }
      const MemoryCounters c = scope.counters();
      run.end_allocated_bytes = c.allocated_bytes;
      run.end_reserved_bytes = c.reserved_bytes;
      run.end_cached_bytes = c.cached_bytes;
      run.peak_reserved_bytes = c.peak_reserved_bytes;
      for (StepPhase p : kStepPhases) {
        const std::int64_t peak = run.phase_peak_bytes[std::size_t(p)];
        if (peak > run.peak_allocated_bytes) {
          run.peak_allocated_bytes = peak;
          run.peak_phase = p;
        }
      }
      r.runs.push_back(std::move(run));
    }
    r.memory.inventory_bytes = bytes.backbone() + bytes.adapters + r.adapter_grad_bytes +
                               r.adapter_optimizer_bytes;
    std::vector<double> xs, ys;
    for (const auto& s : r.runs) {
      xs.push_back(double(s.seq));
      ys.push_back(double(s.peak_allocated_bytes));
    }
    r.peak_fit = fit_line(xs, ys);

    // The learning run: fresh adapters and optimizer, the synthetic task.
    LearningRun& l = r.learning;
    torch::manual_seed(o.seed + 2);
    model->reset_adapters();
    adam.emplace(model->adapter_parameters(), AdamOptions{.lr = o.lr});
    std::vector<torch::Tensor> fresh;
    for (const auto& t : model->adapter_parameters()) fresh.push_back(t.detach().clone());
    std::vector<std::int64_t> unused(std::size(kStepPhases), 0);
    for (int s = 0; s < o.learn_steps; ++s) {
      if (s % 10 == 0)
        say(o, "qlora: learning, step " + std::to_string(s + 1) + " of " +
                   std::to_string(o.learn_steps));
      l.losses.push_back(train_step(*model, *adam, learn[std::size_t(s)], scope, unused));
    }
    for (int i = 0; i < 5; ++i) {
      l.first5_mean += l.losses[std::size_t(i)] / 5;
      l.last5_mean += l.losses[l.losses.size() - 1 - std::size_t(i)] / 5;
    }
    {
      const auto adapters = model->adapter_parameters();
      l.adapter_tensors = std::int64_t(adapters.size());
      for (std::size_t i = 0; i < adapters.size(); ++i)
        l.adapters_changed += torch::equal(adapters[i], fresh[i]) ? 0 : 1;
      fresh.clear();
      const auto frozen = model->named_frozen();
      l.frozen_tensors = std::int64_t(frozen.size());
      for (std::size_t i = 0; i < frozen.size(); ++i)
        l.frozen_changed += frozen[i].first == frozen_crc[i].first &&
                                    checksum(frozen[i].second) == frozen_crc[i].second
                                ? 0
                                : 1;
    }  // no handle of the model's tensors outlives it
    l.eval_loss_trained = eval_loss(*model, eval);

    say(o, "qlora: saving the adapters to " + adapter_dir.string());
    const AdapterFile saved = save_adapters(*model, adapter_dir);
    l.adapter_file = saved.path;
    l.adapter_file_bytes = saved.bytes;
    l.lora_config = saved.lora_config;
    const io::SafetensorsHeader header = io::read_safetensors_header(saved.path);
    l.adapter_file_tensors = std::int64_t(header.tensors.size());
    std::set<std::string> in_file, wanted;
    for (const auto& t : header.tensors) in_file.insert(t.name);
    for (const auto& [name, t] : model->named_adapters()) wanted.insert(name);
    l.file_holds_only_adapters = in_file == wanted;
    adam.reset();
    model.reset();

    say(o, "qlora: a fresh backbone from the seed, the adapters loaded onto it");
    {
      const SourceNet source(o, o.seed);
      model.emplace(source.weights(), mo);
    }
    load_adapters(*model, adapter_dir);
    l.eval_loss_reloaded = eval_loss(*model, eval);
    model.reset();
    r.teardown_allocated_bytes = scope.counters().allocated_bytes;
  }
  adapters.remove();
  r.seconds = seconds_since(t_start);
  return r;
}

}  // namespace tally::engine
