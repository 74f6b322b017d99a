// Issue 12, the rest of `tally run qlora`: the Llama layout (engine/runtime/llama_model.hpp:
// RMSNorm, SwiGLU, rotary positions, GQA) and bf16 compute (lora_model.hpp Note [compute dtype])
// on a tiny model: the layout against core's parameter count and published shapes, rotary and GQA
// against their definitions, the LoRA model against its source, bf16 against fp32 within bf16's
// rounding, the run's criteria ①–④ with the ledger given the same layout and compute dtype, and
// bad flags.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "../support/subprocess.hpp"
#include "lora_model.hpp"
#include "qlora_expect.hpp"
#include "llama_model.hpp"
#include "tally/core/finetune.hpp"
#include "tally/core/presets.hpp"
#include "tally/engine/experiments/qlora.hpp"
#include "tally/engine/llama.hpp"

namespace tally::engine::exp_qlora_llama {
namespace {

using test::batch;
using test::expect_every_check_ok;
using test::loss_of;

// h 64, L 2, a 4, a_kv 2 (GQA), f 256, V 256: d = 16.
LlamaConfig tiny(std::int64_t kv_heads = 2) {
  return {.hidden = 64, .layers = 2, .heads = 4, .kv_heads = kv_heads, .ffn = 256, .vocab = 256};
}

Llama source(std::uint64_t seed = 0, std::int64_t kv_heads = 2) {
  torch::manual_seed(seed);
  return Llama(tiny(kv_heads));
}

LoraSetup setup(FineTune method, Precision compute = Precision::fp32, double dropout = 0.05) {
  return {.method = method, .dropout = dropout, .compute = compute};
}

LoraSetup all_targets(FineTune method, Precision compute = Precision::fp32) {
  LoraSetup s = setup(method, compute);
  s.targets = {LoraTarget::q,  LoraTarget::k, LoraTarget::v,   LoraTarget::o,
               LoraTarget::gate, LoraTarget::up, LoraTarget::down};
  return s;
}

// ---- the layout ---------------------------------------------------------------------------------

// Meta's width rule against the published configs' intermediate_size: Llama-2-7B (h 4096) 11008,
// Llama-2-13B (h 5120) 13824; and the module's parameters against core's count and the formula of
// llama.hpp computed here.
TEST(LlamaLayout, ShapeAndParameterCount) {
  EXPECT_EQ(llama_ffn(4096), 11008);
  EXPECT_EQ(llama_ffn(5120), 13824);
  EXPECT_EQ(llama_ffn(768), 2048);
  for (std::int64_t kv : {4, 2, 1}) {
    const LlamaConfig c = tiny(kv);
    const Llama m = source(0, kv);
    const std::int64_t C = 64, d = 16, f = 256, V = 256, L = 2, a = 4;
    const std::int64_t formula =
        2 * V * C + L * (2 * C * a * d + 2 * C * kv * d + 3 * C * f + 2 * C) + C;
    EXPECT_EQ(m->parameter_count(), formula) << kv;
    EXPECT_EQ(double(m->parameter_count()), count_params(llama_model_spec(c)).total()) << kv;
  }
  // Llama-2-7B's shape is core's preset to the parameter (6 738 415 616).
  const ModelSpec l7 = llama_model_spec(
      {.hidden = 4096, .layers = 32, .heads = 32, .kv_heads = 32, .ffn = 11008, .vocab = 32000});
  EXPECT_EQ(count_params(l7).total(), count_params(*model_preset("llama-2-7b")).total());
  EXPECT_EQ(count_params(l7).total(), 6738415616.0);
}

// Note [rotary positions]: each pair (x_i, x_{i+d/2}) at position t turns by t·θ^(−2i/d),
// computed here element by element in double.
TEST(LlamaLayout, RotaryTurnsEachPairByItsAngle) {
  const std::int64_t T = 7, d = 8;
  const double theta = 10000;
  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({1, 1, T, d});
  const auto [cos, sin] = rotary_tables(T, d, theta, torch::kFloat);
  const torch::Tensor y = apply_rotary(x, cos, sin);
  const auto X = x.accessor<float, 4>(), Y = y.accessor<float, 4>();
  for (std::int64_t t = 0; t < T; ++t)
    for (std::int64_t i = 0; i < d / 2; ++i) {
      const double angle = double(t) * std::pow(theta, -2.0 * double(i) / double(d));
      const double a = X[0][0][t][i], b = X[0][0][t][i + d / 2];
      EXPECT_NEAR(Y[0][0][t][i], a * std::cos(angle) - b * std::sin(angle), 1e-5) << t << " " << i;
      EXPECT_NEAR(Y[0][0][t][i + d / 2], b * std::cos(angle) + a * std::sin(angle), 1e-5);
    }
}

// RoFormer eq. 16: ⟨R_m q, R_n k⟩ depends on n − m only.
TEST(LlamaLayout, RotaryScoresDependOnRelativePosition) {
  const std::int64_t T = 12, d = 16;
  torch::manual_seed(2);
  const torch::Tensor q = torch::randn({d}), k = torch::randn({d});
  const auto [cos, sin] = rotary_tables(T, d, 10000, torch::kFloat);
  const torch::Tensor rq = apply_rotary(q.expand({1, 1, T, d}), cos, sin)[0][0];  // (T, d)
  const torch::Tensor rk = apply_rotary(k.expand({1, 1, T, d}), cos, sin)[0][0];
  for (std::int64_t shift : {1, 4}) {
    const double a = rq[2].dot(rk[5]).item<double>();
    const double b = rq[2 + shift].dot(rk[5 + shift]).item<double>();
    EXPECT_NEAR(a, b, 1e-4) << shift;
  }
  EXPECT_GT(std::fabs(rq[2].dot(rk[5]).item<double>() - rq[2].dot(rk[6]).item<double>()), 1e-3);
}

// The two autograd functions against autograd through their plain formulas, in float64: RMSNorm
// x/√(mean(x²) + ε)·w and rotary x·cos + rotate_half(x)·sin.
TEST(LlamaLayout, NormAndRotaryGradientsAreTheirFormulas) {
  const auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  torch::manual_seed(6);
  const torch::Tensor x0 = torch::randn({2, 5, 8}, f64), w0 = torch::randn({8}, f64);
  const torch::Tensor g = torch::randn({2, 5, 8}, f64);
  const torch::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
  const torch::Tensor y = rms_norm(x, w, 1e-5);
  y.backward(g);
  const torch::Tensor xr = x0.clone().requires_grad_(true), wr = w0.clone().requires_grad_(true);
  const torch::Tensor yr = xr / torch::sqrt(xr.pow(2).mean(-1, true) + 1e-5) * wr;
  yr.backward(g);
  EXPECT_TRUE(torch::allclose(y, yr, 1e-12, 1e-12));
  EXPECT_TRUE(torch::allclose(x.grad(), xr.grad(), 1e-10, 1e-12));
  EXPECT_TRUE(torch::allclose(w.grad(), wr.grad(), 1e-10, 1e-12));

  const auto [cos, sin] = rotary_tables(5, 8, 10000, torch::kDouble);
  const torch::Tensor q0 = torch::randn({1, 2, 5, 8}, f64), gq = torch::randn({1, 2, 5, 8}, f64);
  const torch::Tensor q = q0.clone().requires_grad_(true), qr = q0.clone().requires_grad_(true);
  apply_rotary(q, cos, sin).backward(gq);
  (qr * cos + torch::cat({-qr.narrow(-1, 4, 4), qr.narrow(-1, 0, 4)}, -1) * sin).backward(gq);
  EXPECT_TRUE(torch::allclose(q.grad(), qr.grad(), 1e-12, 1e-12));
}

// GQA: each key/value head serves a/a_kv consecutive query heads — the same as multi-head
// attention over k, v with every head copied to its group (built here by index); a tiled copy
// (head j serving j, j + a_kv, …) is another function.
TEST(LlamaLayout, GqaIsMultiHeadAttentionWithSharedKeyValueHeads) {
  const std::int64_t B = 2, T = 6, a = 4, kv = 2, d = 8;
  torch::manual_seed(3);
  const torch::Tensor q = torch::randn({B, T, a * d}), k = torch::randn({B, T, kv * d}),
                      v = torch::randn({B, T, kv * d});
  const torch::Tensor mask = causal_mask(T);
  const auto [cos, sin] = rotary_tables(T, d, 10000, torch::kFloat);
  const auto expand = [&](const torch::Tensor& t, const std::vector<std::int64_t>& heads) {
    std::vector<torch::Tensor> parts;
    for (std::int64_t h : heads) parts.push_back(t.narrow(2, h * d, d));
    return torch::cat(parts, 2);
  };
  const torch::Tensor gqa = llama_attention(q, k, v, a, kv, mask, cos, sin);
  const torch::Tensor mha = llama_attention(q, expand(k, {0, 0, 1, 1}), expand(v, {0, 0, 1, 1}),
                                            a, a, mask, cos, sin);
  EXPECT_TRUE(torch::allclose(gqa, mha, 1e-6, 1e-6));
  const torch::Tensor tiled = llama_attention(q, expand(k, {0, 1, 0, 1}), expand(v, {0, 1, 0, 1}),
                                              a, a, mask, cos, sin);
  EXPECT_FALSE(torch::allclose(gqa, tiled, 1e-3, 1e-3));
}

// ---- the LoRA model on the Llama layout ---------------------------------------------------------

// Before training the LoRA model is its backbone: with dense fp32 weights the Llama's loss; with
// NF4 close to it.
TEST(LoraLlama, ConvertedModelIsTheLlama) {
  Llama g = source();
  const auto b = batch(2, 32);
  double ref = 0;
  {
    torch::NoGradGuard no_grad;
    ref = g->forward(b.first, b.second).item<double>();
  }
  const LoraModel lora(g, {.lora = setup(FineTune::lora)});
  EXPECT_NEAR(loss_of(lora, b), ref, 1e-5);
  const LoraModel qlora(g, {.lora = setup(FineTune::qlora)});
  const double q = loss_of(qlora, b);
  EXPECT_TRUE(std::isfinite(q));
  EXPECT_NEAR(q, ref, 0.01 * ref);
  EXPECT_NE(q, ref);
}

// Every Hugging Face Llama target, gate included, named as PEFT names them; the module's counts and
// bytes are the ledger's for the same ModelSpec.
TEST(LoraLlama, AllSevenTargetsAndTheLedgersCounts) {
  const LoraModel m(source(), {.lora = all_targets(FineTune::qlora)});
  const auto named = m.named_adapters();
  ASSERT_EQ(named.size(), 2u * 7 * 2);
  EXPECT_EQ(named[8].first, "blocks.0.gate_proj.lora_A.weight");
  EXPECT_EQ(named[13].first, "blocks.0.down_proj.lora_B.weight");
  const auto b = batch(1, 16);
  m.forward(b.first, b.second, true).backward();
  for (const auto& [name, t] : named) EXPECT_TRUE(t.grad().defined()) << name;
  std::set<std::string> frozen;
  for (const auto& [name, t] : m.named_frozen()) {
    EXPECT_FALSE(t.requires_grad()) << name;
    frozen.insert(name);
  }
  for (const char* n : {"embed_tokens.weight", "blocks.1.input_layernorm.weight",
                        "blocks.0.gate_proj.weight.nf4", "norm.weight", "lm_head.weight"})
    EXPECT_TRUE(frozen.count(n)) << n;
  const FineTuneLedger f = finetune_ledger(llama_model_spec(tiny()), all_targets(FineTune::qlora));
  const LoraModel::Bytes by = m.bytes();
  EXPECT_EQ(double(by.trainable_params), f.trainable_params);
  EXPECT_EQ(double(by.quantized_params), f.quantized_params);
  EXPECT_EQ(double(by.frozen_params), f.frozen_params);
  EXPECT_EQ(by.quantized_weights, f.quantized_weight_bytes);
  EXPECT_EQ(by.frozen, f.frozen_bytes);  // embeddings, head and norms in fp32 (PEFT's upcast)
}

// The checkpointed Llama block (its replay reads the rotary tables the forward kept) gives the
// plain graph's loss and gradients, dropout masks included.
TEST(LoraLlama, CheckpointingGivesThePlainGraphsGradients) {
  const Llama g = source();
  const auto b = batch(2, 32);
  std::vector<torch::Tensor> grads[2];
  double loss[2] = {0, 0};
  for (int c = 0; c < 2; ++c) {
    torch::manual_seed(5);
    LoraSetup s = all_targets(FineTune::qlora);
    s.dropout = 0.1;
    const LoraModel m(g, {.lora = s, .checkpoint = c == 1});
    {
      torch::NoGradGuard no_grad;
      for (const auto& [name, t] : m.named_adapters())
        if (name.find("lora_B") != std::string::npos) t.normal_(0, 0.02);
    }
    auto l = m.forward(b.first, b.second, true);
    loss[c] = l.item<double>();
    l.backward();
    for (const auto& t : m.adapter_parameters()) grads[c].push_back(t.grad().clone());
  }
  EXPECT_EQ(loss[0], loss[1]);
  for (std::size_t i = 0; i < grads[0].size(); ++i)
    EXPECT_TRUE(torch::allclose(grads[0][i], grads[1][i], 1e-5, 1e-7)) << i;
}

// ---- bf16 compute -------------------------------------------------------------------------------

// Dequantizing into bf16 is core's fp32 value rounded to nearest even — torch's own fp32 → bf16
// cast of core's dequantization, bit for bit; the transient is 2 bytes per weight.
TEST(Bf16, DequantizedWeightIsCoresValueRounded) {
  torch::manual_seed(4);
  const torch::Tensor w = torch::randn({96, 70}) * 0.02;  // 105 blocks of 64, a ragged group
  for (bool dq : {true, false}) {
    const FrozenWeight f = FrozenWeight::make_nf4(w, 64, dq, 16);
    const torch::Tensor bf = f.weight(torch::kBFloat16);
    ASSERT_EQ(bf.scalar_type(), torch::kBFloat16);
    EXPECT_EQ(bf.nbytes(), 2u * 96 * 70);
    EXPECT_TRUE(torch::equal(bf, f.weight(torch::kFloat).to(torch::kBFloat16))) << dq;
  }
}

// Where the unquantized tensors live (Note [compute dtype]): qlora fp32 (PEFT's upcast) or, with
// upcast_unquantized = false, bf16; lora the whole backbone in bf16 — each the ledger's bytes.
TEST(Bf16, UnquantizedBytesAreTheLedgers) {
  const Llama g = source();
  LoraSetup kept_bf16 = setup(FineTune::qlora, Precision::bf16);
  kept_bf16.upcast_unquantized = false;
  for (const LoraSetup& s : {setup(FineTune::qlora, Precision::bf16), kept_bf16,
                             setup(FineTune::lora, Precision::bf16)}) {
    const LoraModel m(g, {.lora = s});
    const FineTuneLedger f = finetune_ledger(llama_model_spec(tiny()), s);
    const LoraModel::Bytes by = m.bytes();
    EXPECT_EQ(by.frozen, f.frozen_bytes) << to_string(s.method) << " " << s.upcast_unquantized;
    EXPECT_EQ(by.backbone() + by.adapters,
              f.backbone_bytes() + f.adapter_bytes + (s.method == FineTune::qlora ? 4.0 * 14 : 0));
    const double per = s.method == FineTune::qlora && s.upcast_unquantized ? 4.0 : 2.0;
    EXPECT_EQ(by.frozen, per * double(by.frozen_params));
  }
}

struct Grads {
  double loss = 0;
  std::vector<torch::Tensor> grads;
};

Grads step(const Llama& g, const LoraSetup& s) {
  torch::manual_seed(5);  // the same adapters in both dtypes
  const LoraModel m(g, {.lora = s});
  {
    torch::NoGradGuard no_grad;  // B ≠ 0, so every gradient flows through both factors
    for (const auto& [name, t] : m.named_adapters())
      if (name.find("lora_B") != std::string::npos) t.normal_(0, 0.02);
  }
  const auto b = batch(2, 32);
  const torch::Tensor loss = m.forward(b.first, b.second, true);
  EXPECT_EQ(loss.scalar_type(), torch::kFloat);
  loss.backward();
  Grads r{.loss = loss.item<double>()};
  for (const auto& t : m.adapter_parameters()) {
    EXPECT_EQ(t.scalar_type(), torch::kFloat);         // fp32 masters (PEFT)
    EXPECT_EQ(t.grad().scalar_type(), torch::kFloat);  // fp32 gradients
    r.grads.push_back(t.grad().clone());
  }
  return r;
}

// bf16 keeps 8 significant bits: each rounding moves a value by at most u = 2⁻⁸ of itself. At
// initialisation the loss (≈ ln V = 5.5) is fp32 arithmetic on logits of size ≈ 0.1, so rounding
// them moves it by far less than u·loss. Each adapter gradient is a product along a path of about
// 8 bf16 roundings per layer and direction (norm, projections, scores, softmax, values, MLP),
// 2 layers, forward and back: at worst 32 errors of u adding up, bounded here by 16u = 6.25 % of
// the gradient's norm (they are not all aligned). No dropout: the masks are drawn per dtype.
TEST(Bf16, LossAndGradientsAreFp32sWithinBf16Rounding) {
  const double u = std::ldexp(1.0, -8);
  const Llama g = source();
  for (FineTune method : {FineTune::qlora, FineTune::lora}) {
    LoraSetup s32 = all_targets(method);
    s32.dropout = 0;
    LoraSetup s16 = s32;
    s16.compute = Precision::bf16;
    const Grads a = step(g, s32), b = step(g, s16);
    EXPECT_LE(std::fabs(b.loss - a.loss) / a.loss, u) << to_string(method);
    EXPECT_NE(b.loss, a.loss);  // bf16 did run
    ASSERT_EQ(a.grads.size(), b.grads.size());
    for (std::size_t i = 0; i < a.grads.size(); ++i) {
      const double rel = ((b.grads[i] - a.grads[i]).norm() / a.grads[i].norm()).item<double>();
      EXPECT_LE(rel, 16 * u) << to_string(method) << " adapter tensor " << i;
      EXPECT_GT(rel, 0) << i;
    }
  }
}

// ---- the run ------------------------------------------------------------------------------------

QloraOptions tiny_run(FineTune method, Precision compute) {
  QloraOptions o;
  o.arch = Arch::llama;
  o.model = {.hidden = 64, .layers = 2, .heads = 4, .vocab = 256};
  o.kv_heads = 2;
  o.lora = setup(method, compute);
  o.seqs = {32, 64, 128};
  o.steps = 2;
  o.learn_steps = 30;
  o.learn_seq = 32;
  o.lr = 1e-2;
  return o;
}

// The seed's program as the seed runs it: Llama layout, NF4 + double quantization, bf16 compute.
// The ledger is asked for the same layout and dtype; the allocator after a step is its persistent
// items plus the 4-byte mean of each double-quantized matrix (2 layers × 7), the dequantized layer
// is 2 bytes per weight of the largest matrix (gate, up and down are 64 × 256).
TEST(QloraLlamaRun, Bf16QloraMeetsEveryCheckAndTheLedger) {
  const QloraResult r = run_qlora(tiny_run(FineTune::qlora, Precision::bf16));
  expect_every_check_ok(r);
  EXPECT_EQ(r.spec.mlp, MlpKind::swiglu);
  EXPECT_EQ(r.spec.kv_heads, 2);
  EXPECT_EQ(r.ledger.total_params, count_params(llama_model_spec(tiny())).total());
  EXPECT_EQ(r.quant.matrices, 2 * 7);
  EXPECT_EQ(r.quant.not_nearest, 0);
  EXPECT_EQ(r.quant.dequantized_module, "gate_proj");
  EXPECT_EQ(r.quant.dequantized_layer_bytes, 2.0 * 64 * 256);
  EXPECT_EQ(r.quant.dequantized_layer_bytes, r.ledger.dequant_transient_bytes);
  const double ledger_static = r.ledger.static_bytes() - r.ledger.dequant_transient_bytes;
  EXPECT_EQ(double(r.memory.after_step_bytes), ledger_static + 4.0 * 14);
  EXPECT_EQ(r.frozen_bytes, r.ledger.frozen_bytes);
  EXPECT_EQ(r.adapter_optimizer_bytes, 2 * 4.0 * double(r.trainable_params));  // fp32 m, v
  EXPECT_EQ(r.adapter_grad_bytes, 4.0 * double(r.trainable_params));           // fp32 grads
  for (std::size_t i = 1; i < r.runs.size(); ++i)
    EXPECT_GT(r.runs[i].peak_allocated_bytes, r.runs[i - 1].peak_allocated_bytes);
  EXPECT_GT(r.peak_fit.r_squared, 0.95);
  EXPECT_LT(r.learning.last5_mean, r.learning.first5_mean);
  EXPECT_EQ(r.learning.eval_loss_reloaded, r.learning.eval_loss_trained);
  EXPECT_EQ(r.teardown_allocated_bytes, 0);
}

// --method lora --precision bf16: the whole frozen backbone in bf16, 2 bytes per parameter.
TEST(QloraLlamaRun, Bf16LoraHoldsTheBackboneInBf16) {
  const QloraResult r = run_qlora(tiny_run(FineTune::lora, Precision::bf16));
  expect_every_check_ok(r);
  EXPECT_EQ(r.frozen_bytes, 2.0 * r.ledger.total_params);
  EXPECT_EQ(double(r.memory.after_step_bytes),
            r.ledger.static_bytes() - r.ledger.dequant_transient_bytes);
}

// ---- the command --------------------------------------------------------------------------------

tally::subprocess::Ran run_tally(const std::string& args) {
  std::vector<std::string> argv = {TALLY_BINARY};
  std::istringstream words(args);
  for (std::string w; words >> w;) argv.push_back(w);
  return tally::subprocess::run_command(argv, 120);
}

constexpr const char* kTiny =
    "run qlora --arch llama --hidden 64 --layers 2 --heads 4 --vocab 256 --seq 32,64,128 "
    "--steps 2 --learn-seq 32 --lr 0.01";

TEST(QloraLlamaCli, JsonCarriesLayoutAndPrecision) {
  const auto r = run_tally(std::string(kTiny) + " --kv-heads 2 --precision bf16 --json");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const auto j = nlohmann::json::parse(r.out);
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["arch"], "llama");
  EXPECT_EQ(j["precision"], "bf16");
  EXPECT_EQ(j["model"]["kv_heads"], 2);
  EXPECT_EQ(j["model"]["ffn"], 256);
  EXPECT_EQ(j["model"]["mlp"], "swiglu");
  EXPECT_EQ(j["model"]["position"], "rotary");
  const std::string conv = j["convention"];
  for (const char* s : {"compute bf16", "llama layout", "GQA 4 query / 2 key-value heads"})
    EXPECT_NE(conv.find(s), std::string::npos) << s << "\n" << conv;
  std::set<std::string> ids;
  for (const auto& c : j["criteria"]) {
    EXPECT_TRUE(c["ok"].get<bool>()) << c.dump();
    ids.insert(c["id"].get<std::string>());
  }
  for (const char* id : {"①", "②", "③", "④", "quant", "learn"}) EXPECT_TRUE(ids.count(id)) << id;
  EXPECT_EQ(j["quantization"]["dequantized_layer_bytes"], j["ledger"]["dequant_transient_bytes"]);
}

TEST(QloraLlamaCli, TextLabelsLayoutAndDtype) {
  const auto r = run_tally(std::string(kTiny) +
                           " --method lora --precision bf16 --lora-targets q,k,v,o,gate,up,down "
                           "--learn-steps 10");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (const char* s : {"arch llama | compute bf16", "frozen backbone (bf16)",
                        "frozen bf16 backbone", "sweep: 2 steps at each T, compute bf16",
                        "llama layout (RMSNorm, SwiGLU f 256, rotary, 4 heads"})
    EXPECT_NE(r.out.find(s), std::string::npos) << s << "\n" << r.out;
  EXPECT_EQ(r.out.find("FAILED"), std::string::npos) << r.out;
}

// One line on stderr naming the flag, its value and what is allowed; exit 2; nothing on stdout.
TEST(QloraLlamaCli, BadFlagsExit2) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"--arch mamba", {"--arch", "mamba", "gpt", "llama"}},
      {"--precision fp16", {"--precision", "fp16", "fp32", "bf16"}},
      {"--kv-heads 3", {"--kv-heads", "3", "divide --heads = 4"}},
      {"--ffn=-5", {"--ffn", "-5"}},
  };
  for (const auto& [bad, words] : cases) {
    const auto r = run_tally(std::string(kTiny) + " " + bad);
    EXPECT_EQ(r.exit_code, 2) << bad << "\n" << r.out << r.err;
    EXPECT_TRUE(r.out.empty()) << bad;
    for (const auto& w : words) EXPECT_NE(r.err.find(w), std::string::npos) << bad << ": " << r.err;
    EXPECT_LE(std::count(r.err.begin(), r.err.end(), '\n'), 1) << bad << ": " << r.err;
  }
  // An odd head dim (60 / 4 = 15) has no rotary pairs; GPT-2's layout has no GQA and no separate
  // MLP width: refused, not ignored.
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--arch llama --hidden 60 --heads 4",
            "--hidden = 60: over --heads = 4 gives head dim 15"},
           {"--hidden 64 --heads 4 --kv-heads 2", "--kv-heads applies to --arch llama"},
           {"--hidden 64 --heads 4 --ffn 128", "--ffn applies to --arch llama"}}) {
    const auto r = run_tally("run qlora --layers 2 --vocab 256 --seq 32,64,128 " + args);
    EXPECT_EQ(r.exit_code, 2) << args << "\n" << r.out << r.err;
    EXPECT_TRUE(r.out.empty()) << args;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << ": " << r.err;
  }
}

}  // namespace
}  // namespace tally::engine::exp_qlora_llama
