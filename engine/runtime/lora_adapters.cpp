// The adapters on disk: one safetensors file with the LoRA configuration in its metadata
// (lora_model.hpp, Note [adapter file]).
#include <nlohmann/json.hpp>

#include <cstring>
#include <map>
#include <set>
#include <string>

#include "lora_model.hpp"
#include "tally/core/types.hpp"
#include "tally/io/safetensors.hpp"

namespace tally::engine {

namespace {

// PEFT's LoraConfig fields and tally's description of the base model.
nlohmann::json lora_config_json(const LoraModel& model) {
  const LoraSetup& s = model.options().lora;
  nlohmann::json targets = nlohmann::json::array();
  for (LoraTarget t : s.targets) targets.push_back(std::string(module_name(t)));
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"r", s.rank},
          {"lora_alpha", s.alpha},
          {"lora_dropout", s.dropout},
          {"target_modules", targets},
          {"bias", "none"},
          {"base_model", model.spec().name},
          {"arch", std::string(to_string(model.arch()))},
          {"method", std::string(to_string(s.method))},
          {"quant", s.method == FineTune::qlora ? std::string(to_string(s.quant)) : "none"},
          {"double_quant", s.method == FineTune::qlora && s.double_quant},
          {"quant_block", s.block},
          {"quant_block2", s.block2}};
}

}  // namespace

AdapterFile save_adapters(const LoraModel& model, const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const auto named = model.named_adapters();
  std::vector<io::TensorView> views;
  for (const auto& [name, t] : named) {
    TALLY_INVARIANT(t.scalar_type() == torch::kFloat && t.is_contiguous());
    views.push_back({.name = name,
                     .dtype = io::TensorDType::f32,
                     .shape = {t.size(0), t.size(1)},
                     .data = reinterpret_cast<const std::byte*>(t.data_ptr<float>()),
                     .size_bytes = std::size_t(t.nbytes())});
  }
  AdapterFile f{.path = dir / kAdapterFileName, .tensors = std::int64_t(views.size()),
                .lora_config = lora_config_json(model).dump()};
  const io::WrittenFile w =
      io::write_safetensors(f.path, views, {{"format", "pt"}, {"lora_config", f.lora_config}});
  f.bytes = std::int64_t(w.size_bytes);
  return f;
}

AdapterFile load_adapters(LoraModel& model, const std::filesystem::path& dir) {
  const std::filesystem::path path = dir / kAdapterFileName;
  if (!std::filesystem::is_regular_file(path))
    throw InvalidInput(path.string() + ": no adapter file (tally run qlora --save-adapters writes it)");
  const io::SafetensorsFile file = io::read_safetensors(path);
  const auto& meta = file.header.metadata;
  const auto it = meta.find("lora_config");
  if (it == meta.end())
    throw InvalidInput(path.string() + ": __metadata__ has no lora_config");
  nlohmann::json saved;
  try {
    saved = nlohmann::json::parse(it->second);
  } catch (const nlohmann::json::exception& e) {
    throw InvalidInput(path.string() + ": lora_config is not JSON: " + e.what());
  }
  const nlohmann::json want = lora_config_json(model);
  for (const auto& [key, value] : want.items())
    if (!saved.contains(key) || saved[key] != value)
      throw InvalidInput(path.string() + ": lora_config." + key + " = " +
                         (saved.contains(key) ? saved[key].dump() : std::string("(absent)")) +
                         " vs the model's " + value.dump());
  const auto named = model.named_adapters();
  if (file.header.tensors.size() != named.size())
    throw InvalidInput(path.string() + ": " + std::to_string(file.header.tensors.size()) +
                       " tensors vs the model's " + std::to_string(named.size()) + " adapters");
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : named) {
    const io::TensorInfo* info = file.header.find(name);
    if (info == nullptr) throw InvalidInput(path.string() + ": no tensor '" + name + "'");
    const std::vector<std::int64_t> shape = {t.size(0), t.size(1)};
    if (info->dtype != io::TensorDType::f32 || info->shape != shape)
      throw InvalidInput(path.string() + ": '" + name + "' is " +
                         std::string(io::to_string(info->dtype)) + " of another shape than the "
                         "model's F32 (" + std::to_string(shape[0]) + ", " +
                         std::to_string(shape[1]) + ")");
    const auto bytes = file.bytes(*info);
    std::memcpy(t.data_ptr<float>(), bytes.data(), bytes.size());
  }
  return {.path = path, .bytes = std::int64_t(file.header.file_bytes),
          .tensors = std::int64_t(named.size()), .lora_config = it->second};
}

}  // namespace tally::engine
