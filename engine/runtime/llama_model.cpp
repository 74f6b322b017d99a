// The engine's Llama-layout decoder (llama_model.hpp, llama.hpp).
#include "llama_model.hpp"

#include <cmath>
#include <limits>
#include <string>

#include "gpt_model.hpp"
#include "tally/core/types.hpp"
#include "run_helpers.hpp"

namespace tally::engine {

namespace {
}  // namespace

std::string_view to_string(Arch a) {
  switch (a) {
    case Arch::gpt: return "gpt";
    case Arch::llama: return "llama";
  }
  return "?";
}

std::optional<Arch> parse_arch(std::string_view s) {
  for (Arch a : {Arch::gpt, Arch::llama})
    if (to_string(a) == s) return a;
  return std::nullopt;
}

std::int64_t llama_ffn(std::int64_t hidden) {
  constexpr std::int64_t kMultipleOf = 256;
  const std::int64_t f = 2 * (4 * hidden) / 3;  // int(2·hidden_dim/3), hidden_dim = 4h
  return kMultipleOf * ((f + kMultipleOf - 1) / kMultipleOf);
}

void LlamaConfig::validate() const {
  require(hidden >= 1, "--hidden", hidden, "must be >= 1");
  require(heads >= 1, "--heads", heads, "must be >= 1");
  require(hidden % heads == 0, "--hidden", hidden,
          "must be divisible by --heads = " + std::to_string(heads));
  require((hidden / heads) % 2 == 0, "--hidden", hidden,
          "over --heads = " + std::to_string(heads) + " gives head dim " +
              std::to_string(hidden / heads) + ": rotary needs an even head dim (it turns pairs)");
  require(kv_heads >= 1 && heads % kv_heads == 0, "--kv-heads", kv_heads,
          "must divide --heads = " + std::to_string(heads));
  require(ffn >= 1, "--ffn", ffn, "must be >= 1");
  require(layers >= 1, "--layers", layers, "must be >= 1");
  require(vocab >= 2, "--vocab", vocab, "must be >= 2");
  require(micro_batch >= 1, "--micro-batch", micro_batch, "must be >= 1");
  if (!(rope_theta > 1 && std::isfinite(rope_theta)))
    throw InvalidInput("rope_theta = " + format_number(rope_theta) + ": must be > 1");
  if (!(norm_eps > 0 && norm_eps < 1))
    throw InvalidInput("norm_eps = " + format_number(norm_eps) + ": must be in (0, 1)");
}

ModelSpec llama_model_spec(const LlamaConfig& c) {
  c.validate();
  const auto s = [](std::int64_t v) { return std::to_string(v); };
  return ModelSpec{.name = "tally-llama h" + s(c.hidden) + " L" + s(c.layers) + " a" + s(c.heads) +
                           " kv" + s(c.kv_heads) + " f" + s(c.ffn) + " V" + s(c.vocab),
                   .hidden = c.hidden,
                   .layers = c.layers,
                   .heads = c.heads,
                   .kv_heads = c.kv_heads,
                   .ffn = c.ffn,
                   .vocab = c.vocab,
                   .tied_embeddings = false,
                   .linear_bias = false,
                   .dropout = false,
                   .mlp = MlpKind::swiglu,
                   .norm = NormKind::rmsnorm,
                   .position = PositionKind::rotary};
}

// ---- shared pieces ------------------------------------------------------------------------------

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The norm's statistics: fp32, or float64 for a float64 input (the tests' reference precision).
torch::ScalarType stat_type(const torch::Tensor& x) {
  return x.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
}

// Note [rms norm]: saves its input and the fp32 1/rms per row, as torch's native layer_norm saves
// its input, mean and rstd (and fused RMSNorm kernels save x and rstd); its output is not kept.
struct RmsNorm : torch::autograd::Function<RmsNorm> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& weight, double eps) {
    const torch::Tensor xf = x.to(stat_type(x));  // x itself when fp32
    const torch::Tensor rstd = torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
    ctx->save_for_backward({x, weight, rstd});
    return (xf * rstd).to(x.scalar_type()) * weight.to(x.scalar_type());
  }
  // y = x̂·w with x̂ = x·rstd: dx = rstd·(g·w − x̂·mean(g·w·x̂)), dw = Σ g·x̂ over the rows.
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const torch::Tensor& w = saved[1];
    const torch::Tensor& rstd = saved[2];
    const torch::Tensor xhat = x.to(stat_type(x)) * rstd;
    const torch::Tensor gf = g[0].to(stat_type(x));
    const torch::Tensor gw = gf * w.to(stat_type(x));
    const torch::Tensor dx = rstd * (gw - xhat * (gw * xhat).mean(-1, /*keepdim=*/true));
    torch::Tensor dw;
    if (ctx->needs_input_grad(1))
      dw = (gf * xhat).reshape({-1, w.size(0)}).sum(0).to(w.scalar_type());
    return {dx.to(x.scalar_type()), dw, torch::Tensor()};
  }
};

torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  const std::int64_t half = x.size(-1) / 2;
  return x * cos + torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1) * sin;
}

// Note [rotary positions]: backward turns the gradient back by the same angles (the transpose of
// a rotation), so only the tables are kept.
struct Rotary : torch::autograd::Function<Rotary> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& cos, const torch::Tensor& sin) {
    ctx->saved_data["cos"] = cos;
    ctx->saved_data["sin"] = sin;
    return rotate(x, cos, sin).contiguous();
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const torch::Tensor cos = ctx->saved_data["cos"].toTensor();
    const torch::Tensor sin = ctx->saved_data["sin"].toTensor();
    return {rotate(g[0], cos, -sin), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  return RmsNorm::apply(x, weight, eps);
}

std::pair<torch::Tensor, torch::Tensor> rotary_tables(std::int64_t T, std::int64_t head_dim,
                                                      double theta, torch::ScalarType dtype) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat);
  // θ^(−2i/d) for i in [0, d/2), as HF: 1 / θ^(arange(0, d, 2) / d).
  const torch::Tensor inv_freq =
      torch::pow(theta, torch::arange(0, head_dim, 2, f32) / double(head_dim)).reciprocal();
  const torch::Tensor freqs = torch::outer(torch::arange(T, f32), inv_freq);  // (T, d/2)
  const torch::Tensor angles = torch::cat({freqs, freqs}, -1);               // (T, d)
  return {angles.cos().to(dtype), angles.sin().to(dtype)};
}

torch::Tensor apply_rotary(const torch::Tensor& x, const torch::Tensor& cos,
                           const torch::Tensor& sin) {
  return Rotary::apply(x, cos, sin);
}

torch::Tensor llama_attention(const torch::Tensor& q_btc, const torch::Tensor& k_btc,
                              const torch::Tensor& v_btc, std::int64_t heads, std::int64_t kv_heads,
                              const torch::Tensor& causal_mask, const torch::Tensor& cos,
                              const torch::Tensor& sin) {
  const std::int64_t B = q_btc.size(0), T = q_btc.size(1), d = q_btc.size(2) / heads;
  const std::int64_t n = heads / kv_heads;  // query heads per key/value head
  // Rotated q, k (contiguous (B, heads, T, d)); query head j·n + i uses key/value head j, so the
  // n query heads of a group stack into one (n·T, d) matrix against that group's k and v.
  const auto q = apply_rotary(q_btc.view({B, T, heads, d}).transpose(1, 2), cos, sin)
                     .view({B, kv_heads, n * T, d});
  const auto k = apply_rotary(k_btc.view({B, T, kv_heads, d}).transpose(1, 2), cos, sin);
  const auto v = v_btc.view({B, T, kv_heads, d}).transpose(1, 2);  // (B, a_kv, T, d)
  auto att = (torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(d))))
                 .view({B, heads, T, T});
  att = torch::softmax(att.masked_fill(causal_mask, -std::numeric_limits<double>::infinity()), -1);
  return torch::matmul(att.view({B, kv_heads, n * T, T}), v)  // (B, a_kv, n·T, d)
      .view({B, heads, T, d})
      .transpose(1, 2)
      .contiguous()
      .view({B, T, heads * d});
}

// ---- the module ---------------------------------------------------------------------------------

namespace {
torch::nn::Linear linear(std::int64_t in, std::int64_t out) {
  torch::nn::Linear l(torch::nn::LinearOptions(in, out).bias(false));
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(l->weight, 0.0, 0.02);
  return l;
}
}  // namespace

LlamaBlockImpl::LlamaBlockImpl(const LlamaConfig& c)
    : heads(c.heads), kv_heads(c.kv_heads), eps(c.norm_eps) {
  const std::int64_t C = c.hidden, d = c.hidden / c.heads;
  input_layernorm = register_parameter("input_layernorm", torch::ones({C}));
  post_attention_layernorm = register_parameter("post_attention_layernorm", torch::ones({C}));
  q_proj = register_module("q_proj", linear(C, c.heads * d));
  k_proj = register_module("k_proj", linear(C, c.kv_heads * d));
  v_proj = register_module("v_proj", linear(C, c.kv_heads * d));
  o_proj = register_module("o_proj", linear(c.heads * d, C));
  gate_proj = register_module("gate_proj", linear(C, c.ffn));
  up_proj = register_module("up_proj", linear(C, c.ffn));
  down_proj = register_module("down_proj", linear(c.ffn, C));
}

torch::Tensor LlamaBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& causal_mask,
                                      const torch::Tensor& cos, const torch::Tensor& sin) {
  const auto a = rms_norm(x, input_layernorm, eps);
  const auto y = llama_attention(q_proj(a), k_proj(a), v_proj(a), heads, kv_heads, causal_mask,
                                 cos, sin);
  const auto h = x + o_proj(y);  // (B, T, C)
  const auto m = rms_norm(h, post_attention_layernorm, eps);
  return h + down_proj(torch::silu(gate_proj(m)) * up_proj(m));
}

LlamaImpl::LlamaImpl(const LlamaConfig& c) : config(c) {
  c.validate();
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab, c.hidden));
  layers = register_module("layers", torch::nn::ModuleList());
  for (std::int64_t l = 0; l < c.layers; ++l) layers->push_back(LlamaBlock(c));
  norm = register_parameter("norm", torch::ones({c.hidden}));
  lm_head = register_module("lm_head", linear(c.hidden, c.vocab));
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(embed_tokens->weight, 0.0, 0.02);
}

torch::Tensor LlamaImpl::forward(const torch::Tensor& idx, const torch::Tensor& targets) {
  const std::int64_t T = idx.size(1);
  auto x = embed_tokens->forward(idx);  // (B, T, C)
  const auto mask = causal_mask(T);
  const auto [cos, sin] =
      rotary_tables(T, config.hidden / config.heads, config.rope_theta, x.scalar_type());
  for (const auto& block : *layers) x = block->as<LlamaBlock>()->forward(x, mask, cos, sin);
  return lm_loss(lm_head->forward(rms_norm(x, norm, config.norm_eps)), targets);
}

std::int64_t LlamaImpl::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

}  // namespace tally::engine
