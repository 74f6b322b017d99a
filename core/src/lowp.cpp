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

// ---- NF4 --------------------------------------------------------------------------------------

double normal_quantile(double p) {
  require_real(p > 0 && p < 1, "p", p, "must be in (0, 1)");
  // Φ(x) = erfc(−x/√2)/2 is increasing; bisect to the last bit.
  double lo = -40, hi = 40;
  for (int i = 0; i < 200 && lo < hi; ++i) {
    const double mid = 0.5 * (lo + hi);
    if (mid == lo || mid == hi) break;
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

const std::array<float, 16>& nf4_code() {
  static const std::array<float, 16> code = [] {
    // bitsandbytes create_normal_map: torch.linspace in float32, scipy's norm.ppf in float64, the
    // values as a float32 tensor, sorted, divided by their max in float32.
    const float offset = 0.9677083f;
    auto points = [&](int k) {
      std::vector<float> v;
      for (int i = 0; i < k; ++i)
        v.push_back(float(double(offset) + (0.5 - double(offset)) * i / (k - 1)));
      return v;
    };
    std::vector<float> v;
    const auto p9 = points(9), p8 = points(8);
    for (int i = 0; i < 8; ++i) v.push_back(float(normal_quantile(p9[std::size_t(i)])));
    for (int i = 0; i < 7; ++i) v.push_back(float(-normal_quantile(p8[std::size_t(i)])));
    v.push_back(0.0f);
    std::sort(v.begin(), v.end());
    std::array<float, 16> out{};
    for (std::size_t i = 0; i < 16; ++i) out[i] = v[i] / v.back();
    return out;
  }();
  return code;
}

const std::array<float, 256>& dynamic_map() {
  static const std::array<float, 256> map = [] {
    std::vector<float> v;
    for (int i = 0; i < 7; ++i) {
      const int items = (1 << i) + 1;  // boundaries of linspace(0.1, 1, 2^i + 1)
      std::vector<float> bounds;
      for (int j = 0; j < items; ++j)
        bounds.push_back(float(0.1 + 0.9 * double(j) / double(items - 1)));
      const float scale = float(std::pow(10.0, double(i - 6)));
      for (int j = 0; j + 1 < items; ++j) {
        const float mean = (bounds[std::size_t(j)] + bounds[std::size_t(j + 1)]) / 2.0f;
        v.push_back(scale * mean);
        v.push_back(-scale * mean);
      }
    }
    v.push_back(0.0f);
    v.push_back(1.0f);
    std::sort(v.begin(), v.end());
    std::array<float, 256> out{};
    std::copy(v.begin(), v.end(), out.begin());
    return out;
  }();
  return map;
}

namespace {

// Index of the code point nearest to x (the lower one on a tie).
template <std::size_t N>
std::uint8_t nearest(const std::array<float, N>& code, float x) {
  const auto it = std::lower_bound(code.begin(), code.end(), x);
  if (it == code.begin()) return 0;
  if (it == code.end()) return std::uint8_t(N - 1);
  const auto i = std::size_t(it - code.begin());
  return std::uint8_t(x - code[i - 1] <= code[i] - x ? i - 1 : i);
}

}  // namespace

double Nf4Tensor::bytes() const {
  const double blocks = double(absmax_code.size() + absmax.size());
  return double(packed.size()) + (double_quant ? blocks + 4.0 * double(absmax2.size())
                                               : 4.0 * blocks);
}

int Nf4Tensor::index(std::int64_t i) const {
  const std::uint8_t b = packed[std::size_t(i / 2)];
  return i % 2 == 0 ? b >> 4 : b & 0x0F;
}

float Nf4Tensor::block_absmax(std::int64_t b) const { return view(*this).block_absmax(b); }

float Nf4View::block_absmax(std::int64_t b) const {
  if (!double_quant) return absmax[std::size_t(b)];
  return dynamic_map()[absmax_code[std::size_t(b)]] * absmax2[std::size_t(b / block2)] +
         absmax_mean;
}

void Nf4View::validate() const {
  require_int(block >= 16 && block <= 4096, "quant-block", block, "must be in [16, 4096]");
  require_int(block2 >= 16 && block2 <= 4096, "quant-block2", block2, "must be in [16, 4096]");
  if (count < 0) throw InvalidInput("nf4: count = " + std::to_string(count) + ": must be >= 0");
  const auto expect = [](const char* what, std::size_t have, std::int64_t want) {
    if (std::int64_t(have) != want)
      throw InvalidInput(std::string("nf4: ") + what + " holds " + std::to_string(have) +
                         " values: " + std::to_string(want) + " expected");
  };
  expect("packed", packed.size(), (count + 1) / 2);
  expect("absmax", absmax.size(), double_quant ? 0 : blocks());
  expect("absmax_code", absmax_code.size(), double_quant ? blocks() : 0);
  expect("absmax2", absmax2.size(), double_quant ? (blocks() + block2 - 1) / block2 : 0);
}

Nf4View view(const Nf4Tensor& q) {
  return Nf4View{.count = q.count, .block = q.block, .block2 = q.block2,
                 .double_quant = q.double_quant, .packed = q.packed, .absmax = q.absmax,
                 .absmax_code = q.absmax_code, .absmax2 = q.absmax2,
                 .absmax_mean = q.absmax_mean};
}

void dequantize_nf4(const Nf4View& q, std::int64_t first_block, std::int64_t end_block,
                    std::span<float> out) {
  TALLY_INVARIANT(0 <= first_block && first_block <= end_block && end_block <= q.blocks());
  const std::int64_t begin = std::min(q.count, first_block * q.block);
  const std::int64_t end = std::min(q.count, end_block * q.block);
  TALLY_INVARIANT(std::int64_t(out.size()) == end - begin);
  const auto& code = nf4_code();
  for (std::int64_t b = first_block; b < end_block; ++b) {
    const float a = q.block_absmax(b);
    const std::int64_t stop = std::min(q.count, (b + 1) * q.block);
    for (std::int64_t i = b * q.block; i < stop; ++i) {
      const std::uint8_t byte = q.packed[std::size_t(i / 2)];
      out[std::size_t(i - begin)] = code[i % 2 == 0 ? byte >> 4 : byte & 0x0F] * a;
    }
  }
}

Nf4Tensor quantize_nf4(std::span<const float> w, int block, bool double_quant, int block2) {
  require_int(block >= 16 && block <= 4096, "quant-block", block, "must be in [16, 4096]");
  require_int(block2 >= 16 && block2 <= 4096, "quant-block2", block2, "must be in [16, 4096]");
  Nf4Tensor q;
  q.count = std::int64_t(w.size());
  q.block = block;
  q.block2 = block2;
  q.double_quant = double_quant;
  q.packed.assign((w.size() + 1) / 2, 0);
  std::vector<float> absmax;
  for (std::size_t begin = 0; begin < w.size(); begin += std::size_t(block)) {
    const std::size_t end = std::min(w.size(), begin + std::size_t(block));
    float a = 0;
    for (std::size_t i = begin; i < end; ++i) {
      require_real(std::isfinite(w[i]), "weight", w[i], "must be finite to quantize");
      a = std::max(a, std::fabs(w[i]));
    }
    absmax.push_back(a);
    for (std::size_t i = begin; i < end; ++i) {
      const std::uint8_t c = nearest(nf4_code(), a > 0 ? w[i] / a : 0.0f);
      q.packed[i / 2] |= std::uint8_t(i % 2 == 0 ? c << 4 : c);
    }
  }
  if (!double_quant) {
    q.absmax = std::move(absmax);
    return q;
  }
  double sum = 0;
  for (float a : absmax) sum += a;
  q.absmax_mean = absmax.empty() ? 0.0f : float(sum / double(absmax.size()));
  for (std::size_t begin = 0; begin < absmax.size(); begin += std::size_t(block2)) {
    const std::size_t end = std::min(absmax.size(), begin + std::size_t(block2));
    float a2 = 0;
    for (std::size_t i = begin; i < end; ++i)
      a2 = std::max(a2, std::fabs(absmax[i] - q.absmax_mean));
    q.absmax2.push_back(a2);
    for (std::size_t i = begin; i < end; ++i)
      q.absmax_code.push_back(
          nearest(dynamic_map(), a2 > 0 ? (absmax[i] - q.absmax_mean) / a2 : 0.0f));
  }
  return q;
}

std::vector<float> dequantize_nf4(const Nf4Tensor& q) {
  std::vector<float> out(std::size_t(q.count));
  const Nf4View v = view(q);
  dequantize_nf4(v, 0, v.blocks(), out);
  return out;
}

}  // namespace tally
