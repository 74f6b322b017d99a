#include "tally/core/types.hpp"

#include "tally/core/divisors.hpp"

#include <array>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

namespace tally {

double unit_bytes(SizeUnit u) { return u == SizeUnit::GB ? kGB : kGiB; }
std::string_view to_string(SizeUnit u) { return u == SizeUnit::GB ? "GB" : "GiB"; }

void invariant_failed(const char* expr, const char* file, int line) {
  std::fprintf(stderr, "tally: internal invariant failed: %s (%s:%d)\n", expr, file, line);
  std::abort();
}

namespace {

template <class E, std::size_t N>
using NameTable = std::array<std::pair<E, std::string_view>, N>;

constexpr NameTable<Precision, 6> kPrecisions{{
    {Precision::fp32, "fp32"}, {Precision::bf16, "bf16"}, {Precision::fp16, "fp16"},
    {Precision::fp8, "fp8"}, {Precision::mxfp8, "mxfp8"}, {Precision::nvfp4, "nvfp4"}}};
constexpr NameTable<Optimizer, 5> kOptimizers{{{Optimizer::adam, "adam"},
                                               {Optimizer::adamw, "adamw"},
                                               {Optimizer::adam8bit, "adam-8bit"},
                                               {Optimizer::sgd, "sgd"},
                                               {Optimizer::sgd_momentum, "sgd-momentum"}}};
constexpr NameTable<Recompute, 5> kRecomputes{{{Recompute::none, "none"},
                                               {Recompute::selective, "selective"},
                                               {Recompute::full, "full"},
                                               {Recompute::save_matmuls, "save-matmuls"},
                                               {Recompute::op_sac, "op-sac"}}};
constexpr NameTable<Attention, 2> kAttentions{{
    {Attention::materialized, "materialized"}, {Attention::flash, "flash"}}};
constexpr NameTable<Kernels, 3> kKernels{
    {{Kernels::fused, "fused"}, {Kernels::eager, "eager"}, {Kernels::local, "local"}}};
constexpr NameTable<Loss, 3> kLosses{
    {{Loss::fused, "fused"}, {Loss::vocab_parallel, "vocab-parallel"}, {Loss::eager, "eager"}}};
constexpr NameTable<GradAccumulation, 2> kGradAccumulations{
    {{GradAccumulation::fused, "fused"}, {GradAccumulation::autograd, "autograd"}}};
constexpr NameTable<FlashKernel, 3> kFlashKernels{
    {{FlashKernel::fa2, "fa2"}, {FlashKernel::fa1, "fa1"}, {FlashKernel::cudnn, "cudnn"}}};

template <class E, std::size_t N>
std::string_view name_of(const NameTable<E, N>& t, E e) {
  for (const auto& [k, v] : t)
    if (k == e) return v;
  TALLY_INVARIANT(false && "enum value without a name");
  return {};
}

template <class E, std::size_t N>
std::optional<E> parse_name(const NameTable<E, N>& t, std::string_view s) {
  for (const auto& [k, v] : t)
    if (v == s) return k;
  return std::nullopt;
}

template <class E, std::size_t N>
std::vector<std::string> names(const NameTable<E, N>& t) {
  std::vector<std::string> out;
  for (const auto& kv : t) out.emplace_back(kv.second);
  return out;
}

}  // namespace

std::string_view to_string(Precision p) { return name_of(kPrecisions, p); }
std::string_view to_string(Optimizer o) { return name_of(kOptimizers, o); }
std::string_view to_string(Recompute r) { return name_of(kRecomputes, r); }
std::string_view to_string(Attention a) { return name_of(kAttentions, a); }
std::string_view to_string(Kernels k) { return name_of(kKernels, k); }
std::string_view to_string(Loss l) { return name_of(kLosses, l); }
std::string_view to_string(GradAccumulation g) { return name_of(kGradAccumulations, g); }
std::string_view to_string(FlashKernel f) { return name_of(kFlashKernels, f); }
std::string_view convention_words(FlashKernel f) {
  switch (f) {
    case FlashKernel::fa2: return "";
    case FlashKernel::fa1: return ", FlashAttention-1-class attention kernels";
    case FlashKernel::cudnn: return ", cuDNN's fused attention";
  }
  return "";
}

std::optional<Precision> parse_precision(std::string_view s) {
  if (s == "mixed") return Precision::bf16;  // the seed's precision="mixed"
  return parse_name(kPrecisions, s);
}
std::optional<Optimizer> parse_optimizer(std::string_view s) {
  if (s == "adam8bit" || s == "8bit-adam") return Optimizer::adam8bit;
  if (s == "sgd-m") return Optimizer::sgd_momentum;
  return parse_name(kOptimizers, s);
}
std::optional<Recompute> parse_recompute(std::string_view s) { return parse_name(kRecomputes, s); }
std::optional<Attention> parse_attention(std::string_view s) {
  if (s == "materialised") return Attention::materialized;
  return parse_name(kAttentions, s);
}
std::optional<Kernels> parse_kernels(std::string_view s) { return parse_name(kKernels, s); }
std::optional<Loss> parse_loss(std::string_view s) { return parse_name(kLosses, s); }
std::optional<GradAccumulation> parse_grad_accumulation(std::string_view s) {
  return parse_name(kGradAccumulations, s);
}
std::optional<FlashKernel> parse_flash_kernel(std::string_view s) {
  return parse_name(kFlashKernels, s);
}
std::optional<SizeUnit> parse_size_unit(std::string_view s) {
  if (s == "GB" || s == "gb") return SizeUnit::GB;
  if (s == "GiB" || s == "gib") return SizeUnit::GiB;
  return std::nullopt;
}

const std::vector<std::string>& allowed_precisions() {
  static const auto v = names(kPrecisions);
  return v;
}
const std::vector<std::string>& allowed_optimizers() {
  static const auto v = names(kOptimizers);
  return v;
}
const std::vector<std::string>& allowed_recomputes() {
  static const auto v = names(kRecomputes);
  return v;
}
const std::vector<std::string>& allowed_attentions() {
  static const auto v = names(kAttentions);
  return v;
}
const std::vector<std::string>& allowed_kernels() {
  static const auto v = names(kKernels);
  return v;
}
const std::vector<std::string>& allowed_losses() {
  static const auto v = names(kLosses);
  return v;
}
const std::vector<std::string>& allowed_grad_accumulations() {
  static const auto v = names(kGradAccumulations);
  return v;
}
const std::vector<std::string>& allowed_flash_kernels() {
  static const auto v = names(kFlashKernels);
  return v;
}

double dtype_bytes(Precision p) { return p == Precision::fp32 ? 4.0 : 2.0; }

bool is_low_precision(Precision p) {
  return p == Precision::fp8 || p == Precision::mxfp8 || p == Precision::nvfp4;
}

Precision compute_precision(Precision p) { return is_low_precision(p) ? Precision::bf16 : p; }

Fp8GemmLayouts fp8_gemm_layouts(int compute_capability) {
  require_int(compute_capability >= 0, "compute capability", compute_capability,
              "must be >= 0 (10 * major + minor, e.g. 90 for 9.0; 0 = not known)");
  const int cc = compute_capability;
  return (cc >= 100 && cc < 120) || cc >= 130 ? Fp8GemmLayouts::any : Fp8GemmLayouts::tn_only;
}

std::string compute_capability_name(int compute_capability) {
  if (compute_capability <= 0) return "unknown";
  return std::to_string(compute_capability / 10) + "." + std::to_string(compute_capability % 10);
}

double quantized_element_bytes(Precision p) {
  switch (p) {
    case Precision::fp8: return 1.0;                // e4m3 / e5m2 (per-tensor scale: not counted)
    case Precision::mxfp8: return 1.0 + 1.0 / 32;   // e4m3, an e8m0 scale per 32
    case Precision::nvfp4: return 0.5 + 1.0 / 16;   // e2m1, an e4m3 scale per 16
    default: return 0.0;
  }
}

int low_precision_layouts(Precision p, Fp8GemmLayouts l) {
  if (!is_low_precision(p)) return 0;
  return p == Precision::fp8 && l == Fp8GemmLayouts::any ? 1 : 2;
}

double low_precision_copy_bytes(Precision p, Fp8GemmLayouts l) {
  return low_precision_layouts(p, l) * quantized_element_bytes(p);
}

std::string low_precision_copies_label(Precision p, int compute_capability) {
  if (!is_low_precision(p)) return {};
  if (p != Precision::fp8) return "row-wise and column-wise (scaling blocks along each GEMM's inner "
                                  "dimension)";
  const std::string cc = compute_capability_name(compute_capability);
  if (compute_capability <= 0)
    return "the weight and its transpose (TN-only fp8 GEMMs assumed: no GPU given)";
  return fp8_gemm_layouts(compute_capability) == Fp8GemmLayouts::any
             ? "the weight alone (compute capability " + cc +
                   " takes fp8 GEMMs in any layout, TE keeps no transpose)"
             : "the weight and its transpose (TN-only fp8 GEMMs, compute capability " + cc + ")";
}

double saved_linear_input_bytes(Precision p) { return quantized_element_bytes(p); }

double delayed_scaling_bytes_per_gemm(int amax_history) {
  require_int(amax_history >= 1, "--amax-history", amax_history, "must be >= 1 entry");
  return 5.0 * 4.0 * (double(amax_history) + 1.0);
}

double parse_count(std::string_view text, std::string_view field) {
  auto fail = [&](const char* why) -> double {
    throw InvalidInput(std::string(field) + " = '" + std::string(text) + "': " + why +
                       " (expected a positive count such as 7e9, 7B, 350M, 1.5T)");
  };
  if (text.empty()) return fail("empty");
  double scale = 1.0;
  std::string_view num = text;
  switch (text.back()) {
    case 'K': case 'k': scale = 1e3; break;
    case 'M': case 'm': scale = 1e6; break;
    case 'B': case 'b': case 'G': case 'g': scale = 1e9; break;
    case 'T': case 't': scale = 1e12; break;
    default: break;
  }
  if (scale != 1.0) num.remove_suffix(1);
  double v = 0;
  const auto* first = num.data();
  const auto* last = num.data() + num.size();
  auto [ptr, ec] = std::from_chars(first, last, v);
  if (ec != std::errc() || ptr != last || num.empty()) return fail("not a number");
  v *= scale;
  if (!std::isfinite(v) || v <= 0) return fail("must be positive and finite");
  return v;
}

std::string format_number(double v) {
  // Whole numbers below 1e15 print exactly (a limit of 1048576 must not read 1.04858e+06).
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15)
    return std::to_string(static_cast<long long>(v));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

namespace {

// The number in front of a unit: finite, > 0, spaces allowed before the unit. Returns the value and
// the unit text, or nullopt.
std::optional<std::pair<double, std::string_view>> split_quantity(std::string_view text) {
  const char* first = text.data();
  const char* last = text.data() + text.size();
  double v = 0;
  const auto [ptr, ec] = std::from_chars(first, last, v);
  if (ec != std::errc() || ptr == first) return std::nullopt;
  std::string_view unit(ptr, std::size_t(last - ptr));
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  return std::pair{v, unit};
}

// "K" 1e3 … "T" 1e12, "Ki" 2^10 … "Ti" 2^40, "" 1; nullopt for anything else.
std::optional<double> prefix_scale(std::string_view p) {
  static constexpr std::pair<std::string_view, double> kPrefixes[] = {
      {"", 1.0},          {"K", 1e3},          {"k", 1e3},          {"M", 1e6},
      {"G", 1e9},         {"T", 1e12},         {"Ki", 1024.0},      {"Mi", 1048576.0},
      {"Gi", 1073741824.0}, {"Ti", 1099511627776.0}};
  for (const auto& [name, scale] : kPrefixes)
    if (p == name) return scale;
  return std::nullopt;
}

[[noreturn]] void bad_quantity(std::string_view text, std::string_view field,
                               std::string_view allowed) {
  throw InvalidInput(std::string(field) + " = '" + std::string(text) + "': " + std::string(allowed));
}

}  // namespace

double parse_bytes(std::string_view text, std::string_view field) {
  constexpr std::string_view kAllowed =
      "must be a positive size with its unit: B, KB, MB, GB, TB (1e3…1e12 bytes) or KiB, MiB, "
      "GiB, TiB (2^10…2^40 bytes), e.g. 14GB or 512MiB";
  const auto q = split_quantity(text);
  if (!q || q->second.empty() || q->second.back() != 'B') bad_quantity(text, field, kAllowed);
  const auto scale = prefix_scale(q->second.substr(0, q->second.size() - 1));
  const double v = q->first * (scale ? *scale : 0.0);
  if (!scale || !std::isfinite(v) || !(v > 0)) bad_quantity(text, field, kAllowed);
  return v;
}

double parse_bandwidth(std::string_view text, std::string_view field) {
  constexpr std::string_view kAllowed =
      "must be a positive bandwidth with its unit: bytes as B/s, MB/s, GB/s, TB/s, GiB/s; bits as "
      "b/s, Mb/s, Gb/s, Tb/s (or Mbps, Gbps, Tbps), e.g. 50GB/s or 200Gb/s";
  const auto q = split_quantity(text);
  if (!q) bad_quantity(text, field, kAllowed);
  std::string_view unit = q->second;
  double per_unit = 0;  // bytes per unit symbol
  if (unit.ends_with("B/s")) {
    per_unit = 1.0;
    unit.remove_suffix(3);
  } else if (unit.ends_with("b/s")) {
    per_unit = 1.0 / 8;
    unit.remove_suffix(3);
  } else if (unit.ends_with("bps") && unit.size() > 3) {  // "Gbps" is gigabits, never gigabytes
    per_unit = 1.0 / 8;
    unit.remove_suffix(3);
  } else {
    bad_quantity(text, field, kAllowed);
  }
  const auto scale = prefix_scale(unit);
  const double v = q->first * per_unit * (scale ? *scale : 0.0);
  if (!scale || !std::isfinite(v) || !(v > 0)) bad_quantity(text, field, kAllowed);
  return v;
}

void require_real(bool ok, std::string_view field, double value, std::string_view allowed) {
  if (!ok)
    throw InvalidInput(std::string(field) + " = " + format_number(value) + ": " +
                       std::string(allowed));
}

void require_int(bool ok, std::string_view field, std::int64_t value, std::string_view allowed) {
  if (!ok)
    throw InvalidInput(std::string(field) + " = " + std::to_string(value) + ": " +
                       std::string(allowed));
}

std::string format_bytes(double bytes, SizeUnit u, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f %s", decimals, to_unit(bytes, u),
                std::string(to_string(u)).c_str());
  return buf;
}

void require_fp8_param_gather(Precision p) {
  if (p != Precision::fp8 && p != Precision::mxfp8)
    throw InvalidInput("--fp8-param-gather: --precision " + std::string(to_string(p)) +
                       " has no fp8 parameters (fp8 and mxfp8 only; Megatron-Bridge's nvfp4 "
                       "recipe keeps bf16 weights)");
}

std::vector<std::int64_t> divisors(std::int64_t n) {
  std::vector<std::int64_t> lo, hi;
  for (std::int64_t d = 1; d * d <= n; ++d)
    if (n % d == 0) {
      lo.push_back(d);
      if (d != n / d) hi.push_back(n / d);
    }
  lo.insert(lo.end(), hi.rbegin(), hi.rend());
  return lo;
}

}  // namespace tally
