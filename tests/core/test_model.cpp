// Parameter counts against the published figures (sources in comments) and the presets.
#include "tally/core/model.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "tally/core/presets.hpp"
#include "tally/core/types.hpp"

namespace tally::test_model {
namespace {

double params_b(const char* preset) { return count_params(*model_preset(preset)).total() / 1e9; }

// Touvron et al. 2023 (Llama 2) Table 1 / HF model cards: 6.74B and 13.0B (rounded 13.02B).
TEST(Model, Llama2Counts) {
  EXPECT_NEAR(params_b("llama-2-7b"), 6.74, 0.005);
  EXPECT_NEAR(params_b("llama-2-13b"), 13.02, 0.01);
  EXPECT_NEAR(params_b("llama-2-70b"), 68.98, 0.05);
}
// Meta Llama 3 model card: 8.03B; 70.6B.
TEST(Model, Llama3Counts) {
  EXPECT_NEAR(params_b("llama-3-8b"), 8.03, 0.005);
  EXPECT_NEAR(params_b("llama-3-70b"), 70.55, 0.05);
  // Llama 3.1 405B model card / Dubey et al. 2024 Table 3: 405B (405.85B counted from config.json).
  EXPECT_NEAR(params_b("llama-3.1-405b"), 405.85, 0.05);
}
// The share torchao's FSDP float8 all-gather gathers in fp8 (Note [fp8 all-gather]): the layers'
// linears but the routed experts. Llama 3 8B by hand: 32 · (2·4096² + 2·4096·1024 + 3·4096·14336)
// = 6,979,321,856 of 8,030,261,248; Mixtral-8x7B (MixtralExact's terms): 32 layers of attention
// 2·4096² + 2·4096·1024 and the 4096 × 8 router, over its total — its experts stay bf16.
TEST(Model, Float8GatherShareIsTheNonExpertLinears) {
  EXPECT_DOUBLE_EQ(float8_gather_share(*model_preset("llama-3-8b")),
                   6979321856.0 / 8030261248.0);
  const double h = 4096, attention = 2 * h * h + 2 * h * 1024, router = 8 * h;
  const ModelSpec mixtral = *model_preset("mixtral-8x7b");
  EXPECT_NEAR(float8_gather_share(mixtral),
              32 * (attention + router) / count_params(mixtral).total(), 1e-15);
}
// Mistral 7B paper / model card: 7.24B.
TEST(Model, MistralCount) { EXPECT_NEAR(params_b("mistral-7b"), 7.24, 0.005); }
// Mixtral of Experts (Jiang et al. 2024): 46.7B total, 12.9B active per token.
TEST(Model, MixtralTotalAndActive) {
  const auto c = count_params(*model_preset("mixtral-8x7b"));
  EXPECT_NEAR(c.total() / 1e9, 46.7, 0.05);
  EXPECT_NEAR(c.active() / 1e9, 12.9, 0.05);
  EXPECT_LT(c.active(), c.total());
}
// Mixture-of-experts counts: each figure is written out by hand from the config.json numbers
// (cited on the preset), then checked against the published rounding.

// DeepSeek-V3 technical report (arXiv 2412.19437) §4.2: "DeepSeek-V3 comprises 671B total
// parameters, of which 37B are activated for each token"; the multi-token-prediction module is
// separate (README_WEIGHTS.md in deepseek-ai/DeepSeek-V3: main model 671B, "Activation parameters:
// 36.6B (including 0.9B for the output Head)", MTP 11.5B unique). 36.6B is active without the
// input embedding; with it, 37.55B, which would not round to 37B.
TEST(Model, DeepSeekV3TotalAndActive) {
  const double h = 7168, L = 61;
  const double mla = h * 1536 + 1536 * (128 * (128 + 64))  // q down, q up (nope + rope)
                     + h * (512 + 64)                        // kv down + shared rope key
                     + 512 * (128 * (128 + 128))             // kv up: k nope, v
                     + (128 * 128) * h;                      // o
  const double norms = 2 * h + 1536 + 512;  // block norms, q_a and kv_a norms
  const double expert = 3 * h * 2048, router = 256 * h + 256;  // + e_score_correction_bias
  const double dense_mlp = 3 * h * 18432;
  const double embed = 129280 * h;
  const double total = L * (mla + norms) + 3 * dense_mlp + 58 * (256 * expert + expert + router) +
                       h + 2 * embed;
  const double active_no_embed =
      L * (mla + norms) + 3 * dense_mlp + 58 * ((8 + 1) * expert + router) + h + embed;
  EXPECT_DOUBLE_EQ(total, 671026419200.0);  // the arithmetic above, evaluated by hand
  const auto c = count_params(*model_preset("deepseek-v3"));
  EXPECT_DOUBLE_EQ(c.total(), total);
  EXPECT_DOUBLE_EQ(c.active_without_embedding(), active_no_embed);
  EXPECT_DOUBLE_EQ(c.active(), active_no_embed + embed);
  EXPECT_EQ(std::round(c.total() / 1e9), 671);
  EXPECT_EQ(std::round(c.active_without_embedding() / 1e8), 366);  // 36.6B
  EXPECT_EQ(std::round(c.active_without_embedding() / 1e9), 37);
}

// DeepSeek-V3's multi-token-prediction module (Note [multi-token prediction], model.cpp), by hand
// from its weight file's layer 61 (README_WEIGHTS.md: enorm, hnorm, eh_proj, one transformer layer
// "identical to the Main Model hidden layers" — a MoE layer —, shared_head's norm; embedding and
// head shared): the layer's MLA, norms, 256 + 1 experts and router; the projection 2h × h; three
// norms of h. README_WEIGHTS.md says "11.5B unique parameters" and "Activation parameters: 1.5B
// (including 0.9B for the output Head)": both the layer's alone (11.508B; 0.585B + 0.927B head =
// 1.512B) — the projection's 2h² = 0.103B is not in them (with it 11.61B and 1.615B), though the
// file holds it and training updates it, so tally counts it.
TEST(Model, DeepSeekV3MultiTokenPrediction) {
  const double h = 7168;
  const double mla = h * 1536 + 1536 * (128 * (128 + 64)) + h * (512 + 64) +
                     512 * (128 * (128 + 128)) + (128 * 128) * h;
  const double block_norms = 2 * h + 1536 + 512;
  const double expert = 3 * h * 2048, router = 256 * h + 256;
  const double layer = mla + block_norms + 256 * expert + expert + router;
  const double layer_active = mla + block_norms + (8 + 1) * expert + router;
  const double proj = 2 * h * h, own_norms = 3 * h;
  ModelSpec m = *model_preset("deepseek-v3");
  const ParamCount main = count_params(m);
  m.mtp_layers = 1;
  const ParamCount c = count_params(m);
  EXPECT_DOUBLE_EQ(c.mtp, layer + proj + own_norms);
  EXPECT_DOUBLE_EQ(c.mtp_active, layer_active + proj + own_norms);
  EXPECT_DOUBLE_EQ(c.mtp_norms, block_norms + own_norms);
  EXPECT_NEAR(layer / 1e9, 11.5, 0.05);                       // README_WEIGHTS.md
  EXPECT_NEAR((layer_active + c.output_head) / 1e9, 1.5, 0.05);
  EXPECT_DOUBLE_EQ(c.main_model(), main.total());             // the 671B are untouched
  EXPECT_DOUBLE_EQ(c.total(), main.total() + c.mtp);
  EXPECT_DOUBLE_EQ(c.active(), main.active() + c.mtp_active);
  // EP shards the module's routed experts too.
  EXPECT_DOUBLE_EQ(c.routed_experts, main.routed_experts + 256 * expert);
  // Two modules, twice; more than the layers, a one-line error naming the field.
  m.mtp_layers = 2;
  EXPECT_DOUBLE_EQ(count_params(m).mtp, 2 * c.mtp);
  m.mtp_layers = 62;
  EXPECT_THROW(count_params(m), InvalidInput);
  m.mtp_layers = -1;
  EXPECT_THROW(count_params(m), InvalidInput);
}

// Qwen3 model cards (HF Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B): "30.5B in total and 3.3B
// activated", non-embedding 29.9B; "235B in total and 22B activated", non-embedding 234B. Qwen
// counts the embedding in the active figure (without it 3.0B, not 3.3B).
// Total and active by hand: per layer q, o (h × a·128), k, v (h × 4·128), q_norm and k_norm (128
// each), router h×128, two block norms; 128 SwiGLU experts of 3·h·f, 8 active; final norm; untied
// embeddings of V = 151936.
struct HandCount {
  double total, active, embeddings;
};
HandCount qwen3_moe_by_hand(double h, double L, double a, double f) {
  const double V = 151936, d = 128, expert = 3 * h * f;
  const double rest = 2 * h * (a * d) + 2 * h * (4 * d) + 2 * d + 128 * h + 2 * h;
  return {L * (rest + 128 * expert) + h + 2 * V * h, L * (rest + 8 * expert) + h + 2 * V * h,
          2 * V * h};
}
TEST(Model, Qwen3MoeTotalAndActive) {
  const HandCount small = qwen3_moe_by_hand(2048, 48, 32, 768);
  const auto c = count_params(*model_preset("qwen3-30b-a3b"));
  EXPECT_DOUBLE_EQ(c.total(), small.total);
  EXPECT_DOUBLE_EQ(c.active(), small.active);
  EXPECT_EQ(std::round(small.total / 1e8), 305);
  EXPECT_EQ(std::floor(small.active / 1e8), 33);  // 3.353B, which the card gives as 3.3B
  EXPECT_EQ(std::round((small.total - small.embeddings) / 1e8), 299);

  const HandCount big = qwen3_moe_by_hand(4096, 94, 64, 1536);
  const auto d = count_params(*model_preset("qwen3-235b-a22b"));
  EXPECT_DOUBLE_EQ(d.total(), big.total);
  EXPECT_DOUBLE_EQ(d.active(), big.active);
  EXPECT_EQ(std::round(big.total / 1e9), 235);
  EXPECT_EQ(std::round(big.active / 1e9), 22);
  EXPECT_EQ(std::round((big.total - big.embeddings) / 1e9), 234);
}

// OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (arXiv 2508.10925), Table 1, parameters per
// component — 120b: MLP 114.71B, attention 0.96B, embed + unembed 1.16B, active 5.13B, total
// 116.83B; 20b: 19.12B, 0.64B, 1.16B, 3.61B, 20.91B. The card's active figure leaves out the
// input embedding (with it, 5.71B and 4.19B).
TEST(Model, GptOssTotalAndActivePerComponent) {
  const double h = 2880, V = 201088;
  // q 64·64, k and v 8·64, o; biases on all four; a sink per head.
  const double attention = 2 * h * 4096 + 2 * h * 512 + (4096 + 512 + 512 + h) + 64;
  const double expert = 3 * h * 2880 + (2 * 2880 + h);  // gate_up, down + their biases
  struct Case {
    const char* preset;
    double L, E, mlp_b, attention_b, active_b, total_b;
  };
  for (const Case k : {Case{"gpt-oss-120b", 36, 128, 114.71, 0.96, 5.13, 116.83},
                       Case{"gpt-oss-20b", 24, 32, 19.12, 0.64, 3.61, 20.91}}) {
    const double router = h * k.E + k.E;
    const double mlp = k.L * (k.E * expert + router);
    const double norms = k.L * 2 * h + h;
    const double total = k.L * attention + mlp + norms + 2 * V * h;
    const double active = k.L * (attention + 4 * expert + router) + norms + V * h;
    const auto c = count_params(*model_preset(k.preset));
    EXPECT_DOUBLE_EQ(c.attention, k.L * attention) << k.preset;
    EXPECT_DOUBLE_EQ(c.mlp, mlp) << k.preset;
    EXPECT_DOUBLE_EQ(c.total(), total) << k.preset;
    EXPECT_DOUBLE_EQ(c.active_without_embedding(), active) << k.preset;
    EXPECT_EQ(std::round(c.mlp / 1e7), std::round(k.mlp_b * 100)) << k.preset;
    EXPECT_EQ(std::round(c.attention / 1e7), std::round(k.attention_b * 100)) << k.preset;
    EXPECT_EQ(std::round((c.embedding + c.output_head) / 1e7), 116) << k.preset;
    EXPECT_EQ(std::round(c.active_without_embedding() / 1e7), std::round(k.active_b * 100))
        << k.preset;
    EXPECT_EQ(std::round(c.total() / 1e7), std::round(k.total_b * 100)) << k.preset;
  }
}

// Mixtral-8x7B, exactly: 32 layers of GQA attention (4096² ×2 + 2·4096·1024), 8 SwiGLU experts of
// 3·4096·14336 and a 4096×8 router, 2 routed per token; 32000 × 4096 embeddings, untied.
TEST(Model, MixtralExact) {
  const double h = 4096, L = 32, expert = 3 * h * 14336, rest = 2 * h * h + 2 * h * 1024 + 8 * h + 2 * h;
  const auto c = count_params(*model_preset("mixtral-8x7b"));
  EXPECT_DOUBLE_EQ(c.total(), L * (rest + 8 * expert) + h + 2 * 32000 * h);
  EXPECT_DOUBLE_EQ(c.active(), L * (rest + 2 * expert) + h + 2 * 32000 * h);
}

TEST(Model, ValidateNamesMoeAndMlaFields) {
  struct Case {
    const char* preset;
    const char* field;  // the name the one-line message must carry
    void (*break_it)(ModelSpec&);
  };
  const Case cases[] = {
      {"deepseek-v3", "n_shared_experts", [](ModelSpec& m) { m.shared_experts = -1; }},
      {"deepseek-v3", "shared_expert_intermediate_size", [](ModelSpec& m) { m.shared_expert_ffn = 0; }},
      {"deepseek-v3", "first_k_dense_replace", [](ModelSpec& m) { m.dense_layers = 61; }},
      {"deepseek-v3", "intermediate_size", [](ModelSpec& m) { m.dense_ffn = 0; }},
      {"deepseek-v3", "q_lora_rank", [](ModelSpec& m) { m.q_lora_rank = 0; }},
      {"deepseek-v3", "kv_lora_rank", [](ModelSpec& m) { m.kv_lora_rank = -1; }},
      {"deepseek-v3", "qk_nope_head_dim", [](ModelSpec& m) { m.qk_nope_head_dim = 0; }},
      {"deepseek-v3", "qk_rope_head_dim", [](ModelSpec& m) { m.qk_rope_head_dim = 0; }},
      {"deepseek-v3", "v_head_dim", [](ModelSpec& m) { m.v_head_dim = 0; }},
      {"deepseek-v3", "num_key_value_heads", [](ModelSpec& m) { m.kv_heads = 8; }},
      {"deepseek-v3", "attention_bias", [](ModelSpec& m) { m.qk_norm = true; }},
      // A dense model has no shared experts, router bias or MLA ranks without kv_lora_rank.
      {"llama-2-7b", "n_shared_experts", [](ModelSpec& m) { m.shared_experts = 1; m.shared_expert_ffn = 11008; }},
      {"llama-2-7b", "first_k_dense_replace", [](ModelSpec& m) { m.dense_layers = 1; m.dense_ffn = 11008; }},
      {"llama-2-7b", "router_bias", [](ModelSpec& m) { m.router_bias = true; }},
      {"llama-2-7b", "q_lora_rank", [](ModelSpec& m) { m.q_lora_rank = 1536; }},
      {"qwen3-30b-a3b", "head_dim", [](ModelSpec& m) { m.attn_head_dim = -1; }},
  };
  for (const Case& c : cases) {
    ModelSpec m = *model_preset(c.preset);
    c.break_it(m);
    try {
      m.validate();
      ADD_FAILURE() << "accepted " << c.field;
    } catch (const InvalidInput& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(c.field), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
}
// MLA without q compression (DeepSeek-V2-Lite style): W_q h × a·(d_n + d_r), no q norm.
TEST(Model, MlaWithoutQCompression) {
  auto m = *model_preset("deepseek-v3");
  m.q_lora_rank.reset();
  const auto with = count_params(*model_preset("deepseek-v3"));
  const auto without = count_params(m);
  const double h = 7168, q_direct = h * 128 * 192, q_lora = h * 1536 + 1536 * 128 * 192;
  EXPECT_DOUBLE_EQ(with.attention - without.attention, 61 * (q_lora - q_direct));
  EXPECT_DOUBLE_EQ(with.norms - without.norms, 61 * 1536.0);
}

// Brown et al. 2020 Table 2.1: 175.0B.
TEST(Model, Gpt3Count) { EXPECT_NEAR(params_b("gpt3-175b"), 175.0, 0.5); }
// openai-community/gpt2: 124M (124,439,808 with tied embeddings).
TEST(Model, Gpt2SmallExact) {
  EXPECT_DOUBLE_EQ(count_params(*model_preset("gpt2-124m")).total(), 124439808.0);
}
// The seed's generic 7B uses N = 7e9 for its ledgers; its counted shape (12·h²·L + embeddings) is
// 6.71B, so the nominal figure is what the state ledger uses.
TEST(Model, SeedSevenBUsesNominalN) {
  const auto m = *model_preset("seed-7b");
  EXPECT_EQ(state_params(m), 7e9);
  EXPECT_NEAR(count_params(m).total() / 1e9, 6.71, 0.01);
  EXPECT_EQ(m.hidden, 4096);
  EXPECT_EQ(m.layers, 32);
  EXPECT_EQ(m.heads, 32);
}
TEST(Model, DenseActiveEqualsTotal) {
  for (const auto& n : model_preset_names()) {
    const auto c = count_params(*model_preset(n));
    if (!model_preset(n)->is_moe()) {
      EXPECT_DOUBLE_EQ(c.active(), c.total()) << n;
    }
  }
}
TEST(Model, ParamsOnly) {
  const auto m = model_from_params(parse_count("7B", "params"));
  EXPECT_EQ(state_params(m), 7e9);
  EXPECT_TRUE(m.params_only);
}
TEST(Model, ParseCount) {
  EXPECT_EQ(parse_count("7e9", "params"), 7e9);
  EXPECT_EQ(parse_count("7B", "params"), 7e9);
  EXPECT_EQ(parse_count("350M", "params"), 350e6);
  EXPECT_EQ(parse_count("1.5T", "params"), 1.5e12);
  EXPECT_EQ(parse_count("6.74b", "params"), 6.74e9);
  for (const char* bad : {"", "abc", "7X", "-7B", "0", "B", "7e9x", "inf", "nan"})
    EXPECT_THROW(parse_count(bad, "params"), InvalidInput) << bad;
}
TEST(Model, ValidateRejectsBadShapes) {
  auto m = *model_preset("llama-2-7b");
  m.kv_heads = 5;
  EXPECT_THROW(m.validate(), InvalidInput);
  m = *model_preset("llama-2-7b");
  m.hidden = 4097;
  EXPECT_THROW(m.validate(), InvalidInput);
  m = *model_preset("llama-2-7b");
  m.layers = 0;
  EXPECT_THROW(m.validate(), InvalidInput);
}
// Note [expert capacity]: Megatron-Core's get_capacity (moe_utils.py) is
// ceil(num_tokens · top_k / num_experts · capacity_factor), at least min_capacity = 1; by hand.
TEST(Model, ExpertCapacityRoundsUpTheBalancedShare) {
  EXPECT_EQ(expert_capacity(32, 2, 8, 1.0), 8);      // 32·2/8, exact
  EXPECT_EQ(expert_capacity(20, 2, 8, 1.1), 6);      // 5.5 → 6
  EXPECT_EQ(expert_capacity(32, 2, 8, 4.0), 32);     // c_f = E/k: every token fits (dropless)
  EXPECT_EQ(expert_capacity(4096, 8, 256, 1.0), 128);  // DeepSeek-V3 routing, one 4k sequence
  EXPECT_EQ(expert_capacity(1, 1, 64, 1.0), 1);      // 1/64 → at least one slot
  EXPECT_EQ(expert_capacity(0, 2, 8, 1.0), 1);
  EXPECT_THROW(expert_capacity(32, 9, 8, 1.0), InvalidInput);   // top-k > experts
  EXPECT_THROW(expert_capacity(32, 2, 8, 0.5), InvalidInput);   // below the balanced share
}

TEST(Model, UnknownPreset) { EXPECT_FALSE(model_preset("llama-9-1t").has_value()); }
TEST(Hardware, ClusterPresetsValidate) {
  for (const auto& n : cluster_preset_names()) {
    const auto c = cluster_preset(n);
    ASSERT_TRUE(c.has_value()) << n;
    EXPECT_NO_THROW(c->validate()) << n;
  }
  // nvidia-smi reports 81920 MiB on an A100-80GB: 80 GiB, i.e. 85.9 GB.
  EXPECT_DOUBLE_EQ(cluster_preset("a100-80g")->gpu.memory_bytes, 80 * kGiB);
}

}  // namespace
}  // namespace tally::test_model
