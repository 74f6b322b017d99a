// `tally run fp8`: bf16 training with low-precision weight copies, measured beside core's ledger
// (fp8.hpp). The runner only measures; cli/run_fp8.cpp reports.
#include "tally/engine/experiments/fp8.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <unordered_map>

#include "gpt_model.hpp"
#include "lowp_weights.hpp"
#include "optimizer_torch.hpp"
#include "tally/core/lowp.hpp"
#include "tally/engine/tracking_allocator.hpp"
#include "run_helpers.hpp"

namespace tally::engine {

namespace {

constexpr int kLossWindow = 5;  // steps averaged for the loss gap (d)


// Note [fp8 run data]
// A learnable task, so that 20 steps show the loss falling: every sequence follows the bijection
// t → (5t + 3) mod V (5 is odd, V a power of two in the defaults; any V works, the map is then
// not one-to-one) from a uniformly drawn start; targets are the sequence shifted by one. Both runs
// read the same batches, made before the measured scope (data is not model memory).
struct Fp8Batch {
  torch::Tensor idx, targets;  // (B, T) int64
};
std::vector<Fp8Batch> make_batches(const Fp8Options& o) {
  torch::manual_seed(std::int64_t(o.seed) + 1);
  const GptConfig& c = o.model;
  std::vector<Fp8Batch> batches;
  for (int s = 0; s < o.steps; ++s) {
    torch::Tensor t = torch::randint(c.vocab, {c.micro_batch}, torch::kLong);
    std::vector<torch::Tensor> cols;
    for (std::int64_t j = 0; j <= c.seq; ++j) {
      cols.push_back(t);
      t = (t * 5 + 3).remainder(c.vocab);
    }
    const torch::Tensor seq = torch::stack(cols, 1);  // (B, T + 1)
    batches.push_back({seq.narrow(1, 0, c.seq).contiguous(), seq.narrow(1, 1, c.seq).contiguous()});
  }
  return batches;
}

// The four linear layers of every block, in order.
std::vector<torch::nn::Linear> linears_of(Gpt& model) {
  std::vector<torch::nn::Linear> out;
  for (const auto& m : *model->blocks) {
    auto* b = m->as<GptBlock>();
    for (auto* l : {&b->c_attn, &b->c_proj, &b->c_fc, &b->mlp_proj}) out.push_back(*l);
  }
  return out;
}

std::vector<double> doubles_of(const torch::Tensor& t) {
  const torch::Tensor d = t.detach().to(torch::kDouble).contiguous();
  return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// Core's scalar emulation of one copy of W (out, in): quantize_* on W or Wᵀ, values in the copy's
// layout (NVFP4 tiles are 2D: the column copy is the row copy's values transposed).
std::vector<double> scalar_values(Precision format, CopyLayout layout, const std::vector<double>& w,
                                  std::int64_t out, std::int64_t in) {
  std::vector<double> wt(w.size());
  for (std::int64_t r = 0; r < out; ++r)
    for (std::int64_t c = 0; c < in; ++c) wt[std::size_t(c * out + r)] = w[std::size_t(r * in + c)];
  const std::vector<double>& x = layout == CopyLayout::row ? w : wt;
  switch (format) {
    case Precision::fp8: return quantize_per_tensor(x, Minifloat::e4m3).values;
    case Precision::mxfp8: return quantize_mx(x, Minifloat::e4m3).values;
    default: break;
  }
  const std::vector<double> q = quantize_nvfp4_2d(w, out, in).values;
  if (layout == CopyLayout::row) return q;
  std::vector<double> qt(q.size());
  for (std::int64_t r = 0; r < out; ++r)
    for (std::int64_t c = 0; c < in; ++c) qt[std::size_t(c * out + r)] = q[std::size_t(r * in + c)];
  return qt;
}

constexpr CopyLayout kLayouts[] = {CopyLayout::row, CopyLayout::col};

// (b): elements of both copies of every weight whose stored bytes (read back by core's decode) or
// whose engine dequantization (the fp32 the GEMM reads) differ from core's scalar emulation.
std::int64_t count_mismatches(const std::vector<torch::nn::Linear>& linears,
                              const std::vector<LowpWeight>& copies, std::int64_t& checked) {
  std::int64_t bad = 0;
  checked = 0;
  for (std::size_t i = 0; i < copies.size(); ++i) {
    const LowpWeight& c = copies[i];
    const std::vector<double> w = doubles_of(linears[i]->weight);
    for (CopyLayout l : kLayouts) {
      const std::vector<double> expect = scalar_values(c.format(), l, w, c.out(), c.in());
      const EncodedTensor stored = c.stored(l);
      const torch::Tensor deq = c.dequantize(l).contiguous();
      const float* d = deq.data_ptr<float>();
      for (std::int64_t k = 0; k < stored.count; ++k) {
        const double e = expect[std::size_t(k)];
        if (!same_bits(stored.value(k), e) || !same_bits(d[k], float(e))) ++bad;
      }
      checked += stored.count;
    }
  }
  return bad;
}

// What step 1 compares its refresh with: every copy's bytes and every weight, before the step
// (std::vectors: invisible to the tracking allocator).
struct Snapshot {
  std::vector<EncodedTensor> row, col;
  std::vector<std::vector<double>> weights;
};
Snapshot snapshot(const std::vector<torch::nn::Linear>& linears,
                  const std::vector<LowpWeight>& copies) {
  Snapshot s;
  for (std::size_t i = 0; i < copies.size(); ++i) {
    s.row.push_back(copies[i].stored(CopyLayout::row));
    s.col.push_back(copies[i].stored(CopyLayout::col));
    s.weights.push_back(doubles_of(linears[i]->weight));
  }
  return s;
}

// (c): codes the refresh changed, weights the step changed, and codes that changed although
// neither their weight nor their block's scale nor the tensor scale did.
void compare_refresh(const Snapshot& before, const std::vector<torch::nn::Linear>& linears,
                     const std::vector<LowpWeight>& copies, Fp8Result& r) {
  for (std::size_t i = 0; i < copies.size(); ++i) {
    const std::vector<double> w = doubles_of(linears[i]->weight);
    const std::int64_t out = copies[i].out(), in = copies[i].in();
    for (CopyLayout l : kLayouts) {
      const EncodedTensor& old = l == CopyLayout::row ? before.row[i] : before.col[i];
      const EncodedTensor now = copies[i].stored(l);
      const bool tensor_scale_changed = old.tensor_scale != now.tensor_scale;
      for (std::int64_t k = 0; k < now.count; ++k) {
        // element k of the copy is W's (k / in, k % in) in the row layout, (k % out, k / out) in
        // the column one
        const std::int64_t src = l == CopyLayout::row ? k : (k % out) * in + k / out;
        const bool weight_changed = w[std::size_t(src)] != before.weights[i][std::size_t(src)];
        const bool scale_changed = tensor_scale_changed ||
                                   (now.block > 0 && old.block_scale(k / now.block) !=
                                                         now.block_scale(k / now.block));
        const bool code_changed = old.code(k) != now.code(k);
        r.weights_changed += weight_changed ? 1 : 0;
        r.codes_changed += code_changed ? 1 : 0;
        r.unexplained_changes += code_changed && !weight_changed && !scale_changed ? 1 : 0;
      }
    }
  }
}

// One training step: forward through `linear`, backward, Adam; returns the loss before the update.
// The loss tensor and the graph are released on return.
double train_step(Gpt& model, Adam& adam, const Fp8Batch& b, const LinearForward& linear) {
  adam.zero_grad();
  torch::Tensor loss = model->forward(b.idx, b.targets, linear);
  const double value = loss.item<double>();
  loss.backward();
  adam.step();
  return value;
}

void check_deadline(const Fp8Options& o, std::chrono::steady_clock::time_point t0, int step,
                    const char* run) {
  if (seconds_since(t0) > o.timeout_s)
    throw std::runtime_error("fp8: --timeout " + format_number(o.timeout_s) + " s passed during " +
                             run + " step " + std::to_string(step) + " of " +
                             std::to_string(o.steps));
}

void progress(const char* run, int step, int steps, double loss) {
  std::cerr << "fp8: " << run << " step " << step << "/" << steps << ": loss " << loss << std::endl;
}

// The run with copies, under the tracking allocator (checks a–c, and d's losses).
void run_with_copies(const Fp8Options& o, const std::vector<Fp8Batch>& batches, Fp8Result& r,
                     std::chrono::steady_clock::time_point t0) {
  TrackingAllocatorScope scope({.cache = true});
  const auto allocated = [&] { return double(scope.counters().allocated_bytes); };
  const double a0 = allocated();
  torch::manual_seed(std::int64_t(o.seed));
  Gpt model(o.model);
  model->to(torch::kBFloat16);
  const double a1 = allocated();
  Adam adam(model->parameters(), AdamOptions{.lr = o.lr});
  const double a2 = allocated();
  const std::vector<torch::nn::Linear> linears = linears_of(model);
  std::vector<LowpWeight> copies;
  copies.reserve(linears.size());
  std::unordered_map<const torch::nn::LinearImpl*, const LowpWeight*> copy_of;
  for (const auto& l : linears) copies.emplace_back(o.format, l->weight.size(0), l->weight.size(1));
  for (auto& c : copies) c.allocate_payload();
  const double a3 = allocated();
  for (auto& c : copies) c.allocate_scales();
  const double a4 = allocated();
  for (std::size_t i = 0; i < copies.size(); ++i) {
    copies[i].refresh(linears[i]->weight);
    copy_of[linears[i].get()] = &copies[i];
  }
  r.copy_bytes = a3 - a2;
  r.scale_bytes = a4 - a3;
  r.measured_states.params = a1 - a0;
  r.measured_states.master = a2 - a1;  // m + v + master: one Adam allocation
  r.measured_states.low_precision = a4 - a2;
  r.tensor_scales = copies.front().tensor_scales() * int(copies.size());
  r.mismatches_initial = count_mismatches(linears, copies, r.checked_elements);

  const LinearForward with_copies = [&](torch::nn::Linear& l, const torch::Tensor& x) {
    return lowp_linear(x, l->weight, l->bias, copy_of.at(l.get()));
  };
  const auto refresh_all = [&] {
    for (std::size_t i = 0; i < copies.size(); ++i) copies[i].refresh(linears[i]->weight);
  };
  for (int s = 0; s < o.steps; ++s) {
    std::optional<Snapshot> before;
    if (s == 0) before = snapshot(linears, copies);
    r.losses.push_back(train_step(model, adam, batches[std::size_t(s)], with_copies));
    refresh_all();
    if (s == 0) {
      // Gradients are alive (until the next zero_grad), activations and the loss are not.
      r.measured_state_bytes = allocated() - a0;
      r.measured_states.grads = r.measured_state_bytes - (a4 - a0);
      std::int64_t checked = 0;
      r.refresh_mismatches = count_mismatches(linears, copies, checked);
      compare_refresh(*before, linears, copies, r);
    }
    progress(to_string(o.format).data(), s + 1, o.steps, r.losses.back());
    check_deadline(o, t0, s + 1, "the copies' run");
  }
  std::int64_t checked = 0;
  r.mismatches_final = count_mismatches(linears, copies, checked);
}

// The same model, batches and fp32 GEMMs with no copies (lowp_linear without copies).
void run_reference(const Fp8Options& o, const std::vector<Fp8Batch>& batches, Fp8Result& r,
                   std::chrono::steady_clock::time_point t0) {
  torch::manual_seed(std::int64_t(o.seed));
  Gpt model(o.model);
  model->to(torch::kBFloat16);
  Adam adam(model->parameters(), AdamOptions{.lr = o.lr});
  const LinearForward plain = [](torch::nn::Linear& l, const torch::Tensor& x) {
    return lowp_linear(x, l->weight, l->bias, nullptr);
  };
  for (int s = 0; s < o.steps; ++s) {
    r.reference_losses.push_back(train_step(model, adam, batches[std::size_t(s)], plain));
    progress("reference (no copies)", s + 1, o.steps, r.reference_losses.back());
    check_deadline(o, t0, s + 1, "the reference run");
  }
}

double tail_mean(const std::vector<double>& v) {
  const std::size_t k = std::min<std::size_t>(kLossWindow, v.size());
  double sum = 0;
  for (std::size_t i = v.size() - k; i < v.size(); ++i) sum += v[i];
  return sum / double(k);
}

}  // namespace

void Fp8Options::validate() const {
  if (!is_low_precision(format))
    throw InvalidInput("--format = " + std::string(to_string(format)) +
                       ": allowed fp8, mxfp8, nvfp4");
  model.validate();
  const std::int64_t block = copy_block(format);
  if (model.hidden % block != 0)
    throw InvalidInput("--hidden = " + std::to_string(model.hidden) + ": " +
                       std::string(to_string(format)) + " needs a multiple of " +
                       std::to_string(block) + " (its blocks run along every weight dimension)");
  if (steps < 2 || steps > 100000)
    throw InvalidInput("--steps = " + std::to_string(steps) + ": must be in [2, 100000]");
  if (!(lr > 0) || !std::isfinite(lr))
    throw InvalidInput("--lr = " + format_number(lr) + ": must be finite and > 0");
  if (!(timeout_s > 0) || !std::isfinite(timeout_s))
    throw InvalidInput("--timeout = " + format_number(timeout_s) + ": must be finite and > 0");
  if (threads < 0)
    throw InvalidInput("--threads = " + std::to_string(threads) + ": must be >= 0 (0 = default)");
}

double fp8_loss_tolerance(Precision format) { return format == Precision::nvfp4 ? 0.12 : 0.05; }

std::string Fp8Result::convention() const {
  std::string copies;
  switch (options.format) {
    case Precision::fp8:
      copies = "fp8 e4m3 W and W^T, one fp32 scale_inv per weight (per-tensor current scaling: "
               "this refresh's amax; no amax history)";
      break;
    case Precision::mxfp8:
      copies = "MXFP8 e4m3 + e8m0 scale per 32 (MX v1.0 6.3's floor(log2 amax) - 8; TE's kernels "
               "round the scale up instead: not emulated), row-wise (blocks along in) and "
               "column-wise (along out), each from the bf16 weight";
      break;
    default:
      copies = "NVFP4 e2m1 two per byte + e4m3 scale per 16 (16x16 tiles, TE's 2D weight scaling) "
               "+ fp32 tensor scale per copy, row-wise and column-wise";
      break;
  }
  return "bf16 mixed (fp32 master, Adam fp32 m,v) + " + copies + " of the " +
         std::to_string(linear_layers) +
         " linear weights, refreshed after every step | GEMMs emulated: copy dequantized to fp32, "
         "matmul in fp32, output rounded to bf16; dgrad on the column-wise copy, wgrad to the "
         "bf16 weight (straight through, TE) | inputs and output gradients stay bf16 (TE "
         "quantizes them too: not emulated) | biases, norms, embeddings, LM head bf16, not copied";
}

std::vector<Fp8Check> fp8_checks(const Fp8Result& r) {
  std::vector<Fp8Check> out;
  auto rel = [&](std::string what, double measured, double predicted, double tol) {
    const double d = predicted == 0 ? std::abs(measured) : std::abs(measured / predicted - 1);
    out.push_back({std::move(what), measured, predicted, tol, d <= tol});
  };
  rel("(a) copies' codes + block scales (B) vs core low_precision_copy_bytes x linear weights",
      r.copy_bytes, r.predicted_copy_bytes, 0);
  rel("(a) model states after step 1 (B) vs core model_states", r.measured_state_bytes,
      r.predicted_states.bytes.total(), kFp8StateTolerance);
  rel("(b) elements differing from core's scalar emulation, before step 1",
      double(r.mismatches_initial), 0, 0);
  rel("(b) elements differing from core's scalar emulation, after the last step",
      double(r.mismatches_final), 0, 0);
  rel("(c) elements differing from core's encoding of the updated weights, after step 1",
      double(r.refresh_mismatches), 0, 0);
  rel("(c) codes changed with their weight and scales unchanged", double(r.unexplained_changes),
      0, 0);
  out.push_back({"(c) codes changed by step 1's refresh (> 0)", double(r.codes_changed),
                 double(r.weights_changed), 0, r.codes_changed > 0});
  const double first = r.losses.empty() ? 0 : r.losses.front();
  const double last = r.losses.empty() ? 0 : tail_mean(r.losses);
  out.push_back({"(d) loss falls: mean of the last steps / first step (< 1)",
                 first > 0 ? last / first : 0, 1, 0, first > 0 && last < first});
  rel("(d) loss, mean of the last steps vs the run without copies", last,
      r.reference_losses.empty() ? 0 : tail_mean(r.reference_losses),
      fp8_loss_tolerance(r.options.format));
  return out;
}

Fp8Result run_fp8(const Fp8Options& options) {
  options.validate();
  const Fp8Options& o = options;
  if (o.threads > 0) torch::set_num_threads(o.threads);
  Fp8Result r{.options = o};
  r.model = gpt_model_spec(o.model);
  const std::int64_t C = o.model.hidden, L = o.model.layers;
  r.n_params = std::int64_t(count_params(r.model).total());
  r.linear_layers = 4 * L;
  r.linear_weights = 12 * C * C * L;
  r.linear_biases = 9 * C * L;
  // The engine keeps both copies (Note [low-precision copies]), as TE does on a TN-only GPU.
  r.predicted_copy_bytes =
      low_precision_copy_bytes(o.format, Fp8GemmLayouts::tn_only) * double(r.linear_weights);
  r.predicted_states = model_states(double(r.n_params),
                                    StateSetup{.precision = o.format,
                                               .optimizer = Optimizer::adam,
                                               .gemm_weight_share = gemm_weight_share(r.model)});
  const std::vector<Fp8Batch> batches = make_batches(o);
  const auto t0 = std::chrono::steady_clock::now();
  run_with_copies(o, batches, r, t0);
  r.seconds = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  run_reference(o, batches, r, t0);
  r.reference_seconds = seconds_since(t1);
  if (!r.losses.empty() && !r.reference_losses.empty())
    r.loss_gap = std::abs(tail_mean(r.losses) / tail_mean(r.reference_losses) - 1);
  return r;
}

}  // namespace tally::engine
