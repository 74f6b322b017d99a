#include "tally/core/lowp.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "tally/core/types.hpp"

namespace tally {

namespace {

struct Bits {
  int e, m, bias;
};

Bits layout_of(Minifloat f) {
  switch (f) {
    case Minifloat::e4m3: return {4, 3, 7};
    case Minifloat::e5m2: return {5, 2, 15};
    case Minifloat::e2m1: return {2, 1, 1};
  }
  TALLY_INVARIANT(false && "unknown minifloat");
  return {};
}

double abs_max(std::span<const double> x) {
  double a = 0;
  for (double v : x)
    if (!std::isnan(v)) a = std::max(a, std::fabs(v));
  return a;
}

// floor(log2(a)) for a finite a > 0, exact (frexp, not log2's rounding).
int floor_log2(double a) {
  int k = 0;
  (void)std::frexp(a, &k);  // a = f · 2^k, f in [0.5, 1)
  return k - 1;
}

}  // namespace

std::string_view to_string(Minifloat f) {
  switch (f) {
    case Minifloat::e4m3: return "e4m3";
    case Minifloat::e5m2: return "e5m2";
    case Minifloat::e2m1: return "e2m1";
  }
  return "?";
}

int max_normal_exponent(Minifloat f) {
  const Bits l = layout_of(f);
  // e5m2 reserves its top exponent for inf/NaN; e4m3 and e2m1 use it for normals.
  const int top = (1 << l.e) - 1;
  return (f == Minifloat::e5m2 ? top - 1 : top) - l.bias;
}

double max_normal(Minifloat f) {
  const Bits l = layout_of(f);
  // e4m3's all-ones mantissa at the top exponent is NaN: its largest mantissa is one less.
  const int top_mantissa = (1 << l.m) - (f == Minifloat::e4m3 ? 2 : 1);
  return std::ldexp(1.0 + double(top_mantissa) / double(1 << l.m), max_normal_exponent(f));
}

std::uint8_t encode(Minifloat f, double x) {
  const Bits l = layout_of(f);
  const std::uint8_t sign = std::signbit(x) ? std::uint8_t(1u << (l.e + l.m)) : std::uint8_t(0);
  if (std::isnan(x)) {
    if (f == Minifloat::e2m1) throw InvalidInput("e2m1 has no NaN: cannot encode NaN");
    return std::uint8_t(sign | ((1u << (l.e + l.m)) - 1));  // S.1111.111 / S.11111.11
  }
  const int emin = 1 - l.bias;
  const double top = max_normal(f);
  double a = std::fabs(x);
  if (a == 0) return sign;
  if (a >= top) a = top;  // saturate (inf too: "satfinite")
  const int e = std::max(floor_log2(a), emin);
  const double quantum = std::ldexp(1.0, e - l.m);
  // nearbyint in the default rounding mode: to nearest, ties to even.
  const double v = std::min(std::nearbyint(a / quantum) * quantum, top);
  if (v == 0) return sign;
  if (v < std::ldexp(1.0, emin))  // subnormal: exponent field 0
    return std::uint8_t(sign | std::uint8_t(v / std::ldexp(1.0, emin - l.m)));
  const int ev = floor_log2(v);
  const auto mant = std::uint8_t(v / std::ldexp(1.0, ev - l.m) - double(1 << l.m));
  return std::uint8_t(sign | std::uint8_t((ev + l.bias) << l.m) | mant);
}

double decode(Minifloat f, std::uint8_t code) {
  const Bits l = layout_of(f);
  const bool negative = (code >> (l.e + l.m)) & 1u;
  const int ef = (code >> l.m) & ((1 << l.e) - 1);
  const int m = code & ((1 << l.m) - 1);
  const int top = (1 << l.e) - 1;
  double v = 0;
  if (f == Minifloat::e4m3 && ef == top && m == (1 << l.m) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (f == Minifloat::e5m2 && ef == top) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (ef == 0) {
    v = double(m) * std::ldexp(1.0, 1 - l.bias - l.m);
  } else {
    v = (1.0 + double(m) / double(1 << l.m)) * std::ldexp(1.0, ef - l.bias);
  }
  return negative ? -v : v;
}

double round_to(Minifloat f, double x) { return decode(f, encode(f, x)); }

double decode_e8m0(std::uint8_t code) {
  if (code == 0xFF) return std::numeric_limits<double>::quiet_NaN();
  return std::ldexp(1.0, int(code) - 127);
}

QuantizedTensor quantize_per_tensor(std::span<const double> x, Minifloat f) {
  const double amax = abs_max(x);
  const double scale = amax > 0 ? max_normal(f) / amax : 1.0;
  QuantizedTensor q;
  q.values.reserve(x.size());
  for (double v : x) q.values.push_back(round_to(f, v * scale) / scale);
  q.element_bytes = f == Minifloat::e2m1 ? 0.5 * double(x.size()) : double(x.size());
  q.scale_bytes = 4;  // one fp32 scale
  return q;
}

QuantizedTensor quantize_mx(std::span<const double> x, Minifloat f) {
  QuantizedTensor q;
  q.values.reserve(x.size());
  for (std::size_t begin = 0; begin < x.size(); begin += kMxBlock) {
    const auto block = x.subspan(begin, std::min<std::size_t>(kMxBlock, x.size() - begin));
    const double amax = abs_max(block);
    // MX v1.0 §6.3: E = floor(log2(amax)) − emax_element, within e8m0's range [−127, 127]; an
    // all-zero block takes the smallest scale.
    const int shared =
        amax > 0 ? std::clamp(floor_log2(amax) - max_normal_exponent(f), -127, 127) : -127;
    const double scale = decode_e8m0(std::uint8_t(shared + 127));
    for (double v : block) q.values.push_back(round_to(f, v / scale) * scale);
    q.scale_bytes += 1;
  }
  q.element_bytes = (f == Minifloat::e2m1 ? 0.5 : 1.0) * double(x.size());
  return q;
}

QuantizedTensor quantize_nvfp4(std::span<const double> x) {
  QuantizedTensor q;
  q.values.reserve(x.size());
  const double fp4_max = max_normal(Minifloat::e2m1), fp8_max = max_normal(Minifloat::e4m3);
  const double amax = abs_max(x);
  const double global = amax > 0 ? amax / (fp4_max * fp8_max) : 1.0;  // fp32 tensor scale
  for (std::size_t begin = 0; begin < x.size(); begin += kNvfp4Block) {
    const auto block = x.subspan(begin, std::min<std::size_t>(kNvfp4Block, x.size() - begin));
    const double s = round_to(Minifloat::e4m3, abs_max(block) / (fp4_max * global));
    for (double v : block)
      q.values.push_back(s > 0 ? round_to(Minifloat::e2m1, v / (s * global)) * s * global : 0.0);
    q.scale_bytes += 1;  // the e4m3 block scale
  }
  q.scale_bytes += 4;  // the fp32 tensor scale
  q.element_bytes = 0.5 * double(x.size());
  return q;
}

}  // namespace tally
