// Hugging Face config.json reader: real-shaped fixtures against the core presets and the published
// totals, one test per class of malformed input, and a deterministic mutation sweep.
#include "tally/io/hf_config.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "io_test_util.hpp"
#include "tally/core/presets.hpp"

namespace tally::io::test_hf_config {
namespace {

using test::data_path;
using test::expect_invalid;
using test::fixture;
using test::replaced;

const char* const kSrc = "test/config.json";

ModelSpec parse(const std::string& text) { return parse_hf_config(text, kSrc); }

// Every item of the count, not only the total: the file and the preset must describe one model.
void expect_same_count(const ModelSpec& loaded, const char* preset) {
  const ParamCount a = count_params(loaded);
  const ParamCount b = count_params(*model_preset(preset));
  EXPECT_EQ(a.embedding, b.embedding) << preset;
  EXPECT_EQ(a.attention, b.attention) << preset;
  EXPECT_EQ(a.mlp, b.mlp) << preset;
  EXPECT_EQ(a.mlp_active, b.mlp_active) << preset;
  EXPECT_EQ(a.norms, b.norms) << preset;
  EXPECT_EQ(a.output_head, b.output_head) << preset;
}

// ---- fixtures written from the published config.json files --------------------------------------

// meta-llama/Llama-2-7b-hf config.json; Touvron et al. 2023, Table 1: 6.74B.
TEST(HfConfig, Llama2_7b) {
  const ModelSpec m = load_hf_config(data_path("llama-2-7b.json"));
  expect_same_count(m, "llama-2-7b");
  EXPECT_NEAR(count_params(m).total() / 1e9, 6.74, 0.005);
  EXPECT_EQ(m.name, "llama");
  EXPECT_EQ(m.mlp, MlpKind::swiglu);
  EXPECT_EQ(m.norm, NormKind::rmsnorm);
  EXPECT_EQ(m.position, PositionKind::rotary);
  EXPECT_FALSE(m.linear_bias);
  EXPECT_FALSE(m.tied_embeddings);
}

// meta-llama/Meta-Llama-3-8B config.json (GQA, 8 KV heads); model card: 8.03B.
TEST(HfConfig, Llama3_8b) {
  const ModelSpec m = load_hf_config(data_path("llama-3-8b.json"));
  expect_same_count(m, "llama-3-8b");
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_NEAR(count_params(m).total() / 1e9, 8.03, 0.005);
}

// mistralai/Mistral-7B-v0.1 config.json; Jiang et al. 2023: 7.24B.
TEST(HfConfig, Mistral7b) {
  const ModelSpec m = load_hf_config(data_path("mistral-7b.json"));
  expect_same_count(m, "mistral-7b");
  EXPECT_NEAR(count_params(m).total() / 1e9, 7.24, 0.005);
}

// mistralai/Mixtral-8x7B-v0.1 config.json; Jiang et al. 2024: 46.7B total, 12.9B active.
TEST(HfConfig, Mixtral8x7b) {
  const ModelSpec m = load_hf_config(data_path("mixtral-8x7b.json"));
  expect_same_count(m, "mixtral-8x7b");
  EXPECT_EQ(m.experts, 8);
  EXPECT_EQ(m.experts_per_token, 2);
  EXPECT_NEAR(count_params(m).total() / 1e9, 46.7, 0.05);
  EXPECT_NEAR(count_params(m).active() / 1e9, 12.9, 0.05);
}

// The MoE fixtures are the published config.json files trimmed to the keys that shape the model
// (tokens, rope scaling, quantization and layer_types left out). Counts: tests/core/test_model.cpp
// derives each by hand; here the file must describe the same model as the preset, item by item.

// deepseek-ai/DeepSeek-V3 config.json (HF): MLA, 1 shared + 256 routed experts, 3 dense layers;
// technical report §4.2: 671B total, 37B activated (36.6B without the input embedding).
TEST(HfConfig, DeepSeekV3) {
  const ModelSpec m = load_hf_config(data_path("deepseek-v3.json"));
  expect_same_count(m, "deepseek-v3");
  EXPECT_EQ(m.name, "deepseek_v3");
  EXPECT_EQ(m.experts, 256);
  EXPECT_EQ(m.experts_per_token, 8);
  EXPECT_EQ(m.ffn, 2048);
  EXPECT_EQ(m.shared_experts, 1);
  EXPECT_EQ(m.shared_expert_ffn, 2048);
  EXPECT_EQ(m.dense_layers, 3);
  EXPECT_EQ(m.dense_ffn, 18432);
  EXPECT_TRUE(m.router_bias);
  EXPECT_EQ(m.q_lora_rank, 1536);
  EXPECT_EQ(m.kv_lora_rank, 512);
  EXPECT_EQ(m.qk_nope_head_dim, 128);
  EXPECT_EQ(m.qk_rope_head_dim, 64);
  EXPECT_EQ(m.v_head_dim, 128);
  const ParamCount c = count_params(m);
  EXPECT_EQ(std::round(c.total() / 1e9), 671);
  EXPECT_EQ(std::round(c.active_without_embedding() / 1e9), 37);
}

// Qwen/Qwen3-30B-A3B and Qwen/Qwen3-235B-A22B config.json (HF): head_dim 128 ≠ h / a, q/k norms;
// model cards: 30.5B / 3.3B activated, 235B / 22B activated.
TEST(HfConfig, Qwen3Moe) {
  const ModelSpec small = load_hf_config(data_path("qwen3-30b-a3b.json"));
  expect_same_count(small, "qwen3-30b-a3b");
  EXPECT_EQ(small.head_dim(), 128);
  EXPECT_TRUE(small.qk_norm);
  EXPECT_EQ(small.ffn, 768);
  EXPECT_EQ(std::round(count_params(small).total() / 1e8), 305);
  const ModelSpec big = load_hf_config(data_path("qwen3-235b-a22b.json"));
  expect_same_count(big, "qwen3-235b-a22b");
  EXPECT_EQ(std::round(count_params(big).total() / 1e9), 235);
  EXPECT_EQ(std::round(count_params(big).active() / 1e9), 22);
}

// openai/gpt-oss-120b and openai/gpt-oss-20b config.json (HF); gpt-oss model card Table 1:
// 116.83B total / 5.13B active, 20.91B / 3.61B.
TEST(HfConfig, GptOss) {
  const ModelSpec big = load_hf_config(data_path("gpt-oss-120b.json"));
  expect_same_count(big, "gpt-oss-120b");
  EXPECT_TRUE(big.attention_sinks && big.expert_bias && big.router_bias && big.linear_bias);
  EXPECT_EQ(big.head_dim(), 64);
  EXPECT_EQ(std::round(count_params(big).total() / 1e7), 11683);
  EXPECT_EQ(std::round(count_params(big).active_without_embedding() / 1e7), 513);
  const ModelSpec small = load_hf_config(data_path("gpt-oss-20b.json"));
  expect_same_count(small, "gpt-oss-20b");
  EXPECT_EQ(std::round(count_params(small).total() / 1e7), 2091);
  EXPECT_EQ(std::round(count_params(small).active_without_embedding() / 1e7), 361);
  // attention_bias false drops the q, k, v, o biases (4096 + 512 + 512 + 2880 per layer) only.
  const auto unbiased = parse(replaced(fixture("gpt-oss-20b.json"), "\"attention_bias\": true",
                                       "\"attention_bias\": false"));
  EXPECT_EQ(count_params(small).attention - count_params(unbiased).attention, 24.0 * 8000);
  EXPECT_EQ(count_params(small).mlp, count_params(unbiased).mlp);
}

// Note [sliding window]: GPT-OSS windows every other layer by 128 tokens (GptOssConfig's default
// layer_types, sliding first; the file may spell them), Mistral 7B v0.1 every layer by 4096;
// Mixtral's null, and Qwen2's unused window (use_sliding_window false), are none. layer_types must
// name L layers of the two kinds.
TEST(HfConfig, SlidingWindow) {
  const ModelSpec big = load_hf_config(data_path("gpt-oss-120b.json"));
  EXPECT_EQ(big.attention_window, 128);
  EXPECT_EQ(big.window_layers, 18);
  EXPECT_EQ(big.window_layers, model_preset("gpt-oss-120b")->window_layers);
  std::string types = "\"layer_types\": [";
  for (int i = 0; i < 36; ++i)
    types += std::string(i ? ", " : "") +
             (i < 30 ? "\"sliding_attention\"" : "\"full_attention\"");
  types += "], \"sliding_window\": 128";
  const std::string gpt_oss = fixture("gpt-oss-120b.json");
  EXPECT_EQ(parse(replaced(gpt_oss, "\"sliding_window\": 128", types)).window_layers, 30);
  const ModelSpec mistral = load_hf_config(data_path("mistral-7b.json"));
  EXPECT_EQ(mistral.attention_window, 4096);
  EXPECT_EQ(mistral.window_layers, 32);
  EXPECT_EQ(load_hf_config(data_path("mixtral-8x7b.json")).window_layers, 0);
  const std::string unused = replaced(fixture("mistral-7b.json"), "\"sliding_window\": 4096",
                                      "\"sliding_window\": 4096, \"use_sliding_window\": false");
  EXPECT_EQ(parse(unused).attention_window, 0);
  const std::string from_layer = replaced(fixture("mistral-7b.json"), "\"sliding_window\": 4096",
                                          "\"sliding_window\": 4096, \"max_window_layers\": 28");
  EXPECT_EQ(parse(from_layer).window_layers, 4);
  // layer_types must list the L layers, each of the two kinds.
  const auto with_types = [&](const std::string& list) {
    return replaced(gpt_oss, "\"sliding_window\": 128",
                    "\"sliding_window\": 128, \"layer_types\": [" + list + "]");
  };
  expect_invalid([&] { parse(with_types("\"full_attention\"")); }, {"layer_types", "36"});
  std::string local = "\"local\"";
  for (int i = 1; i < 36; ++i) local += ", \"local\"";
  expect_invalid([&] { parse(with_types(local)); }, {"layer_types", "sliding_attention"});
}

// Note [GPT-OSS kernels] (core/operators.hpp): GPT-OSS's YaRN attention factor (rope_scaling's
// attention_factor, else HF's get_mscale 0.1·ln(factor) + 1) and swiglu_limit (GptOssConfig's
// default 7.0), which decide Megatron-Core's kernels; the preset carries the same.
TEST(HfConfig, GptOssYarnAndClamp) {
  const ModelSpec m = load_hf_config(data_path("gpt-oss-120b.json"));
  EXPECT_NEAR(m.rotary_attention_scale, 0.1 * std::log(32.0) + 1.0, 1e-12);
  EXPECT_EQ(m.glu_clamp, 7.0);
  EXPECT_EQ(m.rotary_attention_scale, model_preset("gpt-oss-120b")->rotary_attention_scale);
  EXPECT_EQ(m.glu_clamp, model_preset("gpt-oss-120b")->glu_clamp);
  const std::string text = fixture("gpt-oss-120b.json");
  const std::string yarn = "\"rope_type\": \"yarn\"";
  const std::string given = yarn + ", \"attention_factor\": 1.0";
  EXPECT_EQ(parse(replaced(text, yarn, given)).rotary_attention_scale, 1.0);
  EXPECT_EQ(parse(replaced(text, yarn, "\"type\": \"yarn\"")).rotary_attention_scale,
            m.rotary_attention_scale);  // the older key
  EXPECT_EQ(parse(replaced(text, yarn, "\"rope_type\": \"linear\"")).rotary_attention_scale,
            1.0);
  EXPECT_EQ(parse(replaced(text, "\"swiglu_limit\": 7.0", "\"swiglu_limit\": 10.0")).glu_clamp,
            10.0);
  EXPECT_EQ(parse(replaced(text, "\"swiglu_limit\": 7.0,", "")).glu_clamp, 7.0);
  expect_invalid([&] { parse(replaced(text, "\"swiglu_limit\": 7.0", "\"swiglu_limit\": -1")); },
                 {"swiglu_limit"});
  expect_invalid([&] { parse(replaced(text, yarn, yarn + ", \"attention_factor\": 0")); },
                 {"attention_factor"});
  // Other families keep 1 and 0.
  const ModelSpec llama = load_hf_config(data_path("mistral-7b.json"));
  EXPECT_EQ(llama.rotary_attention_scale, 1.0);
  EXPECT_EQ(llama.glu_clamp, 0.0);
}

// MLA without q compression: q_lora_rank null (DeepSeek-V2-Lite's config states it so).
TEST(HfConfig, MlaQLoraRankNull) {
  const auto text = replaced(fixture("deepseek-v3.json"), "\"q_lora_rank\": 1536", "\"q_lora_rank\": null");
  const ModelSpec m = parse(text);
  EXPECT_FALSE(m.q_lora_rank.has_value());
  EXPECT_EQ(m.kv_lora_rank, 512);
}

// openai-community/gpt2 config.json (GPT-2 key names, no n_inner): 124,439,808 parameters.
TEST(HfConfig, Gpt2Small) {
  const ModelSpec m = load_hf_config(data_path("gpt2.json"));
  expect_same_count(m, "gpt2-124m");
  EXPECT_EQ(count_params(m).total(), 124439808.0);
  EXPECT_EQ(m.ffn, 4 * 768);
  EXPECT_EQ(m.max_positions, 1024);
  EXPECT_EQ(m.position, PositionKind::learned);
  EXPECT_EQ(m.norm, NormKind::layernorm);
  EXPECT_EQ(m.mlp, MlpKind::gelu);
  EXPECT_TRUE(m.linear_bias);
  EXPECT_TRUE(m.tied_embeddings);
}

TEST(HfConfig, Gpt2NullInnerMeansFourH) {
  const auto text = replaced(fixture("gpt2.json"), "\"n_head\": 12,", "\"n_head\": 12, \"n_inner\": null,");
  EXPECT_EQ(parse(text).ffn, 3072);
}

TEST(HfConfig, Defaults) {
  const ModelSpec m = parse(R"({"hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
                                "intermediate_size": 512, "vocab_size": 1000})");
  EXPECT_EQ(m.kv_heads, 4);             // num_key_value_heads defaults to the head count
  EXPECT_FALSE(m.tied_embeddings);
  EXPECT_EQ(m.mlp, MlpKind::swiglu);    // LlamaConfig's default hidden_act is silu
  EXPECT_EQ(m.name, "config");          // no model_type: the file's stem
}

TEST(HfConfig, GeluActivationIsPlainMlp) {
  const auto text = replaced(fixture("llama-2-7b.json"), "\"silu\"", "\"gelu_pytorch_tanh\"");
  EXPECT_EQ(parse(text).mlp, MlpKind::gelu);
}

TEST(HfConfig, GptNeoxIsLayerNormWithBiases) {
  const ModelSpec m = parse(R"({"model_type": "gpt_neox", "hidden_size": 512, "num_hidden_layers": 6,
      "num_attention_heads": 8, "intermediate_size": 2048, "vocab_size": 50304, "hidden_act": "gelu"})");
  EXPECT_EQ(m.norm, NormKind::layernorm);
  EXPECT_TRUE(m.linear_bias);
  EXPECT_EQ(m.position, PositionKind::rotary);
  EXPECT_EQ(m.mlp, MlpKind::gelu);
}

// ---- hostile input: one test per class (DESIGN.md §5) ---------------------------------------------

TEST(HfConfigBad, FileTooLarge) {
  const std::string big = "{" + std::string(kMaxJsonFileBytes, ' ') + "}";
  const auto path = test::temp_file("hf_too_large.json", big);
  expect_invalid([&] { load_hf_config(path); }, {path.string(), "4 MiB"});
  expect_invalid([&] { parse(big); }, {kSrc, "4 MiB"});
}

TEST(HfConfigBad, MissingFileAndDirectory) {
  expect_invalid([] { load_hf_config(data_path("no-such-file.json")); }, {"no-such-file.json"});
  expect_invalid([] { load_hf_config(data_path("")); }, {"not a regular file"});
}

TEST(HfConfigBad, NotJson) {
  expect_invalid([] { parse("hidden_size = 4096"); }, {kSrc, "not valid JSON"});
  expect_invalid([] { parse(""); }, {kSrc, "not valid JSON"});
  expect_invalid([] { parse(R"({"hidden_size": 4096,})"); }, {kSrc, "not valid JSON"});
}

TEST(HfConfigBad, NotAnObject) {
  expect_invalid([] { parse("[1, 2, 3]"); }, {kSrc, "an array", "must be a JSON object"});
  expect_invalid([] { parse("\"llama\""); }, {kSrc, "a string"});
  expect_invalid([] { parse("4096"); }, {kSrc, "a number"});
  expect_invalid([] { parse("null"); }, {kSrc, "null"});
}

TEST(HfConfigBad, MissingRequiredField) {
  const auto text = replaced(fixture("llama-2-7b.json"), "\"hidden_size\": 4096,", "");
  expect_invalid([&] { parse(text); }, {kSrc, "hidden_size missing", "[1, 1048576]"});
}

TEST(HfConfigBad, StringWhereIntegerExpected) {
  const auto text = replaced(fixture("llama-2-7b.json"), "\"hidden_size\": 4096", "\"hidden_size\": \"4096\"");
  expect_invalid([&] { parse(text); },
                 {kSrc, "hidden_size = \"4096\"", "must be an integer in [1, 1048576]", "a string"});
}

TEST(HfConfigBad, FractionalInteger) {
  const auto text = replaced(fixture("llama-2-7b.json"), "\"hidden_size\": 4096", "\"hidden_size\": 4096.5");
  expect_invalid([&] { parse(text); }, {kSrc, "hidden_size = 4096.5", "must be an integer"});
  // An integral float is the integer it spells.
  const auto whole = replaced(fixture("llama-2-7b.json"), "\"hidden_size\": 4096", "\"hidden_size\": 4096.0");
  EXPECT_EQ(parse(whole).hidden, 4096);
}

TEST(HfConfigBad, Negative) {
  const auto text = replaced(fixture("llama-2-7b.json"), "\"num_hidden_layers\": 32", "\"num_hidden_layers\": -32");
  expect_invalid([&] { parse(text); }, {kSrc, "num_hidden_layers = -32", "[1, 16384]"});
}

TEST(HfConfigBad, Zero) {
  const auto text = replaced(fixture("llama-2-7b.json"), "\"vocab_size\": 32000", "\"vocab_size\": 0");
  expect_invalid([&] { parse(text); }, {kSrc, "vocab_size = 0", "[1, 16777216]"});
}

TEST(HfConfigBad, BeyondInt32AndInt64) {
  const auto big = replaced(fixture("llama-2-7b.json"), "\"intermediate_size\": 11008",
                            "\"intermediate_size\": 2147483648");
  expect_invalid([&] { parse(big); }, {kSrc, "intermediate_size = 2147483648", "[1, 16777216]"});
  const auto huge = replaced(fixture("llama-2-7b.json"), "\"intermediate_size\": 11008",
                             "\"intermediate_size\": 18446744073709551615");
  expect_invalid([&] { parse(huge); }, {kSrc, "intermediate_size = 18446744073709551615"});
  const auto beyond = replaced(fixture("llama-2-7b.json"), "\"intermediate_size\": 11008",
                               "\"intermediate_size\": 1e400");
  expect_invalid([&] { parse(beyond); }, {kSrc});
}

TEST(HfConfigBad, Boolean) {
  const auto text = replaced(fixture("llama-2-7b.json"), "\"num_attention_heads\": 32",
                             "\"num_attention_heads\": true");
  expect_invalid([&] { parse(text); }, {kSrc, "num_attention_heads = true", "a boolean"});
  const auto tie = replaced(fixture("llama-2-7b.json"), "\"tie_word_embeddings\": false",
                            "\"tie_word_embeddings\": 0");
  expect_invalid([&] { parse(tie); }, {kSrc, "tie_word_embeddings = 0", "true or false"});
}

TEST(HfConfigBad, AbsurdSize) {
  const auto text = replaced(fixture("llama-2-7b.json"), "\"hidden_size\": 4096", "\"hidden_size\": 1e12");
  expect_invalid([&] { parse(text); }, {kSrc, "hidden_size = 1000000000000", "[1, 1048576]"});
}

TEST(HfConfigBad, ArchitectureInconsistent) {  // ModelSpec::validate, prefixed with the file
  const auto text = replaced(fixture("llama-3-8b.json"), "\"num_key_value_heads\": 8",
                             "\"num_key_value_heads\": 5");
  expect_invalid([&] { parse(text); }, {kSrc, "num_key_value_heads = 5", "divide"});
  // A stated head_dim other than h / a (Mistral-Nemo, Qwen3) shapes q, k, v and o.
  const auto head_dim = replaced(fixture("llama-3-8b.json"), "\"hidden_act\"", "\"head_dim\": 256, \"hidden_act\"");
  EXPECT_EQ(parse(head_dim).head_dim(), 256);
}

TEST(HfConfigBad, UnsupportedModelTypeAndActivation) {
  const auto type = replaced(fixture("llama-2-7b.json"), "\"llama\"", "\"gemma\"");
  expect_invalid([&] { parse(type); }, {kSrc, "model_type = \"gemma\"", "llama", "--params"});
  const auto act = replaced(fixture("llama-2-7b.json"), "\"silu\"", "\"tanh\"");
  expect_invalid([&] { parse(act); }, {kSrc, "hidden_act = \"tanh\"", "silu"});
}

TEST(HfConfigBad, MoeFields) {
  const auto too_many = replaced(fixture("mixtral-8x7b.json"), "\"num_experts_per_tok\": 2",
                                 "\"num_experts_per_tok\": 9");
  expect_invalid([&] { parse(too_many); }, {kSrc, "num_experts_per_tok = 9", "[1, 8]"});
  const auto missing = replaced(fixture("mixtral-8x7b.json"), "\"num_experts_per_tok\": 2,", "");
  expect_invalid([&] { parse(missing); }, {kSrc, "num_experts_per_tok missing"});
  const auto shared = replaced(fixture("mixtral-8x7b.json"), "\"num_local_experts\": 8",
                               "\"num_local_experts\": 8, \"n_shared_experts\": 2");
  expect_invalid([&] { parse(shared); }, {kSrc, "moe_intermediate_size missing"});
  const std::string ds = fixture("deepseek-v3.json");
  const auto all_dense = replaced(ds, "\"first_k_dense_replace\": 3", "\"first_k_dense_replace\": 61");
  expect_invalid([&] { parse(all_dense); }, {kSrc, "first_k_dense_replace = 61", "[0, num_hidden_layers"});
  const auto freq = replaced(ds, "\"moe_layer_freq\": 1", "\"moe_layer_freq\": 2");
  expect_invalid([&] { parse(freq); }, {kSrc, "moe_layer_freq", "only 1"});
  const auto rank = replaced(ds, "\"kv_lora_rank\": 512", "\"kv_lora_rank\": 0");
  expect_invalid([&] { parse(rank); }, {kSrc, "kv_lora_rank"});
  const auto v_dim = replaced(ds, "\"v_head_dim\": 128,", "");
  expect_invalid([&] { parse(v_dim); }, {kSrc, "v_head_dim missing"});
  const auto bias = replaced(ds, "\"attention_bias\": false", "\"attention_bias\": true");
  expect_invalid([&] { parse(bias); }, {kSrc, "attention_bias", "MLA"});
  const auto only = replaced(fixture("qwen3-30b-a3b.json"), "\"mlp_only_layers\": []",
                             "\"mlp_only_layers\": [5]");
  expect_invalid([&] { parse(only); }, {kSrc, "mlp_only_layers", "not modelled"});
}

TEST(HfConfigBad, DuplicateKeyAndDeepNesting) {
  const auto dup = replaced(fixture("llama-2-7b.json"), "\"hidden_size\": 4096",
                            "\"hidden_size\": 4096, \"hidden_size\": 1");
  expect_invalid([&] { parse(dup); }, {kSrc, "\"hidden_size\"", "once"});
  const std::string deep = "{\"a\": " + std::string(100000, '[') + std::string(100000, ']') + "}";
  expect_invalid([&] { parse(deep); }, {kSrc, "nesting depth", "64"});
}

TEST(HfConfigBad, MessagesArePrintableAscii) {
  const std::string text = "{\"model_type\": \"\xc3\xa9\xe2\x80\x8b\", \"x\": \"\xff\"}";
  const std::string msg = test::invalid_input_message([&] { parse(text); });
  for (const unsigned char c : msg) EXPECT_TRUE(c >= 0x20 && c < 0x7f) << msg;
}

// ---- robustness: mutations of a valid file ---------------------------------------------------------

// 2,000 deterministic mutations (truncation, byte flips, inserted and deleted characters) of a valid
// config.json: each must parse to a ModelSpec that validates, or throw InvalidInput with a one-line
// message — nothing else. The unmutated file still reads as the published Mixtral 8x7B shape.
// tests/fuzz/fuzz_hf_config.cpp explores further.
TEST(HfConfigFuzz, MutationsParseOrThrowInvalidInput) {
  const std::string base = fixture("mixtral-8x7b.json");
  std::mt19937_64 rng(20240501);  // fixed seed; mt19937_64's sequence is fixed by the standard
  auto below = [&](std::size_t n) { return n == 0 ? 0 : static_cast<std::size_t>(rng() % n); };
  const std::string inserts = std::string("{}[]\",:-+.eE0123456789 \\/tfnul\x7f\xff\xc3") + '\0';
  int parsed = 0, rejected = 0;
  for (int i = 0; i < 2000; ++i) {
    std::string t = base;
    const int edits = 1 + int(below(3));
    for (int e = 0; e < edits; ++e) {
      switch (below(5)) {
        case 0: t.resize(below(t.size() + 1)); break;                             // truncate
        case 1: if (!t.empty()) t[below(t.size())] ^= char(1 + below(255)); break;  // flip
        case 2: t.insert(below(t.size() + 1), 1, inserts[below(inserts.size())]); break;
        case 3: if (!t.empty()) t.erase(below(t.size()), 1 + below(8)); break;      // delete
        default: {                                                                  // digit swap
          const auto at = t.find_first_of("0123456789", below(t.size() + 1));
          if (at != std::string::npos) t[at] = char('0' + below(10));
        }
      }
    }
    try {
      const ModelSpec m = parse_hf_config(t, "mutation");
      m.validate();
      EXPECT_GT(count_params(m).total(), 0);
      ++parsed;
    } catch (const InvalidInput& e) {
      const std::string msg = e.what();
      EXPECT_TRUE(!msg.empty() && msg.find('\n') == std::string::npos)
          << "mutation " << i << ": not one line: " << msg;
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "mutation " << i << " threw a non-InvalidInput exception: " << e.what();
    } catch (...) {
      ADD_FAILURE() << "mutation " << i << " threw a non-std exception";
    }
  }
  EXPECT_EQ(parsed + rejected, 2000);
  EXPECT_GT(parsed, 0);    // the sweep exercises both outcomes
  EXPECT_GT(rejected, 0);

  // mistralai/Mixtral-8x7B-v0.1 config.json, as in HfConfig.Mixtral8x7b.
  const ModelSpec m = parse_hf_config(base, "mutation");
  EXPECT_EQ(m.name, "mixtral");
  EXPECT_EQ(m.hidden, 4096);
  EXPECT_EQ(m.layers, 32);
  EXPECT_EQ(m.heads, 32);
  EXPECT_EQ(m.kv_heads, 8);
  EXPECT_EQ(m.ffn, 14336);
  EXPECT_EQ(m.vocab, 32000);
  EXPECT_EQ(m.experts, 8);
  EXPECT_EQ(m.experts_per_token, 2);
  EXPECT_EQ(m.mlp, MlpKind::swiglu);
  EXPECT_FALSE(m.tied_embeddings);
}

}  // namespace
}  // namespace tally::io::test_hf_config

namespace tally::io::test_hf_config {
namespace {

// Qwen/Qwen2-7B config.json (hidden 3584, 28 layers, 28 heads, 4 kv heads, 18944, vocab 152064,
// untied): its safetensors hold 7,615,616,512 parameters — the count without q/k/v biases is
// 7,615,487,488, 28 layers × (3584 + 2·512) = 129,024 short (modeling_qwen2.py: q_proj, k_proj and
// v_proj have bias=True).
TEST(HfConfig, Qwen2CountsItsQkvBiases) {
  const ModelSpec m = parse(R"({"model_type": "qwen2", "hidden_size": 3584, "num_hidden_layers": 28,
      "num_attention_heads": 28, "num_key_value_heads": 4, "intermediate_size": 18944,
      "vocab_size": 152064, "tie_word_embeddings": false, "hidden_act": "silu",
      "attention_dropout": 0.0})");
  EXPECT_TRUE(m.qkv_bias);
  EXPECT_EQ(std::int64_t(count_params(m).total()), 7'615'616'512);
  EXPECT_FALSE(m.dropout);
}

// transformers' Qwen2Config: use_sliding_window=False and max_window_layers=28 by default, layer i
// windowed when use_sliding_window and i >= max_window_layers. Qwen/Qwen2.5-14B's config.json:
// 48 layers, sliding_window 131072, max_window_layers 70, use_sliding_window false.
TEST(HfConfig, QwenSlidingWindowFollowsItsConfigClass) {
  const auto qwen = [](const std::string& window) {
    return parse(R"({"model_type": "qwen2", "hidden_size": 5120, "num_hidden_layers": 48,
        "num_attention_heads": 40, "num_key_value_heads": 8, "intermediate_size": 13824,
        "vocab_size": 152064, "max_position_embeddings": 131072, )" + window + "}");
  };
  EXPECT_EQ(qwen(R"("sliding_window": 4096)").attention_window, 0);  // use_sliding_window: false
  const ModelSpec on = qwen(R"("sliding_window": 4096, "use_sliding_window": true)");
  EXPECT_EQ(on.attention_window, 4096);
  EXPECT_EQ(on.window_layers, 48 - 28);  // from layer 28, the class's default
  EXPECT_EQ(qwen(R"("sliding_window": 4096, "use_sliding_window": true, "max_window_layers": 40)")
                .window_layers,
            8);
  // Past L: no layer windowed, not an error (the 14B's own file, use_sliding_window turned on).
  const ModelSpec past =
      qwen(R"("sliding_window": 131072, "use_sliding_window": true, "max_window_layers": 70)");
  EXPECT_EQ(past.attention_window, 0);
  EXPECT_EQ(past.window_layers, 0);
}

// Dropout comes from the config: GPT-2's pdrops are 0.1; Llama 3 states attention_dropout 0.0;
// Llama 2's file states none.
TEST(HfConfig, DropoutFromTheConfig) {
  EXPECT_TRUE(load_hf_config(data_path("gpt2.json")).dropout);
  EXPECT_FALSE(load_hf_config(data_path("llama-3-8b.json")).dropout);
  EXPECT_FALSE(load_hf_config(data_path("llama-2-7b.json")).dropout);
  EXPECT_TRUE(parse(replaced(fixture("llama-3-8b.json"), "\"attention_dropout\": 0.0",
                             "\"attention_dropout\": 0.1"))
                  .dropout);
}

}  // namespace
}  // namespace tally::io::test_hf_config
