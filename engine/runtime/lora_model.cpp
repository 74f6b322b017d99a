// LoRA / QLoRA on the engine's decoders (lora_model.hpp): frozen dense or NF4 weights in the
// compute dtype, fp32 adapters and per-block gradient checkpointing.
#include "lora_model.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <array>
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
// Into bf16: core's fp32 values for up to this many elements at a time, on the stack, then
// rounded (Note [NF4 linear]); blocks hold at most 4096 elements (LoraSetup::validate).
constexpr std::int64_t kDequantScratch = 4096;

}  // namespace

// ---- FrozenWeight -------------------------------------------------------------------------------

FrozenWeight FrozenWeight::make_dense(const torch::Tensor& w, torch::ScalarType dtype) {
  FrozenWeight f;
  f.out = w.size(0);
  f.in = w.size(1);
  f.dense = w.detach().to(dtype).contiguous().clone();
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

torch::Tensor FrozenWeight::weight(torch::ScalarType dtype) const {
  TORCH_CHECK(dtype == torch::kFloat || dtype == torch::kBFloat16, "compute dtype ", dtype,
              ": fp32 or bf16");
  if (!quantized) return dense.scalar_type() == dtype ? dense : dense.to(dtype);
  const Nf4View v = view();
  // The transient dequantized layer, in the compute dtype.
  torch::Tensor w = torch::empty({out, in}, torch::TensorOptions().dtype(dtype));
  if (dtype == torch::kFloat) {
    float* data = w.data_ptr<float>();
    at::parallel_for(0, v.blocks(), kDequantGrainBlocks, [&](std::int64_t b0, std::int64_t b1) {
      const std::int64_t begin = b0 * v.block, end = std::min(v.count, b1 * v.block);
      dequantize_nf4(v, b0, b1, std::span<float>(data + begin, std::size_t(end - begin)));
    });
    return w;
  }
  auto* data = w.data_ptr<at::BFloat16>();
  const std::int64_t step = std::max<std::int64_t>(1, kDequantScratch / v.block);  // blocks
  at::parallel_for(0, v.blocks(), kDequantGrainBlocks, [&](std::int64_t b0, std::int64_t b1) {
    std::array<float, kDequantScratch> scratch;
    for (std::int64_t s0 = b0; s0 < b1; s0 += step) {
      const std::int64_t s1 = std::min(b1, s0 + step);
      const std::int64_t begin = s0 * v.block, end = std::min(v.count, s1 * v.block);
      dequantize_nf4(v, s0, s1, std::span<float>(scratch.data(), std::size_t(end - begin)));
      for (std::int64_t i = begin; i < end; ++i)
        data[i] = at::BFloat16(scratch[std::size_t(i - begin)]);  // round to nearest even
    }
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
    return torch::matmul(x, w->weight(x.scalar_type()).t());  // the dequantized copy dies here
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const auto* w = reinterpret_cast<const FrozenWeight*>(ctx->saved_data["w"].toInt());
    return {torch::matmul(g[0], w->weight(g[0].scalar_type())), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor frozen_matmul(const torch::Tensor& x, const FrozenWeight& w) {
  return FrozenMatmul::apply(x, &w);
}

torch::Tensor LoraLinear::forward(const torch::Tensor& x, bool train) const {
  const torch::ScalarType dt = x.scalar_type();  // the compute dtype
  torch::Tensor y = frozen_matmul(x, base);
  if (bias.defined()) y = y + bias.to(dt);
  if (!adapted()) return y;
  const torch::Tensor in = dropout > 0 ? torch::dropout(x, dropout, train) : x;
  // The fp32 masters cast for the matmuls as autocast does (Note [compute dtype]); fp32: no copy.
  return y + torch::matmul(torch::matmul(in, lora_A.to(dt).t()), lora_B.to(dt).t()) * scale;
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

namespace {
LoraLinear& slot(LoraBlock& b, LoraTarget t) {
  switch (t) {
    case LoraTarget::q: return b.q_proj;
    case LoraTarget::k: return b.k_proj;
    case LoraTarget::v: return b.v_proj;
    case LoraTarget::o: return b.o_proj;
    case LoraTarget::gate: return b.gate_proj;
    case LoraTarget::up: return b.up_proj;
    case LoraTarget::down: return b.down_proj;
  }
  TALLY_INVARIANT(false && "a LoraTarget");
  return b.q_proj;
}
}  // namespace

std::vector<std::pair<LoraTarget, const LoraLinear*>> LoraBlock::linears() const {
  std::vector<std::pair<LoraTarget, const LoraLinear*>> v = {
      {LoraTarget::q, &q_proj}, {LoraTarget::k, &k_proj}, {LoraTarget::v, &v_proj},
      {LoraTarget::o, &o_proj}};
  if (arch == Arch::llama) v.emplace_back(LoraTarget::gate, &gate_proj);
  v.emplace_back(LoraTarget::up, &up_proj);
  v.emplace_back(LoraTarget::down, &down_proj);
  return v;
}

std::vector<std::pair<LoraTarget, LoraLinear*>> LoraBlock::linears() {
  std::vector<std::pair<LoraTarget, LoraLinear*>> v;
  for (const auto& [t, l] : std::as_const(*this).linears())
    v.emplace_back(t, const_cast<LoraLinear*>(l));  // *this is not const: neither are its parts
  return v;
}

const LoraLinear& LoraBlock::linear(LoraTarget t) const {
  for (const auto& [target, l] : linears())
    if (target == t) return *l;
  TALLY_INVARIANT(false && "the block has this linear");
  return q_proj;
}

torch::Tensor LoraBlock::forward(const torch::Tensor& x, const BlockContext& c, bool train) const {
  if (arch == Arch::llama) {  // llama_model.cpp's LlamaBlock
    const auto a = rms_norm(x, norm_1_weight, norm_eps);
    const auto y = llama_attention(q_proj.forward(a, train), k_proj.forward(a, train),
                                   v_proj.forward(a, train), heads, kv_heads, c.mask, c.cos, c.sin);
    const auto h = x + o_proj.forward(y, train);  // (B, T, C)
    const auto m = rms_norm(h, norm_2_weight, norm_eps);
    const auto gated = torch::silu(gate_proj.forward(m, train)) * up_proj.forward(m, train);
    return h + down_proj.forward(gated, train);
  }
  // gpt_model.cpp's GptBlock; the norms' weights cast to x's dtype (no copy in fp32).
  const std::int64_t C = x.size(2);
  const auto ln = [C](const torch::Tensor& t, const torch::Tensor& w, const torch::Tensor& b) {
    return torch::layer_norm(t, {C}, w.to(t.scalar_type()), b.to(t.scalar_type()));
  };
  const auto a = ln(x, norm_1_weight, norm_1_bias);
  const auto y = causal_self_attention(q_proj.forward(a, train), k_proj.forward(a, train),
                                       v_proj.forward(a, train), heads, c.mask);
  const auto h = x + o_proj.forward(y, train);  // (B, T, C)
  const auto m = up_proj.forward(ln(h, norm_2_weight, norm_2_bias), train);
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

// Note [gradient checkpointing]. The block context (mask; rotary tables, undefined for a GPT) goes
// in saved_data: none of it requires grad, and an undefined tensor cannot be a Function's input.
struct CheckpointedBlock : torch::autograd::Function<CheckpointedBlock> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x,
                               const BlockContext* context, const LoraBlock* block, bool train) {
    ctx->saved_data["block"] = reinterpret_cast<std::int64_t>(block);
    ctx->saved_data["train"] = train;
    ctx->saved_data["mask"] = context->mask;
    if (context->cos.defined()) {
      ctx->saved_data["cos"] = context->cos;
      ctx->saved_data["sin"] = context->sin;
    }
    if (train) ctx->saved_data["rng"] = generator_state();
    ctx->save_for_backward({x});
    return block->forward(x, *context, train);  // grad mode is off here: nothing else is kept
  }
  static variable_list backward(AutogradContext* ctx, variable_list g) {
    const auto* block = reinterpret_cast<const LoraBlock*>(ctx->saved_data["block"].toInt());
    const bool train = ctx->saved_data["train"].toBool();
    BlockContext context{.mask = ctx->saved_data["mask"].toTensor()};
    if (ctx->saved_data.count("cos") > 0) {
      context.cos = ctx->saved_data["cos"].toTensor();
      context.sin = ctx->saved_data["sin"].toTensor();
    }
    const torch::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    {
      torch::AutoGradMode enable(true);
      // The forward's dropout masks again, then the generator as it was (torch's fork_rng).
      const torch::Tensor now = train ? generator_state() : torch::Tensor();
      if (train) set_generator_state(ctx->saved_data["rng"].toTensor());
      torch::Tensor y = block->forward(x, context, train);
      if (train) set_generator_state(now);
      torch::autograd::backward({y}, {g[0]});
    }
    return {x.grad(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Note [compute dtype]: the dtype the unquantized tensors are kept in.
torch::ScalarType unquantized_dtype(const LoraSetup& s, torch::ScalarType compute) {
  return s.method == FineTune::qlora && s.upcast_unquantized ? torch::kFloat : compute;
}

torch::Tensor copy_as(const torch::Tensor& t, torch::ScalarType dtype) {
  return t.defined() ? t.detach().to(dtype).contiguous().clone() : torch::Tensor();
}

LoraLinear make_linear(const SourceLinear& src, const LoraSetup& s, torch::ScalarType compute) {
  LoraLinear l;
  l.base = s.method == FineTune::qlora
               ? FrozenWeight::make_nf4(src.weight, s.block, s.double_quant, s.block2)
               : FrozenWeight::make_dense(src.weight, compute);
  l.bias = copy_as(src.bias, unquantized_dtype(s, compute));
  if (std::find(s.targets.begin(), s.targets.end(), src.target) != s.targets.end()) {
    l.lora_A = torch::empty({std::int64_t(s.rank), l.base.in}, kF32).requires_grad_(true);
    l.lora_B = torch::empty({l.base.out, std::int64_t(s.rank)}, kF32).requires_grad_(true);
    l.scale = s.alpha / double(s.rank);
    l.dropout = s.dropout;
  }
  return l;
}

}  // namespace

// ---- the model ------------------------------------------------------------------------------------

void require_runnable(const LoraSetup& s, const ModelSpec& m) {
  s.validate(m);
  if (s.method != FineTune::lora && s.method != FineTune::qlora)
    throw InvalidInput("--method " + std::string(to_string(s.method)) +
                       ": tally run qlora runs lora or qlora");
  if (s.method == FineTune::qlora && s.quant != Quant::nf4)
    throw InvalidInput("--quant " + std::string(to_string(s.quant)) +
                       ": tally run qlora quantizes to nf4 (the seed's); fp4 and int8 are in the "
                       "ledger only (tally memory --method qlora --quant ...)");
  if (s.compute != Precision::fp32 && s.compute != Precision::bf16)
    throw InvalidInput("--precision " + std::string(to_string(s.compute)) +
                       ": tally run qlora computes in fp32 or bf16 (libtorch 1.13 has no fp16 "
                       "matrix product on the CPU)");
}

torch::ScalarType LoraModel::compute_dtype() const {
  return options_.lora.compute == Precision::bf16 ? torch::kBFloat16 : torch::kFloat;
}

LoraModel::LoraModel(const SourceModel& src, const LoraModelOptions& options)
    : arch_(src.arch), spec_(src.spec), options_(options), rope_theta_(src.rope_theta),
      norm_eps_(src.norm_eps) {
  const LoraSetup& s = options_.lora;
  require_runnable(s, spec_);
  torch::NoGradGuard no_grad;
  const torch::ScalarType compute = compute_dtype(), kept = unquantized_dtype(s, compute);
  embed_ = copy_as(src.embed, kept);
  positions_ = copy_as(src.positions, kept);
  norm_f_weight_ = copy_as(src.norm_f_weight, kept);
  norm_f_bias_ = copy_as(src.norm_f_bias, kept);
  head_.out = embed_.size(0);
  head_.in = embed_.size(1);
  head_.dense = src.lm_head.defined() ? copy_as(src.lm_head, kept) : embed_;  // gpt: tied
  for (const SourceBlock& sb : src.blocks) {
    LoraBlock b{.arch = arch_, .heads = src.heads, .kv_heads = src.kv_heads,
                .norm_eps = src.norm_eps};
    b.norm_1_weight = copy_as(sb.norm_1_weight, kept);
    b.norm_1_bias = copy_as(sb.norm_1_bias, kept);
    b.norm_2_weight = copy_as(sb.norm_2_weight, kept);
    b.norm_2_bias = copy_as(sb.norm_2_bias, kept);
    for (const SourceLinear& l : sb.linears) slot(b, l.target) = make_linear(l, s, compute);
    blocks_.push_back(std::move(b));
  }
  reset_adapters();
}

void LoraModel::reset_adapters() {
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

torch::Tensor LoraModel::forward(const torch::Tensor& idx, const torch::Tensor& targets,
                                 bool train, const std::function<void()>& on_head_backward) const {
  const std::int64_t T = idx.size(1), C = spec_.hidden;
  const torch::ScalarType dt = compute_dtype();
  const bool graph = torch::GradMode::is_enabled();
  torch::Tensor x = torch::embedding(embed_, idx);  // (B, T, C)
  if (arch_ == Arch::gpt) {
    TORCH_CHECK(T <= positions_.size(0), "sequence ", T, " exceeds the position table ",
                positions_.size(0));
    x = x + positions_.narrow(0, 0, T);
  }
  x = x.to(dt);  // activations in the compute dtype (Note [compute dtype]); fp32: x itself
  if (graph) x.requires_grad_(true);  // enable_input_require_grads (Note [gradient checkpointing])
  BlockContext ctx{.mask = causal_mask(T)};
  if (arch_ == Arch::llama)
    std::tie(ctx.cos, ctx.sin) = rotary_tables(T, spec_.head_dim(), rope_theta_, dt);
  for (const LoraBlock& b : blocks_)
    x = graph && options_.checkpoint
            ? CheckpointedBlock::apply(x, &ctx, &b, train)
            : b.forward(x, ctx, train);
  if (graph && on_head_backward) x.register_hook([on_head_backward](torch::Tensor) {
    on_head_backward();
  });
  const torch::Tensor h =
      arch_ == Arch::llama
          ? rms_norm(x, norm_f_weight_, norm_eps_)
          : torch::layer_norm(x, {C}, norm_f_weight_.to(dt), norm_f_bias_.to(dt));
  // The head, frozen: the same saves-nothing matmul as the frozen linears; logits upcast to fp32.
  return lm_loss(frozen_matmul(h, head_), targets);
}

std::vector<torch::Tensor> LoraModel::adapter_parameters() const {
  std::vector<torch::Tensor> v;
  for (const auto& [name, t] : named_adapters()) v.push_back(t);
  return v;
}

std::vector<std::pair<std::string, torch::Tensor>> LoraModel::named_adapters() const {
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

// Names as the source modules name them: gpt.hpp's (wte, wpe, ln_1, ln_f) or Hugging Face
// Llama's (embed_tokens, input_layernorm, norm, lm_head); only defined tensors.
std::vector<std::pair<std::string, torch::Tensor>> LoraModel::named_frozen() const {
  const bool gpt = arch_ == Arch::gpt;
  std::vector<std::pair<std::string, torch::Tensor>> v;
  const auto add = [&v](std::string name, const torch::Tensor& t) {
    if (t.defined()) v.emplace_back(std::move(name), t);
  };
  add(gpt ? "wte.weight" : "embed_tokens.weight", embed_);
  add("wpe", positions_);
  for (std::size_t i = 0; i < blocks_.size(); ++i) {
    const LoraBlock& b = blocks_[i];
    const std::string prefix = "blocks." + std::to_string(i) + ".";
    const std::string n1 = prefix + (gpt ? "ln_1." : "input_layernorm.");
    const std::string n2 = prefix + (gpt ? "ln_2." : "post_attention_layernorm.");
    add(n1 + "weight", b.norm_1_weight);
    add(n1 + "bias", b.norm_1_bias);
    for (const auto& [target, l] : b.linears()) {
      const std::string name = prefix + std::string(module_name(target)) + ".";
      for (const auto& [suffix, t] : l->base.storage()) add(name + suffix, t);
      add(name + "bias", l->bias);
    }
    add(n2 + "weight", b.norm_2_weight);
    add(n2 + "bias", b.norm_2_bias);
  }
  add(gpt ? "ln_f.weight" : "norm.weight", norm_f_weight_);
  add("ln_f.bias", norm_f_bias_);
  if (!gpt) add("lm_head.weight", head_.dense);
  return v;
}

LoraModel::Bytes LoraModel::bytes() const {
  Bytes r;
  const auto frozen = [&r](const torch::Tensor& t) {
    if (!t.defined()) return;
    r.frozen += nbytes(t);
    r.frozen_params += t.numel();
  };
  for (const auto& b : blocks_)
    for (const auto& [target, l] : b.linears()) {
      if (l->base.quantized) {
        r.quantized_weights += l->base.code_bytes();
        r.constants += l->base.constant_bytes();
        r.quantized_params += l->base.out * l->base.in;
      } else {
        frozen(l->base.dense);
      }
      frozen(l->bias);
    }
  for (const torch::Tensor* t : {&embed_, &positions_, &norm_f_weight_, &norm_f_bias_}) frozen(*t);
  if (arch_ == Arch::llama) frozen(head_.dense);  // untied
  for (const auto& b : blocks_)
    for (const torch::Tensor* t : {&b.norm_1_weight, &b.norm_1_bias, &b.norm_2_weight,
                                   &b.norm_2_bias})
      frozen(*t);
  for (const auto& [name, t] : named_adapters()) {
    r.adapters += nbytes(t);
    r.trainable_params += t.numel();
  }
  return r;
}

// ---- sources --------------------------------------------------------------------------------------

SourceModel source_of(const Gpt& g) {
  const GptConfig& c = g->config;
  SourceModel s{.arch = Arch::gpt, .spec = gpt_model_spec(c), .heads = c.heads,
                .kv_heads = c.heads};
  s.embed = g->wte->weight;
  s.positions = g->wpe;
  s.norm_f_weight = g->ln_f->weight;
  s.norm_f_bias = g->ln_f->bias;
  const std::int64_t C = c.hidden;
  const auto rows = [C](const torch::Tensor& t, int i) { return t.narrow(0, i * C, C); };
  for (const auto& m : *g->blocks) {
    const auto& b = *m->as<GptBlock>();
    s.blocks.push_back(
        {.norm_1_weight = b.ln_1->weight, .norm_1_bias = b.ln_1->bias,
         .norm_2_weight = b.ln_2->weight, .norm_2_bias = b.ln_2->bias,
         .linears = {{LoraTarget::q, rows(b.c_attn->weight, 0), rows(b.c_attn->bias, 0)},
                     {LoraTarget::k, rows(b.c_attn->weight, 1), rows(b.c_attn->bias, 1)},
                     {LoraTarget::v, rows(b.c_attn->weight, 2), rows(b.c_attn->bias, 2)},
                     {LoraTarget::o, b.c_proj->weight, b.c_proj->bias},
                     {LoraTarget::up, b.c_fc->weight, b.c_fc->bias},
                     {LoraTarget::down, b.mlp_proj->weight, b.mlp_proj->bias}}});
  }
  return s;
}

SourceModel source_of(const Llama& m) {
  const LlamaConfig& c = m->config;
  SourceModel s{.arch = Arch::llama, .spec = llama_model_spec(c), .heads = c.heads,
                .kv_heads = c.kv_heads, .rope_theta = c.rope_theta, .norm_eps = c.norm_eps};
  s.embed = m->embed_tokens->weight;
  s.norm_f_weight = m->norm;
  s.lm_head = m->lm_head->weight;
  for (const auto& layer : *m->layers) {
    const auto& b = *layer->as<LlamaBlock>();
    s.blocks.push_back({.norm_1_weight = b.input_layernorm,
                        .norm_2_weight = b.post_attention_layernorm,
                        .linears = {{LoraTarget::q, b.q_proj->weight, {}},
                                    {LoraTarget::k, b.k_proj->weight, {}},
                                    {LoraTarget::v, b.v_proj->weight, {}},
                                    {LoraTarget::o, b.o_proj->weight, {}},
                                    {LoraTarget::gate, b.gate_proj->weight, {}},
                                    {LoraTarget::up, b.up_proj->weight, {}},
                                    {LoraTarget::down, b.down_proj->weight, {}}}});
  }
  return s;
}

}  // namespace tally::engine
