// `tally compare`: a base layout and the seed's alternatives, each costed with the planner's own
// evaluate_layout (one "does it fit", one time model).
#include <cstdint>
#include <string>

#include "tally/core/planner.hpp"

namespace tally {

std::string_view to_string(Alternative a) {
  switch (a) {
    case Alternative::double_micro_batch: return "double-micro-batch";
    case Alternative::recompute_double_seq: return "recompute-double-seq";
    case Alternative::double_gpus: return "double-gpus";
  }
  return "?";
}

std::optional<Alternative> parse_alternative(std::string_view s) {
  for (Alternative a : {Alternative::double_micro_batch, Alternative::recompute_double_seq,
                        Alternative::double_gpus})
    if (to_string(a) == s) return a;
  return std::nullopt;
}

double Comparison::comm_share() const {
  if (!eval) return 0;
  return (eval->tp_s + eval->cp_s + eval->pp_s + eval->dp_exposed_s) / eval->step_s;
}
double Comparison::bubble_share() const { return eval ? eval->bubble_s / eval->step_s : 0; }

std::vector<Comparison> compare_alternatives(const PlanRequest& base_request, const Layout& base,
                                             const std::vector<Alternative>& alternatives) {
  std::vector<Comparison> out;
  auto add = [&](std::string name, std::string change, PlanRequest req, Layout l) {
    Comparison c{.name = std::move(name), .change = std::move(change), .request = req, .layout = l};
    try {
      c.eval = evaluate_layout(req, l);
    } catch (const InvalidInput& e) {
      c.invalid_reason = e.what();
    }
    out.push_back(std::move(c));
  };
  // An alternative that cannot hold the global batch: say why, never cost an impossible layout.
  auto refuse = [&](Alternative a, std::string change, const PlanRequest& req, const Layout& l,
                    std::string reason) {
    Comparison c{.name = std::string(to_string(a)), .change = std::move(change), .request = req,
                 .layout = l};
    c.invalid_reason = std::move(reason);
    out.push_back(std::move(c));
  };
  const auto arrow = [](const char* what, std::int64_t from, std::int64_t to) {
    return std::string(what) + " " + std::to_string(from) + " → " + std::to_string(to);
  };
  add("base", base.describe(), base_request, base);
  // The base as costed: with its settled split (Note [planner stages], [planner virtual stages]),
  // so an interleaved base without --pp-layers names the slot split it was timed with.
  if (out.back().eval) out.back().change = out.back().eval->layout.describe();
  for (Alternative a : alternatives) {
    PlanRequest req = base_request;
    Layout l = base;
    std::string change;
    switch (a) {
      case Alternative::double_micro_batch:
        if (base.grad_accum < 2) {
          // Holding the global batch needs an accumulation step to halve; never print "1 → 0".
          refuse(a, arrow("micro-batch", base.micro_batch, 2 * base.micro_batch), req, l,
                 "doubling the micro-batch at the same global batch needs accumulation >= 2 (it "
                 "is 1 here); at accumulation 1 it would double the global batch instead");
          continue;
        }
        l.micro_batch *= 2;
        l.grad_accum /= 2;
        change = "micro-batch " + std::to_string(base.micro_batch) + " → " +
                 std::to_string(l.micro_batch) + ", accumulation " +
                 std::to_string(base.grad_accum) + " → " + std::to_string(l.grad_accum);
        break;
      case Alternative::recompute_double_seq:
        l.recompute = Recompute::full;
        req.seq *= 2;
        change = "full recompute, sequence " + std::to_string(base_request.seq) + " → " +
                 std::to_string(req.seq);
        break;
      case Alternative::double_gpus: {
        req.gpus *= 2;
        l.dp *= 2;
        change = arrow("GPUs", base_request.gpus, req.gpus) + " (" + arrow("DP", base.dp, l.dp) +
                 "), global batch held by ";
        // Twice the data-parallel ranks take half the samples each: half the accumulation, or
        // half the micro-batch; with both odd no layout holds the global batch.
        if (l.grad_accum % 2 == 0) {
          l.grad_accum /= 2;
          change += arrow("accumulation", base.grad_accum, l.grad_accum);
        } else if (l.micro_batch % 2 == 0) {
          l.micro_batch /= 2;
          change += arrow("micro-batch", base.micro_batch, l.micro_batch);
        } else {
          refuse(a, arrow("GPUs", base_request.gpus, req.gpus), req, l,
                 "doubling the GPUs at the same global batch halves each rank's samples: it needs "
                 "an even accumulation or micro-batch (accumulation " +
                     std::to_string(base.grad_accum) + ", micro-batch " +
                     std::to_string(base.micro_batch) + " here); otherwise it would double the "
                     "global batch");
          continue;
        }
        break;
      }
    }
    add(std::string(to_string(a)), change, req, l);
  }
  return out;
}

}  // namespace tally
