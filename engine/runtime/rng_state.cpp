// The default generator's state as hex (rng_state.hpp).
#include "rng_state.hpp"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cstdint>
#include <mutex>

#include "tally/core/types.hpp"

namespace tally::engine {

std::string generator_state_hex() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    state = gen.get_state();
  }
  static constexpr char kHex[] = "0123456789abcdef";
  const auto* p = state.data_ptr<std::uint8_t>();
  std::string hex;
  hex.reserve(std::size_t(state.numel()) * 2);
  for (std::int64_t i = 0; i < state.numel(); ++i) {
    hex += kHex[p[i] >> 4];
    hex += kHex[p[i] & 15];
  }
  return hex;
}

void set_generator_state_hex(const std::string& hex, const std::string& source) {
  const auto digit = [](char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
  };
  if (hex.empty() || hex.size() % 2 != 0)
    throw InvalidInput(source + " = " + std::to_string(hex.size()) +
                       " characters: must be the hex of torch's CPU generator state");
  at::Tensor state = at::empty({std::int64_t(hex.size() / 2)}, at::kByte);
  auto* p = state.data_ptr<std::uint8_t>();
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0)
      throw InvalidInput(source + ": character " + std::to_string(i) +
                         " is not a lower-case hex digit");
    p[i / 2] = std::uint8_t(hi * 16 + lo);
  }
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  try {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(state);
  } catch (const c10::Error& e) {
    throw InvalidInput(source + " (" + std::to_string(hex.size() / 2) +
                       " bytes): torch rejects it: " + e.what_without_backtrace());
  }
}

}  // namespace tally::engine
