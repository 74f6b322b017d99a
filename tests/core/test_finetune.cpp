// The LoRA / QLoRA ledger (core/finetune.hpp, Note [QLoRA ledger]) against the QLoRA paper's
// figures (Dettmers et al. 2023 §3) and the seed's QLoRA program (7B, NF4 + double quantization,
// r = 8 on q_proj and v_proj); every expected value is derived here from the architecture.
#include "tally/core/finetune.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tally/core/presets.hpp"

namespace tally::test_finetune {
namespace {

// Llama-2-7B (presets.cpp: h 4096, 32 layers, 32 heads, f 11008, V 32000, untied, RMSNorm).
const double h = 4096, f = 11008, L = 32, V = 32000;

// Seed criterion ① and ②: r = 8 on q and v gives 32 · 2 · 8 · (4096 + 4096) = 4,194,304 trainable
// parameters — 0.062 % of 6.74 B (< 0.2 %) — and with fp32 weights, gradients and Adam's m, v
// (16 bytes each) 0.067 GB, the seed's "≈ 0.08 GB".
TEST(FineTune, SeedAdaptersOnLlama2_7B) {
  const ModelSpec m = *model_preset("llama-2-7b");
  const FineTuneLedger r = finetune_ledger(m, LoraSetup{});
  EXPECT_EQ(r.trainable_params, 32.0 * 2 * 8 * (4096 + 4096));
  EXPECT_LT(r.trainable_fraction(), 0.002);
  EXPECT_NEAR(r.trainable_fraction(), 4194304.0 / 6738415616.0, 1e-12);  // Llama-2-7B's N
  EXPECT_DOUBLE_EQ(r.adapter_total_bytes(), 16.0 * 4194304);
  EXPECT_NEAR(r.adapter_total_bytes() / 1e9, 0.08, 0.015);
}

// QLoRA §3: NF4 with double quantization costs 8/64 + 32/(64·256) = 0.127 bits of constants per
// parameter, 0.5 without; the backbone is ≈ 0.5 N bytes plus what stays unquantized.
TEST(FineTune, Nf4BackboneAndDoubleQuantization) {
  const ModelSpec m = *model_preset("llama-2-7b");
  const FineTuneLedger dq = finetune_ledger(m, LoraSetup{});
  const FineTuneLedger no_dq = finetune_ledger(m, LoraSetup{.double_quant = false});
  // Quantized: the linear weights of the 32 layers, 4h² + 3hf each.
  const double q = L * (4 * h * h + 3 * h * f);
  EXPECT_EQ(dq.quantized_params, q);
  EXPECT_EQ(dq.quantized_weight_bytes, q / 2);
  // Every matrix here is a multiple of 64 · 256 elements, so the paper's ratios hold exactly.
  EXPECT_NEAR(dq.bits_per_quantized_param, 4 + 8.0 / 64 + 32.0 / (64 * 256), 1e-12);
  EXPECT_NEAR(no_dq.bits_per_quantized_param, 4.5, 1e-12);
  // Left unquantized: embedding and head (2 V h) and the norms (65 h), in fp32 after PEFT's
  // prepare_model_for_kbit_training; in bf16 without the upcast.
  const double rest = 2 * V * h + (2 * L + 1) * h;
  EXPECT_EQ(dq.frozen_params, rest);
  EXPECT_EQ(dq.frozen_bytes, 4 * rest);
  EXPECT_EQ(finetune_ledger(m, LoraSetup{.upcast_unquantized = false}).frozen_bytes, 2 * rest);
  // The seed's "0.5 N": the quantized weights alone are 0.5 bytes per quantized parameter; the
  // whole backbone with constants and the fp32 embedding and head is 0.69 N.
  const double N = dq.total_params;
  EXPECT_NEAR(dq.quantized_weight_bytes / q, 0.5, 1e-12);
  EXPECT_NEAR(dq.backbone_bytes() / N, (q * 4.127 / 8 + 4 * rest) / N, 1e-3);
  // The transient: the largest matrix (h × f), dequantized to bf16.
  EXPECT_EQ(dq.dequant_transient_bytes, 2 * h * f);
}

// LoRA keeps the frozen backbone in the compute dtype: 2 N bytes in bf16.
TEST(FineTune, LoraBackboneInComputeDtype) {
  const ModelSpec m = *model_preset("llama-2-7b");
  const FineTuneLedger r = finetune_ledger(m, LoraSetup{.method = FineTune::lora});
  EXPECT_EQ(r.frozen_bytes, 2 * r.total_params);
  EXPECT_EQ(r.quantized_params, 0);
  EXPECT_EQ(r.dequant_transient_bytes, 0);
  EXPECT_EQ(r.trainable_params, 32.0 * 2 * 8 * (4096 + 4096));
}

// Targets map onto each layout: all seven on Llama; GPT's GELU MLP has no gate; int8 keeps one
// fp32 scale per output row.
TEST(FineTune, TargetsAndInt8) {
  const ModelSpec m = *model_preset("llama-2-7b");
  const FineTuneLedger all = finetune_ledger(
      m, LoraSetup{.rank = 16,
                   .targets = {LoraTarget::q, LoraTarget::k, LoraTarget::v, LoraTarget::o,
                               LoraTarget::gate, LoraTarget::up, LoraTarget::down}});
  EXPECT_EQ(all.trainable_params, L * 16 * (4 * (h + h) + 3 * (h + f)));
  const ModelSpec gpt = *model_preset("gpt2-124m");
  try {
    (void)finetune_ledger(gpt, LoraSetup{.targets = {LoraTarget::gate}});
    ADD_FAILURE() << "gate accepted on a GELU MLP";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find("gate"), std::string::npos);
  }
  const FineTuneLedger i8 = finetune_ledger(m, LoraSetup{.quant = Quant::int8});
  EXPECT_EQ(i8.quantized_weight_bytes, L * (4 * h * h + 3 * h * f));
  EXPECT_EQ(i8.quant_constant_bytes, 4 * L * (4 * h + 2 * f + h));  // rows: q k v o, gate up, down
}

// MoE: the experts' matrices are quantized and adapted per expert; the router is quantized.
TEST(FineTune, MixtureOfExpertsPerExpert) {
  const ModelSpec m = *model_preset("mixtral-8x7b");
  const double mh = 4096, mf = 14336, kv = 1024, E = 8;
  const FineTuneLedger r =
      finetune_ledger(m, LoraSetup{.targets = {LoraTarget::q, LoraTarget::down}});
  EXPECT_EQ(r.trainable_params, 32.0 * 8 * ((mh + mh) + E * (mf + mh)));
  EXPECT_EQ(r.quantized_params, 32.0 * (2 * mh * mh + 2 * mh * kv + E * 3 * mh * mf + mh * E));
}

TEST(FineTune, BadInputIsRefused) {
  const ModelSpec m = *model_preset("llama-2-7b");
  EXPECT_THROW(finetune_ledger(m, LoraSetup{.rank = 0}), InvalidInput);
  EXPECT_THROW(finetune_ledger(m, LoraSetup{.alpha = std::nan("")}), InvalidInput);
  EXPECT_THROW(finetune_ledger(m, LoraSetup{.targets = {}}), InvalidInput);
  EXPECT_THROW(finetune_ledger(m, LoraSetup{.targets = {LoraTarget::q, LoraTarget::q}}),
               InvalidInput);
  EXPECT_THROW(finetune_ledger(m, LoraSetup{.method = FineTune::full}), InvalidInput);
  EXPECT_THROW(finetune_ledger(model_from_params(7e9), LoraSetup{}), InvalidInput);
  for (const char* s : {"full", "lora", "qlora"}) EXPECT_TRUE(parse_finetune(s).has_value());
  EXPECT_FALSE(parse_quant("nf5").has_value());
  EXPECT_EQ(parse_lora_target("down"), LoraTarget::down);
}


// Note [activation inventory], LoRA adapters, on the seed's program (Llama-2-7B, r = 8 on q_proj and
// v_proj, lora_dropout 0.05, bf16): per layer and token, q's and v's A outputs 2·(2·8) bytes, their
// dropped inputs 2·(2·4096) and the dropout masks 1·(2·4096). By hand at s = 512, b = 1:
// 512·(32 + 16384 + 8192) = 12,599,296 bytes more than the backbone's layer.
TEST(LoraActivations, SeedProgramKeepsTheAdaptersInputsRankOutputsAndMasks) {
  const ModelSpec m = *model_preset("llama-2-7b");
  const ActivationSetup base{.seq = 512, .micro_batch = 1, .dropout = false, .act_bytes = 2};
  LoraSetup s;  // the seed's defaults: qlora, r 8, α 16, dropout 0.05, targets q and v
  ActivationSetup with = base;
  add_lora_activations(m, s, with);
  EXPECT_DOUBLE_EQ(with.lora_input_width, 2 * 4096.0);
  EXPECT_DOUBLE_EQ(with.lora_rank_width, 16.0);
  EXPECT_TRUE(with.lora_dropout);
  EXPECT_DOUBLE_EQ(activations(m, with).per_layer_bytes - activations(m, base).per_layer_bytes,
                   512.0 * (32 + 16384 + 8192));
  // Without dropout A reads the base layer's input: only the rank-r outputs remain.
  s.dropout = 0;
  with = base;
  add_lora_activations(m, s, with);
  EXPECT_DOUBLE_EQ(activations(m, with).per_layer_bytes - activations(m, base).per_layer_bytes,
                   512.0 * 32);
  // Gradient checkpointing keeps the layer input only; the adapters' terms come back in the
  // replayed layer's transient.
  s.dropout = 0.05;
  ActivationSetup full = base;
  full.recompute = Recompute::full;
  ActivationSetup full_lora = full;
  add_lora_activations(m, s, full_lora);
  EXPECT_DOUBLE_EQ(activations(m, full_lora).per_layer_bytes, activations(m, full).per_layer_bytes);
  EXPECT_DOUBLE_EQ(activations(m, full_lora).recompute_transient_bytes -
                       activations(m, full).recompute_transient_bytes,
                   512.0 * (32 + 16384 + 8192));
  // A bad dropout is bad input, and the plans run without TP.
  s.dropout = 1;
  EXPECT_THROW(add_lora_activations(m, s, with), InvalidInput);
  ActivationSetup tp = base;
  tp.tp = 2;
  tp.lora_rank_width = 16;
  EXPECT_THROW(activations(m, tp), InvalidInput);
}

// An MoE expert's adapter sees each token once per routed choice: Qwen3-30B-A3B (128 experts, top 8,
// hidden 2048) with r = 4 on up_proj: Σd_in = 8·2048 per token, Σr = 8·4.
TEST(LoraActivations, ExpertAdaptersCountTheRoutedChoices) {
  const ModelSpec m = *model_preset("qwen3-30b-a3b");
  ASSERT_EQ(m.experts_per_token, 8);
  ASSERT_EQ(m.hidden, 2048);
  LoraSetup s{.method = FineTune::lora, .rank = 4, .targets = {LoraTarget::up}};
  ActivationSetup a{.seq = 128};
  add_lora_activations(m, s, a);
  EXPECT_DOUBLE_EQ(a.lora_input_width, 8 * 2048.0);
  EXPECT_DOUBLE_EQ(a.lora_rank_width, 8 * 4.0);
}

}  // namespace
}  // namespace tally::test_finetune
