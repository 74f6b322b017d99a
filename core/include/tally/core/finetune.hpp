// Fine-tuning ledgers (issue 12, the seed's QLoRA program): full fine-tuning, LoRA on a frozen
// backbone in the compute dtype, and QLoRA on a frozen 4-bit backbone.
//
// Legend: N = the model's parameters, r = LoRA rank, d_in × d_out = a linear layer's weight, B = the
// first-level quantization block (64), B2 = the second-level block of double quantization (256).
//
// Note [QLoRA ledger]
// Which tensors exist, in which format, following what the seed's program runs (transformers +
// bitsandbytes `BitsAndBytesConfig(load_in_4bit, nf4, double quant, bf16 compute)`, PEFT
// `prepare_model_for_kbit_training` then `get_peft_model`):
//  - quantized: every linear weight of the decoder layers (q, k, v, o, the MLP's matrices, an MoE
//    router) — transformers replaces each such nn.Linear with bitsandbytes' Linear4bit and skips
//    lm_head; 4 bits per parameter, two indices per byte;
//  - quantization constants (Dettmers et al. 2023, "QLoRA", §3): one fp32 absmax per block of 64
//    parameters, 32/64 = 0.5 bits per parameter; with double quantization the absmax values are
//    themselves quantized to 8 bits in blocks of 256 with one fp32 constant each:
//    8/64 + 32/(64·256) = 0.127 bits per parameter (the paper's figures; the per-tensor mean it
//    subtracts is not counted). int8 (LLM.int8, bitsandbytes Linear8bitLt): 8 bits and one fp32
//    scale per output row;
//  - left unquantized: embeddings, the LM head, norms and biases. PEFT's
//    prepare_model_for_kbit_training casts every non-quantized fp16/bf16 parameter to fp32 (the
//    seed calls it), so by default they take 4 bytes; `upcast_unquantized = false` keeps the
//    compute dtype;
//  - LoRA adapters: A (r × d_in) and B (d_out × r) per target matrix, per layer (per expert for an
//    MoE's MLP), trainable, in fp32 (PEFT creates them as nn.Linear in the default dtype), with
//    fp32 gradients and the optimizer's states (Adam: m, v);
//  - transient: Linear4bit dequantizes its weight to the compute dtype for each matmul, so the
//    largest quantized matrix exists once more in the compute dtype while it runs.
// LoRA (no quantization) keeps the whole frozen backbone in the compute dtype. Full fine-tuning is
// the model-state ledger (core/model_states.hpp). Activations are not here: the activation ledger
// (core/activations.hpp, with full recompute for gradient checkpointing) counts the backbone's.
#pragma once

#include <string>
#include <string_view>
#include <optional>
#include <vector>

#include "tally/core/activations.hpp"
#include "tally/core/model.hpp"
#include "tally/core/types.hpp"

namespace tally {

enum class FineTune { full, lora, qlora };
enum class Quant { nf4, fp4, int8 };
// Hugging Face Llama module names; a GELU MLP (GPT) has up and down only.
enum class LoraTarget { q, k, v, o, gate, up, down };

std::string_view to_string(FineTune f);
std::string_view to_string(Quant q);
std::string_view to_string(LoraTarget t);
std::optional<FineTune> parse_finetune(std::string_view s);
std::optional<Quant> parse_quant(std::string_view s);
std::optional<LoraTarget> parse_lora_target(std::string_view s);

struct LoraSetup {
  FineTune method = FineTune::qlora;
  int rank = 8;
  double alpha = 16;                 // scale α/r; no memory of its own
  double dropout = 0.05;             // PEFT lora_dropout (the seed's 0.05; PEFT's default is 0)
  std::vector<LoraTarget> targets = {LoraTarget::q, LoraTarget::v};
  Quant quant = Quant::nf4;
  bool double_quant = true;
  int block = 64;                    // first-level block (nf4/fp4)
  int block2 = 256;                  // second-level block (double quantization)
  Precision compute = Precision::bf16;
  bool upcast_unquantized = true;    // PEFT prepare_model_for_kbit_training (qlora only)
  Optimizer optimizer = Optimizer::adam;  // of the adapters
  void validate(const ModelSpec& m) const;  // throws InvalidInput naming the field
};

struct FineTuneLedger {
  double total_params = 0;           // the model's N (count_params)
  double trainable_params = 0;       // adapters (lora, qlora)
  double trainable_fraction() const { return total_params > 0 ? trainable_params / total_params : 0; }
  double quantized_params = 0;       // qlora: the decoder layers' linear weights
  double frozen_params = 0;          // the rest of the backbone (qlora) or all of it (lora)
  double bits_per_quantized_param = 0;  // weights + constants, averaged (nf4 + dq: 4.127)
  // bytes
  double quantized_weight_bytes = 0;
  double quant_constant_bytes = 0;
  double frozen_bytes = 0;
  double adapter_bytes = 0, adapter_grad_bytes = 0, adapter_optimizer_bytes = 0;
  double dequant_transient_bytes = 0;
  double backbone_bytes() const { return quantized_weight_bytes + quant_constant_bytes + frozen_bytes; }
  double adapter_total_bytes() const {
    return adapter_bytes + adapter_grad_bytes + adapter_optimizer_bytes;
  }
  double static_bytes() const {
    return backbone_bytes() + adapter_total_bytes() + dequant_transient_bytes;
  }
  std::string convention;            // quant, double quant, block, unquantized dtype, compute
};

// Note [QLoRA ledger]; method must be lora or qlora (full fine-tuning: core/model_states.hpp).
FineTuneLedger finetune_ledger(const ModelSpec& m, const LoraSetup& s);

// The adapters' share of the activation ledger (Note [activation inventory], LoRA adapters): sets
// a's lora_input_width (Σ d_in of one layer's adapted matrices, an MoE expert's once per routed
// choice), lora_rank_width (Σ r over them) and lora_dropout (s.dropout > 0).
void add_lora_activations(const ModelSpec& m, const LoraSetup& s, ActivationSetup& a);

}  // namespace tally
