// The activation ledger (激活账): bytes of tensors saved for the backward pass, per GPU.
//
// Legend: s = sequence length, b = micro-batch size, h = hidden size, a = attention heads,
// h_kv = key/value width (a_kv · h/a), f = FFN width, V = vocabulary, L = layers,
// t = tensor-parallel degree, c = context-parallel degree, p = pipeline stages, m = micro-batches.
//
// Note [activation inventory]
// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models", §4.1)
// count, per layer with 2-byte activations and 1-byte dropout masks:
//   attention:  QKV input 2sbh, Q and K 4sbh, softmax 2as²b, its dropout mask as²b, dropout output
//               2as²b, V 2sbh, projection input 2sbh, projection dropout mask sbh
//               = 11sbh + 5as²b
//   MLP:        W1 input 2sbh, GeLU input 8sbh, W2 input 8sbh, dropout mask sbh = 19sbh
//   LayerNorms: 2 × 2sbh = 4sbh
//   total       sbh(34 + 5as/h)
// tally keeps this as an inventory of named terms, generalised to GQA (K, V of width h_kv), any FFN
// width and the SwiGLU MLP (gate, up and their product saved: 6sbf instead of GeLU's 4sbf). Every
// parallelism or policy switches terms off or divides them:
//   TP t:            terms inside the column/row-parallel region ÷ t (Korthikanti eq. 2:
//                    sbh(10 + 24/t + 5as/(ht))); LayerNorm inputs, the QKV/W1 inputs and the dropout
//                    masks after the row-parallel layers stay replicated.
//   TP + SP:         every term ÷ t (eq. 4: sbh/t · (34 + 5as/h)).
//   CP c:            s → s/c for every term; materialised scores hold (s/c)·s per head.
//   selective:       drop the a·s² terms (softmax, its mask, dropout output) — recomputed (§5).
//   full recompute:  keep only each layer's input, 2sbh (÷ t with SP); the layer whose backward
//                    runs holds its whole inventory again, less that input (Note [backward
//                    phases]: a transient of the blocks' backward, never alive with the logits).
//   flash attention: no a·s² term; keeps the softmax log-sum-exp, 4 bytes per (a, s, b).
//   pipeline:        the first 1F1B stage holds min(p, m) micro-batches of L/p layers; interleaved
//                    schedules hold (1 + (p−1)/(p·m')) times that (Korthikanti §4.2.3). With
//                    uneven stages, stage s holds min(p − s, m) micro-batches of its own layers and
//                    the peak is the largest stage.
//   embeddings:      the embedding-output dropout mask sbh (first stage, ÷t with SP).
//   output:          final norm input 2sbh, LM-head input 2sbh and fp32 logits 4sbV
//                    (Korthikanti §4.3: 4sbh(1 + V/h)/t), on the last stage; an eager PyTorch
//                    loss holds three fp32 tensors of the logits' size, 12sbV (eager_loss).
//   MoE layer:       the MLP hidden of the E_act routed experts (× c_f, the capacity factor) and
//                    the shared experts; the router's fp32 probabilities 4sb·E (the top-k and
//                    softmax/sigmoid backward read them) — replicated under TP (÷t with SP),
//                    like the MLP input; each routed copy's fp32 weight 4sb·E_act·c_f (the
//                    experts' activation applies the weights: Megatron-Core's TEGroupedMLP, and
//                    torchtitan scores the inputs first, so the combine keeps no expert
//                    output; until 2026-12-07 tally kept them, 2sb·E_act·c_f·h); and the dispatched
//                    tokens (the grouped GEMM's input, read by its weight gradient) as the
//                    expert-TP group gathered them: 2sb·E_act·c_f·h ·g/t with SP (g/1
//                    without), g = e_t when the ETP ranks hold different tokens (Note [expert
//                    tensor parallelism], parallel_groups.hpp; Megatron-Core's dispatcher
//                    all-gathers them before the TE grouped GEMM, which saves what it is given)
//                    — 2sb·E_act·c_f·h at e_t = t.
//   low precision:   under an fp8 / MXFP8 / NVFP4 recipe (types.hpp Note [low precision]) each of
//                    Transformer Engine's low-precision linears saves its input for the weight
//                    gradient in the format, q bytes per element, while a tensor another kernel
//                    saves stays bf16 beside it (Megatron-Core's TE layer spec, core_v0.14.0
//                    gpt_layer_specs.py): the QKV input (a fused LayerNorm-linear's output, q·sbh;
//                    MLA's unfused norm feeds q-down and kv-down, 2·q·sbh) and a dense MLP's input
//                    (fused, q·sbh) are saved only quantized; a MoE layer's MLP input stays bf16
//                    for the router, shared experts adding their q·sbh copy; the down projection's
//                    input, q·sbf (gate and up stay bf16 for the activation's backward); the
//                    dispatched tokens, q per element; MLA's latent norms' outputs,
//                    q·sb(r_q + r_kv);
//                    with flash attention the attention output stays bf16 for its backward and the
//                    projection adds a q copy (materialised: the q copy only). Selective and full
//                    recompute follow; save-matmuls and op-sac (PyTorch's checkpointing, outside
//                    TE) keep their bf16 figures.
//   LoRA adapters:   (fine-tuning, core/finetune.hpp; PEFT's LoraLayer: B(A(dropout(x)))·α/r)
//                    per adapted matrix the rank-r output of A, B's input, 2sb·r; with
//                    lora_dropout > 0 the dropout makes A a new input, 2sb·d_in, and keeps its
//                    mask, sb·d_in (without dropout A reads the base layer's input, already
//                    counted). Under bf16 autocast the fp32 adapters see bf16 copies, hence the
//                    compute dtype's bytes; the mask is one byte.
//
// Note [backward phases]
// The inventory counts what the forward saves; the stage peak is reached in the backward, which
// frees as it goes, so the peak is the largest of its phases, never their sum. Backward runs the
// loss and the LM head first, then the layers from the last, and in each layer the MLP block and
// the output projection before the attention core (reverse topological order, the same under
// Megatron-LM, Hugging Face and torchtitan, all on PyTorch's autograd). Autograd drops a node's
// saved tensors as soon as that node's backward has run, and a gradient once its consumer has run
// (torch/csrc/autograd/engine.cpp, Engine::evaluate_function: call_function, then
// fn.release_variables(); pytorch/pytorch 00c0674d). The phases, per stage:
//   loss + LM-head backward: every saved tensor of the stage (its layers' and the embedding's)
//       + the output terms (final-norm and head inputs, the loss's fp32 logits-sized tensors).
//       Only the last stage has it. The logits are gone before the last layer's backward starts.
//   blocks' backward, one layer at a time: the stage's saved tensors + what that layer's backward
//       holds beyond them, the larger of two points in it:
//     MLP backward (the layer's backward begins): under full recompute the replay has just rebuilt
//       the layer's whole inventory — less its input, which the checkpoint holds already: the
//       replay runs on the saved input detached, which shares its storage (torch.utils.checkpoint
//       CheckpointFunction.backward, detach_variable; pytorch/pytorch 0008d771; Megatron-LM's
//       CheckpointFunction the same way). No other policy adds anything here.
//     attention-core backward: the MLP block's and the output projection's saved tensors are freed
//       (Part::mlp in activations.cpp); with materialised attention softmax's backward holds its
//       saved output P, its incoming gradient dP and its result dS, a new tensor
//       (tools/autograd/derivatives.yaml: _softmax → _softmax_backward_data(grad, result, dim, …)):
//       the score gradients, 2·a·s²·b/t beyond the inventory (÷c: s/c queries × s keys). Under full
//       recompute the replayed attention part is alive too; under selective recompute the
//       attention core's a·s² terms are rebuilt here (Megatron checkpoints core_attention).
//       With flash attention no a·s² tensor exists and this point stays below the MLP one.
//   Not counted (as the inventory omits LayerNorm statistics): gradients h or f wide — the
//   residual stream's, dV, the MLP hidden's — a few sbh per layer; the replay of save-matmuls' and
//   op-sac's cheap ops at the start of a layer's backward. Megatron's fused masked softmax writes
//   dS over dP (scaled_upper_triang_masked_softmax bwd_cuda: "backward pass is completely
//   in-place"), one a·s²·b gradient, but attention dropout's backward holds two anyway: tally
//   counts two. The LoRA adapters' terms are kept at the attention point whatever their targets.
//   Pipeline: the blocks' phase is largest on the fullest stage (the first under 1F1B), the
//   loss's on the last.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tally/core/model.hpp"
#include "tally/core/types.hpp"

namespace tally {

struct ActivationSetup {
  std::int64_t seq = 0;          // s, full sequence length
  std::int64_t micro_batch = 1;  // b
  int tp = 1;                    // t
  bool sequence_parallel = false;
  int cp = 1;                    // c
  int pp = 1;                    // p
  int interleave = 1;            // virtual chunks per stage (1 = plain 1F1B)
  int micro_batches = 1;         // m, micro-batches per step (gradient accumulation × pipeline)
  Recompute recompute = Recompute::none;
  RecomputeModules recompute_modules;  // beside recompute (types.hpp)
  Attention attention = Attention::flash;
  bool dropout = true;           // Korthikanti keeps dropout masks; Llama-style training has none
  double act_bytes = 2.0;        // bytes per activation element (bf16/fp16 = 2, fp32 = 4)
  // q: bytes per element of the inputs a low-precision recipe's linears save for their weight
  // gradient (saved_linear_input_bytes: fp8 1, mxfp8 1.03125, nvfp4 0.5625); 0 = no such recipe.
  // Note [activation inventory], low precision.
  double linear_input_bytes = 0;
  // Expert TP e_t (0 = tp): how many ranks' dispatched tokens an expert rank gathers (Note [expert
  // tensor parallelism]).
  int etp = 0;
  // MoE: routed slots per token and expert choice, as a multiple of the balanced share (token-
  // dropping capacity factor; 1 = dropless and balanced). Expert parallelism leaves the per-rank
  // figure unchanged: a rank receives as many routed tokens as it sends.
  double capacity_factor = 1.0;
  // The loss: false = a fused vocabulary-parallel cross-entropy keeping one fp32 logits tensor,
  // 4sbV/t (Megatron-LM; Korthikanti §4.3); true = PyTorch's cross_entropy(logits.float()) run
  // eagerly (uncompiled), whose saved fp32 log-softmax, the fp32 gradient of the NLL and
  // log-softmax's fp32 input gradient are alive together as backward starts: 12sbV/t (torchtitan
  // before it compiled the loss; Hugging Face's Trainer).
  bool eager_loss = false;
  // LoRA adapters of one layer (finetune.hpp lora_activation_widths): per token, the summed input
  // width Σd_in and the summed rank Σr of the adapted matrices (an MoE expert counted once per
  // routed choice); lora_dropout: PEFT's lora_dropout > 0. Fine-tuning plans run without TP.
  double lora_input_width = 0;
  double lora_rank_width = 0;
  bool lora_dropout = false;
  // Layers of the first and last pipeline stage (core/pipeline.hpp stage_layers); 0 = the even
  // split L/p (which needs p·v | L). These two need interleave 1.
  int first_stage_layers = 0, last_stage_layers = 0;
  // Or every stage's layers (core/pipeline.hpp check_stage_list; interleaved, every virtual
  // stage's, Note [uneven virtual stages]); not owned; overrides the two.
  const std::vector<int>* stage_layer_list = nullptr;
  void validate(const ModelSpec& m) const;
  int layers_on_stage(const ModelSpec& m, int s) const;  // after validate
};

struct ActivationTerm {
  std::string name;              // e.g. "attention scores (softmax)"
  std::string formula;           // e.g. "2·a·s²·b"
  double bytes = 0;              // per layer per micro-batch, after parallelism and policy
};

// Note [backward phases]: where the stage peak is reached.
enum class BackwardPhase { loss_and_head, blocks };
std::string_view to_string(BackwardPhase p);  // "loss + LM-head backward", "blocks' backward"

struct ActivationResult {
  std::vector<ActivationTerm> layer_terms;   // one layer, one micro-batch
  double per_layer_bytes = 0;                // Σ layer_terms (a MoE model's MoE layer)
  double dense_layer_bytes = 0;              // one dense leading layer of a MoE model (else 0)
  double layers_on_stage = 0;                // L / p
  double in_flight_micro_batches = 0;        // first 1F1B stage (× interleave factor)
  double transformer_bytes = 0;              // per_layer × layers_on_stage × in-flight
  double embedding_bytes = 0;                // first stage, × in-flight
  double output_bytes = 0;                   // last stage, one micro-batch (× 1 + D with MTP)
  // Last stage, one micro-batch: the D multi-token-prediction modules' layers and their own
  // saved tensors (Note [multi-token prediction] in model.cpp); 0 without them.
  double mtp_bytes = 0;
  // Note [backward phases]. One layer's backward, beyond the stage's saved tensors:
  // full recompute: the replayed layer's inventory less its checkpointed input (0 otherwise);
  double recompute_transient_bytes = 0;
  // materialised attention: softmax's incoming and outgoing gradients, 2·a·s²·b/t (0 with flash);
  double score_gradient_bytes = 0;
  // the larger of the layer's MLP-backward and attention-core-backward points (≥ 0).
  double layer_backward_bytes = 0;
  double loss_phase_bytes = 0;               // last stage: its saved tensors + output_bytes
  double blocks_phase_bytes = 0;             // fullest stage: its saved tensors + layer_backward
  BackwardPhase peak_phase = BackwardPhase::loss_and_head;
  int peak_stage = 0;                        // the pipeline stage holding the peak
  double peak_stage_bytes = 0;               // max(loss_phase_bytes, blocks_phase_bytes)
  ActivationSetup setup;
  std::string convention() const;
};

// Per-GPU activation ledger. Throws InvalidInput on bad setup or a params-only model.
ActivationResult activations(const ModelSpec& m, const ActivationSetup& setup);

// The longest sequence, a multiple of `step` up to `max_len`, for which fits(seq) holds — by
// bisection, since activations never shrink as the sequence grows; 0 when not even `step` fits.
// `tally memory --max-seq` and the fine-tuning plan ask it.
std::int64_t longest_sequence(std::int64_t step, std::int64_t max_len,
                              const std::function<bool(std::int64_t)>& fits);

// The planner's hot path: ActivationResult::peak_stage_bytes without the itemized terms (no
// allocation). The caller must have validated the setup (ActivationSetup::validate) once.
double activation_peak_bytes_unchecked(const ModelSpec& m, const ActivationSetup& setup);

// One layer's share of the ledger (ActivationResult's per-layer fields): it depends on the
// layer's shape — seq, micro_batch, tp, sequence_parallel, cp, recompute, attention, etp and the
// request's dtypes, dropout, capacity factor and LoRA widths — and not on the pipeline (pp,
// interleave, micro_batches, the stage split) or the loss, so the planner computes it once per
// shape.
struct LayerActivationBytes {
  double per_layer = 0;            // ActivationResult::per_layer_bytes
  double dense_layer = 0;          // ::dense_layer_bytes
  double recompute_transient = 0;  // ::recompute_transient_bytes
  double score_gradients = 0;      // ::score_gradient_bytes
  double layer_backward = 0;       // ::layer_backward_bytes
};
LayerActivationBytes layer_activation_bytes_unchecked(const ModelSpec& m,
                                                      const ActivationSetup& setup);
// peak_stage_bytes from a layer's share computed for the same shape.
double activation_peak_bytes_unchecked(const ModelSpec& m, const ActivationSetup& setup,
                                       const LayerActivationBytes& layer);

}  // namespace tally
