// Which ranks form which process group in a (dp, tp, pp, cp) layout: the rank arithmetic the
// planner's link choice (comm.hpp: TP stride 1, CP stride tp, DP stride tp·cp, PP stride
// tp·cp·dp) and the engine's process groups (engine/runtime/include/tally/engine/process_groups.hpp)
// share. Pure integer arithmetic, no torch.
//
// Rank order: Megatron-LM's default "tp-cp-dp-pp" (megatron/core/parallel_state.py,
// RankGenerator with order "tp-cp-ep-dp-pp", ep = 1): TP varies fastest, then CP, then DP, then
// PP. A global rank r has coordinates
//   tp_i = r mod t,  cp_i = (r / t) mod c,  dp_i = (r / (t·c)) mod d,  pp_i = r / (t·c·d),
// i.e. r = tp_i + t·(cp_i + c·(dp_i + d·pp_i)). The group of kind X holding r is every rank whose
// coordinates other than X equal r's, listed in increasing X coordinate (= increasing global rank);
// a rank's index in that list is its rank inside the group.
//
// Example, world 8 = dp 2 × tp 2 × pp 2: TP groups {0,1} {2,3} {4,5} {6,7}; DP groups {0,2} {1,3}
// {4,6} {5,7}; PP groups {0,4} {1,5} {2,6} {3,7}.
#pragma once

#include <string_view>
#include <vector>

namespace tally {

enum class GroupKind { tp, cp, dp, pp };
std::string_view to_string(GroupKind k);  // "tp", "cp", "dp", "pp"

struct ParallelLayout {
  int dp = 1, tp = 1, pp = 1, cp = 1;
  int world_size() const { return dp * tp * pp * cp; }
  int size(GroupKind k) const;    // ranks in one group of kind k
  int stride(GroupKind k) const;  // spacing of a group's ranks in the global order
  // Throws InvalidInput naming the flag (--dp, --tp, --pp, --cp) when a degree is < 1, or naming
  // the product when dp·tp·pp·cp ≠ world_size.
  void validate(int world_size) const;
};

struct RankCoords {
  int tp = 0, cp = 0, dp = 0, pp = 0;
  int operator[](GroupKind k) const;
};

// Coordinates of global rank r (0 <= r < world_size). Throws InvalidInput on a rank out of range.
RankCoords rank_coords(const ParallelLayout& layout, int rank);
// The global ranks of the kind-k group holding `rank`, in group order.
std::vector<int> group_ranks(const ParallelLayout& layout, GroupKind k, int rank);
// Every kind-k group, ordered by their first rank.
std::vector<std::vector<int>> all_groups(const ParallelLayout& layout, GroupKind k);

// Note [expert rank groups]
// The MoE layers group the same ranks differently (Megatron-Core core_v0.14.0, commit 23e00ed,
// megatron/core/parallel_state.py initialize_model_parallel): expert_tensor_parallel_size
// (ETP, e_t) defaults to the TP size; expert_data_parallel_size = world / (e_t·e_p·p); and a second
// RankGenerator(tp = e_t, ep = e_p, dp = EDP, pp = p, cp = 1) over the same order "tp-cp-ep-dp-pp"
// lays them out, whose PP groups Megatron asserts equal the dense ones. Inside the t·c·d ranks of
// a pipeline stage, expert TP varies fastest, then EP, then expert DP:
//   etp_i = r' mod e_t,  ep_i = (r' / e_t) mod e_p,  edp_i = r' / (e_t·e_p),  r' = r mod (t·c·d)
// so an ETP group is e_t adjacent ranks, an EP group strides e_t, an expert-DP group e_t·e_p, and
// e_t·e_p must divide t·c·d (EDP = t·c·d / (e_t·e_p); the context-parallel ranks join expert DP).
// Example, world 16 = tp 2 × dp 8 with e_t 1, e_p 8: EP groups {0..7} {8..15}, expert DP {0, 8}
// {1, 9} …; with e_t 2, e_p 4: ETP {0, 1}, EP {0, 2, 4, 6}, expert DP {0, 8}.
enum class ExpertGroupKind { etp, ep, edp };
std::string_view to_string(ExpertGroupKind k);  // "etp", "ep", "edp"

struct ExpertLayout {
  int etp = 1, ep = 1, edp = 1, pp = 1;
  int world_size() const { return etp * ep * edp * pp; }
  int size(ExpertGroupKind k) const;
  int stride(ExpertGroupKind k) const;  // 1, e_t, e_t·e_p
};

// The expert layout of `dense` at expert TP `etp` (0 = dense.tp, Megatron-Core's default) and
// expert parallelism `ep`. Throws InvalidInput naming --etp / --ep when a degree is < 1 or e_t·e_p
// does not divide t·c·d.
ExpertLayout expert_layout(const ParallelLayout& dense, int etp, int ep);
// The global ranks of the kind-k expert group holding `rank`, in group order.
std::vector<int> expert_group_ranks(const ExpertLayout& layout, ExpertGroupKind k, int rank);

// Note [expert tensor parallelism]
// How the MoE layer's tokens meet its expert-TP split (Megatron-Core core_v0.14.0,
// transformer/moe/token_dispatcher.py MoEAlltoAllTokenDispatcher: "A2A(EP) → AG(TP)" to dispatch,
// "RS(TP) → A2A(EP)" to combine, TP being the expert-TP group; extensions/transformer_engine.py
// TEGroupedLinear with explicit_expert_comm: the expert GEMMs do no communication of their own,
// f/e_t wide). Each rank routes its own tokens T_r (b·s/c, ÷t with sequence parallelism); after the
// EP all-to-all the ETP group all-gathers what its members received, so every expert-TP rank runs
// its f/e_t slice of its E/e_p experts on the routed copies of g·T_r tokens, and reduce-scatters
// the partial outputs before the combine. g = e_t when the ETP group's ranks hold different tokens
// — sequence parallel, or no TP — and 1 when they hold the same ones (TP without SP: the routed
// copies are already on every TP rank, and the TP all-reduce sums the partial outputs, as for a
// dense MLP). Megatron-Core refuses TP without SP for MoE training (moe_layer.py), so tally allows
// TP without SP only with e_t = t.
// The expert-side figures per rank: routed copies g·T_r·k·c_f (the expert GEMMs' rows and the
// grouped input saved for the weight gradient); MLP hidden g·T_r·k·c_f·f/e_t = T·k·c_f·f/t
// whatever e_t; ETP all-gather and reduce-scatter of S = g·T_r·k·c_f·h·e each.
int expert_gather_ranks(int tp, int etp, bool sequence_parallel);
// Throws InvalidInput naming --etp unless etp == tp, tp == 1 or sequence_parallel.
void require_expert_tp(int tp, int etp, bool sequence_parallel);

}  // namespace tally
