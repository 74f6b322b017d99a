// The sample stream (tally/engine/sample_stream.hpp, Note [sample stream]).
#include "tally/engine/sample_stream.hpp"

#include <numeric>
#include <string>
#include <utility>

#include "tally/core/types.hpp"

namespace tally::engine {

namespace {

std::uint64_t splitmix64(std::uint64_t& state) {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace

std::int64_t SampleStream::at(std::int64_t position) {
  const std::int64_t epoch = position / n_;
  if (epoch != epoch_) shuffle(epoch);
  return perm_[std::size_t(position % n_)];
}

// Fisher–Yates; the modulo's bias (< n / 2^64) is immaterial here.
void SampleStream::shuffle(std::int64_t epoch) {
  perm_.resize(std::size_t(n_));
  std::iota(perm_.begin(), perm_.end(), std::int64_t{0});
  std::uint64_t state = seed_;
  state = splitmix64(state) ^ (std::uint64_t(epoch) * 0xD1B54A32D192ED03ULL);
  for (std::int64_t i = n_ - 1; i > 0; --i) {
    const auto j = std::int64_t(splitmix64(state) % std::uint64_t(i + 1));
    std::swap(perm_[std::size_t(i)], perm_[std::size_t(j)]);
  }
  epoch_ = epoch;
}

std::vector<std::int64_t> sample_indices(std::uint64_t seed, std::int64_t dataset_samples,
                                         std::int64_t position, std::int64_t count) {
  if (dataset_samples < 1 || position < 0 || count < 0)
    throw InvalidInput("sample_indices: dataset_samples = " + std::to_string(dataset_samples) +
                       ", position = " + std::to_string(position) + ", count = " +
                       std::to_string(count) + ": need n >= 1, position >= 0, count >= 0");
  SampleStream stream(seed, dataset_samples);
  std::vector<std::int64_t> out;
  for (std::int64_t i = 0; i < count; ++i) out.push_back(stream.at(position + i));
  return out;
}

}  // namespace tally::engine
