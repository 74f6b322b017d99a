// The planner's stage splits (internal, core/src/plan_prepared.hpp): which layers each pipeline
// stage or virtual stage holds when a layout doesn't say.
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "plan_prepared.hpp"
#include "tally/core/pipeline.hpp"

namespace tally::detail {

// Note [planner stages]
// A pipeline's end stages carry more than layers: the first the embedding, the last the final
// norm, the LM head and the loss (6·V·h FLOPs per token, a large share for big vocabularies). With
// interleave 1 the planner picks the layer split that makes the slowest stage fastest, among the
// even split and end stages one layer lighter (as Llama 3 puts 126 layers on 16 stages:
// 7 + 14 × 8 + 7, Dubey et al. 2024 §3.3.2), weighing each stage by its FLOPs — a choice that
// depends on (pp, recompute) only, so it is made once and the memory pruning stays exact. A PP
// that doesn't divide the layers gets the most even split (extra layers on the later stages).
// Interleaved schedules keep equal stages where pp·v | layers (Megatron-LM's rule), else take
// Megatron-Core's embedding and loss slots (Note [planner virtual stages]).
std::pair<int, int> choose_split(const Prepared& P, int pp, Recompute rc) {
  const auto key = std::make_pair(pp, int(rc));
  if (const auto it = P.splits.find(key); it != P.splits.end()) return it->second;
  const PlanRequest& r = *P.req;
  const int layers = int(r.model.layers);
  const double head = P.head_flops, layer = (P.hw_flops[int(rc)] - head) / layers;
  auto pace = [&](int first, int last) {
    const std::vector<int> n = stage_layers(layers, pp, first, last);
    double worst = 0;
    for (std::size_t s = 0; s < n.size(); ++s)
      worst = std::max(worst, n[s] * layer + (s + 1 == n.size() ? head : 0.0));
    return worst;
  };
  const int even = layers / pp;
  // The most even split, as (first, last) when the layers don't divide (0, 0 when they do).
  std::pair<int, int> best = layers % pp == 0 ? std::make_pair(0, 0)
                                               : std::make_pair(even, even + 1);
  double best_pace = pace(best.first, best.second);
  for (const auto& [f, l] : {std::pair{even - 1, even}, std::pair{even, even - 1},
                             std::pair{even - 1, even - 1}, std::pair{even, even}}) {
    if (f < 1 || l < 1 || (pp == 2 && f + l != layers) || layers - f - l < pp - 2) continue;
    const double p = pace(f, l);
    if (p < best_pace * (1 - 1e-12)) {
      best = {f, l};
      best_pace = p;
    }
  }
  return P.splits.emplace(key, best).first->second;
}

// Note [planner virtual stages]: an interleaved layout whose pp·v virtual stages don't divide
// the layers takes Megatron-Core's split where the embedding and the loss each count as a layer
// (account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split; Llama 3 puts
// 126 layers on 16 stages so): (L + 2)/(pp·v) slots per virtual stage, the first and the last
// one layer lighter (Note [uneven virtual stages] in pipeline.hpp). Null when pp·v doesn't divide
// L + 2 either. Made once per (pp, v).
std::shared_ptr<const std::vector<int>> slot_split(const Prepared& P, int pp, int v) {
  const auto key = std::make_pair(pp, v);
  if (const auto it = P.slot_splits.find(key); it != P.slot_splits.end()) return it->second;
  const std::int64_t slots = P.req->model.layers + 2, chunks = std::int64_t(pp) * v;
  std::shared_ptr<const std::vector<int>> list;
  if (pp > 1 && v > 1 && slots % chunks == 0) {
    std::vector<int> per(std::size_t(chunks), int(slots / chunks));
    per.front() -= 1;  // the embedding's slot
    per.back() -= 1;   // the loss's slot
    list = std::make_shared<const std::vector<int>>(std::move(per));
  }
  return P.slot_splits.emplace(key, list).first->second;
}

}  // namespace tally::detail
