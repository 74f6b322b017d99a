// `tally run moe` (issue 15, "Executed in the engine at small scale"): one mixture-of-experts layer
// (engine/runtime/moe_layer.hpp: router → softmax → top-k, E routed experts, optional shared
// expert) with expert parallelism over Gloo all-to-all, run for real on CPU ranks and checked
// against a single-process run and core's ledgers (DESIGN.md §4):
//   equivalence    float64: the layer's output and every gradient (router, this rank's experts,
//                  shared expert, input) equal the single-process layer on the same data to 1e-10
//                  relative; the routed copies dropped at capacity agree exactly
//   communication  the EP group's all-to-all calls and bytes in one forward + backward, measured by
//                  its Comm counters, beside core step_traffic()'s ep item (Note [expert
//                  parallelism] in core/src/comm.cpp): 4 per layer, S(ep−1)/ep each
//   memory         fp32 model states on this rank (parameters, gradients, Adam m and v) measured by
//                  the tracking allocator beside core model_states() with StateSetup.ep
//
// Legend: W = world size, ep = EP ranks, T = tokens per rank, h, f, E, k, c_f as in
// tally/engine/moe.hpp; C = expert_capacity(T, k, E, c_f) slots per (source rank, expert).
// The W ranks form W/ep EP groups of adjacent ranks (Megatron-Core's expert rank order with expert
// TP 1); every group runs the same layer on the same tokens (they are expert-data-parallel
// replicas), so one launch of 4 ranks checks ep = 4 and ep = 2. Every rank builds the whole layer
// from `seed` and draws all ep·T tokens; EP rank r of a group takes tokens [r·T, (r+1)·T).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tally/core/comm.hpp"
#include "tally/core/model_states.hpp"
#include "tally/engine/dist_env.hpp"
#include "tally/engine/moe.hpp"

namespace tally::engine {

// Note [default MoE layer]
// h 16, f 32, E 8, k 2, SwiGLU, T 32 tokens per rank, c_f 1: C = 32·2/8 = 8 slots exactly, so the
// all-to-all buffer E·C·h equals core's T·k·c_f·h and the byte check is exact; ep = 1, 2, 4, 8
// divide E. N = 8·16 + 8·3·32·16 = 12,416 parameters; the float64 check and the fp32 memory step
// take milliseconds. S = T·k·c_f·h·8 = 8,192 bytes per float64 all-to-all.
struct MoeOptions {
  std::vector<int> ep;               // EP degrees, run one after another; empty = {W}
  MoeConfig layer;
  std::int64_t tokens = 32;          // T, per rank
  std::uint64_t seed = 0;            // weights and tokens
  double timeout_s = 60;             // rendezvous and every collective
  int threads = 1;                   // torch intra-op threads per rank (0 = libtorch's)
  // InvalidInput naming the flag, the value and the allowed range: --ep not dividing the world
  // size or --experts, --top-k > --experts, --capacity-factor outside [1, 64], …
  void validate(int world_size) const;
};

struct MoeVariant {
  int ep = 1;
  int group = 0;                     // which EP group this rank is in (0 … W/ep − 1)
  std::int64_t capacity = 0;         // C
  // float64 equivalence, this rank
  double max_output_rel_diff = 0;    // max|y − y_ref| / max|y_ref| over this rank's tokens
  double max_grad_rel_diff = 0;      // max over tensors (input included) of the same
  std::string worst_grad;
  std::int64_t dropped = 0, reference_dropped = 0;  // routed copies of this rank's tokens
  double step_seconds = 0;           // the float64 forward + backward + gradient all-reduce
  // communication: this rank's all-to-alls in that forward + backward
  std::int64_t all_to_all_calls = 0;
  double all_to_all_bytes = 0;       // Comm counters: core's formula on each call's real S
  double all_to_all_seconds = 0;
  double buffer_bytes = 0;           // S of each exchange: E·C·h·8
  bool capacity_exact = false;       // E·C = T·k·c_f: the padded slots are core's
  StepTraffic predicted;             // core step_traffic() for one layer, float64 activations
  // memory: fp32 parameters + gradients + Adam m, v alive after one optimizer step, this rank
  double state_bytes = 0;
  ModelStateResult predicted_states;  // core model_states(N, fp32 Adam, ep)
};

struct MoeResult {
  MoeOptions options;
  int rank = 0, world_size = 1;
  std::int64_t n_params = 0;         // N of the whole layer
  double expert_share = 0;           // routed experts' share of N
  std::vector<MoeVariant> variants;  // in options.ep order
};

// Tolerances, with their reason: float64 sums in a different order (the dispatch buffers, the
// batched GEMMs) differ by a few ulps; 1e-10 leaves six orders of magnitude. Bytes: the same
// formula on the same S (1e-12). Model states: the allocator counts each live storage's requested
// bytes, and what is alive is exactly params, grads, m and v; core's N(1−e) + N·e/ep is a
// floating-point product, exact to rounding (1e-12 relative: one byte in a terabyte).
inline constexpr double kMoeF64Tolerance = 1e-10;
inline constexpr double kMoeBytesTolerance = 1e-12;
inline constexpr double kMoeStateTolerance = 1e-12;

struct MoeCheck {
  std::string what;
  double measured = 0, predicted = 0, tolerance = 0;  // relative (predicted 0: absolute)
  bool ok = true;
};
std::vector<MoeCheck> moe_checks(const MoeResult& r);
bool moe_ok(const MoeResult& r);

// Runs every EP degree of options.ep on this rank. Progress: one line per degree on stderr (rank 0).
MoeResult run_moe(const DistEnv& env, const MoeOptions& options);

}  // namespace tally::engine
