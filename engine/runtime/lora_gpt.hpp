// LoRA and QLoRA on the engine's GPT (internal: torch). The seed's QLoRA program — transformers +
// bitsandbytes `load_in_4bit` (NF4, double quantization), PEFT `prepare_model_for_kbit_training` +
// `get_peft_model(LoraConfig(r, lora_alpha, lora_dropout, target_modules))` with gradient
// checkpointing — on the CPU, in fp32 compute.
//
// Legend: B = micro-batch, T = sequence, C = hidden, L = layers, a = heads, V = vocabulary,
// r = LoRA rank, d_in × d_out = a linear layer (weight (d_out, d_in)).
//
// The module is gpt.hpp's GPT with its fused c_attn split into q_proj, k_proj, v_proj (rows
// [0, C), [C, 2C), [2C, 3C) of the fused weight: the same function) and the other linears named as
// Hugging Face's Llama names them (core/finetune.hpp's LoraTarget): o_proj = c_proj, up_proj = c_fc,
// down_proj = mlp_proj. Every weight is frozen; the trainable parameters are the adapters.
//
// Note [NF4 linear]
// Method qlora keeps each decoder-layer linear weight as bitsandbytes' Linear4bit does: the NF4
// indices, two per byte, and the constants (core/lowp.hpp quantize_nf4; with double quantization
// the 8-bit absmax codes, one fp32 absmax per block2 of them and the fp32 mean), each a torch
// tensor. Every use dequantizes the weight to a fresh fp32 (d_out, d_in) tensor through core's
// dequantize_nf4 (the one definition) and frees it after the matmul — the ledger's transient
// "dequantized layer". The matmul is an autograd function that saves nothing (bitsandbytes'
// MatMul4Bit saves the quantized state only): backward dequantizes again for dx = dy·W, and no
// weight gradient exists. Method lora holds the weight dense in fp32 and runs the same function,
// so the two methods differ in the weight's storage alone. Biases, LayerNorms, the embeddings and
// the tied head stay unquantized in fp32 (the compute dtype here; PEFT would upcast them to fp32).
//
// Note [LoRA adapter]
// PEFT's LoraLayer: y = base(x) + B(A(dropout(x)))·α/r, A (r, d_in) Kaiming-uniform with a = √5
// (bound 1/√d_in, nn.Linear's default), B (d_out, r) zero, so an untrained adapter changes
// nothing; fp32 parameters, no bias. Dropout applies to the adapter's input only (train()).
//
// Note [gradient checkpointing]
// libtorch 1.13's C++ API has no torch.utils.checkpoint. CheckpointedBlock is the reentrant
// variant written as an autograd function: forward runs the block without building a graph and
// saves only its input x (B, T, C) and the CPU generator's state; backward restores that state
// (so the recomputed dropout masks are the forward's), replays the block with grad enabled from a
// detached x, and back-propagates the incoming gradient through the replay, which fills the
// adapters' .grad and returns dx. As with PyTorch's reentrant checkpoint, a graph is built only if
// some input requires grad: the embedding output is marked requires_grad (transformers'
// enable_input_require_grads, which prepare_model_for_kbit_training calls for this reason).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gpt_model.hpp"
#include "tally/core/finetune.hpp"
#include "tally/core/lowp.hpp"

namespace tally::engine {

// A frozen linear weight (d_out, d_in): dense fp32 (lora) or NF4 (qlora, Note [NF4 linear]).
struct FrozenWeight {
  std::int64_t out = 0, in = 0;
  bool quantized = false;
  int block = 64, block2 = 256;
  bool double_quant = true;
  torch::Tensor dense;        // (out, in) fp32: lora
  torch::Tensor packed;       // (⌈out·in/2⌉,) uint8: two indices per byte, high nibble first
  torch::Tensor absmax;       // (blocks,) fp32: without double quantization
  torch::Tensor absmax_code;  // (blocks,) uint8: with double quantization
  torch::Tensor absmax2;      // (⌈blocks/block2⌉,) fp32: with double quantization
  torch::Tensor absmax_mean;  // () fp32: with double quantization

  static FrozenWeight make_dense(const torch::Tensor& w);  // a copy of w, contiguous fp32
  // w's row-major elements quantized by core's quantize_nf4.
  static FrozenWeight make_nf4(const torch::Tensor& w, int block, bool double_quant, int block2);
  Nf4View view() const;      // quantized only
  torch::Tensor weight() const;  // (out, in) fp32: dense, or a new tensor dequantized now
  double code_bytes() const;      // the 4-bit indices (qlora) or the fp32 weight (lora)
  double constant_bytes() const;  // absmax (or codes + absmax2 + mean); 0 for lora
  // Every tensor held, with its name's suffix ("weight", "weight.nf4", "weight.absmax", ...).
  std::vector<std::pair<std::string, torch::Tensor>> storage() const;
};

// x (…, in) · Wᵀ → (…, out) through the autograd function of Note [NF4 linear].
torch::Tensor frozen_matmul(const torch::Tensor& x, const FrozenWeight& w);

// One frozen linear with an optional adapter (Note [LoRA adapter]).
struct LoraLinear {
  FrozenWeight base;
  torch::Tensor bias;            // (out,) fp32, frozen
  torch::Tensor lora_A, lora_B;  // (r, in), (out, r), requires_grad; undefined: not a target
  double scale = 0, dropout = 0;
  bool adapted() const { return lora_A.defined(); }
  torch::Tensor forward(const torch::Tensor& x, bool train) const;
};

struct LoraBlock {
  std::int64_t heads = 0;
  torch::Tensor ln_1_weight, ln_1_bias, ln_2_weight, ln_2_bias;  // (C)
  LoraLinear q_proj, k_proj, v_proj, o_proj, up_proj, down_proj;
  // x (B, T, C) → (B, T, C): gpt_model.cpp's block with the adapters' deltas.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& causal_mask, bool train) const;
  // The linears with their Hugging Face names, in a fixed order.
  std::vector<std::pair<LoraTarget, const LoraLinear*>> linears() const;
  std::vector<std::pair<LoraTarget, LoraLinear*>> linears();
};

std::string_view module_name(LoraTarget t);  // "q_proj", "k_proj", ..., "down_proj"

// Throws InvalidInput naming the flag unless this module runs the setup on a GPT of shape c:
// method lora or qlora, quant nf4, compute fp32, and what LoraSetup::validate checks (no 'gate'
// target: the GELU MLP has up and down only).
void require_runnable(const LoraSetup& s, const GptConfig& c);

struct LoraGptOptions {
  LoraSetup lora;                  // method lora | qlora; quant nf4; compute fp32
  bool checkpoint = true;          // Note [gradient checkpointing], per block
};

class LoraGpt {
 public:
  // The frozen backbone from `source`'s weights (copied or quantized; source may be destroyed
  // afterwards) and fresh adapters drawn from torch's default generator. Throws InvalidInput when
  // the setup is not one this module runs (method full, quant fp4/int8, target gate).
  LoraGpt(const Gpt& source, const LoraGptOptions& options);

  // idx, targets (B, T) → mean cross-entropy (fp32 scalar). train: the adapters' dropout on, and
  // with grad mode the blocks are checkpointed (options.checkpoint). on_head_backward, when set,
  // is called once in backward when the gradient reaches the last block's output (the loss, LM
  // head and final LayerNorm are done, the blocks' backward begins).
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets, bool train,
                        const std::function<void()>& on_head_backward = {}) const;

  std::vector<torch::Tensor> adapter_parameters() const;  // A and B of every adapter, in order
  // Named tensors: the adapters ("blocks.3.v_proj.lora_A.weight", PEFT's suffixes) and everything
  // frozen ("wte.weight", "blocks.0.q_proj.weight.nf4", ...).
  std::vector<std::pair<std::string, torch::Tensor>> named_adapters() const;
  std::vector<std::pair<std::string, torch::Tensor>> named_frozen() const;
  // A fresh draw of every adapter (A Kaiming-uniform, B zero) from torch's default generator.
  void reset_adapters();

  // The bytes the model holds, by ledger item (Σ nbytes of its tensors).
  struct Bytes {
    double quantized_weights = 0;  // NF4 indices (qlora); 0 for lora
    double constants = 0;          // NF4 constants
    double frozen = 0;             // the rest of the backbone: dense weights (lora), biases,
                                   // norms, embeddings
    double adapters = 0;
    std::int64_t quantized_params = 0;  // elements behind the NF4 indices
    std::int64_t frozen_params = 0;     // elements of the other frozen tensors
    std::int64_t trainable_params = 0;  // adapter elements
    double backbone() const { return quantized_weights + constants + frozen; }
  };
  Bytes bytes() const;

  const LoraGptOptions& options() const { return options_; }
  const GptConfig& config() const { return config_; }
  const std::vector<LoraBlock>& blocks() const { return blocks_; }

 private:
  GptConfig config_;
  LoraGptOptions options_;
  torch::Tensor wte_, wpe_, ln_f_weight_, ln_f_bias_;  // (V, C), (T, C), (C), (C)
  FrozenWeight head_;                                   // the LM head: wte_ itself (tied)
  std::vector<LoraBlock> blocks_;
};

// ---- adapters on disk (Note [adapter file]) -----------------------------------------------------

// Note [adapter file]
// PEFT's save_pretrained writes only the adapters: adapter_model.safetensors (the A and B weights,
// named after their modules) beside adapter_config.json. tally writes the one safetensors file,
// F32 tensors named as named_adapters() names them, with the LoRA configuration in the header's
// __metadata__: "lora_config" holds PEFT's fields (peft_type, r, lora_alpha, lora_dropout,
// target_modules, bias "none") and tally's base-model description (method, quantization, the GPT
// shape); "format" is "pt" as PEFT writes it. Loading checks that configuration and every tensor's
// name, dtype and shape against the model and refuses a mismatch with one line.
inline constexpr const char* kAdapterFileName = "adapter_model.safetensors";

struct AdapterFile {
  std::filesystem::path path;
  std::int64_t bytes = 0;        // the file's size
  std::int64_t tensors = 0;
  std::string lora_config;       // the metadata's JSON text
};
// Writes <dir>/adapter_model.safetensors (dir is created). Throws std::system_error on I/O.
AdapterFile save_adapters(const LoraGpt& model, const std::filesystem::path& dir);
// Copies the adapters of <dir>/adapter_model.safetensors into the model. Throws InvalidInput
// naming the file for a missing file, another configuration or a tensor that does not fit.
AdapterFile load_adapters(LoraGpt& model, const std::filesystem::path& dir);

}  // namespace tally::engine
