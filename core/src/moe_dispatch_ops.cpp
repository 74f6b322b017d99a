// The memory-bound kernels of Megatron-Core's MoE token dispatcher (Note [MoE token dispatcher]):
// what runs around the dispatch and combine all-to-alls of every MoE layer, per kernel, with the
// bytes it reads and writes. layer_ops (operators.cpp) emits them as memory-bound Ops.
//
// Note [MoE token dispatcher]
// Megatron-Core's MoEAlltoAllTokenDispatcher (megatron/core/transformer/moe/token_dispatcher.py:
// dispatch_preprocess, dispatch_postprocess, combine_preprocess, combine_postprocess), moe_utils.py
// (permute, unpermute, sort_chunks_by_idxs) and router.py (TopKRouter.routing) at NVIDIA/Megatron-LM
// 2edffad — the submodule Megatron-Bridge v0.4.2 (c8101293) pins — with moe_permute_fusion and
// moe_router_fusion on, as Bridge sets them (moe_permute_fusion: models/gpt_oss/gpt_oss_bridge.py,
// qwen/qwen3_moe_bridge.py, deepseek/deepseek_v3_bridge.py; moe_router_fusion: the GPT-OSS, Qwen3
// and DeepSeek configs of scripts/performance/configs), so every kernel is Transformer
// Engine's at 366798e (v2.14.1, the TE that Bridge pins): pytorch/router.py
// fused_topk_with_score_function, and pytorch/permutation.py over the Triton kernels of
// common/triton/permutation.py. Per MoE layer and micro-batch on one rank, with
//   T_r  tokens entering the MoE layer on the rank (b·s/c, /t with sequence parallelism),
//   E    experts; k their top-k; κ = c_f·k the routed slots per token (dropless c_f = 1; drop-and-
//        pad fills each expert to c_f times its balanced share); P = κ·T_r rows permuted and sent,
//   g    ranks of the expert-TP all-gather (Note [expert tensor parallelism]); R = g·P rows the
//        rank's E/ep local experts receive,
//   h    hidden; e activation bytes. The alltoall dispatcher permutes the tokens unquantized under
//        every recipe (the grouped GEMM quantizes what arrives, Note [low-precision casts]); logits
//        and probs are in e as well (moe_router_dtype None: the input's dtype; DeepSeek-V3's
//        bridge sets fp32, not modelled: T_r·E-sized tensors); index maps are int32, 4 B:
//   moe-topk           fused_topk_with_score_function_fwd: reads the logits, writes the dense probs,
//                      the bool routing map and the fp32 scores saved for backward:
//                      T_r·E·(2e + 5); backward reads map, scores and probs' gradient and writes
//                      the logits' gradient: T_r·E·(2e + 5)
//   moe-row-id-map.1,2,3  make_row_id_map's three passes over the [T_r, 2E + 1] int32 map: block
//                      cumsums of the bool map T_r·E·(1 + 4); their offsets, read and written
//                      T_r·E·8; per token a sort, reading T_r·E·4 and writing κ destination rows,
//                      κ expert ids and the count, T_r·4·(2κ + 1). Saved for backward.
//   moe-permute        _permute_kernel with probs: reads each token once, T_r·h·e, writes its κ
//                      copies, P·h·e, reads its map row, T_r·4·(2κ + 1), gathers and writes the κ
//                      probs, 2P·e; backward _unpermute_kernel, the copies' gradients summed back
//                      and the probs' un-permuted: reads P·h·e, writes T_r·h·e, the map
//                      T_r·4·(2κ + 1), zero-fills the dense probs' gradient T_r·E·e, moves 2P·e
//   moe-sort-chunks    only with E/ep > 1 local experts: after the all-to-all (and the expert-TP
//                      gather) the rows, grouped by source rank, regrouped by local expert:
//                      _make_chunk_sort_map_kernel writes R·4 (moe-sort-chunks-map), then
//                      _sort_chunks_by_map_kernel with probs reads and writes R·h·e and R·e and
//                      reads the map, 2R·h·e + 2R·e + 4R; backward the same kernel on the
//                      gradients, the map saved: the same bytes
//   moe-unsort-chunks  the reverse before the combine all-to-all, without probs: map R·4, then
//                      2R·h·e + 4R forward and backward. Drop-and-pad (c_f > 1) sorts by
//                      transpose(0, 1).contiguous() instead: the copies alone, no map
//   moe-unpermute      _unpermute_kernel without merging probs (the probs weigh the activation:
//                      TEGroupedMLP's weighted_bias_swiglu_impl or _quick_geglu_impl, experts.py):
//                      reads P·h·e, writes T_r·h·e, reads each token's count and κ rows,
//                      T_r·4·(κ + 1); backward _permute_kernel without probs, the same bytes
// The same kernels under OperatorSetup::kernels eager (no uncompiled-PyTorch MoE is modelled).
// Each is one kernel, timed as a memory-bound Op like the others (roofline, plus the GPU's
// per-kernel cost). Full recompute replays the forward kernels (Megatron-Core's full layer
// recompute runs the dispatcher again, as its all-to-alls are replayed, Note [expert
// parallelism]); the selective modules (layernorm, moe_act: save_matmuls) replay none of them.
// Unfused (moe_permute_fusion False; not modelled, no recipe here runs it): permute is an
// index_select after a stable argsort of the transposed T_r·E map (2P·h·e for the tokens against
// the fused (T_r + P)·h·e), unpermute a zero-filled scatter_add, sort_chunks split + cat (the same
// 2R·h·e) after a host synchronisation.
// Not counted: the per-expert token counts (routing_map.sum, their all-gather, T_r·E bytes, and
// the host synchronisation; the Bridge recipes capture moe_preprocess in CUDA graphs), the probs'
// per-row read in the weighted activation (R·e beside its R·f·e), the benchmark-only random logits
// (moe_router_force_load_balancing), the auxiliary-loss kernels (T_r·E-sized; GPT-OSS trains
// without, moe_router_load_balancing_type "none"), and the flex dispatcher (DeepEP, HybridEP),
// whose permutation runs inside the library around its own communication: counted here as the
// alltoall dispatcher's.
#include <vector>

#include "tally/core/operators.hpp"
#include "tally/core/parallel_groups.hpp"

namespace tally::detail {

std::vector<DispatchKernel> moe_dispatch_kernels(const ModelSpec& m, const OperatorSetup& s) {
  if (!m.is_moe() || s.dense_layer) return {};
  const double e = s.act_bytes, h = double(m.hidden), E = double(m.experts), i4 = 4;
  const double Tr = double(s.micro_batch) * double(s.seq / s.cp) /
                    (s.sequence_parallel ? s.tp : 1);
  const int etp = s.etp > 0 ? s.etp : s.tp;
  const double kappa = double(m.experts_per_token) * s.capacity_factor;
  const double P = kappa * Tr;
  const double R = P * expert_gather_ranks(s.tp, etp, s.sequence_parallel);
  const double topk = Tr * E * (2 * e + 5);
  const double permute = (Tr + P) * h * e + Tr * i4 * (2 * kappa + 1) + 2 * P * e;
  const double unpermute = (Tr + P) * h * e + Tr * i4 * (kappa + 1);
  std::vector<DispatchKernel> k{
      {"moe-topk", "moe-topk.backward", topk, topk},
      {"moe-row-id-map.1", {}, Tr * E * (1 + i4), 0},
      {"moe-row-id-map.2", {}, Tr * E * 2 * i4, 0},
      {"moe-row-id-map.3", {}, Tr * E * i4 + Tr * i4 * (2 * kappa + 1), 0},
      {"moe-permute", "moe-permute.backward", permute, permute + Tr * E * e}};
  if (m.experts / s.ep > 1) {
    const bool padded = s.capacity_factor > 1;  // drop-and-pad: transpose copies, no map
    const double map = padded ? 0 : R * i4;
    const double sort = 2 * R * h * e + 2 * R * e + map, unsort = 2 * R * h * e + map;
    if (!padded) k.push_back({"moe-sort-chunks-map", {}, map, 0});
    k.push_back({"moe-sort-chunks", "moe-sort-chunks.backward", sort, sort});
    if (!padded) k.push_back({"moe-unsort-chunks-map", {}, map, 0});
    k.push_back({"moe-unsort-chunks", "moe-unsort-chunks.backward", unsort, unsort});
  }
  k.push_back({"moe-unpermute", "moe-unpermute.backward", unpermute, unpermute});
  return k;
}

}  // namespace tally::detail
