// tally core vocabulary: units, enums and the convention label shared by every ledger.
//
// Units (STYLE.md habit 1): every quantity carries its unit in its name.
//   *_bytes  bytes (double: ledgers reach 1e15 and fractional bytes per parameter, e.g. 4-bit = 0.5)
//   *_s      seconds          *_hours  hours
//   *_bps    bytes per second (never bits)          *_flops  floating-point operations
// GB = 1e9 bytes and GiB = 2^30 bytes are converted only at the reporting edge (to_unit).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

namespace tally {

inline constexpr double kGB = 1e9;                 // decimal gigabyte
inline constexpr double kGiB = 1073741824.0;       // 2^30 bytes
inline constexpr double kMB = 1e6;
inline constexpr double kMiB = 1048576.0;          // 2^20 bytes
// The most GPUs a layout may hold (--gpus, and dp·tp·pp·cp of a given layout): 2^24, so that
// products of parallel degrees stay within an int.
inline constexpr int kMaxGpus = 1 << 24;

enum class SizeUnit { GB, GiB };
double unit_bytes(SizeUnit u);
inline double to_unit(double bytes, SizeUnit u) { return bytes / unit_bytes(u); }
std::string_view to_string(SizeUnit u);

// Bad user input (STYLE.md habit 6): thrown at the boundary, message names the field, the value and
// the allowed range. The CLI maps it to exit code 2.
class InvalidInput : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A broken invariant: a bug, not bad input. Survives NDEBUG.
[[noreturn]] void invariant_failed(const char* expr, const char* file, int line);
#define TALLY_INVARIANT(cond) \
  ((cond) ? (void)0 : ::tally::invariant_failed(#cond, __FILE__, __LINE__))

// Training precision of parameters and gradients. fp32: no separate master copy. bf16/fp16: 16-bit
// parameters and gradients plus fp32 master weights (seed: 混合精度 2+2+8+4).
// Note [low precision] — fp8, mxfp8, nvfp4 are recipes on top of bf16 mixed precision, as
// Transformer Engine runs them under Megatron-Core: the transformer layers' linear GEMMs (qkv,
// out-proj, MLP, experts) run in the format; parameters, gradients, activations, the attention
// core, norms, router, embedding and LM head stay bf16; master weights and Adam moments fp32. Each
// linear weight also keeps its low-precision copies for the step (TE's weight workspaces):
//   fp8    per-tensor scaling (TE "delayed scaling": e4m3 forward, e5m2 gradients, an amax
//          history per tensor): the fp8 weight and, where the GPU's fp8 GEMMs take TN layouts
//          only (Hopper), its transpose for the backward GEMMs — 2 B per weight, 1 B on
//          datacenter Blackwell (Note [fp8 operand layouts])
//   mxfp8  OCP Microscaling MXFP8 (TE MXFP8BlockScaling, Blackwell): e4m3 elements with one e8m0
//          scale per 32 along the GEMM's inner dimension, a row-wise and a column-wise copy,
//          2 · (1 + 1/32) B per weight
//   nvfp4  NVIDIA NVFP4 (TE NVFP4BlockScaling, Blackwell): e2m1 elements, one e4m3 scale per 16
//          and an fp32 scale per tensor, row-wise and column-wise, 2 · (0.5 + 1/16) B per weight
// Per-tensor scales are a few bytes per tensor: not counted. Two more stores, each labelled in
// its ledger's convention (Transformer Engine v2.8, commit 40c69e7):
//   saved inputs  each low-precision linear saves its input for the weight gradient in the format
//                 (module/linear.py, layernorm_linear.py, grouped_linear.py: the quantized input,
//                 column-wise data only — row-wise for per-tensor fp8 under SP's gather — kept by
//                 save_for_backward), saved_linear_input_bytes per element: 1, 1 + 1/32 and
//                 0.5 + 1/16 B; what other kernels save of the same tensor stays bf16 (the
//                 activation ledger, Note [activation inventory])
//   amax history  delayed scaling (fp8) keeps, per GEMM, 3 forward tensors (input, weight,
//                 output) and 2 backward (grad output, grad input) — module/base.py — each with an
//                 fp32 scale and an fp32 amax history of amax_history_len entries (fp8.py
//                 DelayedScalingRecipeState; common/recipe DelayedScaling's default 1024;
//                 Megatron-Core sets it from --fp8-amax-history-len, default 1):
//                 delayed_scaling_bytes_per_gemm, the state ledger's scaling-metadata item
enum class Precision { fp32, bf16, fp16, fp8, mxfp8, nvfp4 };
// Note [fp8 operand layouts] — which copies of a low-precision tensor its GEMMs need. The forward
// Y = X·Wᵀ reduces over the input features, the inner axis of X's and W's rows; the backward
// GEMMs reduce over another axis (dgrad dX = dY·W over W's output rows, wgrad dW = dYᵀ·X over the
// tokens). Hopper's fp8 tensor cores (and Ada's, and consumer Blackwell's sm_120) take fp8
// operands in TN layout only (both K-major), so Transformer Engine keeps each per-tensor fp8
// tensor a backward GEMM reads as row-wise data and its transpose, which it passes as the
// column-wise data (common/gemm/cublaslt_gemm.cu CanonicalizeGemmInput). Datacenter
// Blackwell takes any layout: TE then keeps the row-wise data alone and the transposed GEMMs
// read it as it is — pytorch/csrc/quantizer.cpp Float8Quantizer and
// Float8CurrentScalingQuantizer::create_tensor allocate the transpose only when column-wise usage
// is asked and !nvte_is_non_tn_fp8_gemm_supported(), and the row-wise data whenever it is;
// rmsnorm_api.cpp's fp8 transpose and distributed.py _all_gather_fp8's transpose of the
// gathered rows follow (Transformer Engine v2.8, commit 40c69e7). The rule, TE's
// is_non_tn_fp8_gemm_supported (pytorch/utils.py; common/transformer_engine.cpp): compute
// capability 10.x, 11.x or >= 13.0 — B200 and GB200 10.0, B300 and GB300 10.3; H100 and H200
// 9.0, A100 8.0 (NVIDIA, developer.nvidia.com/cuda-gpus). MXFP8 and NVFP4 keep a row-wise and a
// column-wise copy on every GPU: their scaling blocks run along the GEMM's inner dimension,
// which is a different axis of the tensor in the forward and the backward GEMMs
// (MXFP8Quantizer::create_tensor allocates each usage asked for, whatever the GPU).
enum class Fp8GemmLayouts { tn_only, any };
// TE's rule above; compute capability as 10·major + minor (90 = 9.0, 103 = 10.3); 0 = not known,
// which takes TN only (every GPU before Blackwell: the larger ledger).
Fp8GemmLayouts fp8_gemm_layouts(int compute_capability);
// "9.0", "10.3"; "unknown" for 0.
std::string compute_capability_name(int compute_capability);
enum class Optimizer { adam, adamw, adam8bit, sgd, sgd_momentum };
// Activation recompute policies, each named after the framework that defines its saved set:
//   selective     Megatron-LM --recompute-granularity selective (Korthikanti et al. 2022 §5):
//                 recompute the attention core (scores, softmax, dropout, context)
//   full          Megatron-LM --recompute-granularity full: keep each layer's input, replay it
//   save_matmuls  PyTorch selective activation checkpointing with a policy that saves the outputs
//                 of matmuls and attention and recomputes the rest (norms, activations, rotary)
//   op_sac        torchtitan's selective op-level AC (activation_checkpoint mode "selective", option
//                 "op"): saves attention's outputs and every other matmul output in a layer — of
//                 q, k, v, o, gate (w1), up (w3), down (w2) it recomputes k, o and up — and replays
//                 those GEMMs with the norms, rotary and activation. Defined for dense layers with
//                 ordinary attention (op_sac_applies: torchtitan's Llama), not MoE or MLA.
enum class Recompute { none, selective, full, save_matmuls, op_sac };
inline constexpr int kRecomputePolicies = 5;
// Megatron-Core's recompute modules (TransformerConfig.recompute_modules, the selective
// granularity's list) that a policy above does not name, on top of none, selective or
// save_matmuls (full replays everything; op_sac is torchtitan's):
//   mla_up_proj  MLA's q and kv up-projections and the rotary embedding replayed in backward from
//                the latents the layer keeps anyway; their outputs — the attention's q, k, v —
//                are discarded after use ("output-discarding checkpointing")
//   dense_mlp    ("mlp") each dense MLP replayed from its input: a dense model's every layer, a MoE
//                model's dense leading layers (MoE layers are "moe", not modelled)
// A request's choice, as a recipe names them; the planner does not search them.
struct RecomputeModules {
  bool mla_up_proj = false;
  bool dense_mlp = false;
  bool any() const { return mla_up_proj || dense_mlp; }
  bool operator==(const RecomputeModules&) const = default;
};
enum class Attention { materialized, flash };
// How the memory-bound kernels between the GEMMs run (Note [eager kernels] in operators.hpp):
//   fused  each norm, rotary, activation and residual is one kernel reading its inputs and writing
//          its output once (Megatron-LM / Transformer Engine fused kernels, torch.compile)
//   eager  uncompiled PyTorch as torchtitan's Llama writes it: every operator its own kernel, every
//          intermediate through HBM (fp32 RMSNorm in five pieces, complex fp32 rotary, GQA's
//          repeat_kv copies, SiLU and the gate's product apart)
//   local  Megatron-LM's own modules (--transformer-impl local, all of Megatron-LM before
//          Transformer Engine): fused as above, but each linear layer's bias is added by a kernel
//          of its own after its GEMM and its gradient summed by another, and materialised
//          attention's context is permuted by a copy (Note [local kernels] in operators.hpp)
enum class Kernels { fused, eager, local };
// How the loss's kernels run (Note [loss kernels] in operators.hpp):
//   fused           one fused cross-entropy kernel (Megatron-Core --cross-entropy-loss-fusion,
//                   Transformer Engine's, flash-attn's): e + 12 B per logit forward, 8 + e backward
//   vocab-parallel  Megatron-LM's vocab_parallel_cross_entropy as written, its default: the fp32
//                   cast, then max, in-place subtract, exp and divide and a sum, one kernel each:
//                   e + 36 forward, 12 + e backward
//   eager           PyTorch's uncompiled cross_entropy(logits.float()): e + 20, 24 + e, and three
//                   fp32 tensors of the logits' size held (the others hold one)
enum class Loss { fused, vocab_parallel, eager };
// How a step's micro-batches' weight gradients are summed (Note [gradient accumulation] in
// planner.cpp):
//   fused     inside the weight-gradient GEMM, which adds into the gradient buffer (Megatron-LM's
//             --gradient-accumulation-fusion, Transformer Engine's fuse_wgrad_accumulation): no
//             kernel of its own
//   autograd  PyTorch's AccumulateGrad adds each micro-batch's gradient into .grad in place, a
//             kernel reading both and writing the sum (PyTorch DDP under no_sync, FSDP, Megatron-
//             LM 2021's DDP without contiguous buffers)
enum class GradAccumulation { fused, autograd };
// Which fused-attention kernel runs Attention::flash (Note [flash kernel generations] in
// operators.hpp):
//   fa2  FlashAttention-2 and PyTorch SDPA's flash backend: the GPU's attention fractions
//        (KernelPerf)
//   fa1  FlashAttention (v1) and kernels no faster: Tri Dao's 2022 Triton kernel that MPT /
//        llm-foundry run (attn_impl triton), whose docstring puts it slightly below FlashAttention
//        forward + backward; the fractions × kFa1AttentionSpeed
//   cudnn  cuDNN's fused attention, Transformer Engine's choice on Hopper and later (NVIDIA NeMo's
//        docs: TE prefers cuDNN's flash attention on Hopper+, Tri Dao's on Ampere) and the default
//        SDPA backend of the PyTorch the H200 probe ran: the GPU's measured cuDNN table
//        (KernelPerf::cudnn_attention_table, Note [cuDNN attention] in presets.cpp), or a
//        calibration's measured attention; a GPU with neither is refused
enum class FlashKernel { fa2, fa1, cudnn };

std::string_view to_string(Precision p);
std::string_view to_string(Optimizer o);
std::string_view to_string(Recompute r);
std::string_view to_string(Attention a);
std::string_view to_string(Kernels k);
std::string_view to_string(Loss l);
std::string_view to_string(GradAccumulation g);
std::string_view to_string(FlashKernel f);
// A plan convention's words for the attention kernel: "" for the default fa2, else ", <what>".
std::string_view convention_words(FlashKernel f);

// Parsers for the boundary (CLI, files). Return nullopt on unknown names; allowed_*() lists the names.
std::optional<Precision> parse_precision(std::string_view s);
std::optional<Optimizer> parse_optimizer(std::string_view s);
std::optional<Recompute> parse_recompute(std::string_view s);
std::optional<Attention> parse_attention(std::string_view s);
std::optional<Kernels> parse_kernels(std::string_view s);
std::optional<Loss> parse_loss(std::string_view s);
std::optional<GradAccumulation> parse_grad_accumulation(std::string_view s);
std::optional<FlashKernel> parse_flash_kernel(std::string_view s);
std::optional<SizeUnit> parse_size_unit(std::string_view s);
const std::vector<std::string>& allowed_precisions();
const std::vector<std::string>& allowed_optimizers();
const std::vector<std::string>& allowed_recomputes();
const std::vector<std::string>& allowed_attentions();
const std::vector<std::string>& allowed_kernels();
const std::vector<std::string>& allowed_losses();
const std::vector<std::string>& allowed_grad_accumulations();
const std::vector<std::string>& allowed_flash_kernels();

// Bytes of one element of the training dtype of parameters, gradients and activations (a
// low-precision recipe keeps them in bf16: Note [low precision]).
double dtype_bytes(Precision p);
// True for fp8, mxfp8, nvfp4 (Note [low precision]).
bool is_low_precision(Precision p);
// The dtype of everything a low-precision recipe leaves out of the format (bf16); p otherwise.
Precision compute_precision(Precision p);
// Bytes per element of one quantized copy, its block scales included (per-tensor scales are not
// counted): 1, 1 + 1/32, 0.5 + 1/16 for fp8, mxfp8, nvfp4; 0 for fp32/bf16/fp16.
double quantized_element_bytes(Precision p);
// Copies kept of a low-precision tensor that transposed GEMMs read (Note [fp8 operand layouts]):
// 2 (row-wise and column-wise), but 1 for per-tensor fp8 where the GPU takes any layout; 0 for
// fp32/bf16/fp16.
int low_precision_layouts(Precision p, Fp8GemmLayouts l);
// Bytes per linear weight of its low-precision copies (Note [low precision]):
// low_precision_layouts × quantized_element_bytes — fp8 2 (TN only) or 1, mxfp8 2.0625, nvfp4
// 1.125; 0 for fp32/bf16/fp16.
double low_precision_copy_bytes(Precision p, Fp8GemmLayouts l);
// The copies named for a convention label, e.g. "the weight and its transpose (TN-only fp8
// GEMMs, compute capability 9.0)"; empty for fp32/bf16/fp16.
std::string low_precision_copies_label(Precision p, int compute_capability);
// Megatron-Core's fp8 parameters exist for fp8 and mxfp8 (Note [fp8 parameters] in
// model_states.cpp): throws InvalidInput naming --fp8-param-gather otherwise.
void require_fp8_param_gather(Precision p);
// Bytes per element of a low-precision linear's input saved for its weight gradient (Note [low
// precision]): one copy, quantized_element_bytes — 1, 1 + 1/32, 0.5 + 1/16 for fp8, mxfp8, nvfp4;
// 0 for fp32/bf16/fp16.
double saved_linear_input_bytes(Precision p);
// TE's DelayedScaling default amax_history_len, and the fp8 scaling metadata of one GEMM:
// 5 tensors × 4 B × (history + 1) — an fp32 amax history and an fp32 scale each (Note [low
// precision]).
inline constexpr int kTeAmaxHistory = 1024;
double delayed_scaling_bytes_per_gemm(int amax_history);

// Parses a parameter count such as "7e9", "7B", "6.74b", "175B", "350M", "1.5T", "7000000000".
// Throws InvalidInput naming `field` on anything else or on a non-positive value.
double parse_count(std::string_view text, std::string_view field);

// Quantities typed with their unit (STYLE.md: a flag named "gbps" is read as gigabits by everyone who
// buys networks, so the unit goes with the value). Case matters where it means something: B is a
// byte, b a bit; K/k, M, G, T are decimal prefixes (1e3 … 1e12), Ki, Mi, Gi, Ti binary (2^10 … 2^40).
// A space between number and unit is allowed. Throw InvalidInput naming `field`, the text and the
// accepted forms; the value must be finite and > 0.
//   parse_bytes:      "14GB" = 14e9, "512MiB" = 2^29, "1.5TB", "100B"          → bytes
//   parse_bandwidth:  "50GB/s" = 5e10 B/s, "200Gb/s" = "200Gbps" = 2.5e10 B/s,
//                     "1.6Tb/s" = 2e11 B/s, "25GiB/s"                          → bytes per second
double parse_bytes(std::string_view text, std::string_view field);
double parse_bandwidth(std::string_view text, std::string_view field);

// A number for messages and labels (the one formatter): whole numbers below 1e15 exactly
// ("1048576", "-2"), others in shortest-%g form ("0.5", "5e-324", "1e+15"), nan and inf as such.
std::string format_number(double v);
// Input checks shared by the ledgers: throw InvalidInput "field = value: allowed" unless ok.
void require_real(bool ok, std::string_view field, double value, std::string_view allowed);
void require_int(bool ok, std::string_view field, std::int64_t value, std::string_view allowed);
// The same with the allowed range built only on failure — for messages that format numbers, on
// paths the planner runs for every layout: `require_real(ok, "f", v, [&] { return "..." + ...; })`.
template <class Allowed>
  requires std::is_invocable_r_v<std::string, Allowed>
void require_real(bool ok, std::string_view field, double value, Allowed&& allowed) {
  if (!ok) require_real(false, field, value, std::string_view(allowed()));
}
template <class Allowed>
  requires std::is_invocable_r_v<std::string, Allowed>
void require_int(bool ok, std::string_view field, std::int64_t value, Allowed&& allowed) {
  if (!ok) require_int(false, field, value, std::string_view(allowed()));
}

// Formats a byte count in the given unit with its unit name, e.g. "26.25 GB".
std::string format_bytes(double bytes, SizeUnit u, int decimals = 2);

}  // namespace tally
