// The planner's stage splits (internal, core/src/plan_prepared.hpp): which layers each pipeline
// stage or virtual stage holds when a layout doesn't say, and the makespan of a layout tally
// prints, by its schedule.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "plan_prepared.hpp"
#include "tally/core/pipeline.hpp"

namespace tally::detail {

// Note [planner stages]
// A pipeline's end stages carry more than layers: the first the embedding, the last the final norm,
// the LM head and the loss (6·V·h FLOPs per token, a large share for big vocabularies) and any
// multi-token-prediction modules. With interleave 1 the planner picks the layer split that makes
// the slowest stage fastest, among the even split, end stages one layer lighter (as Llama 3 puts
// 126 layers on 16 stages: 7 + 14 × 8 + 7, Dubey et al. 2024 §3.3.2) and a last stage lighter by
// more (the first one layer heavier or lighter) where that is faster still, weighing each stage by
// its FLOPs — a choice that depends on (pp, recompute) only, so it is made once and the memory
// pruning stays exact. A PP that doesn't divide the layers gets the most even split (extra layers
// on the later stages). Interleaved schedules keep equal stages where pp·v | layers (Megatron-LM's
// rule), else take Megatron-Core's embedding and loss slots (Note [planner virtual stages]).
std::pair<int, int> choose_split(const Prepared& P, int pp, Recompute rc) {
  const auto key = std::make_pair(pp, int(rc));
  if (const auto it = P.splits.find(key); it != P.splits.end()) return it->second;
  const PlanRequest& r = *P.req;
  const int layers = int(r.model.layers);
  const double head = P.head_flops[int(rc)], layer = (P.hw_flops[int(rc)] - head) / layers;
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
  std::vector<std::pair<int, int>> candidates{{even - 1, even}, {even, even - 1},
                                              {even - 1, even - 1}, {even, even}};
  // A last stage heavier than a layer beyond its layers (a large vocabulary's head, the MTP
  // modules: Note [multi-token prediction]) may shed more than one, and the first stage, whose
  // embedding is a lookup, take one more: DeepSeek-V3's Megatron-Bridge recipe on 8 stages puts
  // 8 layers and the embedding on the first, 8 on each middle one, 5 and the MTP module on the
  // last. Tried after the splits above, kept only where strictly faster.
  for (int l = even; l >= 1; --l)
    for (const int f : {even + 1, even, even - 1}) candidates.emplace_back(f, l);
  for (const auto& [f, l] : candidates) {
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

// Note [priced by the schedule]
// The search ranks layouts by pipeline_makespan, a closed form over the stages' totals (Note
// [uneven stages] in pipeline.cpp): exact for equal stages and equal virtual stages (Narayanan et
// al. 2021 eq. 1 and its interleaved form), a lower bound for unequal stages at v = 1, and neither
// for unequal virtual stages, where it takes every chunk as 1/v of its stage (on random splits up
// to 15 % low at v = 1, 37 % low to 11 % high interleaved; VirtualStages.ClosedFormIsExactOnly-
// ForEqualStages in tests/core/test_virtual_stages.cpp checks both). The layouts tally prints —
// the plan's best, the near misses, `compare`, the reasons' variants, evaluate_layout — are
// priced by the schedule itself: the discrete-event simulation of 1F1B or Megatron-Core's
// interleaved order, each virtual stage with its own layers and the embedding, LM head and loss
// on the first and last. A virtual stage's time is the stage's parts per micro-batch: its layers'
// kernels and exposed collectives, the end stages' extras and TP edges, and its 1/v share of the
// stage's sends and gradient accumulation; its backward is the layers' own backward and the LM
// head's, the accumulation, and β (the layer's backward share) of the rest.
double scheduled_makespan(const Layout& L, int model_layers, const StagePieces& x) {
  const int P = L.pp, v = L.interleave, V = P * v;
  const std::vector<int>* list = L.stage_layer_list.get();
  const double share = 1.0 / v;
  std::vector<double> forward(std::size_t(V), 0.0), backward(std::size_t(V), 0.0);
  for (int j = 0; j < V; ++j) {
    const int n = list != nullptr && std::int64_t(list->size()) == V
                      ? (*list)[std::size_t(j)]
                      : L.layers_on_stage(model_layers, j % P) / v;
    double total = n * (x.layer_s + x.comm_per_layer_s) + (x.accumulate_s + x.pp_s) * share;
    double back = n * (x.layer_backward_s + x.beta * x.comm_per_layer_s) + x.accumulate_s * share +
                  x.beta * x.pp_s * share;
    if (j == 0) {
      total += x.first_extra_s + x.edge_first_s;
      back += x.beta * (x.first_extra_s + x.edge_first_s);
    }
    if (j == V - 1) {
      total += x.last_extra_s + x.edge_last_s;
      back += x.last_extra_backward_s + x.beta * x.edge_last_s;
    }
    backward[std::size_t(j)] = back;
    forward[std::size_t(j)] = std::max(0.0, total - back);
  }
  return simulate_virtual_stage_makespan(forward, backward, P, int(L.grad_accum));
}

}  // namespace tally::detail
