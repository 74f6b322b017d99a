// LoRA / QLoRA on the engine's GPT (lora_gpt.hpp): frozen dense or NF4 weights, adapters and
// per-block gradient checkpointing.
#include "lora_gpt.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <span>
#include <string>
#include <utility>

#include "tally/core/types.hpp"

namespace tally::engine {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

const auto kF32 = torch::TensorOptions().dtype(torch::kFloat);
const auto kU8 = torch::TensorOptions().dtype(torch::kByte);

template <class T>
std::span<const T> span_of(const torch::Tensor& t) {
  if (!t.defined()) return {};
  return {t.data_ptr<T>(), std::size_t(t.numel())};
}

template <class T>
torch::Tensor tensor_of(const std::vector<T>& v, const torch::TensorOptions& o) {
  torch::Tensor t = torch::empty({std::int64_t(v.size())}, o);
  std::copy(v.begin(), v.end(), t.data_ptr<T>());
  return t;
}

double nbytes(const torch::Tensor& t) { return t.defined() ? double(t.nbytes()) : 0.0; }

// Dequantizing runs over the blocks in parallel (core's function on disjoint block ranges).
constexpr std::int64_t kDequantGrainBlocks = 4096;

}  // namespace

// ---- FrozenWeight -------------------------------------------------------------------------------

FrozenWeight FrozenWeight::make_dense(const torch::Tensor& w) {
  FrozenWeight f;
  f.out = w.size(0);
  f.in = w.size(1);
  f.dense = w.detach().to(torch::kFloat).contiguous().clone();
  return f;
}

FrozenWeight FrozenWeight::make_nf4(const torch::Tensor& w, int block, bool double_quant,
                                    int block2) {
  const torch::Tensor src = w.detach().to(torch::kFloat).contiguous();
  const Nf4Tensor q =
      quantize_nf4(span_of<float>(src), block, double_quant, block2);
  FrozenWeight f;
  f.out = w.size(0);
  f.in = w.size(1);
  f.quantized = true;
  f.block = q.block;
  f.block2 = q.block2;
  f.double_quant = q.double_quant;
  f.packed = tensor_of(q.packed, kU8);
  if (double_quant) {
    f.absmax_code = tensor_of(q.absmax_code, kU8);
    f.absmax2 = tensor_of(q.absmax2, kF32);
    f.absmax_mean = torch::scalar_tensor(q.absmax_mean, kF32);
  } else {
    f.absmax = tensor_of(q.absmax, kF32);
  }
  return f;
}

Nf4View FrozenWeight::view() const {
  TALLY_INVARIANT(quantized);
  Nf4View v{.count = out * in, .block = block, .block2 = block2, .double_quant = double_quant,
            .packed = span_of<std::uint8_t>(packed), .absmax = span_of<float>(absmax),
            .absmax_code = span_of<std::uint8_t>(absmax_code),
            .absmax2 = span_of<float>(absmax2),
            .absmax_mean = absmax_mean.defined() ? absmax_mean.item<float>() : 0.0f};
  v.validate();
  return v;
}

torch::Tensor FrozenWeight::weight() const {
  if (!quantized) return dense;
  const Nf4View v = view();
  torch::Tensor w = torch::empty({out, in}, kF32);  // the transient dequantized layer
  float* data = w.data_ptr<float>();
  at::parallel_for(0, v.blocks(), kDequantGrainBlocks, [&](std::int64_t b0, std::int64_t b1) {
    const std::int64_t begin = b0 * v.block, end = std::min(v.count, b1 * v.block);
    dequantize_nf4(v, b0, b1, std::span<float>(data + begin, std::size_t(end - begin)));
  });
  return w;
}

double FrozenWeight::code_bytes() const { return quantized ? nbytes(packed) : nbytes(dense); }

double FrozenWeight::constant_bytes() const {
  return nbytes(absmax) + nbytes(absmax_code) + nbytes(absmax2) + nbytes(absmax_mean);
}

std::vector<std::pair<std::string, torch::Tensor>> FrozenWeight::storage() const {
  if (!quantized) return {{"weight", dense}};
  std::vector<std::pair<std::string, torch::Tensor>> v = {{"weight.nf4", packed}};
  if (double_quant) {
    v.emplace_back("weight.absmax_code", absmax_code);
    v.emplace_back("weight.absmax2", absmax2);
    v.emplace_back("weight.absmax_mean", absmax_mean);
  } else {
    v.emplace_back("weight.absmax", absmax);
  }
  return v;
}

// ---- the frozen matmul (Note [NF4 linear]) ------------------------------------------------------

namespace {

struct FrozenMatmul : torch::autograd::Function<FrozenMatmul> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const FrozenWeight* w) {
    ctx->saved_data["w"] = reinterpret_cast<std::int64_t>(w);
    return torch::matmul(x, w->weight().t());  // the dequantized copy dies here
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const auto* w = reinterpret_cast<const FrozenWeight*>(ctx->saved_data["w"].toInt());
    return {torch::matmul(g[0], w->weight()), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor frozen_matmul(const torch::Tensor& x, const FrozenWeight& w) {
  return FrozenMatmul::apply(x, &w);
}

torch::Tensor LoraLinear::forward(const torch::Tensor& x, bool train) const {
  torch::Tensor y = frozen_matmul(x, base) + bias;
  if (!adapted()) return y;
  const torch::Tensor in = dropout > 0 ? torch::dropout(x, dropout, train) : x;
  return y + torch::matmul(torch::matmul(in, lora_A.t()), lora_B.t()) * scale;
}

// ---- blocks ---------------------------------------------------------------------------------------

std::string_view module_name(LoraTarget t) {
  switch (t) {
    case LoraTarget::q: return "q_proj";
    case LoraTarget::k: return "k_proj";
    case LoraTarget::v: return "v_proj";
    case LoraTarget::o: return "o_proj";
    case LoraTarget::gate: return "gate_proj";
    case LoraTarget::up: return "up_proj";
    case LoraTarget::down: return "down_proj";
  }
  return "?";
}

std::vector<std::pair<LoraTarget, const LoraLinear*>> LoraBlock::linears() const {
  return {{LoraTarget::q, &q_proj},  {LoraTarget::k, &k_proj},   {LoraTarget::v, &v_proj},
          {LoraTarget::o, &o_proj},  {LoraTarget::up, &up_proj}, {LoraTarget::down, &down_proj}};
}

std::vector<std::pair<LoraTarget, LoraLinear*>> LoraBlock::linears() {
  std::vector<std::pair<LoraTarget, LoraLinear*>> v;
  for (const auto& [t, l] : std::as_const(*this).linears())
    v.emplace_back(t, const_cast<LoraLinear*>(l));  // *this is not const: neither are its parts
  return v;
}

torch::Tensor LoraBlock::forward(const torch::Tensor& x, const torch::Tensor& mask,
                                 bool train) const {
  const std::int64_t C = x.size(2);
  const auto ln = [C](const torch::Tensor& t, const torch::Tensor& w, const torch::Tensor& b) {
    return torch::layer_norm(t, {C}, w, b);
  };
  const auto a = ln(x, ln_1_weight, ln_1_bias);
  const auto y = causal_self_attention(q_proj.forward(a, train), k_proj.forward(a, train),
                                       v_proj.forward(a, train), heads, mask);
  const auto h = x + o_proj.forward(y, train);  // (B, T, C)
  const auto m = up_proj.forward(ln(h, ln_2_weight, ln_2_bias), train);
  return h + down_proj.forward(torch::gelu(m, "tanh"), train);
}

namespace {

torch::Tensor generator_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_generator_state(const torch::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

// Note [gradient checkpointing].
struct CheckpointedBlock : torch::autograd::Function<CheckpointedBlock> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const torch::Tensor& mask, const LoraBlock* block, bool train) {
    ctx->saved_data["block"] = reinterpret_cast<std::int64_t>(block);
    ctx->saved_data["train"] = train;
    if (train) ctx->saved_data["rng"] = generator_state();
    ctx->save_for_backward({x, mask});
    return block->forward(x, mask, train);  // grad mode is off here: nothing else is kept
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const auto* block = reinterpret_cast<const LoraBlock*>(ctx->saved_data["block"].toInt());
    const bool train = ctx->saved_data["train"].toBool();
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor x = saved[0].detach().requires_grad_(true);
    {
      torch::AutoGradMode enable(true);
      // The forward's dropout masks again, then the generator as it was (torch's fork_rng).
      const torch::Tensor now = train ? generator_state() : torch::Tensor();
      if (train) set_generator_state(ctx->saved_data["rng"].toTensor());
      torch::Tensor y = block->forward(x, saved[1], train);
      if (train) set_generator_state(now);
      torch::autograd::backward({y}, {g[0]});
    }
    return {x.grad(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

LoraLinear make_linear(const torch::Tensor& w, const torch::Tensor& b, LoraTarget target,
                       const LoraSetup& s) {
  LoraLinear l;
  l.base = s.method == FineTune::qlora
               ? FrozenWeight::make_nf4(w, s.block, s.double_quant, s.block2)
               : FrozenWeight::make_dense(w);
  l.bias = b.detach().to(torch::kFloat).contiguous().clone();
  if (std::find(s.targets.begin(), s.targets.end(), target) != s.targets.end()) {
    l.lora_A = torch::empty({std::int64_t(s.rank), l.base.in}, kF32).requires_grad_(true);
    l.lora_B = torch::empty({l.base.out, std::int64_t(s.rank)}, kF32).requires_grad_(true);
    l.scale = s.alpha / double(s.rank);
    l.dropout = s.dropout;
  }
  return l;
}

}  // namespace

// ---- the model ------------------------------------------------------------------------------------

void require_runnable(const LoraSetup& s, const GptConfig& c) {
  s.validate(gpt_model_spec(c));
  if (s.method != FineTune::lora && s.method != FineTune::qlora)
    throw InvalidInput("--method " + std::string(to_string(s.method)) +
                       ": tally run qlora runs lora or qlora");
  if (s.method == FineTune::qlora && s.quant != Quant::nf4)
    throw InvalidInput("--quant " + std::string(to_string(s.quant)) +
                       ": tally run qlora quantizes to nf4 (the seed's); fp4 and int8 are in the "
                       "ledger only (tally memory --method qlora --quant ...)");
  if (s.compute != Precision::fp32)
    throw InvalidInput("compute dtype " + std::string(to_string(s.compute)) +
                       ": the CPU run computes in fp32");
}

LoraGpt::LoraGpt(const Gpt& source, const LoraGptOptions& options)
    : config_(source->config), options_(options) {
  const LoraSetup& s = options_.lora;
  require_runnable(s, config_);
  torch::NoGradGuard no_grad;
  const auto copy = [](const torch::Tensor& t) { return t.detach().contiguous().clone(); };
  wte_ = copy(source->wte->weight);
  wpe_ = copy(source->wpe);
  ln_f_weight_ = copy(source->ln_f->weight);
  ln_f_bias_ = copy(source->ln_f->bias);
  head_.out = wte_.size(0);
  head_.in = wte_.size(1);
  head_.dense = wte_;  // tied: the embedding itself
  const std::int64_t C = config_.hidden;
  for (const auto& m : *source->blocks) {
    const auto& g = *m->as<GptBlock>();
    LoraBlock b;
    b.heads = g.heads;
    b.ln_1_weight = copy(g.ln_1->weight);
    b.ln_1_bias = copy(g.ln_1->bias);
    b.ln_2_weight = copy(g.ln_2->weight);
    b.ln_2_bias = copy(g.ln_2->bias);
    const auto rows = [&](const torch::Tensor& t, int i) { return t.narrow(0, i * C, C); };
    b.q_proj = make_linear(rows(g.c_attn->weight, 0), rows(g.c_attn->bias, 0), LoraTarget::q, s);
    b.k_proj = make_linear(rows(g.c_attn->weight, 1), rows(g.c_attn->bias, 1), LoraTarget::k, s);
    b.v_proj = make_linear(rows(g.c_attn->weight, 2), rows(g.c_attn->bias, 2), LoraTarget::v, s);
    b.o_proj = make_linear(g.c_proj->weight, g.c_proj->bias, LoraTarget::o, s);
    b.up_proj = make_linear(g.c_fc->weight, g.c_fc->bias, LoraTarget::up, s);
    b.down_proj = make_linear(g.mlp_proj->weight, g.mlp_proj->bias, LoraTarget::down, s);
    blocks_.push_back(std::move(b));
  }
  reset_adapters();
}

void LoraGpt::reset_adapters() {
  torch::NoGradGuard no_grad;
  for (auto& b : blocks_)
    for (auto& [target, l] : b.linears()) {
      if (!l->adapted()) continue;
      torch::nn::init::kaiming_uniform_(l->lora_A, std::sqrt(5.0));  // PEFT reset_lora_parameters
      l->lora_B.zero_();
      l->lora_A.mutable_grad() = torch::Tensor();
      l->lora_B.mutable_grad() = torch::Tensor();
    }
}

torch::Tensor LoraGpt::forward(const torch::Tensor& idx, const torch::Tensor& targets, bool train,
                               const std::function<void()>& on_head_backward) const {
  const std::int64_t T = idx.size(1), C = config_.hidden;
  TORCH_CHECK(T <= config_.seq, "sequence ", T, " exceeds the position table ", config_.seq);
  const bool graph = torch::GradMode::is_enabled();
  torch::Tensor x = torch::embedding(wte_, idx) + wpe_.narrow(0, 0, T);  // (B, T, C)
  if (graph) x.requires_grad_(true);  // enable_input_require_grads (Note [gradient checkpointing])
  const torch::Tensor mask = causal_mask(T);
  for (const LoraBlock& b : blocks_)
    x = graph && options_.checkpoint ? CheckpointedBlock::apply(x, mask, &b, train)
                                     : b.forward(x, mask, train);
  if (graph && on_head_backward) x.register_hook([on_head_backward](torch::Tensor) {
    on_head_backward();
  });
  const torch::Tensor h = torch::layer_norm(x, {C}, ln_f_weight_, ln_f_bias_);
  // The tied head, frozen: the same saves-nothing matmul as the frozen linears.
  return lm_loss(frozen_matmul(h, head_), targets);
}

std::vector<torch::Tensor> LoraGpt::adapter_parameters() const {
  std::vector<torch::Tensor> v;
  for (const auto& [name, t] : named_adapters()) v.push_back(t);
  return v;
}

std::vector<std::pair<std::string, torch::Tensor>> LoraGpt::named_adapters() const {
  std::vector<std::pair<std::string, torch::Tensor>> v;
  for (std::size_t i = 0; i < blocks_.size(); ++i)
    for (const auto& [target, l] : blocks_[i].linears()) {
      if (!l->adapted()) continue;
      const std::string prefix =
          "blocks." + std::to_string(i) + "." + std::string(module_name(target));
      v.emplace_back(prefix + ".lora_A.weight", l->lora_A);
      v.emplace_back(prefix + ".lora_B.weight", l->lora_B);
    }
  return v;
}

std::vector<std::pair<std::string, torch::Tensor>> LoraGpt::named_frozen() const {
  std::vector<std::pair<std::string, torch::Tensor>> v = {{"wte.weight", wte_}, {"wpe", wpe_}};
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const LoraBlock& b = blocks_[i];
    const std::string prefix = "blocks." + std::to_string(i) + ".";
    v.emplace_back(prefix + "ln_1.weight", b.ln_1_weight);
    v.emplace_back(prefix + "ln_1.bias", b.ln_1_bias);
    for (const auto& [target, l] : b.linears()) {
      const std::string name = prefix + std::string(module_name(target)) + ".";
      for (const auto& [suffix, t] : l->base.storage()) v.emplace_back(name + suffix, t);
      v.emplace_back(name + "bias", l->bias);
    }
    v.emplace_back(prefix + "ln_2.weight", b.ln_2_weight);
    v.emplace_back(prefix + "ln_2.bias", b.ln_2_bias);
  }
  v.emplace_back("ln_f.weight", ln_f_weight_);
  v.emplace_back("ln_f.bias", ln_f_bias_);
  return v;
}

LoraGpt::Bytes LoraGpt::bytes() const {
  Bytes r;
  for (const auto& b : blocks_)
    for (const auto& [target, l] : b.linears()) {
      if (l->base.quantized) {
        r.quantized_weights += l->base.code_bytes();
        r.constants += l->base.constant_bytes();
        r.quantized_params += l->base.out * l->base.in;
      } else {
        r.frozen += l->base.code_bytes();
        r.frozen_params += l->base.dense.numel();
      }
      r.frozen += nbytes(l->bias);
      r.frozen_params += l->bias.numel();
    }
  for (const torch::Tensor* t : {&wte_, &wpe_, &ln_f_weight_, &ln_f_bias_}) {
    r.frozen += nbytes(*t);
    r.frozen_params += t->numel();
  }
  for (const auto& b : blocks_)
    for (const torch::Tensor* t : {&b.ln_1_weight, &b.ln_1_bias, &b.ln_2_weight, &b.ln_2_bias}) {
      r.frozen += nbytes(*t);
      r.frozen_params += t->numel();
    }
  for (const auto& [name, t] : named_adapters()) {
    r.adapters += nbytes(t);
    r.trainable_params += t.numel();
  }
  return r;
}

}  // namespace tally::engine
