#include "tally/core/finetune.hpp"

#include <algorithm>
#include <cmath>

#include "tally/core/model_states.hpp"

namespace tally {

namespace {

constexpr FineTune kMethods[] = {FineTune::full, FineTune::lora, FineTune::qlora};
constexpr Quant kQuants[] = {Quant::nf4, Quant::fp4, Quant::int8};
constexpr LoraTarget kTargets[] = {LoraTarget::q,    LoraTarget::k,  LoraTarget::v,
                                   LoraTarget::o,    LoraTarget::gate, LoraTarget::up,
                                   LoraTarget::down};

template <class E, std::size_t N>
std::optional<E> parse_in(const E (&all)[N], std::string_view s) {
  for (E e : all)
    if (to_string(e) == s) return e;
  return std::nullopt;
}

// One linear layer of a decoder layer: weight d_in × d_out, `copies` of it per layer (experts).
struct Linear {
  std::optional<LoraTarget> target;  // none: not a LoRA target (an MoE router)
  double d_in = 0, d_out = 0, copies = 1;
  bool bias = false;
  double weights() const { return d_in * d_out * copies; }
};

// The decoder layer's linear layers, as core/src/model.cpp counts them.
std::vector<Linear> layer_linears(const ModelSpec& m) {
  const double h = double(m.hidden), f = double(m.ffn), E = double(m.experts);
  const double hq = double(m.heads * m.head_dim()), kv = double(m.kv_heads * m.head_dim());
  const bool lb = m.linear_bias, qkvb = m.linear_bias || m.qkv_bias;
  std::vector<Linear> v = {{LoraTarget::q, h, hq, 1, qkvb},
                           {LoraTarget::k, h, kv, 1, qkvb},
                           {LoraTarget::v, h, kv, 1, qkvb},
                           {LoraTarget::o, hq, h, 1, lb}};
  if (m.mlp == MlpKind::swiglu) {
    v.push_back({LoraTarget::gate, h, f, E, false});
    v.push_back({LoraTarget::up, h, f, E, false});
    v.push_back({LoraTarget::down, f, h, E, false});
  } else {
    v.push_back({LoraTarget::up, h, f, E, lb});
    v.push_back({LoraTarget::down, f, h, E, lb});
  }
  if (m.is_moe()) v.push_back({std::nullopt, h, E, 1, false});  // router
  return v;
}

}  // namespace

std::string_view to_string(FineTune f) {
  switch (f) {
    case FineTune::full: return "full";
    case FineTune::lora: return "lora";
    case FineTune::qlora: return "qlora";
  }
  return "?";
}
std::string_view to_string(Quant q) {
  switch (q) {
    case Quant::nf4: return "nf4";
    case Quant::fp4: return "fp4";
    case Quant::int8: return "int8";
  }
  return "?";
}
std::string_view to_string(LoraTarget t) {
  switch (t) {
    case LoraTarget::q: return "q";
    case LoraTarget::k: return "k";
    case LoraTarget::v: return "v";
    case LoraTarget::o: return "o";
    case LoraTarget::gate: return "gate";
    case LoraTarget::up: return "up";
    case LoraTarget::down: return "down";
  }
  return "?";
}
std::optional<FineTune> parse_finetune(std::string_view s) { return parse_in(kMethods, s); }
std::optional<Quant> parse_quant(std::string_view s) { return parse_in(kQuants, s); }
std::optional<LoraTarget> parse_lora_target(std::string_view s) { return parse_in(kTargets, s); }

void LoraSetup::validate(const ModelSpec& m) const {
  if (m.params_only)
    throw InvalidInput("--method " + std::string(to_string(method)) +
                       ": LoRA needs an architecture (a preset or config.json), not only --params");
  m.validate();
  if (method == FineTune::full)
    throw InvalidInput("--method full: the model-state ledger answers it, not the LoRA ledger");
  // Fine-tuning trains the main model; its ledgers have no MTP modules (Note [multi-token
  // prediction] in model.cpp).
  require_int(m.mtp_layers == 0, "mtp-layers", m.mtp_layers,
              "must be 0 with --method " + std::string(to_string(method)) +
                  " (LoRA fine-tuning of the MTP modules is not modelled)");
  require_int(rank >= 1 && rank <= 65536, "lora-rank", rank, "must be in [1, 65536]");
  require_real(std::isfinite(alpha) && alpha > 0, "lora-alpha", alpha, "must be > 0");
  require_real(std::isfinite(dropout) && dropout >= 0 && dropout < 1, "lora-dropout", dropout,
               "must be in [0, 1)");
  require_int(block >= 16 && block <= 4096, "quant-block", block, "must be in [16, 4096]");
  require_int(block2 >= 16 && block2 <= 4096, "quant-block2", block2, "must be in [16, 4096]");
  if (targets.empty()) throw InvalidInput("--lora-targets: at least one target (q,k,v,o,gate,up,down)");
  for (std::size_t i = 0; i < targets.size(); ++i) {
    if (std::count(targets.begin(), targets.end(), targets[i]) > 1)
      throw InvalidInput("--lora-targets: '" + std::string(to_string(targets[i])) +
                         "' given twice");
    if (targets[i] == LoraTarget::gate && m.mlp != MlpKind::swiglu)
      throw InvalidInput("--lora-targets: 'gate' — the model's GELU MLP has up and down only");
  }
}

FineTuneLedger finetune_ledger(const ModelSpec& m, const LoraSetup& s) {
  s.validate(m);
  const ParamCount count = count_params(m);
  const std::vector<Linear> linears = layer_linears(m);
  const double L = double(m.layers);
  double weights = 0, biases = 0, largest = 0;
  for (const Linear& l : linears) {
    weights += l.weights();
    biases += l.bias ? l.d_out * l.copies : 0.0;
    largest = std::max(largest, l.d_in * l.d_out);
  }
  // The itemisation must account for every parameter of the layers it itemises; an architecture
  // it does not know (another attention or MLP form) is refused rather than mis-counted.
  const double layer_params = L * (weights + biases);
  if (std::fabs(layer_params - (count.attention + count.mlp)) > 0.5)
    throw InvalidInput("--method " + std::string(to_string(s.method)) + ": the layers of '" +
                       m.name + "' are not itemised by the LoRA ledger (" +
                       format_number(layer_params) + " of " +
                       format_number(count.attention + count.mlp) + " parameters)");

  FineTuneLedger r;
  r.total_params = count.total();
  for (const Linear& l : linears)
    if (l.target && std::find(s.targets.begin(), s.targets.end(), *l.target) != s.targets.end())
      r.trainable_params += L * double(s.rank) * (l.d_in + l.d_out) * l.copies;
  const StateItems adam = state_bytes_per_param(Precision::fp32, s.optimizer);
  r.adapter_bytes = adam.params * r.trainable_params;
  r.adapter_grad_bytes = adam.grads * r.trainable_params;
  r.adapter_optimizer_bytes = (adam.m + adam.v) * r.trainable_params;
  const double compute_bytes = dtype_bytes(s.compute);

  std::string conv = std::string(to_string(s.method)) + " r=" + std::to_string(s.rank) + " on ";
  for (std::size_t i = 0; i < s.targets.size(); ++i)
    conv += (i ? "," : "") + std::string(to_string(s.targets[i]));
  conv += " | adapters fp32 + " + std::string(to_string(s.optimizer)) + " | compute " +
          std::string(to_string(s.compute));
  if (s.method == FineTune::lora) {
    r.frozen_params = r.total_params;
    r.frozen_bytes = compute_bytes * r.frozen_params;
    r.convention = conv + " | frozen backbone in " + std::string(to_string(s.compute));
    return r;
  }
  r.quantized_params = L * weights;
  r.frozen_params = r.total_params - r.quantized_params;
  for (const Linear& l : linears) {
    const double n = l.d_in * l.d_out;  // one matrix
    double wbytes = 0, cbytes = 0;
    if (s.quant == Quant::int8) {
      wbytes = n;
      cbytes = 4.0 * l.d_out;  // fp32 scale per output row
    } else {
      wbytes = std::ceil(n / 2);
      const double blocks = std::ceil(n / s.block);
      cbytes = s.double_quant ? blocks + 4.0 * std::ceil(blocks / s.block2) : 4.0 * blocks;
    }
    r.quantized_weight_bytes += L * l.copies * wbytes;
    r.quant_constant_bytes += L * l.copies * cbytes;
  }
  r.bits_per_quantized_param =
      8.0 * (r.quantized_weight_bytes + r.quant_constant_bytes) / r.quantized_params;
  r.frozen_bytes = (s.upcast_unquantized ? 4.0 : compute_bytes) * r.frozen_params;
  r.dequant_transient_bytes = compute_bytes * largest;
  const bool four_bit = s.quant != Quant::int8;
  r.convention = conv + " | " + std::string(to_string(s.quant)) +
                 (four_bit ? std::string(s.double_quant ? " + double quant" : "") + ", block " +
                                 std::to_string(s.block) +
                                 (s.double_quant ? "/" + std::to_string(s.block2) : "")
                           : std::string(", fp32 scale per row")) +
                 " | embeddings, head, norms, biases " +
                 (s.upcast_unquantized ? "fp32 (PEFT prepare_model_for_kbit_training)"
                                       : std::string(to_string(s.compute))) +
                 " | one dequantized layer";
  return r;
}

void add_lora_activations(const ModelSpec& m, const LoraSetup& s, ActivationSetup& a) {
  s.validate(m);
  a.lora_input_width = a.lora_rank_width = 0;
  for (const Linear& l : layer_linears(m)) {
    if (!l.target || std::find(s.targets.begin(), s.targets.end(), *l.target) == s.targets.end())
      continue;
    // An expert's matrix sees the tokens routed to it: top-k copies of each token in all.
    const double per_token = l.copies > 1 ? double(m.experts_per_token) : 1.0;
    a.lora_input_width += l.d_in * per_token;
    a.lora_rank_width += double(s.rank) * per_token;
  }
  a.lora_dropout = s.dropout > 0;
}

}  // namespace tally
