#include "tally/core/lowp.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

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

namespace {

double element_bytes(Minifloat f, std::size_t n) {
  return (f == Minifloat::e2m1 ? 0.5 : 1.0) * double(n);
}

// Per-tensor fp8: scale and scale_inv in fp32, as Transformer Engine holds them (a scale past
// fp32's range — amax below 448/FLT_MAX — is clamped to FLT_MAX).
struct PerTensorScale {
  float scale = 1.0f, scale_inv = 1.0f;
};
PerTensorScale per_tensor_scale(double amax, Minifloat f) {
  if (!(amax > 0)) return {};
  const float s = float(std::min(max_normal(f) / amax, double(std::numeric_limits<float>::max())));
  return {s, 1.0f / s};
}

// MX v1.0 §6.3: the e8m0 code of E = floor(log2(amax)) − emax_element, within e8m0's range
// [−127, 127]; an all-zero block takes the smallest scale.
std::uint8_t mx_scale_code(double amax, Minifloat f) {
  const int shared =
      amax > 0 ? std::clamp(floor_log2(amax) - max_normal_exponent(f), -127, 127) : -127;
  return std::uint8_t(shared + 127);
}

// NVFP4's fp32 tensor scale g = amax / (6 · 448) (at least the smallest fp32, so a tensor of tiny
// values still divides) and a block's e4m3 scale code e4m3(amax_block / (6 · g)).
float nvfp4_tensor_scale(double amax) {
  if (!(amax > 0)) return 1.0f;
  const double g = amax / (max_normal(Minifloat::e2m1) * max_normal(Minifloat::e4m3));
  return std::max(float(g), std::numeric_limits<float>::denorm_min());
}
std::uint8_t nvfp4_block_code(double amax_block, float g) {
  return encode(Minifloat::e4m3, amax_block / (max_normal(Minifloat::e2m1) * double(g)));
}
// An element's e2m1 code under block scale s (decoded) and tensor scale g; a block whose scale
// rounds to 0 stores zeros.
std::uint8_t nvfp4_code(double v, double s, float g) {
  return s > 0 ? encode(Minifloat::e2m1, v / (s * double(g))) : std::uint8_t(0);
}
double nvfp4_value(double v, double s, float g) {
  return s > 0 ? round_to(Minifloat::e2m1, v / (s * double(g))) * s * double(g) : 0.0;
}

void require_tiles(std::size_t n, std::int64_t rows, std::int64_t cols) {
  require_int(rows > 0 && rows % kNvfp4Block == 0, "rows", rows,
              "must be a positive multiple of 16 (NVFP4 16x16 tiles)");
  require_int(cols > 0 && cols % kNvfp4Block == 0, "cols", cols,
              "must be a positive multiple of 16 (NVFP4 16x16 tiles)");
  require_int(rows * cols == std::int64_t(n), "rows*cols", rows * cols,
              [&] { return "must equal the element count " + std::to_string(n); });
}

// amax of every 16×16 tile of a rows×cols row-major matrix, tile (r/16, c/16) at
// (r/16)·(cols/16) + c/16.
std::vector<double> tile_amax(std::span<const double> x, std::int64_t rows, std::int64_t cols) {
  const std::int64_t tc = cols / kNvfp4Block;
  std::vector<double> a(std::size_t(rows / kNvfp4Block * tc), 0.0);
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const double v = x[std::size_t(r * cols + c)];
      double& t = a[std::size_t(r / kNvfp4Block * tc + c / kNvfp4Block)];
      if (!std::isnan(v)) t = std::max(t, std::fabs(v));
    }
  return a;
}

}  // namespace

QuantizedTensor quantize_per_tensor(std::span<const double> x, Minifloat f) {
  const PerTensorScale s = per_tensor_scale(abs_max(x), f);
  QuantizedTensor q;
  q.values.reserve(x.size());
  for (double v : x) q.values.push_back(round_to(f, v * double(s.scale)) * double(s.scale_inv));
  q.element_bytes = element_bytes(f, x.size());
  q.scale_bytes = 4;  // one fp32 scale
  return q;
}

QuantizedTensor quantize_mx(std::span<const double> x, Minifloat f) {
  QuantizedTensor q;
  q.values.reserve(x.size());
  for (std::size_t begin = 0; begin < x.size(); begin += kMxBlock) {
    const auto block = x.subspan(begin, std::min<std::size_t>(kMxBlock, x.size() - begin));
    const double scale = decode_e8m0(mx_scale_code(abs_max(block), f));
    for (double v : block) q.values.push_back(round_to(f, v / scale) * scale);
    q.scale_bytes += 1;
  }
  q.element_bytes = element_bytes(f, x.size());
  return q;
}

QuantizedTensor quantize_nvfp4(std::span<const double> x) {
  QuantizedTensor q;
  q.values.reserve(x.size());
  const float g = nvfp4_tensor_scale(abs_max(x));
  for (std::size_t begin = 0; begin < x.size(); begin += kNvfp4Block) {
    const auto block = x.subspan(begin, std::min<std::size_t>(kNvfp4Block, x.size() - begin));
    const double s = decode(Minifloat::e4m3, nvfp4_block_code(abs_max(block), g));
    for (double v : block) q.values.push_back(nvfp4_value(v, s, g));
    q.scale_bytes += 1;  // the e4m3 block scale
  }
  q.scale_bytes += 4;  // the fp32 tensor scale
  q.element_bytes = element_bytes(Minifloat::e2m1, x.size());
  return q;
}

QuantizedTensor quantize_nvfp4_2d(std::span<const double> x, std::int64_t rows, std::int64_t cols) {
  require_tiles(x.size(), rows, cols);
  const float g = nvfp4_tensor_scale(abs_max(x));
  const std::vector<double> amax = tile_amax(x, rows, cols);
  std::vector<double> s(amax.size());
  for (std::size_t t = 0; t < amax.size(); ++t)
    s[t] = decode(Minifloat::e4m3, nvfp4_block_code(amax[t], g));
  QuantizedTensor q;
  q.values.resize(x.size());
  const std::int64_t tc = cols / kNvfp4Block;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const std::size_t i = std::size_t(r * cols + c);
      q.values[i] = nvfp4_value(x[i], s[std::size_t(r / kNvfp4Block * tc + c / kNvfp4Block)], g);
    }
  q.element_bytes = element_bytes(Minifloat::e2m1, x.size());
  q.scale_bytes = double(x.size()) / kNvfp4Block + 4;  // the 1×16 layout's scales + g
  return q;
}

// ---- Stored form (Note [encoded tensor]) -------------------------------------------------------

std::uint8_t EncodedTensor::code(std::int64_t i) const {
  TALLY_INVARIANT(i >= 0 && i < count);
  if (element != Minifloat::e2m1) return codes[std::size_t(i)];
  const std::uint8_t b = codes[std::size_t(i / 2)];
  return i % 2 == 0 ? std::uint8_t(b & 0x0F) : std::uint8_t(b >> 4);
}

double EncodedTensor::block_scale(std::int64_t b) const {
  switch (scale_format) {
    case Scales::none: return 1.0;
    case Scales::e8m0: return decode_e8m0(block_scales[std::size_t(b)]);
    case Scales::e4m3: return decode(Minifloat::e4m3, block_scales[std::size_t(b)]);
  }
  return 1.0;
}

double EncodedTensor::value(std::int64_t i) const {
  const double s = block > 0 ? block_scale(i / block) : 1.0;
  return decode(element, code(i)) * s * double(tensor_scale);
}

std::vector<double> EncodedTensor::values() const {
  std::vector<double> v(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) v[std::size_t(i)] = value(i);
  return v;
}

namespace {

EncodedTensor empty_encoded(Minifloat f, std::size_t n) {
  EncodedTensor e;
  e.element = f;
  e.count = std::int64_t(n);
  e.codes.assign(f == Minifloat::e2m1 ? (n + 1) / 2 : n, 0);
  return e;
}

void put_code(EncodedTensor& e, std::size_t i, std::uint8_t c) {
  if (e.element != Minifloat::e2m1) {
    e.codes[i] = c;
    return;
  }
  e.codes[i / 2] |= i % 2 == 0 ? c : std::uint8_t(c << 4);
}

}  // namespace

EncodedTensor encode_per_tensor(std::span<const double> x, Minifloat f) {
  const PerTensorScale s = per_tensor_scale(abs_max(x), f);
  EncodedTensor e = empty_encoded(f, x.size());
  for (std::size_t i = 0; i < x.size(); ++i) put_code(e, i, encode(f, x[i] * double(s.scale)));
  e.tensor_scale = s.scale_inv;
  return e;
}

EncodedTensor encode_mx(std::span<const double> x, Minifloat f) {
  EncodedTensor e = empty_encoded(f, x.size());
  e.scale_format = EncodedTensor::Scales::e8m0;
  e.block = kMxBlock;
  for (std::size_t begin = 0; begin < x.size(); begin += kMxBlock) {
    const std::size_t len = std::min<std::size_t>(kMxBlock, x.size() - begin);
    const std::uint8_t sc = mx_scale_code(abs_max(x.subspan(begin, len)), f);
    const double scale = decode_e8m0(sc);
    for (std::size_t i = begin; i < begin + len; ++i) put_code(e, i, encode(f, x[i] / scale));
    e.block_scales.push_back(sc);
  }
  return e;
}

EncodedTensor encode_nvfp4(std::span<const double> x) {
  EncodedTensor e = empty_encoded(Minifloat::e2m1, x.size());
  e.scale_format = EncodedTensor::Scales::e4m3;
  e.block = kNvfp4Block;
  e.tensor_scale = nvfp4_tensor_scale(abs_max(x));
  for (std::size_t begin = 0; begin < x.size(); begin += kNvfp4Block) {
    const std::size_t len = std::min<std::size_t>(kNvfp4Block, x.size() - begin);
    const std::uint8_t sc = nvfp4_block_code(abs_max(x.subspan(begin, len)), e.tensor_scale);
    const double s = decode(Minifloat::e4m3, sc);
    for (std::size_t i = begin; i < begin + len; ++i)
      put_code(e, i, nvfp4_code(x[i], s, e.tensor_scale));
    e.block_scales.push_back(sc);
  }
  return e;
}

EncodedTensor encode_nvfp4_2d(std::span<const double> x, std::int64_t rows, std::int64_t cols,
                              bool transpose) {
  require_tiles(x.size(), rows, cols);
  EncodedTensor e = empty_encoded(Minifloat::e2m1, x.size());
  e.scale_format = EncodedTensor::Scales::e4m3;
  e.block = kNvfp4Block;
  e.tensor_scale = nvfp4_tensor_scale(abs_max(x));
  const std::vector<double> amax = tile_amax(x, rows, cols);
  std::vector<std::uint8_t> tile_code(amax.size());
  for (std::size_t t = 0; t < amax.size(); ++t)
    tile_code[t] = nvfp4_block_code(amax[t], e.tensor_scale);
  const std::int64_t tc = cols / kNvfp4Block;
  // Stored layout: R × C' (x, or xᵀ); element k of it is x's (r, c).
  const std::int64_t stored_cols = transpose ? rows : cols;
  for (std::int64_t k = 0; k < e.count; ++k) {
    const std::int64_t i = k / stored_cols, j = k % stored_cols;
    const std::int64_t r = transpose ? j : i, c = transpose ? i : j;
    const std::uint8_t sc = tile_code[std::size_t(r / kNvfp4Block * tc + c / kNvfp4Block)];
    if (k % kNvfp4Block == 0) e.block_scales.push_back(sc);  // one per 16 along the stored row
    put_code(e, std::size_t(k),
             nvfp4_code(x[std::size_t(r * cols + c)], decode(Minifloat::e4m3, sc), e.tensor_scale));
  }
  return e;
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
