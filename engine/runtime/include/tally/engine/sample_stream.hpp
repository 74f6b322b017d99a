// The training data's order: an endless, seeded, resumable stream of sample indices (torch-free).
//
// Legend: n = samples in the data set, p = a position in the stream, e = an epoch.
#pragma once

#include <cstdint>
#include <vector>

namespace tally::engine {

// Note [sample stream]
// The training data is an endless stream of positions p = 0, 1, 2, …; position p holds sample
// perm_e[p mod n] of epoch e = ⌊p / n⌋, where perm_e is a Fisher–Yates shuffle of [0, n) driven by
// splitmix64 seeded from (seed, e). A batch is a run of positions, so (seed, consumed_samples)
// alone fixes every batch still to come: that pair is the data loader's whole state, and a resume
// that restores the parameters but not consumed_samples silently trains on other data (seed ④).
// A pure function, so tests compute the expected indices without running anything.
class SampleStream {
 public:
  SampleStream(std::uint64_t seed, std::int64_t n) : seed_(seed), n_(n) {}
  std::int64_t at(std::int64_t position);  // the sample index at position p

 private:
  void shuffle(std::int64_t epoch);
  std::uint64_t seed_;
  std::int64_t n_;
  std::int64_t epoch_ = -1;
  std::vector<std::int64_t> perm_;
};

// `count` indices from `position` on. Throws InvalidInput unless n >= 1, position >= 0, count >= 0.
std::vector<std::int64_t> sample_indices(std::uint64_t seed, std::int64_t dataset_samples,
                                         std::int64_t position, std::int64_t count);

}  // namespace tally::engine
