// `tally run qlora`: the quantization checks, the fit and the acceptance checks (qlora.hpp).
#include <algorithm>
#include <cmath>
#include <limits>

#include "qlora_internal.hpp"

namespace tally::engine {

double QuantizationChecks::loss_rel_diff() const {
  return loss_fp32 != 0 ? std::fabs(loss_converted - loss_fp32) / std::fabs(loss_fp32) : 0.0;
}

LinearFit fit_line(const std::vector<double>& x, const std::vector<double>& y) {
  TALLY_INVARIANT(x.size() == y.size() && x.size() >= 2);
  const double n = double(x.size());
  double mx = 0, my = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    mx += x[i] / n;
    my += y[i] / n;
  }
  double sxx = 0, sxy = 0, syy = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    sxx += (x[i] - mx) * (x[i] - mx);
    sxy += (x[i] - mx) * (y[i] - my);
    syy += (y[i] - my) * (y[i] - my);
  }
  LinearFit f;
  f.slope = sxx > 0 ? sxy / sxx : 0;
  f.intercept = my - f.slope * mx;
  // R² = 1 − SS_res/SS_tot, which for a least-squares line is Sxy²/(Sxx·Syy).
  f.r_squared = sxx > 0 && syy > 0 ? sxy * sxy / (sxx * syy) : (syy == 0 ? 1.0 : 0.0);
  return f;
}

// Note [quantization checks]
// Against the fp32 weights W each NF4 matrix was quantized from, with a = the block's exact
// absmax (max |w| over the block) and â the absmax the model reads back (double quantization's
// 8-bit code through the dynamic map, times absmax2, plus the mean):
//  - nearest: the stored index i of every element is the code point nearest to w/a — checked
//    against its neighbours i ± 1 (the code book is sorted), 1e-6 slack for float rounding;
//  - error: |w − ŵ| ≤ a·g/2 + |a − â|·|code[i]| with g the larger gap beside code[i] — the grid's
//    half step, plus what double quantization moved the scale (ŵ = core's dequantization);
//  - code points: a matrix whose every block holds the 16 code points × 1/8 (a power of two, so
//    w/a is exact) quantizes and dequantizes bit for bit, through the run's block settings;
//  - constants (double quantization): each block's (a − mean)/absmax2 is coded to the dynamic
//    map's nearest value, and |a − â| ≤ absmax2 · (the larger gap beside that value)/2;
//  - loss: the converted model (adapters' B = 0, so the backbone alone, in the compute dtype) on
//    one batch beside the fp32 model it came from: finite and within 1 % (4-bit weights of a
//    Gaussian carry ≈10 % RMS error, bf16 rounds each value by up to 2⁻⁹ relative; at
//    initialisation the loss moves by far less).
void check_quantized(const torch::Tensor& source_weight, const FrozenWeight& f,
                     QuantizationChecks& q, double& err2, double& sum2) {
  const torch::Tensor w = source_weight.detach().to(torch::kFloat).contiguous();
  const torch::Tensor back = f.weight();  // core's dequantize_nf4
  const Nf4View v = f.view();
  const float* src = w.data_ptr<float>();
  const float* deq = back.data_ptr<float>();
  const auto& code = nf4_code();
  const auto& map = dynamic_map();
  const auto half_gap = [](const auto& book, std::size_t i) {
    double g = 0;
    if (i > 0) g = std::max(g, double(book[i]) - double(book[i - 1]));
    if (i + 1 < book.size()) g = std::max(g, double(book[i + 1]) - double(book[i]));
    return g / 2;
  };
  ++q.matrices;
  for (std::int64_t b = 0; b < v.blocks(); ++b) {
    const std::int64_t begin = b * v.block, end = std::min(v.count, (b + 1) * v.block);
    float a = 0;
    for (std::int64_t i = begin; i < end; ++i) a = std::max(a, std::fabs(src[i]));
    const float ahat = v.block_absmax(b);
    for (std::int64_t i = begin; i < end; ++i) {
      const std::uint8_t byte = v.packed[std::size_t(i / 2)];
      const std::size_t k = i % 2 == 0 ? byte >> 4 : byte & 0x0F;
      const double x = a > 0 ? double(src[i] / a) : 0.0;
      const double d = std::fabs(x - double(code[k]));
      if ((k > 0 && std::fabs(x - double(code[k - 1])) < d - 1e-6) ||
          (k + 1 < code.size() && std::fabs(x - double(code[k + 1])) < d - 1e-6))
        ++q.not_nearest;
      const double err = std::fabs(double(src[i]) - double(deq[i]));
      const double bound = double(a) * half_gap(code, k) +
                           std::fabs(double(a) - double(ahat)) * std::fabs(double(code[k])) +
                           1e-6 * double(a);
      if (bound > 0) q.max_error_over_bound = std::max(q.max_error_over_bound, err / bound);
      q.max_abs_error = std::max(q.max_abs_error, err);
      err2 += err * err;
      sum2 += double(src[i]) * double(src[i]);
    }
    q.elements += end - begin;
    ++q.blocks;
    if (!v.double_quant) continue;
    const float scale = v.absmax2[std::size_t(b / v.block2)];
    const std::size_t k = v.absmax_code[std::size_t(b)];
    const double c = scale > 0 ? double((a - v.absmax_mean) / scale) : 0.0;
    const double d = std::fabs(c - double(map[k]));
    if ((k > 0 && std::fabs(c - double(map[k - 1])) < d - 1e-6) ||
        (k + 1 < map.size() && std::fabs(c - double(map[k + 1])) < d - 1e-6))
      ++q.constants_not_nearest;
    const double step = double(scale) * half_gap(map, k) + 1e-6 * double(a);
    if (step > 0)
      q.max_constant_error_over_step =
          std::max(q.max_constant_error_over_step, std::fabs(double(a) - double(ahat)) / step);
  }
}

bool code_points_round_trip(const LoraSetup& s) {
  const auto& code = nf4_code();
  const std::int64_t n = 4 * std::int64_t(s.block);
  torch::Tensor w = torch::empty({1, n}, torch::kFloat);
  for (std::int64_t i = 0; i < n; ++i) w.data_ptr<float>()[i] = code[std::size_t(i % 16)] * 0.125f;
  const FrozenWeight f = FrozenWeight::make_nf4(w, s.block, s.double_quant, s.block2);
  return torch::equal(f.weight(), w);
}

std::string_view to_string(CheckScope s) {
  switch (s) {
    case CheckScope::tally: return "tally";
    case CheckScope::seed: return "seed";
  }
  return "?";
}

bool seed_setup(const LoraSetup& s) {
  const LoraSetup seed;  // the seed's program: core's defaults
  const bool adapters = s.rank == seed.rank && s.targets == seed.targets;
  if (s.method != FineTune::qlora) return adapters;
  return adapters && s.quant == seed.quant && s.double_quant == seed.double_quant &&
         s.block == seed.block && s.block2 == seed.block2;
}

bool qlora_passed(const std::vector<QloraCheck>& checks) {
  return std::all_of(checks.begin(), checks.end(),
                     [](const QloraCheck& c) { return c.ok || !c.binds; });
}

namespace {

QloraCheck check(std::string id, std::string what, double measured, std::string relation,
                 double limit, bool ok) {
  return {.id = std::move(id), .what = std::move(what), .measured = measured, .limit = limit,
          .relation = std::move(relation), .ok = ok};
}

QloraCheck within(std::string id, std::string what, double measured, double target, double tol) {
  return check(std::move(id), std::move(what), measured,
               "±" + std::to_string(int(std::lround(tol * 100))) + " % of", target,
               target > 0 && std::fabs(measured / target - 1) <= tol);
}

// Note [check scopes]: one of the seed's thresholds, binding for the seed's setup only.
QloraCheck seed_threshold(QloraCheck c, bool seed_scenario) {
  c.scope = CheckScope::seed;
  c.binds = seed_scenario;
  return c;
}

}  // namespace

std::vector<QloraCheck> qlora_checks(const QloraResult& r) {
  std::vector<QloraCheck> v;
  const bool qlora = r.options.lora.method == FineTune::qlora;
  const bool seed = seed_setup(r.options.lora);
  // Quantization (qlora only).
  if (qlora) {
    const auto& q = r.quant;
    v.push_back(check("quant", "elements not at their nearest NF4 code point",
                      double(q.not_nearest), "=", 0, q.ran && q.not_nearest == 0));
    v.push_back(check("quant", "max |w − dequantize(quantize(w))| / (a·gap/2 + |a − â|)",
                      q.max_error_over_bound, "<=", 1, q.ran && q.max_error_over_bound <= 1));
    v.push_back(check("quant", "code points round-trip bit for bit (1 = yes)",
                      q.code_points_exact ? 1 : 0, "=", 1, q.code_points_exact));
    if (r.options.lora.double_quant) {
      v.push_back(check("quant", "absmax codes not at the dynamic map's nearest value",
                        double(q.constants_not_nearest), "=", 0, q.constants_not_nearest == 0));
      v.push_back(check("quant", "max |a − â| / (absmax2 · half the 8-bit map's gap)",
                        q.max_constant_error_over_step, "<=", 1,
                        q.max_constant_error_over_step <= 1));
    }
  }
  v.push_back(check("quant", "|loss converted − loss fp32| / loss fp32 (finite)",
                    r.quant.loss_rel_diff(), "<=", 0.01,
                    std::isfinite(r.quant.loss_converted) && r.quant.loss_rel_diff() <= 0.01));
  // ① trainable parameters: the module's count is the ledger's; the 7B fraction < 0.2 %.
  v.push_back(check("①", "trainable parameters of the run's model vs the ledger's",
                    double(r.trainable_params), "=", r.ledger.trainable_params,
                    double(r.trainable_params) == r.ledger.trainable_params));
  v.push_back(seed_threshold(check("①", "trainable fraction of Llama-2-7B by the ledger",
                                   r.ledger_7b.trainable_fraction(), "<", 0.002,
                                   r.ledger_7b.trainable_fraction() < 0.002),
                             seed));
  // ② static bytes vs the ledger (its persistent part: the dequantized layer is transient), and
  // the backbone's bytes per parameter.
  const double ledger_static = r.ledger.static_bytes() - r.ledger.dequant_transient_bytes;
  v.push_back(within("②", "static bytes after a step (backbone, constants, unquantized, "
                          "adapters + grads + Adam) vs the ledger",
                     double(r.memory.after_step_bytes), ledger_static, 0.10));
  if (qlora) {
    // The ledger's bits per quantized parameter for this setup (the measured bytes add 4 B of
    // double quantization's mean per matrix), then the seed's ≈ 0.5 N for its own setup.
    const double per = (r.quantized_weight_bytes + r.constant_bytes) / double(r.quantized_params);
    v.push_back(within("②", "4-bit backbone (indices + constants) bytes per quantized parameter "
                            "vs the ledger's bits / 8",
                       per, r.ledger.bits_per_quantized_param / 8, 0.01));
    v.push_back(seed_threshold(
        within("②", "4-bit backbone bytes per quantized parameter vs the seed's 0.5", per, 0.5,
               0.10),
        seed));
  } else {
    // The ledger keeps lora's frozen backbone in the compute dtype (Note [QLoRA ledger]).
    const Precision c = r.options.lora.compute;
    v.push_back(within("②", "frozen backbone bytes per parameter vs " +
                                format_number(dtype_bytes(c)) + " (" +
                                std::string(to_string(c)) + ")",
                       r.frozen_bytes / double(r.frozen_params), dtype_bytes(c), 0.10));
  }
  // ③ peak against T: rising, and linear.
  bool rising = true;
  for (std::size_t i = 1; i < r.runs.size(); ++i)
    rising = rising && r.runs[i].peak_allocated_bytes > r.runs[i - 1].peak_allocated_bytes;
  v.push_back(seed_threshold(
      check("③", "peak allocated rises with every T (1 = yes)", rising ? 1 : 0, "=", 1, rising),
      seed));
  v.push_back(seed_threshold(check("③", "R² of the linear fit of peak bytes against T",
                                   r.peak_fit.r_squared, ">", 0.95, r.peak_fit.r_squared > 0.95),
                             seed));
  // ④ throughput and peak per token, at every T; reserved ≥ allocated.
  double min_tps = std::numeric_limits<double>::infinity();
  double min_slack = std::numeric_limits<double>::infinity();
  for (const auto& s : r.runs) {
    min_tps = std::min(min_tps, s.tokens_per_s());
    min_slack = std::min(min_slack, double(s.end_reserved_bytes - s.end_allocated_bytes));
  }
  v.push_back(check("④", "tokens/s at the slowest T", min_tps, ">", 0, min_tps > 0));
  v.push_back(check("④", "reserved − allocated after the steps, smallest over T (bytes)",
                    min_slack, ">=", 0, min_slack >= 0));
  // The learning run.
  const auto& l = r.learning;
  v.push_back(check("learn", "mean loss of the last 5 steps vs the first 5", l.last5_mean, "<",
                    l.first5_mean, l.last5_mean < l.first5_mean));
  v.push_back(check("learn", "frozen tensors whose CRC-32C changed", double(l.frozen_changed), "=",
                    0, l.frozen_tensors > 0 && l.frozen_changed == 0));
  v.push_back(check("learn", "adapter tensors changed by training", double(l.adapters_changed),
                    "=", double(l.adapter_tensors),
                    l.adapter_tensors > 0 && l.adapters_changed == l.adapter_tensors));
  v.push_back(check("learn", "the adapter file holds only the adapters (1 = yes)",
                    l.file_holds_only_adapters ? 1 : 0, "=", 1, l.file_holds_only_adapters));
  v.push_back(check("learn", "loss with the adapters reloaded onto a fresh backbone",
                    l.eval_loss_reloaded, "=", l.eval_loss_trained,
                    l.eval_loss_reloaded == l.eval_loss_trained));
  return v;
}

}  // namespace tally::engine
