// Fuzz harness: the Hugging Face config.json reader (io/include/tally/io/hf_config.hpp).
//
// The input is a config.json. Checked (Note [fuzz contract] in fuzz_check.hpp): parse_hf_config (in
// memory) and load_hf_config (the file) agree, value or message; an accepted config is JSON and a
// ModelSpec that passes validate() and has a finite, positive parameter count. io has no
// config.json writer, so there is no round trip to check.
#include <cmath>

#include "fuzz_check.hpp"
#include "tally/io/hf_config.hpp"

namespace tally::fuzz {
namespace {

bool same_model(const ModelSpec& a, const ModelSpec& b) {
  return a.name == b.name && a.hidden == b.hidden && a.layers == b.layers && a.heads == b.heads &&
         a.kv_heads == b.kv_heads && a.ffn == b.ffn && a.vocab == b.vocab &&
         a.max_positions == b.max_positions && a.experts == b.experts &&
         a.experts_per_token == b.experts_per_token && a.tied_embeddings == b.tied_embeddings &&
         a.linear_bias == b.linear_bias && a.mlp == b.mlp && a.norm == b.norm &&
         a.position == b.position && a.params_only == b.params_only &&
         a.attn_head_dim == b.attn_head_dim && a.shared_experts == b.shared_experts &&
         a.shared_expert_ffn == b.shared_expert_ffn && a.dense_layers == b.dense_layers &&
         a.dense_ffn == b.dense_ffn && a.router_bias == b.router_bias &&
         a.expert_bias == b.expert_bias && a.attention_sinks == b.attention_sinks &&
         a.qk_norm == b.qk_norm && a.q_lora_rank == b.q_lora_rank &&
         a.kv_lora_rank == b.kv_lora_rank && a.qk_nope_head_dim == b.qk_nope_head_dim &&
         a.qk_rope_head_dim == b.qk_rope_head_dim && a.v_head_dim == b.v_head_dim &&
         a.nominal_params.has_value() == b.nominal_params.has_value() &&
         (!a.nominal_params || same_bits(*a.nominal_params, *b.nominal_params));
}

}  // namespace
}  // namespace tally::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tally::fuzz;
  using namespace tally::io;
  const auto file = read_json_both_ways(
      data, size, "config.json", "parse_hf_config", [](std::string_view t, const std::string& src) { return parse_hf_config(t, src); },
      "load_hf_config", [](const fs::path& path) { return load_hf_config(path); }, same_model);
  if (!file.ok()) return 0;
  const tally::ModelSpec& m = *file.value;
  const auto valid = attempt("ModelSpec::validate", [&] { m.validate(); });
  FUZZ_CHECK(valid.ok(), "an accepted config.json does not validate: " + valid.error);
  const double total = tally::count_params(m).total();
  FUZZ_CHECK(std::isfinite(total) && total > 0, "parameter count " + std::to_string(total));
  return 0;
}
