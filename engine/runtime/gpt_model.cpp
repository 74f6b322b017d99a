// The engine's GPT-style decoder (gpt_model.hpp, gpt.hpp).
#include "gpt_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "tally/core/types.hpp"
#include "run_helpers.hpp"
#include "tally/engine/host_memory.hpp"

namespace tally::engine {

namespace {

// The module as core sees it (gpt_model_spec without the checks).
ModelSpec spec_of(const GptConfig& c) {
  return ModelSpec{.name = "tally-gpt h" + std::to_string(c.hidden) + " L" +
                           std::to_string(c.layers) + " a" + std::to_string(c.heads) + " V" +
                           std::to_string(c.vocab) + " T" + std::to_string(c.seq),
                   .hidden = c.hidden,
                   .layers = c.layers,
                   .heads = c.heads,
                   .kv_heads = c.heads,
                   .ffn = 4 * c.hidden,
                   .vocab = c.vocab,
                   .max_positions = c.seq,
                   .tied_embeddings = true,
                   .linear_bias = true,
                   .mlp = MlpKind::gelu,
                   .norm = NormKind::layernorm,
                   .position = PositionKind::learned};
}

// Note [weights beyond the host]: every rank builds the whole model's fp32 weights first (TP and
// the stages cut theirs from it); a shape whose weights on the host's ranks exceed its memory
// failed inside libtorch's allocator (after seconds of paging, or minutes of building a million
// layers), printing bytes and a C++ backtrace instead of the flags — or the kernel's OOM killer
// ended a rank. Refused by validate(), before a run makes its data, in one line naming the shape.
// The count is core's (count_params of gpt_model_spec), which equals the module's exactly; anything
// else a run needs comes on top.
void require_weights_fit_host(const GptConfig& c) {
  const double n = count_params(spec_of(c)).total();
  require_fits_host(4 * n, "--hidden " + std::to_string(c.hidden) + ", --layers " +
                               std::to_string(c.layers) + ", --vocab " + std::to_string(c.vocab) +
                               ", --seq " + std::to_string(c.seq) + ": " + format_number(n) +
                               " parameters, whose fp32 weights alone take");
}

}  // namespace

void GptConfig::validate() const {
  require(hidden >= 1, "--hidden", hidden, "must be >= 1");
  require(heads >= 1, "--heads", heads, "must be >= 1");
  require(hidden % heads == 0, "--hidden", hidden,
          "must be divisible by --heads = " + std::to_string(heads));
  require(layers >= 1, "--layers", layers, "must be >= 1");
  require(vocab >= 2, "--vocab", vocab, "must be >= 2");
  require(seq >= 1, "--seq", seq, "must be >= 1");
  require(micro_batch >= 1, "--micro-batch", micro_batch, "must be >= 1");
  // Bounds that keep the counts (h², 4h, V·h) exact; the host's memory bounds them far lower.
  constexpr std::int64_t kMax = std::numeric_limits<std::int32_t>::max();
  for (const auto& [flag, v] : {std::pair{"--hidden", hidden}, {"--layers", layers},
                                {"--vocab", vocab}, {"--seq", seq}, {"--micro-batch", micro_batch}})
    require(v <= kMax, flag, v, "must be <= " + std::to_string(kMax));
  require_weights_fit_host(*this);
}

ModelSpec gpt_model_spec(const GptConfig& c) {
  c.validate();
  return spec_of(c);
}

// GPT-2's initialisation: weights N(0, 0.02), biases 0, LayerNorm (1, 0).
static void init_linear(torch::nn::Linear& l) {
  torch::nn::init::normal_(l->weight, 0.0, 0.02);
  torch::nn::init::zeros_(l->bias);
}

GptBlockImpl::GptBlockImpl(std::int64_t hidden, std::int64_t heads_) : heads(heads_) {
  const auto ln = torch::nn::LayerNormOptions({hidden});
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(ln));
  c_attn = register_module("c_attn", torch::nn::Linear(hidden, 3 * hidden));
  c_proj = register_module("c_proj", torch::nn::Linear(hidden, hidden));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(ln));
  c_fc = register_module("c_fc", torch::nn::Linear(hidden, 4 * hidden));
  mlp_proj = register_module("mlp_proj", torch::nn::Linear(4 * hidden, hidden));
  for (auto* l : {&c_attn, &c_proj, &c_fc, &mlp_proj}) init_linear(*l);
}

// Note [what eager PyTorch saves]
// Per block, the tensors autograd keeps until backward (elements; the ledger's inventory in
// core/activations.hpp names the same ones):
//   ln_1: its input x (BTC) + mean, rstd (BT each)    c_attn: its input, ln_1's output (BTC)
//   q·kᵀ: matmul copies q and kᵀ into contiguous (B·a, T, d) batches for bmm and saves them (2 BTC)
//   masked_fill: the (T, T) mask, shared by all layers  softmax: its output (B, a, T, T)
//   att·v: the softmax output (no copy) and the contiguous v (BTC)
//   c_proj: its input, the re-laid-out attention output (BTC)
//   ln_2: its input (BTC) + mean, rstd    c_fc: ln_2's output (BTC)
//   gelu: its input (4BTC)                mlp_proj: gelu's output (4BTC)
// = 16·BTC + a·T²·B elements, Korthikanti's 34sbh + 5as²b without the dropout terms (3sbh + 3as²b
// of his 2-byte units), plus 4·BT LayerNorm statistics and the shared mask, which his inventory
// omits. The scale by 1/√d and the residual adds save nothing (scalar multiply, add).
torch::Tensor causal_mask(std::int64_t T) {
  return torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool)).triu(1);
}

torch::Tensor causal_self_attention(const torch::Tensor& qkv, std::int64_t heads,
                                    const torch::Tensor& causal_mask) {
  const auto parts = qkv.split(qkv.size(2) / 3, 2);  // 3 × (B, T, C) views
  return causal_self_attention(parts[0], parts[1], parts[2], heads, causal_mask);
}

torch::Tensor causal_self_attention(const torch::Tensor& q_btc, const torch::Tensor& k_btc,
                                    const torch::Tensor& v_btc, std::int64_t heads,
                                    const torch::Tensor& causal_mask) {
  const std::int64_t B = q_btc.size(0), T = q_btc.size(1), C = q_btc.size(2), d = C / heads;
  const auto q = q_btc.view({B, T, heads, d}).transpose(1, 2);  // (B, a, T, d)
  const auto k = k_btc.view({B, T, heads, d}).transpose(1, 2);  // (B, a, T, d)
  const auto v = v_btc.view({B, T, heads, d}).transpose(1, 2);  // (B, a, T, d)
  auto att = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(double(d)));  // (B, a, T, T)
  att = torch::softmax(att.masked_fill(causal_mask, -std::numeric_limits<double>::infinity()), -1);
  return torch::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});  // (B, T, C)
}

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  const auto flat = logits.view({-1, logits.size(-1)});
  return torch::nn::functional::cross_entropy(
      flat.scalar_type() == torch::kDouble ? flat : flat.to(torch::kFloat), targets.reshape({-1}));
}

torch::Tensor GptBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& causal_mask,
                                    const LinearForward& linear) {
  const auto run = [&](torch::nn::Linear& l, const torch::Tensor& in) {
    return linear ? linear(l, in) : l->forward(in);
  };
  const auto y = causal_self_attention(run(c_attn, ln_1->forward(x)), heads, causal_mask);
  const auto h = x + run(c_proj, y);  // (B, T, C)
  return h + run(mlp_proj, torch::gelu(run(c_fc, ln_2->forward(h)), "tanh"));
}

GptImpl::GptImpl(const GptConfig& c) : config(c) {
  c.validate();
  wte = register_module("wte", torch::nn::Embedding(c.vocab, c.hidden));
  wpe = register_parameter("wpe", torch::empty({c.seq, c.hidden}));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (std::int64_t l = 0; l < c.layers; ++l) blocks->push_back(GptBlock(c.hidden, c.heads));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.hidden})));
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(wte->weight, 0.0, 0.02);
  torch::nn::init::normal_(wpe, 0.0, 0.01);
}

torch::Tensor GptImpl::forward(const torch::Tensor& idx, const torch::Tensor& targets,
                               const LinearForward& linear) {
  const std::int64_t T = idx.size(1);
  TORCH_CHECK(T <= config.seq, "sequence ", T, " exceeds the position table ", config.seq);
  auto x = wte->forward(idx) + wpe.narrow(0, 0, T);  // (B, T, C)
  const auto mask = causal_mask(T);
  for (const auto& block : *blocks) x = block->as<GptBlock>()->forward(x, mask, linear);
  // (B, T, V) logits in the parameter dtype from the tied embedding, upcast for the loss.
  return lm_loss(torch::matmul(ln_f->forward(x), wte->weight.t()), targets);
}

std::int64_t GptImpl::parameter_count() const {
  std::int64_t n = 0;
  for (const auto& p : parameters()) n += p.numel();
  return n;
}

}  // namespace tally::engine
