// The quantize kernels of the low-precision recipes (Note [low-precision casts], operators.hpp):
// what each recipe's implementation runs to make a low-precision GEMM's operands, per GEMM of one
// layer's operator list.
#include <array>

#include "tally/core/operators.hpp"

namespace tally::detail {

namespace {

// One low-precision GEMM's quantize kernels, by name (Op::name is a view: static strings).
struct QuantizeNames {
  std::string_view gemm, input, weight, grad, transposes;
};
constexpr std::array kNames{
    QuantizeNames{"qkv", "qkv.quantize-input", "qkv.quantize-weight", "qkv.quantize-grad",
                  "qkv.transpose-copies"},
    QuantizeNames{"k-proj", "k-proj.quantize-input", "k-proj.quantize-weight",
                  "k-proj.quantize-grad", "k-proj.transpose-copies"},
    QuantizeNames{"q-down", "q-down.quantize-input", "q-down.quantize-weight",
                  "q-down.quantize-grad", "q-down.transpose-copies"},
    QuantizeNames{"q-up", "q-up.quantize-input", "q-up.quantize-weight", "q-up.quantize-grad",
                  "q-up.transpose-copies"},
    QuantizeNames{"q-proj", "q-proj.quantize-input", "q-proj.quantize-weight",
                  "q-proj.quantize-grad", "q-proj.transpose-copies"},
    QuantizeNames{"kv-down", "kv-down.quantize-input", "kv-down.quantize-weight",
                  "kv-down.quantize-grad", "kv-down.transpose-copies"},
    QuantizeNames{"kv-up", "kv-up.quantize-input", "kv-up.quantize-weight",
                  "kv-up.quantize-grad", "kv-up.transpose-copies"},
    QuantizeNames{"out-proj", "out-proj.quantize-input", "out-proj.quantize-weight",
                  "out-proj.quantize-grad", "out-proj.transpose-copies"},
    QuantizeNames{"mlp-gate-up", "mlp-gate-up.quantize-input", "mlp-gate-up.quantize-weight",
                  "mlp-gate-up.quantize-grad", "mlp-gate-up.transpose-copies"},
    QuantizeNames{"mlp-up", "mlp-up.quantize-input", "mlp-up.quantize-weight",
                  "mlp-up.quantize-grad", "mlp-up.transpose-copies"},
    QuantizeNames{"mlp-down", "mlp-down.quantize-input", "mlp-down.quantize-weight",
                  "mlp-down.quantize-grad", "mlp-down.transpose-copies"},
    QuantizeNames{"shared-gate-up", "shared-gate-up.quantize-input",
                  "shared-gate-up.quantize-weight", "shared-gate-up.quantize-grad",
                  "shared-gate-up.transpose-copies"},
    QuantizeNames{"shared-up", "shared-up.quantize-input", "shared-up.quantize-weight",
                  "shared-up.quantize-grad", "shared-up.transpose-copies"},
    QuantizeNames{"shared-down", "shared-down.quantize-input", "shared-down.quantize-weight",
                  "shared-down.quantize-grad", "shared-down.transpose-copies"},
};

const QuantizeNames& names_of(std::string_view gemm) {
  for (const QuantizeNames& n : kNames)
    if (n.gemm == gemm) return n;
  TALLY_INVARIANT(false && "a low-precision GEMM without quantize kernel names");
  return kNames[0];
}

// Where a GEMM's operands come from (Note [low-precision casts]).
struct Operands {
  bool gathered_input = false;  // column-parallel after the sequence-split norms (SP, t > 1)
  bool gathered_grad = false;   // row-parallel: its output gradient arrives sequence-split
  bool norm_fed = false;        // a TE LayerNormLinear under Megatron-Core (qkv, dense fc1)
  int projections = 1;          // torchtitan's separate Linears sharing X: wq wk wv, w1 w3
};

// `routed`: the layer's mlp-* GEMMs are the routed experts (a MoE layer), fed by the dispatch.
Operands operands(std::string_view g, bool routed, bool sp) {
  if (g == "qkv") return {.gathered_input = sp, .norm_fed = true, .projections = 3};
  if (g == "k-proj") return {.gathered_input = sp, .norm_fed = true};
  if (g == "q-down" || g == "kv-down" || g == "q-proj" || g == "shared-gate-up" ||
      g == "shared-up")
    return {.gathered_input = sp};
  if (g == "out-proj" || g == "shared-down") return {.gathered_grad = sp};
  if (routed) return {};
  if (g == "mlp-gate-up") return {.gathered_input = sp, .norm_fed = true, .projections = 2};
  if (g == "mlp-up") return {.gathered_input = sp, .norm_fed = true};
  if (g == "mlp-down") return {.gathered_grad = sp};
  return {};  // MLA's q-up, kv-up: fed by their own norms, whole on the rank
}

// Bytes of one GEMM's quantize kernels; X, W, G the elements of its input, weight and output
// gradient as the GEMM sees them (Note [low-precision casts] gives each figure's source).
struct QuantizeBytes {
  double input = 0, weight = 0, grad = 0, transposes = 0;
};

QuantizeBytes quantize_bytes(const OperatorSetup& s, const Operands& o, double X, double W,
                             double G) {
  // q₁ one copy, q the copies kept; t the transposes TE makes of a per-tensor fp8 tensor: 1 on a
  // TN-only GPU, 0 where any layout is taken (Note [fp8 operand layouts]).
  const Fp8GemmLayouts layouts = fp8_gemm_layouts(s.compute_capability);
  const double e = s.act_bytes, q1 = quantized_element_bytes(s.recipe),
               q = low_precision_copy_bytes(s.recipe, layouts),
               t = double(low_precision_layouts(s.recipe, layouts) - 1);
  const double Xl = o.gathered_input ? X / s.tp : X, Gl = o.gathered_grad ? G / s.tp : G;
  switch (s.recipe) {
    case Precision::fp8:
      if (s.kernels == Kernels::eager) {  // torchao's tensorwise dynamic casts, uncompiled
        const double cast = 4 * e + 24 + q1;
        const int casts = s.tp > 1 ? 1 : o.projections;
        return {.input = casts * cast * Xl, .weight = cast * W, .grad = cast * Gl,
                .transposes = 2 * q1 * (o.projections * X + W + G)};
      }
      // Transformer Engine: cast (+ transpose) in one kernel; a fused norm writes fp8 itself.
      return {.input = o.norm_fed ? (o.gathered_input ? 0 : t * 2 * q1 * X)
                                  : (o.gathered_input ? (e + q1) * Xl : (e + q) * X),
              .weight = (e + q) * W,
              .grad = o.gathered_grad ? (e + q1) * Gl : (e + q) * G,
              .transposes =
                  t * 2 * q1 * ((o.gathered_input ? X : 0) + (o.gathered_grad ? G : 0))};
    case Precision::mxfp8:
      return {.input = (e + q) * Xl, .weight = (e + q) * W, .grad = (e + q) * Gl};
    case Precision::nvfp4:
      return {.input = (3 * e + q) * Xl, .weight = (2 * e + q) * W, .grad = (3 * e + q) * Gl};
    default:
      return {};
  }
}

}  // namespace

void add_quantize_ops(const ModelSpec& m, const OperatorSetup& s, std::vector<Op>& ops) {
  if (!is_low_precision(s.recipe)) return;
  const bool routed = m.is_moe() && !s.dense_layer;
  const bool sp = s.sequence_parallel && s.tp > 1;
  const bool fused_fp8 = s.recipe == Precision::fp8 && s.kernels == Kernels::fused;
  if (fused_fp8) {
    // The norm of a LayerNormLinear writes q₁ instead of e per element (forward and replays):
    // norm-1 before qkv (MLA keeps a separate norm), norm-2 before a dense fc1.
    const double e = s.act_bytes, q1 = quantized_element_bytes(s.recipe);
    const double tokens = double(s.micro_batch) * double(s.seq / s.cp) /
                          (s.sequence_parallel ? s.tp : 1);
    for (Op& op : ops)
      if (op.kind == OpKind::memory && op.pass != Pass::backward &&
          ((op.name == "norm-1" && !m.is_mla()) || (op.name == "norm-2" && !routed)))
        op.bytes -= (e - q1) * tokens * double(m.hidden);
  }
  auto push = [&](std::string_view name, Pass pass, double bytes, bool weight = false) {
    if (bytes > 0) ops.push_back(Op{.name = name, .kind = OpKind::memory, .pass = pass,
                                    .bytes = bytes, .weight_cast = weight});
  };
  for (std::size_t i = 0, n = ops.size(); i < n; ++i) {
    const Op g = ops[i];  // a copy: push_back reallocates
    if (g.kind != OpKind::gemm || g.high_precision || g.pass == Pass::backward) continue;
    const QuantizeNames& name = names_of(g.name);
    Operands o = operands(g.name, routed, sp);
    o.norm_fed = o.norm_fed && fused_fp8;
    const double M = double(g.m), N = double(g.n), K = double(g.k);
    const QuantizeBytes b = quantize_bytes(s, o, g.batch * M * K, g.batch * K * N, g.batch * M * N);
    push(name.input, g.pass, b.input);  // a replayed GEMM (recompute) casts its operands again
    push(name.weight, g.pass, b.weight, true);
    if (g.pass != Pass::forward) continue;
    push(name.grad, Pass::backward, b.grad);
    push(name.transposes, Pass::backward, b.transposes);
  }
}

}  // namespace tally::detail

namespace tally {

bool weight_casts_cached(const OperatorSetup& s) {
  return is_low_precision(s.recipe) &&
         !(s.recipe == Precision::fp8 && s.kernels == Kernels::eager);
}

}  // namespace tally
