// The MoE token dispatcher's kernels in layer_ops (Note [MoE token dispatcher], core/src/
// moe_dispatch_ops.cpp) against a hand count of what Transformer Engine's fused router and
// permutation kernels read and write (TE 366798e, common/triton/permutation.py,
// pytorch/csrc/extensions/router.cpp), and the dense layers they must leave alone.
// (tests/core/test_operators.cpp, the operator header's main test, is at the file-size limit.)
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "tally/core/operators.hpp"
#include "tally/core/presets.hpp"

namespace tally::test_operators_moe_dispatch {
namespace {

// Bytes of the kernels named "moe-*" in `ops`, by name and pass ("name" forward, "name/r"
// replayed; backward kernels carry their own names).
std::map<std::string, double> dispatcher_bytes(const std::vector<Op>& ops) {
  std::map<std::string, double> out;
  for (const Op& op : ops) {
    if (!op.name.starts_with("moe-")) continue;
    EXPECT_EQ(op.kind, OpKind::memory) << op.name;
    const std::string key = std::string(op.name) + (op.pass == Pass::recompute ? "/r" : "");
    EXPECT_EQ(out.count(key), 0u) << key;  // each kernel once per pass
    out[key] = op.bytes;
  }
  return out;
}

// Mixtral 8x7B (h 4096, E 8, top-2), one sequence of 4096 tokens, TP 1, EP 2 (4 local experts),
// bf16 (e = 2), dropless. By hand from the TE kernels:
//   T_r = 4096 tokens, κ = 2 copies each, P = R = 8192 rows (no expert-TP gather).
//   moe-topk          logits read 2, probs written 2, bool map 1, fp32 scores 4 per (token,
//                     expert): 4096·8·9 = 294,912; backward map 1 + scores 4 + grad probs 2 read,
//                     grad logits 2 written: 294,912
//   moe-row-id-map.1  bool map read, int32 cumsum written: 4096·8·(1 + 4) = 163,840
//   moe-row-id-map.2  int32 read and written: 4096·8·8 = 262,144
//   moe-row-id-map.3  int32 read 4096·8·4 = 131,072; per token 2 rows + 2 expert ids + count
//                     written, 5·4 B: 81,920; 212,992
//   moe-permute       token rows read 4096·4096·2 = 33,554,432, copies written 8192·4096·2 =
//                     67,108,864; map row read 4096·5·4 = 81,920; probs gathered and written
//                     2·8192·2 = 32,768: 100,777,984. Backward: the copies read, the sums
//                     written (the same 100,663,296), map 81,920, probs' gradient moved 32,768,
//                     its dense T_r × E zero-fill 4096·8·2 = 65,536: 100,843,520
//   moe-sort-chunks-map    8192 int32 written: 32,768
//   moe-sort-chunks   rows read and written 2·8192·4096·2 = 134,217,728, probs 2·8192·2 = 32,768,
//                     map 32,768: 134,283,264, backward the same
//   moe-unsort-chunks-map  32,768; moe-unsort-chunks 134,217,728 + 32,768 = 134,250,496 both ways
//   moe-unpermute     copies read and sums written 100,663,296, count + 2 rows per token
//                     4096·3·4 = 49,152: 100,712,448, backward the same (a permute without probs)
TEST(OperatorsMoeDispatch, MixtralAtEp2ByHand) {
  const ModelSpec m = *model_preset("mixtral-8x7b");
  const auto b = dispatcher_bytes(layer_ops(m, OperatorSetup{.seq = 4096, .ep = 2}));
  const std::map<std::string, double> want{
      {"moe-topk", 294912},
      {"moe-topk.backward", 294912},
      {"moe-row-id-map.1", 163840},
      {"moe-row-id-map.2", 262144},
      {"moe-row-id-map.3", 212992},
      {"moe-permute", 100777984},
      {"moe-permute.backward", 100843520},
      {"moe-sort-chunks-map", 32768},
      {"moe-sort-chunks", 134283264},
      {"moe-sort-chunks.backward", 134283264},
      {"moe-unsort-chunks-map", 32768},
      {"moe-unsort-chunks", 134250496},
      {"moe-unsort-chunks.backward", 134250496},
      {"moe-unpermute", 100712448},
      {"moe-unpermute.backward", 100712448}};
  EXPECT_EQ(b, want);
}

// Sequence and expert tensor parallelism: Mixtral, b 2 × s 2048, TP 2 with SP, ETP 2, EP 4
// (2 local experts). The router and the (un)permute see the rank's sequence shard, T_r = 4096/2 =
// 2048 tokens, P = 4096 copies; the chunk sorts run after the ETP all-gather on R = 2·4096 = 8192
// rows.
//   moe-topk     2048·8·9 = 147,456
//   moe-permute  (2048 + 4096)·4096·2 = 50,331,648 + 2048·5·4 = 40,960 + 2·4096·2 = 16,384:
//                50,388,992
//   moe-sort-chunks   as at EP 2 above (R = 8192): 134,283,264
//   moe-unpermute     50,331,648 + 2048·3·4 = 24,576: 50,356,224
TEST(OperatorsMoeDispatch, SequenceShardAndExpertTpGather) {
  const ModelSpec m = *model_preset("mixtral-8x7b");
  const auto b = dispatcher_bytes(layer_ops(
      m, OperatorSetup{.seq = 2048, .micro_batch = 2, .tp = 2, .sequence_parallel = true,
                       .ep = 4}));
  EXPECT_EQ(b.at("moe-topk"), 147456);
  EXPECT_EQ(b.at("moe-permute"), 50388992);
  EXPECT_EQ(b.at("moe-sort-chunks"), 134283264);
  EXPECT_EQ(b.at("moe-unpermute"), 50356224);
}

// Drop-and-pad (capacity factor 1.5): every expert holds 1.5× its share, κ = 3 slots per token,
// P = R = 3·4096 = 12,288 rows; Megatron-Core sorts the padded chunks by transpose().contiguous()
// (token_dispatcher.py dispatch_postprocess): copies only, no map kernel.
//   moe-sort-chunks  2·12288·4096·2 = 201,326,592 + probs 2·12288·2 = 49,152: 201,375,744
//   moe-permute      (4096 + 12288)·4096·2 = 134,217,728 + 4096·7·4 = 114,688 + 2·12288·2 =
//                    49,152: 134,381,568
// The router GEMM scores the tokens the rank holds: with SP over t = 2 a sequence of 4096 is 2048
// rows of h = 4096 against E = 8 experts — 2·2048·8·4096 = 134,217,728 FLOPs forward, half the
// 4096 rows without SP, where every TP rank scores the whole sequence.
TEST(OperatorsMoeDispatch, RouterScoresTheRanksSequenceShard) {
  const ModelSpec m = *model_preset("mixtral-8x7b");
  auto router = [&](bool sp) {
    for (const Op& op : layer_ops(m, OperatorSetup{.seq = 4096, .tp = 2, .sequence_parallel = sp}))
      if (op.name == "router") return op;
    ADD_FAILURE() << "no router op";
    return Op{};
  };
  const Op sharded = router(true), whole = router(false);
  EXPECT_EQ(sharded.m, 2048);
  EXPECT_EQ(sharded.n, 8);
  EXPECT_EQ(sharded.k, 4096);
  EXPECT_DOUBLE_EQ(sharded.flops, 134217728.0);
  EXPECT_EQ(whole.m, 4096);
}

TEST(OperatorsMoeDispatch, DropAndPadSortsByCopy) {
  const ModelSpec m = *model_preset("mixtral-8x7b");
  const auto b = dispatcher_bytes(
      layer_ops(m, OperatorSetup{.seq = 4096, .ep = 2, .capacity_factor = 1.5}));
  EXPECT_EQ(b.count("moe-sort-chunks-map"), 0u);
  EXPECT_EQ(b.count("moe-unsort-chunks-map"), 0u);
  EXPECT_EQ(b.at("moe-sort-chunks"), 201375744);
  EXPECT_EQ(b.at("moe-permute"), 134381568);
}

// One local expert (EP = E): the received rows are already in expert order, no chunk sort.
TEST(OperatorsMoeDispatch, OneLocalExpertSkipsTheChunkSorts) {
  const ModelSpec m = *model_preset("mixtral-8x7b");
  const auto b = dispatcher_bytes(layer_ops(m, OperatorSetup{.seq = 4096, .ep = 8}));
  EXPECT_EQ(b.size(), 9u);  // topk ×2, row-id map ×3, permute ×2, unpermute ×2
  for (const auto& [name, bytes] : b) EXPECT_FALSE(name.starts_with("moe-sort")) << name;
  EXPECT_FALSE(b.count("moe-unsort-chunks"));
}

// Full recompute replays the forward dispatcher kernels (Megatron-Core re-runs the whole layer,
// its all-to-alls with it); the selective modules (save_matmuls: layernorm, moe_act) replay none.
TEST(OperatorsMoeDispatch, RecomputeReplaysTheDispatcherOnlyWhenFull) {
  const ModelSpec m = *model_preset("mixtral-8x7b");
  OperatorSetup s{.seq = 4096, .ep = 2};
  const auto plain = dispatcher_bytes(layer_ops(m, s));
  s.recompute = Recompute::full;
  const auto full = dispatcher_bytes(layer_ops(m, s));
  int replayed = 0;
  for (const auto& [name, bytes] : plain)
    if (!name.ends_with(".backward")) {
      EXPECT_EQ(full.at(name + "/r"), bytes) << name;
      ++replayed;
    }
  EXPECT_EQ(replayed, 10);  // topk, the map's 3 passes, permute, 2 sorts and their maps, unpermute
  EXPECT_EQ(full.size(), plain.size() + 10);
  s.recompute = Recompute::save_matmuls;
  EXPECT_EQ(dispatcher_bytes(layer_ops(m, s)), plain);
}

// The kernels scale with the tokens: twice the micro-batch, twice every kernel's bytes.
TEST(OperatorsMoeDispatch, BytesLinearInTokens) {
  const ModelSpec m = *model_preset("qwen3-30b-a3b");
  const auto one = dispatcher_bytes(layer_ops(m, OperatorSetup{.seq = 4096, .ep = 8}));
  const auto two =
      dispatcher_bytes(layer_ops(m, OperatorSetup{.seq = 4096, .micro_batch = 2, .ep = 8}));
  ASSERT_EQ(one.size(), two.size());
  for (const auto& [name, bytes] : one) EXPECT_DOUBLE_EQ(two.at(name), 2 * bytes) << name;
}

// A dense model, and a MoE model's dense leading layers, get no dispatcher kernel.
TEST(OperatorsMoeDispatch, DenseLayersHaveNone) {
  for (const char* name : {"llama-3-8b", "gpt3-175b", "deepseek-v3"}) {
    const ModelSpec m = *model_preset(name);
    const OperatorSetup s{.seq = 2048, .dense_layer = m.is_moe()};
    EXPECT_TRUE(detail::moe_dispatch_kernels(m, s).empty()) << name;
    EXPECT_TRUE(dispatcher_bytes(layer_ops(m, s)).empty()) << name;
  }
}

// A dense model's kernel list to the bit: Llama 3 8B's layer under four setups, its kernel count
// and the sums of its bytes and FLOPs as hex floats. A regression pin, taken from main at a34d0ea
// (before the dispatcher kernels existed), not a correctness reference: the hand counts of those
// kernels are in test_operators.cpp.
TEST(OperatorsMoeDispatch, DenseKernelsUnchangedToTheBit) {
  struct Pin {
    OperatorSetup s;
    std::size_t ops;
    double bytes, flops;
  };
  const Pin pins[] = {
      {{.seq = 4096}, 26, 0x1.3bp+32, 0x1.54p+42},
      {{.seq = 4096, .micro_batch = 2, .tp = 4, .sequence_parallel = true}, 26, 0x1.5cp+31,
       0x1.54p+41},
      {{.seq = 8192, .recompute = Recompute::full}, 37, 0x1.78p+33, 0x1.e8p+43},
      {{.seq = 4096, .recompute = Recompute::save_matmuls, .recipe = Precision::mxfp8}, 42,
       0x1.d6ep+32, 0x1.54p+42}};
  const ModelSpec m = *model_preset("llama-3-8b");
  for (const Pin& p : pins) {
    const auto ops = layer_ops(m, p.s);
    double bytes = 0, flops = 0;
    for (const Op& op : ops) {
      bytes += op.bytes;
      flops += op.flops;
    }
    EXPECT_EQ(ops.size(), p.ops);
    EXPECT_EQ(bytes, p.bytes);
    EXPECT_EQ(flops, p.flops);
  }
}

}  // namespace
}  // namespace tally::test_operators_moe_dispatch
