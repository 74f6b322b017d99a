// Low-precision weight copies and their GEMM (lowp_weights.hpp, Note [low-precision copies]).
#include "lowp_weights.hpp"

#include <cstring>
#include <string>
#include <vector>

namespace tally::engine {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const auto kBytes = torch::TensorOptions().dtype(torch::kUInt8);
const auto kFloat32 = torch::TensorOptions().dtype(torch::kFloat);

Minifloat element_of(Precision p) {
  return p == Precision::nvfp4 ? Minifloat::e2m1 : Minifloat::e4m3;
}
// Elements per block scale in core's EncodedTensor::block (0: none).
int block_of(Precision p) { return p == Precision::fp8 ? 0 : copy_block(p); }

// Code tables as fp32 tensors (256,), from core's decode: every fp8 byte; for packed e2m1 the low
// and the high nibble of every byte; e8m0 and e4m3 block scales. Built per call (1 KB each), not
// cached: a static tensor made inside a tracking-allocator scope would count as a live storage.
template <class Value>
torch::Tensor table(Value value) {
  std::vector<float> t(256);
  for (int c = 0; c < 256; ++c) t[std::size_t(c)] = float(value(std::uint8_t(c)));
  return torch::from_blob(t.data(), {256}, kFloat32).clone();
}
torch::Tensor e4m3_table() {
  return table([](std::uint8_t c) { return decode(Minifloat::e4m3, c); });
}
torch::Tensor e2m1_low_table() {
  return table([](std::uint8_t c) { return decode(Minifloat::e2m1, std::uint8_t(c & 0x0F)); });
}
torch::Tensor e2m1_high_table() {
  return table([](std::uint8_t c) { return decode(Minifloat::e2m1, std::uint8_t(c >> 4)); });
}
torch::Tensor e8m0_table() { return table(decode_e8m0); }

torch::Tensor look_up(const torch::Tensor& table, const torch::Tensor& codes) {
  return table.index_select(0, codes.to(torch::kLong));
}

void copy_bytes(torch::Tensor& dst, const std::vector<std::uint8_t>& src) {
  TALLY_INVARIANT(dst.numel() == std::int64_t(src.size()));
  std::memcpy(dst.data_ptr<std::uint8_t>(), src.data(), src.size());
}

std::vector<std::uint8_t> bytes_of(const torch::Tensor& t) {
  if (!t.defined()) return {};
  const auto* p = t.data_ptr<std::uint8_t>();
  return {p, p + t.numel()};
}

}  // namespace

int copy_block(Precision format) {
  return format == Precision::mxfp8 ? kMxBlock : format == Precision::nvfp4 ? kNvfp4Block : 1;
}

LowpWeight::LowpWeight(Precision format, std::int64_t out, std::int64_t in)
    : format_(format), out_(out), in_(in) {
  if (!is_low_precision(format))
    throw InvalidInput("--format = " + std::string(to_string(format)) +
                       ": allowed fp8, mxfp8, nvfp4");
  const int b = copy_block(format);
  if (out < 1 || in < 1 || out % b != 0 || in % b != 0)
    throw InvalidInput("linear weight " + std::to_string(out) + "x" + std::to_string(in) + ": " +
                       std::string(to_string(format)) + " needs both dimensions multiples of " +
                       std::to_string(b) + " (its blocks run along each copy's rows)");
  row_.rows = out;
  row_.cols = in;
  col_.rows = in;
  col_.cols = out;
}

void LowpWeight::allocate_payload() {
  const std::int64_t n = out_ * in_;
  const int block = block_of(format_);
  for (Copy* c : {&row_, &col_}) {
    c->codes = torch::empty({format_ == Precision::nvfp4 ? n / 2 : n}, kBytes);
    if (block > 0) c->block_scales = torch::empty({n / block}, kBytes);
  }
}

void LowpWeight::allocate_scales() {
  if (format_ == Precision::mxfp8) return;
  row_.tensor_scale = torch::empty({1}, kFloat32);
  col_.tensor_scale = format_ == Precision::fp8 ? row_.tensor_scale : torch::empty({1}, kFloat32);
}

int LowpWeight::tensor_scales() const {
  return format_ == Precision::fp8 ? 1 : format_ == Precision::nvfp4 ? 2 : 0;
}

double LowpWeight::payload_bytes() const {
  double b = 0;
  for (const Copy* c : {&row_, &col_}) {
    b += double(c->codes.nbytes());
    if (c->block_scales.defined()) b += double(c->block_scales.nbytes());
  }
  return b;
}

double LowpWeight::scale_bytes() const { return 4.0 * tensor_scales(); }

void LowpWeight::refresh(const torch::Tensor& weight) {
  TALLY_INVARIANT(weight.dim() == 2 && weight.size(0) == out_ && weight.size(1) == in_);
  TALLY_INVARIANT(row_.codes.defined());
  TALLY_INVARIANT(format_ == Precision::mxfp8 || row_.tensor_scale.defined());
  torch::NoGradGuard no_grad;
  // The weight's values in double (exact for bf16 and fp32), row-major, and transposed.
  // std::vector, not torch: the quantizer's scratch is no tensor the memory ledger would count.
  const torch::Tensor w = weight.detach().to(torch::kDouble).contiguous();
  const std::vector<double> rows(w.data_ptr<double>(), w.data_ptr<double>() + w.numel());
  const torch::Tensor wt = w.t().contiguous();
  const std::vector<double> cols(wt.data_ptr<double>(), wt.data_ptr<double>() + wt.numel());
  for (CopyLayout l : {CopyLayout::row, CopyLayout::col}) {
    const std::vector<double>& x = l == CopyLayout::row ? rows : cols;
    const EncodedTensor e = format_ == Precision::fp8 ? encode_per_tensor(x, Minifloat::e4m3)
                            : format_ == Precision::mxfp8
                                ? encode_mx(x, Minifloat::e4m3)
                                : encode_nvfp4_2d(rows, out_, in_, l == CopyLayout::col);
    Copy& c = l == CopyLayout::row ? row_ : col_;
    copy_bytes(c.codes, e.codes);
    if (c.block_scales.defined()) copy_bytes(c.block_scales, e.block_scales);
    if (c.tensor_scale.defined()) c.tensor_scale.fill_(e.tensor_scale);
  }
}

torch::Tensor LowpWeight::dequantize(CopyLayout layout) const {
  torch::NoGradGuard no_grad;
  const Copy& c = copy(layout);
  torch::Tensor v;
  if (format_ == Precision::nvfp4)  // element 2j in the low nibble, 2j+1 in the high one
    v = torch::stack({look_up(e2m1_low_table(), c.codes), look_up(e2m1_high_table(), c.codes)}, 1)
            .reshape({-1});
  else
    v = look_up(e4m3_table(), c.codes);
  if (c.block_scales.defined()) {
    const torch::Tensor s =
        look_up(format_ == Precision::mxfp8 ? e8m0_table() : e4m3_table(), c.block_scales);
    v = (v.view({s.numel(), -1}) * s.unsqueeze(1)).reshape({-1});
  }
  if (c.tensor_scale.defined()) v = v * c.tensor_scale;
  return v.view({c.rows, c.cols});
}

EncodedTensor LowpWeight::stored(CopyLayout layout) const {
  const Copy& c = copy(layout);
  EncodedTensor e;
  e.element = element_of(format_);
  e.scale_format = format_ == Precision::mxfp8   ? EncodedTensor::Scales::e8m0
                   : format_ == Precision::nvfp4 ? EncodedTensor::Scales::e4m3
                                                 : EncodedTensor::Scales::none;
  e.block = block_of(format_);
  e.count = c.rows * c.cols;
  e.codes = bytes_of(c.codes);
  e.block_scales = bytes_of(c.block_scales);
  if (c.tensor_scale.defined()) e.tensor_scale = c.tensor_scale.item<float>();
  return e;
}

namespace {

// The emulated low-precision GEMMs (lowp_linear). Saved: x and the weight (autograd keeps
// references, no copies) and the copies' address, which outlive the graph (the model owns them).
struct LowpLinear : torch::autograd::Function<LowpLinear> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               const LowpWeight* copies) {
    ctx->save_for_backward({x, weight});
    ctx->saved_data["copies"] = reinterpret_cast<std::int64_t>(copies);
    const torch::Tensor w = copies ? copies->dequantize(CopyLayout::row) : weight.to(torch::kFloat);
    return (torch::matmul(x.to(torch::kFloat), w.t()) + bias.to(torch::kFloat)).to(x.scalar_type());
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &x = saved[0], &weight = saved[1];
    const auto* copies = reinterpret_cast<const LowpWeight*>(ctx->saved_data["copies"].toInt());
    const std::int64_t out = weight.size(0), in = weight.size(1);
    const torch::Tensor dy = g[0].to(torch::kFloat).reshape({-1, out});  // (rows, out)
    // dgrad reads W (out, in): the column-wise copy Wᵀ (in, out) transposed back.
    const torch::Tensor w =
        copies ? copies->dequantize(CopyLayout::col).t() : weight.to(torch::kFloat);
    const torch::Tensor dx = dy.matmul(w).view(x.sizes()).to(x.scalar_type());
    const torch::Tensor dw = dy.t().matmul(x.to(torch::kFloat).reshape({-1, in}));
    return {dx, dw.to(weight.scalar_type()), dy.sum(0).to(weight.scalar_type()), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor lowp_linear(const torch::Tensor& x, const torch::Tensor& weight,
                          const torch::Tensor& bias, const LowpWeight* copies) {
  return LowpLinear::apply(x, weight, bias, copies);
}

}  // namespace tally::engine
