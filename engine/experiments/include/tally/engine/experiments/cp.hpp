// `tally run cp` (issue 11): context parallelism — ring attention (engine/runtime/
// ring_attention.hpp) over one CP group of c = world size ranks, checked against single-process
// causal attention and core's CP ledger (DESIGN.md §4):
//   equivalence    float64: the output and dQ, dK, dV of this rank's chunks equal the same slices
//                  of softmax(QKᵀ/√d + causal mask)·V and its torch-autograd gradients, computed
//                  whole in one process, to 1e-10 relative
//   communication  bytes and sends of one layer's forward + backward, measured by the CP group's
//                  Comm counters, beside core step_traffic()'s CP item (3(c−1) sends of
//                  2·B·(s/c)·kv_hidden·bytes), exact, in float64 and fp32
//   work balance   (query chunk, key chunk) block pairs each rank computed, gathered over the
//                  ranks, against core's cp_causal_block_pairs() (context_parallel.hpp): max/min
//                  = 1 with Transformer Engine's zigzag split, (4c−1)/3 with contiguous chunks
//   time           fp32 forward + backward per layer (median over repeats), split into block
//                  computation and ring shifts, and each rank's computation time (reported, not
//                  asserted); with a host calibration (`--calibration`) core's operator model of
//                  the ring's kernels beside each rank's (Note [engine ring attention] in
//                  core/gpt_step.hpp: its blocks under each split, contention k·t/c)
// Both splits run, zigzag (what core assumes) first, over the same groups and data.
//
// Legend: B = micro-batch, a = query heads, g = K,V heads, d = head dim, s = sequence,
// c = CP ranks; kv_hidden = g·d. One attention core, no projections: Q, K, V are drawn whole from
// `seed` on every rank (the same everywhere) and each rank takes its two chunks.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tally/core/comm.hpp"
#include "tally/core/context_parallel.hpp"
#include "tally/core/hardware.hpp"
#include "tally/engine/dist_env.hpp"

namespace tally::engine {

// Note [default CP sizes]
// B 2, a 4, g 2, d 16, s 48: s/2 = 24 splits into 2c chunks for c = 1, 2, 3, 4, 6, 8, 12, 24;
// a K,V message is 2·2·(48/c)·32 elements (12,288 fp32 bytes at c = 2). Milliseconds per layer.
struct CpOptions {
  int cp = 0;                   // CP ranks; 0 = the world size. Must equal the world size.
  std::int64_t batch = 2;       // B
  std::int64_t heads = 4;       // a
  std::int64_t kv_heads = 2;    // g, dividing a (GQA; = a for plain multi-head attention)
  std::int64_t head_dim = 16;   // d
  std::int64_t seq = 48;        // s, split into 2c chunks
  int repeats = 5;              // timed fp32 layers (forward + backward) per split
  std::uint64_t seed = 0;       // Q, K, V and the output gradient
  double timeout_s = 60;        // rendezvous and every send / recv
  int threads = 1;              // torch intra-op threads per rank (0 = libtorch's)
  // A host calibration's cluster (io::host_cluster): enables the computation time prediction.
  std::optional<ClusterSpec> host;
  int host_cores = 1;           // the cores the ranks share (contention)
  // InvalidInput naming the flag, the value and the allowed range: --cp ≠ world size, --cp not
  // splitting --seq into 2c chunks, --kv-heads not dividing --heads, sizes out of range.
  void validate(int world_size) const;
};

struct CpVariant {
  CpBalance balance = CpBalance::zigzag;
  // float64 vs single-process, this rank: max|x − x_ref| / max|x_ref| over its slices.
  double out_rel_diff = 0, dq_rel_diff = 0, dk_rel_diff = 0, dv_rel_diff = 0;
  // One layer forward + backward, this rank's CP Comm: sends and bytes (float64, fp32).
  std::int64_t sends_f64 = 0, forward_sends_f64 = 0;
  double bytes_f64 = 0, bytes_f32 = 0;
  StepTraffic predicted_f64, predicted_f32;  // core step_traffic(), 1 layer, 1 micro-batch
  // fp32, this rank: forward + backward per repeat; mean block computation and shift per layer.
  std::vector<double> layer_seconds;
  double compute_s = 0, shift_s = 0;
  // Gathered over the CP ranks (index = CP rank): block pairs of one forward, and mean fp32
  // computation seconds per layer; core's prediction of the pairs.
  std::vector<double> block_pairs, predicted_block_pairs, compute_s_by_rank;
  // With CpOptions::host: core's seconds of each rank's ring kernels per layer (forward +
  // backward, Note [engine ring attention]); empty without.
  std::vector<double> predicted_compute_s_by_rank;
  double median_layer_seconds() const;
  double block_pair_imbalance() const;            // max/min over ranks, measured
  double predicted_block_pair_imbalance() const;  // the same from core
  double compute_imbalance() const;               // max/min of compute_s_by_rank
};

struct CpResult {
  CpOptions options;
  int rank = 0, world_size = 1;
  std::vector<CpVariant> variants;  // zigzag, then contiguous
};

// Tolerances, with their reason: the ring sums the softmax in blocks and another order than the
// reference, a few ulps (1e-16) per operation; 1e-10 leaves six orders of magnitude. Bytes and
// block pairs: counted, exact.
inline constexpr double kCpF64Tolerance = 1e-10;

struct CpCheck {
  std::string what;  // "zigzag dQ f64", "contiguous bytes per layer f64", …
  double measured = 0, predicted = 0, tolerance = 0;  // relative (predicted 0: absolute)
  bool ok = true;
};
std::vector<CpCheck> cp_checks(const CpResult& r);
bool cp_ok(const CpResult& r);

// Runs both splits on this rank. Progress: one line per timed fp32 layer on stderr (rank 0).
CpResult run_cp(const DistEnv& env, const CpOptions& options);

}  // namespace tally::engine
