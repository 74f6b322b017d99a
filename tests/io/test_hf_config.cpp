// Hugging Face config.json reader: real-shaped fixtures against the core presets and the published
// totals, one test per class of malformed input, and a deterministic mutation sweep.
#include "tally/io/hf_config.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

#include "io_test_util.hpp"
#include "tally/core/presets.hpp"

namespace tally::io {
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
  const auto head_dim = replaced(fixture("llama-3-8b.json"), "\"hidden_act\"", "\"head_dim\": 256, \"hidden_act\"");
  expect_invalid([&] { parse(head_dim); }, {kSrc, "head_dim = 256", "128"});
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
  expect_invalid([&] { parse(shared); }, {kSrc, "n_shared_experts = 2", "not representable"});
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
}  // namespace tally::io

namespace tally::io {
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
}  // namespace tally::io
