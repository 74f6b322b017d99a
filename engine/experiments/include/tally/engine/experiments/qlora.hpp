// `tally run qlora` (issue 12; the seed's QLoRA program, criterion ⑤'s CPU path): a random-
// initialised decoder — GPT-2's layout or Llama's (RMSNorm, SwiGLU, rotary, GQA) — fine-tuned with
// LoRA adapters on a frozen NF4 backbone (or, --method lora, a frozen dense one) in one process,
// in fp32 or bf16 compute, under the tracking allocator, beside core's fine-tuning ledger.
//
// Legend: N = the model's parameters (count_params of its ModelSpec), N_q = the quantized ones
// (the decoder layers' linear weights), B = micro-batch, T = sequence, r = LoRA rank.
//
// What runs, in order (engine/runtime/lora_model.hpp holds the model):
//  1. the fp32 source model (gpt.hpp or llama.hpp) from the seed, then the LoRA model built from
//     it — every decoder-layer weight quantized by core's quantize_nf4 (qlora) — and the
//     quantization checks against the fp32 weights (qlora_checks.cpp Note [quantization checks]);
//  2. Adam over the adapters (eager m, v; fp32 whatever the compute dtype);
//  3. the sweep: for each T, `steps` training steps (forward, backward with per-block recompute,
//     Adam step), each phase's peak read from the tracking allocator;
//  4. the learning run: the adapters drawn afresh, `learn_steps` steps on the synthetic task
//     (Note [synthetic task]), the frozen tensors' CRC-32C before and after;
//  5. the adapters saved (safetensors, Note [adapter file]), a fresh backbone quantized from the
//     same seed, the adapters loaded onto it, and its loss against the trained model's.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tally/core/activations.hpp"
#include "tally/core/finetune.hpp"
#include "tally/core/model.hpp"
#include "tally/engine/gpt.hpp"
#include "tally/engine/llama.hpp"
#include "tally/engine/tracking_allocator.hpp"

namespace tally::engine {

struct QloraOptions {
  Arch arch = Arch::gpt;
  // The shape (hidden, layers, heads, vocab, micro_batch) of either layout. For gpt its seq is set
  // to the longest sequence run (the learned position table), so N depends on the sweep. Default:
  // GPT-2 small's shape (Note [default GPT shape]), N = 125.2 M with T up to 2048; llama at the
  // same width: f 2048, untied head, N = 162.1 M.
  GptConfig model;
  std::int64_t kv_heads = 0;  // llama: a_kv (GQA); 0 = model.heads
  std::int64_t ffn = 0;       // llama: the SwiGLU width f; 0 = llama_ffn(model.hidden)
  // method lora | qlora, r, α, dropout, targets, nf4, double quantization, block, block2; compute
  // fp32 or bf16 (Note [compute dtype] in lora_model.hpp), the optimizer Adam.
  LoraSetup lora = {.compute = Precision::fp32};
  std::vector<std::int64_t> seqs = {512, 1024, 2048};  // ③: at least three, rising
  int steps = 5;                  // training steps at each T
  bool checkpoint = true;         // gradient checkpointing per block
  int learn_steps = 30;           // the learning check (≥ 10: first 5 vs last 5)
  std::int64_t learn_seq = 128;   // its sequence length (also the quantization checks' batch)
  double lr = 2e-3;               // the adapters' Adam learning rate
  std::optional<std::filesystem::path> save_adapters;  // unset: a temporary directory
  std::uint64_t seed = 0;         // weights, adapters, data
  int threads = 0;                // torch intra-op threads; 0 = libtorch's default
  std::function<void(const std::string&)> progress;  // one line per stage (the CLI: stderr)
  void validate() const;          // InvalidInput naming the flag
  GptConfig run_model() const;    // model with seq = max(seqs, learn_seq)
  LlamaConfig llama_model() const;  // model's shape with kv_heads and ffn resolved
  ModelSpec run_spec() const;     // gpt_model_spec(run_model()) or llama_model_spec(llama_model())
};

// The phases of one training step, in order; the peak is read in each.
enum class StepPhase { forward, head_backward, blocks_backward, optimizer_step };
inline constexpr StepPhase kStepPhases[] = {StepPhase::forward, StepPhase::head_backward,
                                            StepPhase::blocks_backward, StepPhase::optimizer_step};
std::string_view to_string(StepPhase p);  // "forward", "loss+head backward", ...

// Note [quantization checks] in qlora.cpp.
struct QuantizationChecks {
  bool ran = false;                  // qlora only
  std::int64_t matrices = 0, elements = 0, blocks = 0;
  std::int64_t not_nearest = 0;      // elements whose index is not the nearest code point
  double max_error_over_bound = 0;   // max |w − ŵ| / (a·gap/2 + |a − â|): ≤ 1
  double max_abs_error = 0;          // max |w − ŵ|
  double rel_rms_error = 0;          // ‖W − Ŵ‖ / ‖W‖ over every quantized weight
  bool code_points_exact = false;    // code points × a power of two come back bit for bit
  std::int64_t constants_not_nearest = 0;  // absmax codes not at the dynamic map's nearest value
  double max_constant_error_over_step = 0; // max |a − â| / (absmax2 · local half gap): ≤ 1
  double dequantized_layer_bytes = 0;      // measured: the largest matrix dequantized
  std::string dequantized_module;          // its name ("up_proj"; the first of the largest)
  // The loss on one batch: the fp32 source model vs the LoRA model (in the compute dtype) before
  // training (B = 0: the backbone).
  double loss_fp32 = 0, loss_converted = 0;
  double loss_rel_diff() const;
};

struct StaticMemory {
  // Allocated bytes (tracking allocator) at each boundary, from the scope's start.
  std::int64_t after_model_bytes = 0;      // the LoRA model alone (the fp32 source freed)
  std::int64_t after_optimizer_bytes = 0;  // + Adam m, v of the adapters
  std::int64_t after_step_bytes = 0;       // + the adapters' gradients: everything persistent
  double inventory_bytes = 0;              // Σ nbytes of the model's tensors, m, v and grads
};

struct SeqRun {
  std::int64_t seq = 0, micro_batch = 1;
  std::vector<double> step_seconds, losses;
  std::int64_t peak_allocated_bytes = 0;   // over the steps
  std::int64_t peak_reserved_bytes = 0;
  std::int64_t end_allocated_bytes = 0;    // after the last step
  std::int64_t end_reserved_bytes = 0;
  std::int64_t end_cached_bytes = 0;
  std::vector<std::int64_t> phase_peak_bytes;  // per kStepPhases, max over steps
  StepPhase peak_phase = StepPhase::forward;
  ActivationResult predicted_activations;  // core: the run's setup at this T, compute dtype
  ActivationResult predicted_activations_7b;  // core: Llama-2-7B, the seed's program, bf16
  double tokens() const;                   // B·T per step
  // The median step: the first step at each T also faults in the pages of its fresh blocks (the
  // cache is emptied between sequence lengths) and, at the first T, warms the BLAS threads.
  double median_step_seconds() const;
  double tokens_per_s() const;             // B·T / the median step
  double peak_bytes_per_token() const;     // peak allocated / (B·T)
  double activation_bytes_per_token(double static_bytes) const;  // (peak − static) / (B·T)
};

struct LinearFit {
  double slope = 0, intercept = 0, r_squared = 0;
};
LinearFit fit_line(const std::vector<double>& x, const std::vector<double>& y);

struct LearningRun {
  std::vector<double> losses;
  double first5_mean = 0, last5_mean = 0;
  std::int64_t frozen_tensors = 0, frozen_changed = 0;      // CRC-32C at build vs at the end
  std::int64_t adapter_tensors = 0, adapters_changed = 0;   // vs their fresh draw
  std::filesystem::path adapter_file;
  std::int64_t adapter_file_bytes = 0, adapter_file_tensors = 0;
  bool file_holds_only_adapters = false;   // its tensors are exactly the adapters, by name
  std::string lora_config;                 // the file's metadata
  double eval_loss_trained = 0, eval_loss_reloaded = 0;  // the same batch, dropout off
};

struct QloraResult {
  QloraOptions options;
  GptConfig model;                  // options.run_model()
  ModelSpec spec;                   // options.run_spec(): the ledger's input
  FineTuneLedger ledger;            // core finetune_ledger(spec, options.lora)
  FineTuneLedger ledger_7b;         // the seed's program on Llama-2-7B (bf16 compute)
  ModelSpec spec_7b;
  // What the built model holds, by item (Σ nbytes), and its counts.
  double quantized_weight_bytes = 0, constant_bytes = 0, frozen_bytes = 0, adapter_bytes = 0;
  double adapter_grad_bytes = 0, adapter_optimizer_bytes = 0;
  std::int64_t quantized_params = 0, frozen_params = 0, trainable_params = 0;
  std::int64_t all_params() const { return quantized_params + frozen_params + trainable_params; }
  QuantizationChecks quant;
  StaticMemory memory;
  std::vector<SeqRun> runs;         // per options.seqs
  LinearFit peak_fit;               // peak allocated bytes against T
  LearningRun learning;
  std::int64_t teardown_allocated_bytes = 0;  // after every model is gone (0: nothing leaked)
  double seconds = 0;
};

// Note [check scopes]
// A check either tests tally itself — the ledger against the allocator, the quantization, the
// learning run, the measurement's sanity — and holds for every setup (CheckScope::tally), or it is
// one of the seed's thresholds, set for the seed's own setup (CheckScope::seed): ① the 7B trainable
// fraction < 0.2 % (r 8 on q, v), ② the 4-bit backbone ≈ 0.5 B per quantized parameter (NF4 with
// double quantization, block 64/256), ③ the peak rising with T and linear in it. A seed threshold
// binds only when the run's adapters and quantization are the seed's (seed_setup); for another
// setup it is reported, labelled, with its pass/fail, and does not fail the run: all-target LoRA
// is 0.30 % of Llama-2-7B and --no-double-quant 0.5625 B per parameter, by design. The run fails
// (exit 1) when a binding check fails.
enum class CheckScope { tally, seed };
std::string_view to_string(CheckScope s);  // "tally", "seed"

// The seed's setup for its thresholds: rank 8 on q and v; for qlora NF4 with double quantization
// in blocks of 64 and 256 (α, dropout and the method's contrast run do not move them).
bool seed_setup(const LoraSetup& s);

// One acceptance check: the seed's criteria ①–④ and the quantization and learning
// checks, each a measured value against its limit.
struct QloraCheck {
  std::string id;        // "①" … "④", "quant", "learn"
  std::string what;      // in words
  double measured = 0;
  double limit = 0;
  std::string relation;  // "<", ">", "=", "±10 % of", "<=" — measured relation limit
  bool ok = false;
  CheckScope scope = CheckScope::tally;
  bool binds = true;     // tally's checks always; the seed's when seed_setup (Note [check scopes])
};
std::vector<QloraCheck> qlora_checks(const QloraResult& r);
// Every binding check ok: the run's exit status.
bool qlora_passed(const std::vector<QloraCheck>& checks);

// The ActivationSetup core is asked for the run at sequence T (materialised attention, no
// dropout outside the adapters, activations in `act`, PyTorch's eager loss, full recompute when
// checkpointing) with the adapters' terms (add_lora_activations).
ActivationSetup qlora_activation_setup(const QloraOptions& o, const ModelSpec& spec,
                                       std::int64_t seq, Precision act);

// Runs the experiment in this process (it installs the tracking allocator: no other scope may be
// active). Throws InvalidInput for bad options.
QloraResult run_qlora(const QloraOptions& options);

}  // namespace tally::engine
