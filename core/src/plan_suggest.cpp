// When no layout fits: the smallest changes that would (issue 12), each costed with the ledgers
// the plan uses (Note [does it fit]).
#include <cstdio>

#include "tally/core/activations.hpp"
#include "tally/core/finetune.hpp"
#include "tally/core/planner.hpp"

namespace tally {

namespace {

std::string percent(double fraction) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g %%", 100 * fraction);
  return buf;
}

Suggestion planned(std::string change, std::string cost, const PlanResult& p) {
  Suggestion s{.change = std::move(change), .cost = std::move(cost)};
  const PlanEval* e = p.feasible() ? &p.best.front()
                      : p.near_misses.empty() ? nullptr
                                              : &p.near_misses.front();
  if (e == nullptr) return s;
  s.fits = e->fits;
  s.per_gpu_bytes = e->total_bytes;
  s.usable_bytes = e->usable_bytes;
  if (e->fits) s.step_s = e->step_s;
  s.layout = e->layout.describe();
  return s;
}

// LoRA / QLoRA on every GPU (data parallel over all of them): the ledger's static bytes plus the
// activations of micro-batch 1 with gradient checkpointing.
Suggestion finetuned(const PlanRequest& r, FineTune method) {
  const LoraSetup setup{.method = method,
                        .compute = r.precision == Precision::fp32 ? Precision::bf16 : r.precision,
                        .optimizer = r.optimizer};
  const FineTuneLedger f = finetune_ledger(r.model, setup);
  const double act =
      activations(r.model, ActivationSetup{.seq = r.seq, .micro_batch = 1,
                                           .recompute = Recompute::full,
                                           .dropout = r.uses_dropout(),
                                           .act_bytes = dtype_bytes(setup.compute)})
          .peak_stage_bytes;
  const FitCheck fit = check_fit(f.static_bytes(), act, 0, r.memory_budget());
  const std::string name = method == FineTune::lora ? "LoRA" : "QLoRA (NF4 + double quant)";
  return Suggestion{.change = name + " r=8 on q,v, gradient checkpointing, micro-batch 1",
                    .fits = fit.fits,
                    .per_gpu_bytes = fit.total_bytes,
                    .usable_bytes = fit.usable_bytes,
                    .cost = "a fine-tune, not pre-training: trains " +
                            percent(f.trainable_fraction()) + " of the parameters (adapters)"};
}

}  // namespace

std::vector<Suggestion> suggest_changes(const PlanRequest& r, const SearchSpace& space) {
  std::vector<Suggestion> out;
  // More GPUs at the same global batch: the first doubling (up to 16×) at which a layout fits.
  for (int factor = 2; factor <= 16; factor *= 2) {
    PlanRequest more = r;
    more.gpus = r.gpus * factor;
    try {
      const PlanResult p = plan(more, space);
      if (!p.feasible() && factor < 16) continue;
      out.push_back(planned("GPUs " + std::to_string(r.gpus) + " → " + std::to_string(more.gpus),
                            std::to_string(factor) + "× the GPUs", p));
      break;
    } catch (const InvalidInput&) {
      continue;  // no layout of that many GPUs passes the shape rules (e.g. the batch)
    }
  }
  if (r.optimizer == Optimizer::adam || r.optimizer == Optimizer::adamw) {
    PlanRequest eight = r;
    eight.optimizer = Optimizer::adam8bit;
    out.push_back(planned("8-bit Adam (m and v in 1 byte each)",
                          "block-wise quantized optimizer states (Dettmers et al. 2022)",
                          plan(eight, space)));
  }
  if (!r.model.params_only)
    for (FineTune m : {FineTune::lora, FineTune::qlora}) {
      try {
        out.push_back(finetuned(r, m));
      } catch (const InvalidInput&) {
        // an architecture the LoRA ledger does not itemise: no suggestion
      }
    }
  return out;
}

}  // namespace tally
