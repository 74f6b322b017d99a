// `tally run memory-profile` (issue 3, experiment 3; seed's `report(tag)` block, criteria ①②③⑥):
// one training step of the engine's GPT (gpt.hpp) on the CPU under the tracking allocator
// (tracking_allocator.hpp), measuring allocated, peak and reserved bytes at each phase boundary, each
// beside the core ledgers' prediction for the same inputs:
//   after-model-init      + params item of core model_states          (① ±10 %)
//   after-optimizer-init  + m + v + master of core model_states       (② ±15 %: 8N fp32, 12N mixed)
//   after-forward         + core activations(): the activation ledger (③)
//   after-backward        − activations + grads item                  (cumulative: the full state)
//   after-step            unchanged (gradients kept, as before zero_grad)
// Precision fp32: fp32 parameters, gradients, activations, Adam m and v (the parameters are the
// master). bf16 mixed: bf16 parameters, gradients and activations, fp32 logits for the loss, and an
// fp32 master copy + m + v held by the engine's eager Adam (Note [mixed-precision Adam] in optimizer_torch.hpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tally/core/activations.hpp"
#include "tally/core/model.hpp"
#include "tally/core/model_states.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/gpt.hpp"
#include "tally/engine/tracking_allocator.hpp"

namespace tally::engine {

struct MemoryProfileOptions {
  GptConfig model;                       // default: Note [default GPT shape]
  Precision precision = Precision::fp32; // fp32 or bf16 (mixed); fp16 is refused
  bool allocator_cache = true;           // the tracking allocator's cache (reserved ≥ allocated)
  std::uint64_t seed = 0;                // weights and the random token batch
  int threads = 0;                       // torch intra-op threads; 0 = libtorch's default
  void validate() const;                 // InvalidInput naming the flag
};

enum class Phase { model_init, optimizer_init, forward, backward, step };
inline constexpr Phase kPhases[] = {Phase::model_init, Phase::optimizer_init, Phase::forward,
                                    Phase::backward, Phase::step};
std::string_view to_string(Phase p);  // "after-model-init", ...

struct PhaseRecord {
  Phase phase = Phase::model_init;
  MemoryCounters measured;           // counters read at the end of the phase (peak: within it)
  double increment_bytes = 0;        // measured allocated − allocated at the phase's start
  double predicted_increment_bytes = 0;
  double predicted_allocated_bytes = 0;  // cumulative prediction after the phase
  double seconds = 0;
  // Measured increment / predicted increment; 0 when nothing is predicted to change.
  double increment_ratio() const;
  // Measured allocated / predicted allocated.
  double allocated_ratio() const;
};

struct MemoryProfileResult {
  MemoryProfileOptions options;
  ModelSpec model;                   // gpt_model_spec(options.model)
  double core_params = 0;            // count_params(model).total()
  std::int64_t module_params = 0;    // Σ numel of the libtorch module's parameters
  ModelStateResult states;           // core model_states(N, {precision, adam, ZeRO-0})
  ActivationResult activations;      // core activations(model, setup matching the module)
  std::vector<PhaseRecord> phases;   // in kPhases order
  Phase peak_phase = Phase::model_init;  // the phase whose peak allocated is the highest
  std::int64_t peak_allocated_bytes = 0; // over the whole run
  std::int64_t peak_reserved_bytes = 0;
  std::int64_t teardown_allocated_bytes = 0;  // after model and optimizer are destroyed (0 = no leak)
  double loss = 0;                   // the step's cross-entropy (≈ ln V at init)

  const PhaseRecord& at(Phase p) const;
};

// The ActivationSetup that describes the engine's module: materialised attention, no dropout, no
// recompute, tp = cp = pp = 1, one micro-batch; act_bytes 4 (fp32) or 2 (bf16). The logits term is
// core's fp32 4sbV in both precisions (the module upcasts the logits for the loss).
ActivationSetup gpt_activation_setup(const GptConfig& c, Precision p);

// The seed's criteria ①②③, each a phase's measured increment against a core ledger item.
enum class MemoryCriterion {
  params,            // ① after-model-init increment vs core params item
  optimizer_states,  // ② after-optimizer-init increment vs core m + v + master
  activations,       // ③ forward increment vs core activations()
};

// The seed's criteria ①②③ as checks on one result: measured vs predicted bytes and a tolerance on
// the ratio (Note [memory-profile tolerances] in memory_profile.cpp); cli/run_memory_profile.cpp
// words them.
struct AcceptanceCheck {
  MemoryCriterion criterion = MemoryCriterion::params;
  double measured_bytes = 0;
  double predicted_bytes = 0;
  double tolerance = 0;      // allowed |ratio − 1|
  double ratio() const { return predicted_bytes > 0 ? measured_bytes / predicted_bytes : 0.0; }
  bool ok() const { return predicted_bytes > 0 && std::abs(ratio() - 1.0) <= tolerance; }
};
std::vector<AcceptanceCheck> acceptance_checks(const MemoryProfileResult& r);

// Runs the experiment in this process (it installs the tracking allocator: no other scope may be
// active). Throws InvalidInput for bad options.
MemoryProfileResult run_memory_profile(const MemoryProfileOptions& options);

}  // namespace tally::engine
