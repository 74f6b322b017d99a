// Parameter counts against the published figures (sources in comments) and the presets.
#include "tally/core/model.hpp"

#include <gtest/gtest.h>

#include "tally/core/presets.hpp"
#include "tally/core/types.hpp"

namespace tally {
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
// Mistral 7B paper / model card: 7.24B.
TEST(Model, MistralCount) { EXPECT_NEAR(params_b("mistral-7b"), 7.24, 0.005); }
// Mixtral of Experts (Jiang et al. 2024): 46.7B total, 12.9B active per token.
TEST(Model, MixtralTotalAndActive) {
  const auto c = count_params(*model_preset("mixtral-8x7b"));
  EXPECT_NEAR(c.total() / 1e9, 46.7, 0.05);
  EXPECT_NEAR(c.active() / 1e9, 12.9, 0.05);
  EXPECT_LT(c.active(), c.total());
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
}  // namespace tally
