// LoRA and QLoRA on the engine's decoders, GPT (gpt_model.hpp) or Llama (llama_model.hpp)
// layout (internal: torch). The seed's QLoRA program — transformers + bitsandbytes `load_in_4bit`
// (NF4, double quantization, bnb_4bit_compute_dtype), PEFT `prepare_model_for_kbit_training` +
// `get_peft_model(LoraConfig(r, lora_alpha, lora_dropout, target_modules))` with gradient
// checkpointing — on the CPU, in fp32 or bf16 compute (Note [compute dtype]).
//
// Legend: B = micro-batch, T = sequence, C = hidden, L = layers, a = heads, a_kv = key/value
// heads, f = MLP width, V = vocabulary, r = LoRA rank, d_in × d_out = a linear layer (weight
// (d_out, d_in)).
//
// The module is built from a SourceModel, the fp32 weights by Hugging Face's Llama names
// (core/finetune.hpp's LoraTarget). From gpt.hpp's GPT: its fused c_attn split into q_proj, k_proj,
// v_proj (rows [0, C), [C, 2C), [2C, 3C) of the fused weight: the same function), o_proj = c_proj,
// up_proj = c_fc, down_proj = mlp_proj (no gate: a GELU MLP). From llama_model.hpp's Llama: its
// q, k, v, o, gate, up and down projections as they are. Every weight is frozen; the trainable
// parameters are the adapters.
//
// Note [NF4 linear]
// Method qlora keeps each decoder-layer linear weight as bitsandbytes' Linear4bit does: the NF4
// indices, two per byte, and the constants (core/lowp.hpp quantize_nf4; with double quantization
// the 8-bit absmax codes, one fp32 absmax per block2 of them and the fp32 mean), each a torch
// tensor. Every use dequantizes the weight to a fresh (d_out, d_in) tensor in the compute dtype
// through core's dequantize_nf4 (the one definition; bf16: its fp32 values rounded to nearest
// even, as bitsandbytes' kernel writes its output dtype) and frees it after the matmul — the
// ledger's transient "dequantized layer". The matmul is an autograd function that saves nothing
// (bitsandbytes' MatMul4Bit saves the quantized state only): backward dequantizes again for
// dx = dy·W, and no weight gradient exists. Method lora holds the weight dense in the compute
// dtype and runs the same function, so the two methods differ in the weight's storage alone.
//
// Note [compute dtype]
// What core's ledger assumes for lora / qlora at compute dtype c (core/finetune.hpp Note [QLoRA
// ledger]; the activations at dtype_bytes(c) per element, core/activations.hpp Note [activation
// inventory], LoRA adapters) and this model does:
//  - weights dequantized to c for each matmul, as bitsandbytes' Linear4bit.forward casts its input
//    to compute_dtype and matmul_4bit dequantizes to it: the transient is c's bytes × d_out·d_in;
//  - the adapters' master weights, their gradients and Adam's m, v in fp32 (PEFT creates them as
//    nn.Linear in the default dtype and PeftModel's autocast_adapter_dtype = True upcasts bf16
//    adapters to fp32); each use casts A and B to c, as torch.autocast casts an fp32 weight for a
//    bf16 matmul, so the adapters' matmuls and what they save (A's output, the dropout output) are
//    in c and the gradient reaches the fp32 master through the cast's backward;
//  - activations in c: the embedding output is cast to c, so is every tensor a block passes on;
//    the norms' statistics in fp32 (HF LlamaRMSNorm), the logits upcast to fp32 for the loss;
//  - unquantized tensors (embeddings, LM head, norms, biases): qlora keeps them in fp32 (PEFT's
//    prepare_model_for_kbit_training; LoraSetup::upcast_unquantized = false: in c), lora keeps the
//    whole frozen backbone in c; each is cast to c where it is used (a transient copy when fp32).
// c is fp32 or bf16: libtorch 1.13 has no fp16 matrix product on the CPU. Hugging Face differs in
// one place the ledger does not follow: with the embedding upcast to fp32 and Linear4bit returning
// its input's dtype, transformers' residual stream stays fp32; here, as in the ledger, it is c.
//
// Note [LoRA adapter]
// PEFT's LoraLayer: y = base(x) + B(A(dropout(x)))·α/r, A (r, d_in) Kaiming-uniform with a = √5
// (bound 1/√d_in, nn.Linear's default), B (d_out, r) zero, so an untrained adapter changes
// nothing; fp32 parameters, no bias. Dropout applies to the adapter's input only (train()).
//
// Note [gradient checkpointing]
// libtorch 1.13's C++ API has no torch.utils.checkpoint. CheckpointedBlock is the reentrant
// variant written as an autograd function: forward runs the block without building a graph and
// saves only its input x (B, T, C) (with the mask and rotary tables, shared by every block) and
// the CPU generator's state; backward restores that state (so the recomputed dropout masks are
// the forward's), replays the block with grad enabled from a detached x, and back-propagates the
// incoming gradient through the replay, which fills the adapters' .grad and returns dx. As with
// PyTorch's reentrant checkpoint, a graph is built only if some input requires grad: the embedding
// output is marked requires_grad (transformers' enable_input_require_grads, which
// prepare_model_for_kbit_training calls for this reason).
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
#include "llama_model.hpp"
#include "tally/core/finetune.hpp"
#include "tally/core/lowp.hpp"

namespace tally::engine {

// A frozen linear weight (d_out, d_in): dense (lora; or an unquantized head) or NF4 (qlora, Note
// [NF4 linear]).
struct FrozenWeight {
  std::int64_t out = 0, in = 0;
  bool quantized = false;
  int block = 64, block2 = 256;
  bool double_quant = true;
  torch::Tensor dense;        // (out, in), its storage dtype: lora
  torch::Tensor packed;       // (⌈out·in/2⌉,) uint8: two indices per byte, high nibble first
  torch::Tensor absmax;       // (blocks,) fp32: without double quantization
  torch::Tensor absmax_code;  // (blocks,) uint8: with double quantization
  torch::Tensor absmax2;      // (⌈blocks/block2⌉,) fp32: with double quantization
  torch::Tensor absmax_mean;  // () fp32: with double quantization

  // A copy of w, contiguous, in `dtype`.
  static FrozenWeight make_dense(const torch::Tensor& w, torch::ScalarType dtype = torch::kFloat);
  // w's row-major elements (fp32) quantized by core's quantize_nf4.
  static FrozenWeight make_nf4(const torch::Tensor& w, int block, bool double_quant, int block2);
  Nf4View view() const;      // quantized only
  // (out, in) in `dtype` (fp32 or bf16): dense itself when its dtype is `dtype` (else a cast
  // copy), or a new tensor dequantized now (Note [NF4 linear]).
  torch::Tensor weight(torch::ScalarType dtype = torch::kFloat) const;
  double code_bytes() const;      // the 4-bit indices (qlora) or the dense weight (lora)
  double constant_bytes() const;  // absmax (or codes + absmax2 + mean); 0 for lora
  // Every tensor held, with its name's suffix ("weight", "weight.nf4", "weight.absmax", ...).
  std::vector<std::pair<std::string, torch::Tensor>> storage() const;
};

// x (…, in) · Wᵀ → (…, out) in x's dtype, through the autograd function of Note [NF4 linear].
torch::Tensor frozen_matmul(const torch::Tensor& x, const FrozenWeight& w);

// One frozen linear with an optional adapter (Note [LoRA adapter]); it computes in its input's
// dtype (Note [compute dtype]).
struct LoraLinear {
  FrozenWeight base;
  torch::Tensor bias;            // (out,) frozen; undefined: none (Llama)
  torch::Tensor lora_A, lora_B;  // (r, in), (out, r) fp32, requires_grad; undefined: not a target
  double scale = 0, dropout = 0;
  bool adapted() const { return lora_A.defined(); }
  torch::Tensor forward(const torch::Tensor& x, bool train) const;
};

// The fp32 weights a LoRA model is built from (copied, cast or quantized), by Hugging Face's
// names. The tensors are the source module's own (no copy).
struct SourceLinear {
  LoraTarget target = LoraTarget::q;
  torch::Tensor weight, bias;  // (out, in), (out) or undefined
};
struct SourceBlock {
  torch::Tensor norm_1_weight, norm_1_bias, norm_2_weight, norm_2_bias;  // biases: LayerNorm only
  std::vector<SourceLinear> linears;  // q, k, v, o, (gate,) up, down
};
struct SourceModel {
  Arch arch = Arch::gpt;
  ModelSpec spec;                 // gpt_model_spec / llama_model_spec: the ledger's input
  std::int64_t heads = 0, kv_heads = 0;
  double rope_theta = 0, norm_eps = 0;                     // llama
  torch::Tensor embed, positions;                          // (V, C); gpt: (T, C) learned
  torch::Tensor norm_f_weight, norm_f_bias;                // (C); bias: gpt
  torch::Tensor lm_head;                                   // (V, C) llama; undefined: tied (gpt)
  std::vector<SourceBlock> blocks;
};
SourceModel source_of(const Gpt& g);
SourceModel source_of(const Llama& m);

// Passed to every block of one forward: the causal mask (T, T) and, for Llama, the rotary tables.
struct BlockContext {
  torch::Tensor mask, cos, sin;
};

struct LoraBlock {
  Arch arch = Arch::gpt;
  std::int64_t heads = 0, kv_heads = 0;
  double norm_eps = 0;
  // gpt: LayerNorm weight and bias; llama: RMSNorm weight (bias undefined).
  torch::Tensor norm_1_weight, norm_1_bias, norm_2_weight, norm_2_bias;  // (C)
  LoraLinear q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;  // gate: llama only
  // x (B, T, C) → (B, T, C) in x's dtype: gpt_model.cpp's or llama_model.cpp's block with the
  // adapters' deltas.
  torch::Tensor forward(const torch::Tensor& x, const BlockContext& ctx, bool train) const;
  // The linears with their Hugging Face names, in a fixed order (gate only for llama).
  std::vector<std::pair<LoraTarget, const LoraLinear*>> linears() const;
  std::vector<std::pair<LoraTarget, LoraLinear*>> linears();
  const LoraLinear& linear(LoraTarget t) const;  // one of linears()
};

std::string_view module_name(LoraTarget t);  // "q_proj", "k_proj", ..., "down_proj"

// Throws InvalidInput naming the flag unless this module runs the setup on the model `m`:
// method lora or qlora, quant nf4, compute fp32 or bf16, and what LoraSetup::validate checks (no
// 'gate' target on a GELU MLP).
void require_runnable(const LoraSetup& s, const ModelSpec& m);

struct LoraModelOptions {
  LoraSetup lora;                  // method lora | qlora; quant nf4; compute fp32 | bf16
  bool checkpoint = true;          // Note [gradient checkpointing], per block
};

class LoraModel {
 public:
  // The frozen backbone from `source`'s weights (copied, cast or quantized; the source may be
  // destroyed afterwards) and fresh adapters drawn from torch's default generator. Throws
  // InvalidInput when the setup is not one this module runs (method full, quant fp4/int8, fp16,
  // target gate on a GPT).
  LoraModel(const SourceModel& source, const LoraModelOptions& options);
  LoraModel(const Gpt& source, const LoraModelOptions& options)
      : LoraModel(source_of(source), options) {}
  LoraModel(const Llama& source, const LoraModelOptions& options)
      : LoraModel(source_of(source), options) {}

  // idx, targets (B, T) → mean cross-entropy (fp32 scalar). train: the adapters' dropout on, and
  // with grad mode the blocks are checkpointed (options.checkpoint). on_head_backward, when set,
  // is called once in backward when the gradient reaches the last block's output (the loss, LM
  // head and final norm are done, the blocks' backward begins).
  torch::Tensor forward(const torch::Tensor& idx, const torch::Tensor& targets, bool train,
                        const std::function<void()>& on_head_backward = {}) const;

  std::vector<torch::Tensor> adapter_parameters() const;  // A and B of every adapter, in order
  // Named tensors: the adapters ("blocks.3.v_proj.lora_A.weight", PEFT's suffixes) and everything
  // frozen ("embed.weight", "blocks.0.q_proj.weight.nf4", ...).
  std::vector<std::pair<std::string, torch::Tensor>> named_adapters() const;
  std::vector<std::pair<std::string, torch::Tensor>> named_frozen() const;
  // A fresh draw of every adapter (A Kaiming-uniform, B zero) from torch's default generator.
  void reset_adapters();

  // The bytes the model holds, by ledger item (Σ nbytes of its tensors).
  struct Bytes {
    double quantized_weights = 0;  // NF4 indices (qlora); 0 for lora
    double constants = 0;          // NF4 constants
    double frozen = 0;             // the rest of the backbone: dense weights (lora), biases,
                                   // norms, embeddings, an untied head
    double adapters = 0;
    std::int64_t quantized_params = 0;  // elements behind the NF4 indices
    std::int64_t frozen_params = 0;     // elements of the other frozen tensors
    std::int64_t trainable_params = 0;  // adapter elements
    double backbone() const { return quantized_weights + constants + frozen; }
  };
  Bytes bytes() const;

  const LoraModelOptions& options() const { return options_; }
  Arch arch() const { return arch_; }
  const ModelSpec& spec() const { return spec_; }
  torch::ScalarType compute_dtype() const;  // kFloat or kBFloat16
  const std::vector<LoraBlock>& blocks() const { return blocks_; }

 private:
  Arch arch_;
  ModelSpec spec_;
  LoraModelOptions options_;
  double rope_theta_ = 0, norm_eps_ = 0;
  torch::Tensor embed_, positions_;          // (V, C); (T, C) gpt
  torch::Tensor norm_f_weight_, norm_f_bias_;  // (C); bias: gpt
  FrozenWeight head_;  // gpt: the embedding itself (tied); llama: lm_head
  std::vector<LoraBlock> blocks_;
};

// ---- adapters on disk (Note [adapter file]) -----------------------------------------------------

// Note [adapter file]
// PEFT's save_pretrained writes only the adapters: adapter_model.safetensors (the A and B weights,
// named after their modules) beside adapter_config.json. tally writes the one safetensors file,
// F32 tensors named as named_adapters() names them, with the LoRA configuration in the header's
// __metadata__: "lora_config" holds PEFT's fields (peft_type, r, lora_alpha, lora_dropout,
// target_modules, bias "none") and tally's base-model description (method, quantization, the
// model's layout and shape); "format" is "pt" as PEFT writes it. Loading checks that configuration
// and every tensor's name, dtype and shape against the model and refuses a mismatch with one line.
inline constexpr const char* kAdapterFileName = "adapter_model.safetensors";

struct AdapterFile {
  std::filesystem::path path;
  std::int64_t bytes = 0;        // the file's size
  std::int64_t tensors = 0;
  std::string lora_config;       // the metadata's JSON text
};
// Writes <dir>/adapter_model.safetensors (dir is created). Throws std::system_error on I/O.
AdapterFile save_adapters(const LoraModel& model, const std::filesystem::path& dir);
// Copies the adapters of <dir>/adapter_model.safetensors into the model. Throws InvalidInput
// naming the file for a missing file, another configuration or a tensor that does not fit.
AdapterFile load_adapters(LoraModel& model, const std::filesystem::path& dir);

}  // namespace tally::engine
