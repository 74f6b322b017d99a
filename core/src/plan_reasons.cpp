// Reasons for a plan (the seed's 理由): each dimension flipped once, costed with the same ledgers.
#include <cstdint>
#include <string>

#include "tally/core/planner.hpp"

namespace tally {

namespace {

// Moves a factor of 2 between DP and another dimension, holding the global batch with the
// accumulation count. Returns false when the move is impossible (odd counts).
// Keeps the largest EP the layout still holds (ep·e_t | tp·cp·dp: Note [expert rank groups]).
void fit_ep(Layout& l) {
  const std::int64_t stage = std::int64_t(l.tp) * l.dp * l.cp;
  while (l.ep > 1 && stage % (std::int64_t(l.expert_tp()) * l.ep) != 0) l.ep /= 2;
}

bool move_from_dp(Layout& l, int& dim, bool grow) {
  if (l.expert_tp() == l.tp) l.etp = 0;  // an expert TP equal to TP follows it
  if (grow) {
    if (l.dp % 2 != 0) return false;
    l.dp /= 2;
    dim *= 2;
    l.grad_accum *= 2;
  } else {
    if (dim % 2 != 0 || l.grad_accum % 2 != 0) return false;
    dim /= 2;
    l.dp *= 2;
    l.grad_accum /= 2;
  }
  fit_ep(l);
  return true;
}

}  // namespace

std::vector<Reason> explain_plan(const PlanRequest& r, const PlanEval& chosen) {
  const Layout& c = chosen.layout;
  std::vector<Reason> out;
  auto add = [&](const char* dim, bool used, const Layout& v, bool possible, PlanRequest req) {
    Reason reason{.dimension = dim, .used = used, .variant = v.describe()};
    if (!possible) {
      reason.invalid_reason = "no such layout (an odd count cannot be halved or doubled)";
    } else {
      try {
        reason.eval = evaluate_layout(req, v);
        // As costed, with its settled split (another stage count's end stages or slots).
        reason.variant = reason.eval->layout.describe();
      } catch (const InvalidInput& e) {
        reason.invalid_reason = e.what();
      }
    }
    out.push_back(std::move(reason));
  };
  {
    Layout v = c;
    const bool ok = move_from_dp(v, v.tp, c.tp == 1);
    if (v.tp == 1) v.sp = false;
    add("TP", c.tp > 1, v, ok, r);
  }
  {
    Layout v = c;
    const bool ok = move_from_dp(v, v.pp, c.pp == 1);
    if (v.pp == 1) v.interleave = 1;
    // Another stage count: its split is the planner's (Note [planner stages]), not this one's.
    v.first_stage_layers = v.last_stage_layers = 0;
    v.stage_layer_list.reset();
    add("PP", c.pp > 1, v, ok, r);
  }
  {
    Layout v = c;
    const bool ok = move_from_dp(v, v.cp, c.cp == 1);
    add("CP", c.cp > 1, v, ok, r);
  }
  if (r.model.is_moe()) {  // EP halved, or 2 where none is used
    Layout v = c;
    v.ep = c.ep > 1 ? c.ep / 2 : 2;
    const std::int64_t expert_dp = std::int64_t(c.tp) * c.dp * c.cp / (c.expert_tp() * c.ep);
    add("EP", c.ep > 1, v, c.ep > 1 || (expert_dp % 2 == 0 && r.model.experts % 2 == 0), r);
  }
  if (r.model.is_moe() && c.tp > 1) {  // expert TP 1 instead of TP (with SP), or back to TP
    Layout v = c;
    v.etp = c.expert_tp() == c.tp ? 1 : c.tp;
    if (v.etp != c.tp) v.sp = true;  // Note [expert tensor parallelism]
    fit_ep(v);
    add("ETP", c.expert_tp() != c.tp, v, true, r);
  }
  if (c.tp > 1) {
    Layout v = c;
    v.sp = !c.sp;
    add("SP", c.sp, v, true, r);
  }
  {
    Layout v = c;
    v.zero = c.zero > 0 ? c.zero - 1 : 1;
    add("ZeRO", c.zero > 0, v, c.dp * c.cp > 1, r);
  }
  {
    Layout v = c;
    v.recompute = c.recompute == Recompute::none ? Recompute::selective : Recompute::none;
    add("recompute", c.recompute != Recompute::none, v, true, r);
  }
  {
    Layout v = c;
    const bool ok = c.grad_accum % 2 == 0;
    v.micro_batch *= 2;
    v.grad_accum /= 2;
    add("micro-batch", c.micro_batch > 1, v, ok, r);
  }
  return out;
}

}  // namespace tally
