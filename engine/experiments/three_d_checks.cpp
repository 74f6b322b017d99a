// `tally run 3d`'s options and checks (three_d.hpp): what the run accepts and what it compares
// with core, apart from the run itself (three_d.cpp), which needs libtorch.
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "run_helpers.hpp"
#include "tally/core/parallel_groups.hpp"
#include "tally/core/pipeline.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/experiments/three_d.hpp"

namespace tally::engine {

void ThreeDOptions::validate(int world_size) const {
  model.validate();
  ParallelLayout{.dp = dp, .tp = tp, .pp = pp, .cp = cp}.validate(world_size);
  require(model.seq % (2 * cp) == 0, "--seq", model.seq,
          "must split into 2 x --cp = " + std::to_string(2 * cp) +
              " equal chunks (context parallelism's zigzag: rank r holds chunks r and 2c-1-r)");
  const std::int64_t ffn = 4 * model.hidden;
  require(model.heads % tp == 0 && ffn % tp == 0, "--tp", tp,
          "must divide --heads = " + std::to_string(model.heads) +
              " and the FFN width 4 x --hidden = " + std::to_string(ffn) +
              " (allowed: " + divisors_of(std::gcd(model.heads, ffn)) + ")");
  if (sp && tp == 1)  // core's activation ledger's rule too (ActivationSetup::validate)
    throw InvalidInput("--sp: sequence parallelism needs --tp > 1");
  if (sp)
    require((model.seq / cp) % tp == 0, "--seq", model.seq,
            "must be divisible by --cp x --tp = " + std::to_string(cp * tp) +
                " with --sp (sequence shards of each CP rank's share)");
  require(model.layers >= pp, "--pp", pp,
          "must be <= --layers = " + std::to_string(model.layers) +
              " (one layer per stage at least)");
  // Every virtual stage's layers (Note [uneven virtual stages]); one may hold none, as
  // Megatron-Core's slot split leaves the first the embedding and the last the loss: PpStage runs
  // such a chunk as the identity (with the embedding or the loss on an end).
  if (!pp_layers.empty())
    check_stage_list(pp_layers, int(model.layers), pp, virtual_split_given() ? interleave : 1);
  require(zero >= 0 && zero <= 3, "--zero", zero, "must be 0, 1, 2 or 3 (over the DP x CP group)");
  require(micro_batches >= 0 && micro_batches <= 4096, "--micro-batches", micro_batches,
          "must be in [1, 4096]");
  require(interleave >= 1 && interleave <= 64, "--interleave", interleave, "must be in [1, 64]");
  require(steps >= 1 && steps <= 10000, "--steps", steps, "must be in [1, 10000]");
  if (!(lr > 0 && std::isfinite(lr)))
    throw InvalidInput("--lr = " + format_number(lr) + ": must be finite and > 0");
  if (!(timeout_s > 0 && timeout_s <= 86400))
    throw InvalidInput("--timeout = " + format_number(timeout_s) + ": must be in (0, 86400] s");
  require(threads >= 0 && threads <= 1024, "--threads", threads, "must be in [0, 1024]");
  if (schedule != PipelineSchedule::interleaved)
    require(interleave == 1, "--interleave", interleave,
            "needs --schedule interleaved (gpipe and 1f1b run one chunk per stage)");
  if (schedule == PipelineSchedule::interleaved) {
    const int M = micro_batches_or_default();
    require(pp >= 2, "--pp", pp, "must be >= 2 for the interleaved schedule");
    require(M % pp == 0, "--micro-batches", M,
            "must be a multiple of --pp = " + std::to_string(pp) + " for the interleaved schedule");
    const std::vector<int> layers = stage_split();
    for (int s = 0; s < pp && !virtual_split_given(); ++s)
      require(layers[std::size_t(s)] % interleave == 0, "--interleave", interleave,
              "must divide the layers of every stage (stage " + std::to_string(s) + " holds " +
                  std::to_string(layers[std::size_t(s)]) + " of --layers = " +
                  std::to_string(model.layers) + " over --pp = " + std::to_string(pp) + ")");
  }
  require(kill_rank >= -1 && kill_rank < world_size, "--kill-rank", kill_rank,
          "must be -1 (none) or a rank in [0, " + std::to_string(world_size) + ")");
  if (kill_rank >= 0)
    require(kill_at_step >= 1 && kill_at_step <= steps, "--kill-at-step", kill_at_step,
            "must be in [1, --steps = " + std::to_string(steps) + "]");
}

std::vector<int> ThreeDOptions::stage_split() const {
  if (virtual_split_given()) {  // each stage's chunks summed
    std::vector<int> out;
    for (int s = 0; s < pp; ++s) out.push_back(stage_layer_total(pp_layers, pp, s));
    return out;
  }
  return pp_layers.empty() ? stage_layers(int(model.layers), pp) : pp_layers;
}

std::vector<int> ThreeDOptions::virtual_split() const {
  return virtual_split_given() ? pp_layers : virtual_stage_layers(stage_split(), pp, interleave);
}

bool ThreeDOptions::virtual_split_given() const {
  return interleave > 1 && pp >= 1 &&
         std::int64_t(pp_layers.size()) == std::int64_t(pp) * interleave;
}

// The byte checks are exact but for double rounding: the Comm records each call's S(k−1)/k, which
// is not an integer when k does not divide S (a DP group of 3), and sums them in another order
// than core's calls × bytes per call.
constexpr double kByteRounding = 1e-12;

// fp32 Adam bytes per parameter that ZeRO stage 0..3 shards: none; m, v; + the gradient; + the
// parameter.
constexpr double kShardedBytesPerElement[] = {0, 8, 12, 16};

std::vector<ThreeDCheck> three_d_checks(const ThreeDResult& r) {
  std::vector<ThreeDCheck> out;
  auto rel = [&](std::string what, double measured, double predicted, double tol) {
    const double d = predicted == 0 ? std::abs(measured) : rel_diff(measured, predicted);
    out.push_back({std::move(what), measured, predicted, tol, d <= tol});
  };
  rel("loss f64 vs single-process", r.loss_f64, r.reference_loss_f64, kThreeDF64Tolerance);
  for (const ThreeDRank& m : r.ranks) {
    const std::string rk = "rank " + std::to_string(m.rank) + " ";
    rel(rk + "max gradient difference f64 after the DP reduction", m.max_grad_rel_diff, 0,
        kThreeDF64Tolerance);
    rel(rk + "max parameter difference f64 after one Adam step", m.max_param_rel_diff, 0,
        kThreeDF64Tolerance);
    rel(rk + "TP bytes of its layers vs core's TP item", m.tp_layer_bytes, m.tp_predicted_bytes,
        kByteRounding);
    rel(rk + "TP calls of its layers vs core's", m.tp_layer_calls, m.tp_predicted_calls, 0);
    rel(rk + "SP re-gather bytes of its layers vs core's tp_regather", m.tp_regather_bytes,
        m.tp_regather_predicted_bytes, kByteRounding);
    rel(rk + "SP re-gather calls of its layers vs core's", m.tp_regather_calls,
        m.tp_regather_predicted_calls, 0);
    rel(rk + "SP edge and gradient bytes vs core's engine_sp_traffic", m.tp_other_bytes,
        m.tp_other_predicted_bytes, kByteRounding);
    rel(rk + "PP sends vs the schedule's", m.pp_sends, m.pp_expected_sends, 0);
    rel(rk + "PP tied-embedding bytes vs core's pp_embedding item", m.pp_embedding_bytes,
        m.pp_embedding_predicted_bytes, kByteRounding);
    if (m.pp_sends > 0) {
      rel(rk + "smallest PP send bytes vs core's per call", m.pp_min_send, m.pp_predicted_per_call, 0);
      rel(rk + "largest PP send bytes vs core's per call", m.pp_max_send, m.pp_predicted_per_call, 0);
    }
    if (r.options.cp > 1) {
      rel(rk + "CP bytes of its layers vs core's CP item", m.cp_bytes, m.cp_predicted_bytes,
          kByteRounding);
      rel(rk + "CP sends of its layers vs core's", m.cp_sends, m.cp_predicted_sends, 0);
    }
    rel(rk + "DP bytes vs core's dp_grad + zero_param_gather on its parameters", m.dp_bytes,
        m.dp_predicted_bytes, kByteRounding);
    // Exact but for the shard's rounding: the first N_r mod k ranks of a DP (× CP) group hold one
    // element more of each sharded item (core/sharding.hpp) — fp32 m and v under ZeRO-1, the
    // gradient too under ZeRO-2, the parameters too under ZeRO-3 — bytes that core's N_r/k
    // leaves fractional.
    const double sharded_bytes = kShardedBytesPerElement[std::size_t(r.options.zero)];
    rel(rk + "model-state bytes allocated vs core's model_states on its parameters", m.state_bytes,
        m.state_predicted_bytes, sharded_bytes / m.state_predicted_bytes);
  }
  return out;
}

}  // namespace tally::engine
