// The operator model of a training step (计算账, by operator): each transformer layer's forward and
// backward as a list of kernels with their shapes, FLOPs and bytes, timed on a GPU by
// core/roofline.hpp. It replaces one end-to-end utilisation: the time of a plan comes from the
// kernels it runs, so micro-batch, TP split and sequence length change the speed as they do on a GPU.
//
// Legend (one micro-batch on one tensor-parallel rank): b = micro-batch, s = sequence length,
// c = context-parallel degree, T = b·s/c tokens, t = tensor-parallel degree, h = hidden, a = heads,
// a_kv = key/value heads, d = h/a, h_q = a·d/t, h_kv = ⌈a_kv/t⌉·d, f = FFN width, V = vocabulary,
// e = bytes per activation element, T_n = T/t with sequence parallelism (T otherwise): the tokens the
// norm, dropout and residual kernels see on one rank (Korthikanti et al. 2022 §4.2.2).
//
// Note [operator inventory] (forward; GEMM shapes are m × n with inner k)
//   norm 1, norm 2      memory   read + write T_n·h                        (LayerNorm / RMSNorm)
//   qkv                 GEMM     T × (h_q + 2h_kv), k = h
//   rotary              memory   read + write T·(h_q + h_kv)               (rotary models;
//                                YaRN's unfused kernels: Note [GPT-OSS kernels])
//   attention, flash    fused    4·b·a/t·(s/c)·s·d FLOPs, × ½ when causal (the kernel skips the
//                                masked blocks); reads q, k, v, writes o
//   attention, materialised: scores  GEMM B = b·a/t, (s/c) × s, k = d;  softmax memory read +
//                                write B·(s/c)·s;  dropout  read + write + 1-byte mask (its
//                                backward the same bytes: gradient and mask in, gradient out);
//                                context GEMM B, (s/c) × d, k = s
//   out-proj            GEMM     T × h, k = h_q
//   dropout+residual    memory   read 2, write 1 of T_n·h (+ 1-byte mask with dropout), twice
//   MLP (GeLU)          GEMM     T × f/t, k = h;  gelu memory read + write T·f/t;  GEMM T × h, k = f/t
//   MLP (SwiGLU)        GEMM     T × 2f/t, k = h; swiglu memory read 2 + write 1 of T·f/t; down GEMM
//   MoE                 router GEMM T_r × E, k = h (T_r = T/t under SP: the rank's shard); each of the E/ep local experts' MLP, f/e_t wide,
//                       on c_f·g·T_r·E_act·ep/E tokens (batched, a grouped GEMM; T_r = T/t with
//                       SP, g = e_t gathered ranks: Note [expert tensor parallelism],
//                       parallel_groups.hpp — g·T_r = T when e_t = t);
//                       shared experts: one MLP of width E_s·f_s/t on all T tokens; a dense leading
//                       layer (OperatorSetup::dense_layer): the MLP with f_d; around the all-to-
//                       alls the token dispatcher's memory kernels (router top-k, permute, chunk
//                       sorts, unpermute: moe-*, Note [MoE token dispatcher], moe_dispatch_ops.cpp)
//   MLA (replaces qkv)  q-down T × r_q, k = h and kv-down T × (r_kv + d_r), k = h, whole on every
//                       rank; their norms; q-up T × a/t·(d_n+d_r), k = r_q (or q-proj, k = h);
//                       kv-up T × a/t·(d_n+d_v), k = r_kv; rotary over the d_r parts; attention
//                       with d_qk = d_n + d_r for QKᵀ and d_v for PV (flash 2·(d_qk + d_v) FLOPs
//                       per score); out-proj k = a/t·d_v
// Backward: each GEMM C = A·B (m × n, inner k) becomes dA = dC·Bᵀ (m × k, inner n) and
// dB = Aᵀ·dC (k × n, inner m) — twice the forward FLOPs; a memory kernel reads its saved input and the
// output gradient and writes the input gradient (1.5 × its forward bytes; the attention dropout's
// reads the gradient and its mask: its forward's bytes); flash attention's backward
// executes 2.5 × its forward FLOPs (five GEMMs of the forward's two, FlashAttention-2 §3.1.2).
// Recompute: full replays every forward kernel of the layer; selective replays the attention core
// (Korthikanti et al. 2022 §5: scores, softmax, dropout, context — or the flash forward);
// save-matmuls (PyTorch selective activation checkpointing saving matmul outputs) replays the
// norms, rotary, activation and (materialised) softmax and attention dropout — no GEMM.
// Output (last stage): final norm, LM head GEMM T × V/t (k = h), cross-entropy over fp32 logits
// (Note [loss kernels]). Embedding (first stage): gather and its gradient.
// The optimizer step reads gradients, m, v and master weights and writes m, v, master and the
// 16-bit copy: bytes over memory bandwidth (optimizer_update_bytes).
//
// Note [eager kernels] (OperatorSetup::kernels = eager): the memory-bound kernels as uncompiled
// PyTorch runs torchtitan's Llama (torchtitan 9dec370, torchtitan/models/llama/model.py and
// models/norms.py), one kernel per operator, every intermediate read and written through HBM, the
// backward bytes from autograd's formulas (tools/autograd/derivatives.yaml). Bytes per element of
// the tensor named (e = activation bytes, fp32 = 4):
//   RMSNorm (x·rsqrt(mean(x²) + ε) in fp32, cast back, × weight): forward x.float() e+4, pow 8,
//       mean 4, × rsqrt 8, type_as 4+e, × weight 2e = 28 + 4e; backward × weight 6e (both
//       operands' gradients, the weight's summed), cast 4+e, × rsqrt 24 (grad·r; Σ grad·x),
//       mean's expand 4, pow's 2·x·grad 28 (x.pow(1) copy, × 2, × grad), the two gradients of the
//       fp32 x added 12, cast back 4+e = 76 + 8e.  (fused: 2e forward, 3e backward; LayerNorm is
//       one native kernel eager too, so GPT layouts keep 2e forward, and 5e backward: Note [norm
//       backward passes])
//   rotary on q and k (view_as_complex(x.float()) · freqs, view_as_real, type_as): forward and
//       backward each float cast e+4, complex product 8, cast back 4+e = 16 + 2e (fused 2e, 3e)
//   repeat_kv (a_q/t > a_kv/t: GQA): expand + reshape copies k and v to every query head:
//       forward h_kv·e read + h_q·e written per token, each of k and v; backward the transposed
//       gradient copied (2·h_q·e) and summed over the repeats (h_q·e + h_kv·e)
//   attention output transpose(1, 2).contiguous(): a copy, 2e per element of h_q forward; its
//       gradient reaches the flash backward as a view (no copy)
//   SwiGLU silu(w1·x) · (w3·x): forward silu 2e, product 3e = 5e; backward the product's two
//       gradients 6e, silu's 3e = 9e (fused 3e, 4.5e)
//   residual adds and GeLU are one kernel either way.
//
// Note [GPT-OSS kernels] (kernels fused: Megatron-Core core_r0.17.0 = 2edffadb with Transformer
// Engine, the release Megatron-Bridge v0.4.2 runs GPT-OSS with): three things of GPT-OSS's
// architecture run as kernels of their own there. Bytes per element of the tensor named (e =
// activation bytes):
//   rotary with an attention factor ≠ 1 (ModelSpec::rotary_attention_scale, YaRN's): TE's fused
//       RoPE takes no mscale, so apply_rotary_pos_emb falls back to _apply_rotary_pos_emb_bshd
//       (models/common/embeddings/rope_utils.py) on q and k: t·cos 2e, rotate_half's negation e
//       and concatenation 2e, ·sin 2e, the sum 3e, the final cat with the empty pass-through 2e =
//       12e forward (fused 2e); backward ·sin 2e, the negation e, chunk's gradient concatenated
//       2e, ·cos 2e, the empty pass-through slice's gradient (slice_backward: a zero fill of t's
//       shape) e, and t's three gradients summed in two adds 6e = 14e (fused 3e). The full-width
//       slice is an alias (PyTorch skips a slice of the whole dimension); cos and sin of the
//       [s, d] table are not counted (no head dimension).
//   the GLU's clamp (ModelSpec::glu_clamp): weighted_bias_quick_geglu_impl
//       (fusions/fused_bias_geglu.py) clamps the gate and linear halves of fc1's output and
//       concatenates them before the compiled GLU kernel: per element of the f-wide output, two
//       clamps 2e each and the cat 4e = 8e forward; backward autograd's clamp_backward, where(mask,
//       grad, 0) with 1-byte masks: the gate's le e + 1 and where 1 + 2e, the linear half's ge and
//       le e + 1 each, logical_and_ 3 and where 1 + 2e, then chunk's gradient concatenates the
//       halves 4e = 11e + 8. Inside moe_act's checkpoint, so replayed with the activation.
//   the experts' fc2 bias (linear_bias or expert_bias on a MoE model): TEGroupedMLP's fc2 skips
//       the bias add (fc1's runs in the grouped GEMM's epilogue) and _apply_bias adds t + b·p per
//       local expert (transformer/moe/experts.py): b·p e, the sum 3e, the concatenation 2e = 6e
//       per element of the routed tokens' h-wide output forward (the probabilities taken in bf16,
//       the router's dtype, so the closing .to() moves nothing); backward the gradients of b and
//       of p, each a product and a reduction 3e, and split's gradient concatenated 2e = 8e. Not
//       replayed by moe_act (it follows the down projection).
// The three counts were checked op by op with PyTorch's profiler on the same Python (the aten
// ops of forward and backward; Debian's python3-torch 1.13 on the CPU).
// Not counted: the attention output's bias, added unfused where Megatron-Bridge's GPT-OSS sets
// bias_dropout_fusion off (2e forward, a reduction e backward, per T_n·h); each local expert's
// own launches (one overhead per op); the host's synchronisation of the all-to-all dispatcher.
// Only the routed experts are affected (GPT-OSS has no shared or dense MLP); MLA's rotary, the
// eager kernels (Note [eager kernels]) and the local ones (Note [local kernels]: no TEGroupedMLP)
// keep their counts.
//
// Note [norm backward passes]: a norm's backward computes the input gradient (per row: reads x
// and dy, writes dx) and the weight's (and bias's) gradient (per column: a sum over the rows of
// dy·x̂, reads x and dy again). PyTorch's native LayerNorm (aten/src/ATen/native/cuda/
// layer_norm_kernel.cu: the dX kernel, then cuComputePartGradGammaBeta / GammaBetaBackward over
// dY and X) and Megatron-LM's own fused LayerNorm (megatron/fused_kernels/
// layer_norm_cuda_kernel.cu, apex's HostLayerNormGradient: cuComputePartGradGammaBeta(dout,
// input), then cuComputeGradInput(dout, input) → grad_input) run them as two passes, 5e per element
// (Kernels::eager and local); Transformer Engine's LayerNorm and RMSNorm backward computes dx and
// per-block partial weight gradients in one pass, 3e (Kernels::fused; the partial sums are
// h-sized). On one H200 (tests/data/h200_probe_ops.json, 8192 × 4096 bf16) PyTorch's LayerNorm
// and RMSNorm backward took 2.09× and 2.45× their forward (2e), where two passes give 2.5×, one
// 1.5× (H200Kernels.NormBackwardRunsTwoPasses).
//
// Note [loss kernels] (OperatorSetup::loss), bytes per logit of the rank's T × V/t:
//   fused           one kernel reading the e-byte logits and making three fp32 passes forward
//                   (max, sum of exp, normalise), two and the e-byte gradient backward: e + 12,
//                   8 + e (a fused loss as Megatron-Core --cross-entropy-loss-fusion or
//                   Transformer Engine's; the default)
//   vocab-parallel  Megatron-LM's _VocabParallelCrossEntropy as written (megatron/mpu/
//                   cross_entropy.py at de7dc40f88, 2021; tensor_parallel/cross_entropy.py in
//                   Megatron-Core without --cross-entropy-loss-fusion, its default), each line one
//                   kernel: logits.float() e + 4, max 4, sub_ 8, exp(out=) 8, sum 4, div_ 8 =
//                   e + 36 forward; grad mul_ 8 and the cast's backward 4 + e = 12 + e
//   eager           cross_entropy(logits.float()): forward the cast e + 4, log-softmax's three
//                   reads and a write 16; backward the NLL gradient's zero fill 4, log-softmax
//                   backward 12 (+ its row sum 4), the cast back 4 + e
//
// Note [local kernels] (OperatorSetup::kernels = local): Megatron-LM's own modules, without
// Transformer Engine (--transformer-impl local; all of Megatron-LM before 2023, the runs of
// Narayanan et al. 2021 and Korthikanti et al. 2022), on models with linear biases. Their fused
// kernels are those of `fused`; three things run as kernels of their own (megatron/mpu/layers.py
// and megatron/model/transformer.py at de7dc40f88; Megatron-Core's local ColumnParallelLinear,
// RowParallelLinear and DotProductAttention the same):
//   qkv bias            ColumnParallelLinear adds its bias after the GEMM (F.linear on a 3-D input
//                       in PyTorch < 1.12: matmul, then add_; later, output + bias): read + write
//                       T·(h_q + 2h_kv), 2e; backward its gradient summed over the tokens, read e
//   bias gradients      out-proj, MLP up and MLP down skip the add (skip_bias_add) and pass the
//                       bias into the fused bias-dropout-add and bias-GeLU; autograd sums each bias's
//                       gradient over the tokens in a reduction of its own: read e·T_n·h, e·T·f/t,
//                       e·T_n·h (T_n: the row-parallel outputs are sequence-split under SP)
//   context copy        materialised attention's context, [b·a/t, s, d] → [s, b, a/t·d], by
//                       permute(2, 0, 1, 3).contiguous(): read + write T·h_q, 2e (and in a replay);
//                       its gradient reaches the context GEMM's backward as a strided view, no copy
// Flash attention (Transformer Engine or flash-attn) writes [s, b, h] itself: no context copy. A MoE
// layer's expert biases are not counted (Megatron-LM's local modules predate its MoE layers).
// Note [low-precision casts] (OperatorSetup::recipe fp8, mxfp8, nvfp4): each low-precision GEMM's
// operands are made by memory-bound quantize kernels, added per GEMM as <gemm>.quantize-input and
// .quantize-weight (forward, and again in a replay of that GEMM), .quantize-grad and, where a copy
// is transposed after it was made, .transpose-copies (backward). Per element of the tensor named,
// X the input (m·k), W the weight (k·n), G the output gradient (m·n); e = activation bytes (bf16,
// 2), q₁ = quantized_element_bytes (one copy: fp8 1, MXFP8 1.03125, NVFP4 0.5625), q =
// low_precision_copy_bytes (the copies kept, Note [fp8 operand layouts]: 2q₁, but q₁ for
// per-tensor fp8 on a GPU that takes any layout). Hopper's fp8 GEMMs take TN layouts only and the
// block formats scale along the inner dimension, so there every operand is needed row-wise and
// column-wise: each tensor is read once and written twice. On datacenter Blackwell (compute
// capability 10.x) TE's per-tensor fp8 writes the row-wise copy alone: e + q₁ per element, and
// the transposes below (a fused norm's, a gathered tensor's) are not made.
//   fp8, fused  Transformer Engine v2.8 (40c69e7), delayed scaling, the amax taken inside the cast
//               (pytorch/csrc/quantizer.cpp Float8Quantizer::quantize → nvte_quantize_v2: cast +
//               transpose in one kernel): X, W, G e + q each. X of a LayerNormLinear (Megatron-Core's
//               qkv and dense fc1, TELayerNormColumnParallelLinear) comes out of the norm kernel in
//               fp8 (extensions/normalization.cpp: Float8Quantizer → FULLY_FUSED), whose write
//               shrinks from e to q₁ per element, then rmsnorm_fwd's nvte_transpose reads q₁ and
//               writes q₁: 2q₁ (none where no transpose is kept)
//   fp8, eager  torchao eab345c's Float8Linear, dynamic tensorwise scaling, uncompiled (the
//               torchtitan stack of Note [eager kernels]): per cast float8_utils.tensor_to_amax
//               abs 2e + max e, float8_tensor._ToFloat8ConstrFunc to(float32) e + 4, × scale 8,
//               clamp 8, to(float8) 4 + q₁ = 4e + 24 + q₁; then float8_ops.preprocess_addmm copies
//               each transposed operand (the wgrad's X and G, the dgrad's W) contiguous, 2q₁ per mm
//               that uses it. torchtitan's wq, wk, wv and w1, w3 are separate Linears: X of qkv is
//               cast 3 times and of gate-up twice (once with TP: PrepareFloat8ModuleInput casts it
//               before the gather), its transposed copy made by each mm
//   mxfp8       TE MXFP8Quantizer: one nvte_quantize_v2 kernel writes both copies with their e8m0
//               scales per 32, e + q each; the norm is not fused (normalization.cpp: UNFUSED
//               unless NVTE_NORM_FWD_USE_CUDNN)
//   nvfp4       TE NVFP4Quantizer, NVFP4BlockScaling's defaults (common/recipe): X and G with the
//               random Hadamard transform on the column-wise copy — nvte_hadamard_transform_amax
//               reads e, the row-wise quantize reads e, the fused RHT cast reads e: 3e + q; W
//               without RHT — nvte_compute_amax e, one quantize for both copies e: 2e + q
//   mxfp8 and nvfp4 are TE's kernels under either OperatorSetup::kernels.
// Sequence parallelism (t > 1): the inputs of the column-parallel GEMMs fed by the sequence-split
// norms (qkv, MLA's q-down, kv-down, q-proj, the dense and shared MLPs' up) and the output
// gradients of the row-parallel ones (out-proj, the dense and shared down) are quantized on the
// rank's m/t rows and gathered in the format (TE distributed.py _all_gather_fp8/_mxfp8, torchao
// float8_tensor_parallel.py); per-tensor fp8 gathers the row-wise copy only and, on TN-only GPUs,
// transposes the gathered m rows (2q₁ each), the block formats gather both copies. The routed experts' tokens
// arrive by all-to-all: quantized as the GEMM sees them.
// The weight: torchao casts it in every Float8Linear.forward (per micro-batch, and again in a
// replay); Transformer Engine casts it once per step, since Megatron-Core passes
// is_first_microbatch and TE's modules reuse the cached quantized weight for the step's other
// micro-batches and for recompute (module/base.py get_weight_workspace, update_workspace only
// on the first micro-batch): weight_casts_cached, and the planner counts one cast per step,
// spread over the step's micro-batches (Op::weight_cast, OpsTime::weight_cast_*). Not
// counted: scale and amax-history updates (a few bytes per tensor), the cast of torchao's FSDP
// float8 all-gather (Note [fp8 all-gather], comm.cpp: made on the 1/k shard before the gather,
// not on the gathered weight), the bf16 output of each GEMM (its own bytes).
// FLOP conventions: executed FLOPs here (causal flash counts half); model FLOPs for MFU stay those of
// compute.hpp (attention unmasked, as Megatron-LM and PaLM count). Summed over a GPT layer with
// materialised attention and no recompute, the GEMM FLOPs are exactly Narayanan et al. 2021 eq. 3's
// 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)); a test checks it.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "tally/core/hardware.hpp"
#include "tally/core/model.hpp"
#include "tally/core/model_states.hpp"
#include "tally/core/types.hpp"

namespace tally {

enum class OpKind { gemm, attention, memory };
enum class Pass { forward, backward, recompute };

struct Op {
  std::string_view name;             // static: "qkv", "qkv.dgrad", "softmax", ...
  OpKind kind = OpKind::memory;
  Pass pass = Pass::forward;
  std::int64_t m = 0, n = 0, k = 0;  // GEMM shape (attention: query rows, key rows, head dim)
  double batch = 1;                  // independent GEMMs of this shape
  double flops = 0;                  // executed FLOPs, all batches
  double bytes = 0;                  // HBM bytes read + written
  // Runs in the compute dtype even under a low-precision recipe (Note [low precision], types.hpp):
  // the attention core (flash, or materialised scores and context), the router, the LM head.
  bool high_precision = false;
  // A low-precision weight's quantize kernel (Note [low-precision casts]): once per step where
  // weight_casts_cached, else in every forward and replay.
  bool weight_cast = false;
  // A routed expert's GEMM or kernel (its tokens arrive by all-to-all; no TP input-gradient
  // collective follows its up projection).
  bool routed_expert = false;
  // An attention kernel's generation (Note [flash kernel generations]); others ignore it.
  FlashKernel flash_kernel = FlashKernel::fa2;
};

struct OperatorSetup {
  std::int64_t seq = 0;              // s
  std::int64_t micro_batch = 1;      // b
  int tp = 1;                        // t
  bool sequence_parallel = false;
  int cp = 1;                        // c
  Recompute recompute = Recompute::none;
  RecomputeModules recompute_modules;  // beside recompute (types.hpp)
  Attention attention = Attention::flash;
  FlashKernel flash_kernel = FlashKernel::fa2;  // which kernel runs Attention::flash
  bool causal = true;                // decoder training: flash kernels skip the masked half
  bool dropout = true;
  double act_bytes = 2;              // e
  // layer_ops of a MoE model: false = a MoE layer, true = one of its dense leading layers
  // (ModelSpec::dense_layers, FFN width f_d).
  bool dense_layer = false;
  // Expert parallelism (Note [expert parallelism], core/src/comm.cpp): each rank holds E/ep
  // experts and runs them on the tokens the ep ranks route to them, T·E_act·ep/E rows per expert
  // (the same FLOPs as ep = 1, in larger GEMMs); capacity_factor pads every expert to c_f times
  // its balanced share.
  int ep = 1;
  int etp = 0;  // expert TP e_t (0 = tp): each expert f/e_t wide, on g·T_r·E_act tokens' copies
  double capacity_factor = 1;
  Kernels kernels = Kernels::fused;  // Note [eager kernels]
  Loss loss = Loss::fused;           // Note [loss kernels]
  // The precision recipe: fp8, mxfp8 and nvfp4 add their quantize kernels (Note [low-precision
  // casts]) and then need e = 2 (bf16 activations, Note [low precision]); others add nothing.
  Precision recipe = Precision::bf16;
  // The GPU's compute capability: whether TE's per-tensor fp8 casts write a transpose (Note [fp8
  // operand layouts], types.hpp); 0 = not known: they do, as on Hopper.
  int compute_capability = 0;
  void validate(const ModelSpec& m) const;  // throws InvalidInput naming the field
};

// One transformer layer, one micro-batch, on one rank: forward, backward and recompute kernels.
std::vector<Op> layer_ops(const ModelSpec& m, const OperatorSetup& s);
namespace detail {
// layer_ops' second half (core/src/lowp_ops.cpp): appends to one layer's `ops` the quantize kernels
// of Note [low-precision casts] for its low-precision GEMMs (Op::high_precision already marked) and
// makes the norms that feed a fused fp8 LayerNormLinear write fp8. No-op unless s.recipe is low
// precision.
void add_quantize_ops(const ModelSpec& m, const OperatorSetup& s, std::vector<Op>& ops);
// One kernel of Megatron-Core's MoE token dispatcher and the bytes it moves, forward and (where
// autograd runs one: `backward` named) backward.
struct DispatchKernel {
  std::string_view name, backward;  // static strings; backward empty = no gradient kernel
  double bytes = 0, backward_bytes = 0;
};
// The dispatcher kernels of one MoE layer, one micro-batch, on one rank (core/src/
// moe_dispatch_ops.cpp, Note [MoE token dispatcher]); none for a dense model or a dense layer.
std::vector<DispatchKernel> moe_dispatch_kernels(const ModelSpec& m, const OperatorSetup& s);
}  // namespace detail
// Whether the recipe's kernels cast each weight once per step (Transformer Engine: every recipe
// under fused kernels, and MXFP8 / NVFP4, which are TE's either way) rather than in every forward
// (torchao's eager fp8). Note [low-precision casts].
bool weight_casts_cached(const OperatorSetup& s);
// First pipeline stage's extra kernels (token embedding), one micro-batch.
std::vector<Op> embedding_ops(const ModelSpec& m, const OperatorSetup& s);
// Last pipeline stage's extra kernels (final norm, LM head, cross-entropy), one micro-batch; with
// multi-token prediction each module's own kernels and its pass through the head and loss, but
// not its transformer layer (Note [multi-token prediction] in model.cpp).
std::vector<Op> output_ops(const ModelSpec& m, const OperatorSetup& s);

// The low-precision GEMMs (the linear layers' forward GEMMs a recipe runs in its format, each a TE
// module's GEMM with its own scaling metadata: Note [low precision]) of `layers` transformer layers
// on one GPU, a MoE model's dense leading layers weighed in by their share of the layers: per layer
// attention's projections (qkv and out; MLA's q-down, q-up or q, kv-down, kv-up, out), the MLP's 2
// (gate-up fused, down), a MoE layer's E/ep local experts × 2 and its shared experts' 2 — not the
// router. The count of layer_ops' forward GEMMs outside the bf16 ones, each weighted by its batch.
double low_precision_gemms(const ModelSpec& m, double layers, int ep);

// Bytes the optimizer step moves per parameter it updates (read + write; see the note above).
double optimizer_update_bytes(Precision p, Optimizer o);

// Note [flash kernel generations]
// A GPU's attention fractions (KernelPerf::attention_*: the presets' FlashAttention-2 figures, or a
// probe's measured kernel) describe FlashAttention-2-class kernels. Runs of 2022–23 used slower
// ones: llm-foundry's MPT (attn_impl triton, its default in the published benchmark tables) runs
// Tri Dao's Triton port of FlashAttention, whose docstring
// (llmfoundry/models/layers/flash_attn_triton.py) says its forward is faster than FlashAttention's
// CUDA kernel, its backward slower, and "overall Triton forward + backward is slightly slower" than
// it. FlashAttention (v1) on A100 reaches 30–50 % of peak forward and 25–35 % backward (Dao 2023,
// FlashAttention-2, §1); the A100 preset's FlashAttention-2 figures are 0.6 forward (the middle of
// that paper's 50–73 %) and 0.45 backward (presets.cpp's own choice: the paper says only that
// backward is lower). FlashKernel::fa1 therefore runs at the GPU's fractions × kFa1AttentionSpeed,
// the midpoints over those: 0.40 / 0.60 forward, 0.30 / 0.45 backward — 2/3 both ways (the backward
// ratio leans on the preset's 0.45), where the paper's own benchmark finds FlashAttention-2 "around
// 2×" faster (its best shapes). On another GPU the same ratio is assumed (no FlashAttention-1
// figures on Hopper were found); a kernel "slightly slower" than FlashAttention keeps a small fast
// bias. A calibration's measured attention (`--calibration`, a probe's kernels.attention) is
// already the kernel that probe ran: fa1 scales it too, fa2 and cudnn take it as is, so keep fa2
// or cudnn with a calibration of the kernel you run.
inline constexpr double kFa1AttentionSpeed = 2.0 / 3.0;

// One GEMM kernel: C (m × n) = A (m × k) · B (k × n), `batch` of them in one call, e bytes per
// element — 2·batch·mnk FLOPs, batch·e·(mk + kn + mn) bytes (every operand read or written once).
Op gemm_kernel(std::string_view name, Pass pass, std::int64_t m, std::int64_t n, std::int64_t k,
               double batch, double e);

// Seconds of one kernel on `gpu` (core/roofline.hpp): a GEMM at p's tensor-core peak, except the
// high_precision ones and attention, which run at compute_precision(p) (attention at its
// kernel generation's speed, Note [flash kernel generations]).
double op_seconds(const Op& op, const GpuSpec& gpu, Precision p);

// The family a streaming kernel's measured rate is looked up by (KernelPerf::streaming_rates,
// Note [streaming kernel families]): the operator's name with the layer's position dropped —
// norm-1, norm-2, final-norm, q-norm and kv-norm are "norm", shared-gelu "gelu" — and
// ".backward" kept ("norm.backward"), except the engine ring's ring-mask, "mask" in both passes
// (Note [engine ring attention], core/gpt_step.hpp); any other name is its own family.
std::string_view kernel_family(std::string_view op_name);
// The measured rate of `op_name`'s family on `k`, bytes/s; 0 where none was measured.
double streaming_rate_bps(const KernelPerf& k, std::string_view op_name);

struct OpsTime {
  double forward_s = 0, backward_s = 0, recompute_s = 0;
  // Of those, the weights' quantize kernels (Op::weight_cast): in the forward, and in all passes.
  double weight_cast_forward_s = 0, weight_cast_s = 0;
  // Of backward_s, the weight-gradient GEMMs of the column-parallel linears (is_column_wgrad):
  // what each one's input-gradient collective hides behind (Note [TP gradient overlap]).
  double column_wgrad_s = 0;
  double flops = 0;                  // executed
  double total_s() const { return forward_s + backward_s + recompute_s; }
};
OpsTime time_ops(const std::vector<Op>& ops, const GpuSpec& gpu, Precision p);
// Whether an op is the weight-gradient GEMM of a column-parallel linear whose input gradient is
// reduced over the TP group: qkv, q-proj (MLA without a q latent) and the dense or shared MLP's
// up (gate-up). MLA's down projections are whole on every rank; routed experts reduce nothing
// over TP.
bool is_column_wgrad(std::string_view name);

// One layer's kernels timed (layer_ops, time_ops). A MoE model with dense leading layers
// (ModelSpec::dense_layers) gets the average over its layers, (L_d·dense + (L − L_d)·MoE) / L:
// stage times then sum to the model's, but which stage holds the dense layers is not modelled (for
// DeepSeek-V3 the dense FFN, 18432, equals the active MoE width, 9 × 2048, so they differ little).
OpsTime average_layer_time(const ModelSpec& m, const OperatorSetup& s, const GpuSpec& gpu,
                           Precision p);
// That average from the two layers' times (the planner times the dense layer once for every EP).
OpsTime mix_layer_times(const ModelSpec& m, const OpsTime& moe_layer, const OpsTime& dense_layer);

}  // namespace tally
