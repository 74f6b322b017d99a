// End-to-end tests of the `tally` binary for mixture-of-experts layouts and low-precision recipes
// (issue 15): expert parallelism and expert TP, node-limited routing, fp8's saved inputs and amax
// histories, fp8's weight copies by GPU and FSDP's float8 all-gather — each figure worked by hand
// in the comment above its test (the CLI must print what core computes), and exit code 2 with one
// line naming the flag for bad input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "run_tally.hpp"

namespace test_cli_moe {
namespace {

using tally::cli_test::expect_bad_input;
using tally::cli_test::json_of;
using tally::cli_test::tally;

// Expert parallelism on the command line (Note [expert parallelism]). Mixtral 8x7B: 46,702,792,704
// params, of which the routed experts are 45,097,156,608 (32 layers × 8 × 3·4096·14336); with
// --dp 8 --ep 4 a GPU holds the other 1,605,636,096 and 2 of the 8 experts; its all-to-alls are 4
// per layer, 128 calls, each sending 3/4 of 4096 tokens × top-2 × 4096 × 2 B.
TEST(Cli, ExpertParallelFlags) {
  const auto mem = json_of(tally("memory --model mixtral-8x7b --dp 8 --ep 4 --zero 1 --json"));
  EXPECT_NEAR(mem["params_per_gpu"].get<double>(), 1605636096.0 + 45097156608.0 / 4, 1);
  EXPECT_NE(mem["convention"].get<std::string>().find("EP 4"), std::string::npos);
  const auto comm = json_of(tally("comm --model mixtral-8x7b --dp 8 --ep 4 --seq 4096 --json"));
  bool found = false;
  for (const auto& it : comm["items"])
    if (it["kind"] == "ep-all-to-all") {
      found = true;
      EXPECT_EQ(it["collective"], "all-to-all");
      EXPECT_DOUBLE_EQ(it["calls"].get<double>(), 128);
      EXPECT_DOUBLE_EQ(it["bytes_per_call"].get<double>(), 4096.0 * 2 * 4096 * 2 * 3 / 4);
    }
  EXPECT_TRUE(found) << comm.dump();
  const auto cmp = json_of(tally("compare --model mixtral-8x7b --gpu h100-80g --gpus 16 "
                                 "--global-batch 64 --seq 4096 --ep 8 --zero 1 --micro-batch 1 "
                                 "--recompute full --alternative double-gpus --json"));
  EXPECT_EQ(cmp["options"][0]["eval"]["ep"], 8) << cmp.dump();
  EXPECT_GT(cmp["options"][0]["eval"]["ep_seconds"].get<double>(), 0);
  const auto plan = json_of(tally("plan --model mixtral-8x7b --gpu h100-80g --gpus 16 "
                                  "--global-batch 64 --seq 4096 --max-ep 1 --json"));
  EXPECT_EQ(plan["best"]["ep"], 1) << plan["best"];
  for (const auto& p : plan["alternatives"]) EXPECT_EQ(p["ep"], 1);
  // Refused with one line naming --ep: a dense model, EP not dividing the experts or --dp.
  for (const char* bad : {"memory --model llama-3-8b --dp 2 --ep 2",
                          "memory --model mixtral-8x7b --dp 16 --ep 16",
                          "memory --model mixtral-8x7b --dp 6 --ep 4",
                          "comm --model mixtral-8x7b --dp 6 --ep 4",
                          "comm --model mixtral-8x7b --dp 8 --ep 4 --capacity-factor 0.5",
                          "plan --model mixtral-8x7b --gpus 16 --capacity-factor nan"}) {
    const std::string err = expect_bad_input(bad);
    EXPECT_TRUE(err.find("--ep") != std::string::npos ||
                err.find("--capacity-factor") != std::string::npos)
        << bad << ": " << err;
  }
}

// Expert TP on the command line (Note [expert tensor parallelism]). Mixtral on --tp 2 --sp --dp 8:
// with --ep 8 --etp 1 a GPU holds half of the 1,605,636,096 other params and one whole expert per
// layer, 45,097,156,608 / 8; with the default ETP = TP 2 and --ep 4 the pair all-gathers its
// dispatched copies, 4 calls per layer × 32, each sending 2048 tokens × top-2 × 4096 × 2 B.
TEST(Cli, ExpertTensorParallelFlags) {
  const auto mem = json_of(tally("memory --model mixtral-8x7b --tp 2 --sp --dp 8 --ep 8 --etp 1 "
                                 "--zero 1 --seq 4096 --json"));
  EXPECT_NEAR(mem["params_per_gpu"].get<double>(), 1605636096.0 / 2 + 45097156608.0 / 8, 1);
  EXPECT_NE(mem["convention"].get<std::string>().find("ETP 1"), std::string::npos);
  const auto comm = json_of(tally("comm --model mixtral-8x7b --tp 2 --sp --dp 8 --ep 4 --seq 4096 "
                                  "--json"));
  bool found = false;
  for (const auto& it : comm["items"])
    if (it["kind"] == "expert-tp") {
      found = true;
      EXPECT_DOUBLE_EQ(it["calls"].get<double>(), 128);
      EXPECT_DOUBLE_EQ(it["bytes_per_call"].get<double>(), 2048.0 * 2 * 4096 * 2);
      EXPECT_EQ(it["group"], 2);
    }
  EXPECT_TRUE(found) << comm.dump();
  const auto cmp = json_of(tally("compare --model mixtral-8x7b --gpu h100-80g --gpus 16 --tp 2 "
                                 "--sp --global-batch 64 --seq 4096 --ep 8 --etp 1 --zero 1 "
                                 "--micro-batch 1 --recompute full --alternative double-gpus "
                                 "--json"));
  EXPECT_EQ(cmp["options"][0]["eval"]["etp"], 1) << cmp.dump();
  const auto plan = json_of(tally("plan --model mixtral-8x7b --gpu h100-80g --gpus 16 "
                                  "--global-batch 64 --seq 4096 --etp tp --json"));
  EXPECT_EQ(plan["best"]["etp"], plan["best"]["tp"]) << plan["best"];
  for (const auto& p : plan["alternatives"]) EXPECT_EQ(p["etp"], p["tp"]);
  // Refused with one line naming --etp: ETP other than TP without SP, an ETP not dividing the
  // experts' width, a dense model, a plan value other than tp, 1 or any.
  for (const char* bad : {"memory --model mixtral-8x7b --tp 2 --dp 8 --ep 8 --etp 1 --seq 4096",
                          "comm --model mixtral-8x7b --tp 2 --sp --dp 8 --etp 3",
                          "memory --model llama-3-8b --tp 2 --sp --etp 1 --seq 4096",
                          "plan --model mixtral-8x7b --gpus 16 --etp 2"}) {
    const auto r = tally(bad);
    EXPECT_EQ(r.rc, 2) << bad;
    EXPECT_NE(r.err.find("--etp"), std::string::npos) << bad << ": " << r.err;
  }
}

// Node-limited routing on the command line (DeepSeek-V3 §2.1.2: each token to at most 4 nodes).
// DeepSeek-V3 on --dp 64 --ep 64 over 8 H100 hosts, s 4096: S = 4096 · 8 · 7168 · 2 B per call, 4
// calls per MoE layer × 58 = 232. Plain, a rank sends 56/64 of S to other hosts; with
// --max-route-nodes 4 each token crosses once per remote target node, 4·7/8 against 8·7/8 copies:
// half; and every copy not already on its expert's GPU crosses NVLink once, 7/8 of S.
TEST(Cli, NodeLimitedRouting) {
  const double S = 4096.0 * 8 * 7168 * 2;
  const char* cmd = "comm --model deepseek-v3 --dp 64 --ep 64 --seq 4096 --gpu h100-80g --json";
  for (const int m : {0, 4}) {
    const auto j = json_of(tally(std::string(cmd) + " --max-route-nodes " + std::to_string(m)));
    bool found = false;
    for (const auto& it : j["items"])
      if (it["kind"] == "ep-all-to-all") {
        found = true;
        EXPECT_EQ(it["nodes"], 8);
        EXPECT_EQ(it["max_route_nodes"], m);
        EXPECT_DOUBLE_EQ(it["calls"].get<double>(), 232);
        EXPECT_NEAR(it["inter_node_bytes_per_rank"].get<double>(),
                    232 * S * 56 / 64 * (m == 4 ? 0.5 : 1.0), 1);
        EXPECT_NEAR(it["intra_node_bytes_per_rank"].get<double>(),
                    232 * S * (m == 4 ? 7.0 / 8 : 7.0 / 64), 1);
      }
    EXPECT_TRUE(found) << j.dump();
  }
  const auto plan = json_of(tally("plan --model deepseek-v3 --gpus 1024 --gpu h100-80g "
                                  "--global-batch 8192 --seq 4096 --max-pp 1 --max-cp 1 "
                                  "--max-route-nodes 4 --json"));
  EXPECT_NE(plan["convention"].get<std::string>().find("at most 4 nodes"), std::string::npos);
  for (const char* bad : {"comm --model llama-3-8b --dp 8 --max-route-nodes 4",
                          "plan --model llama-3-8b --gpus 8 --max-route-nodes 4",
                          "comm --model deepseek-v3 --dp 8 --ep 8 --max-route-nodes -1"}) {
    const auto r = tally(bad);
    EXPECT_EQ(r.rc, 2) << bad;
    EXPECT_NE(r.err.find("--max-route-nodes"), std::string::npos) << bad << ": " << r.err;
  }
}

// fp8 on the command line (Note [low precision]): Llama 3 8B's 32 layers × 4 GEMMs keep delayed
// scaling's 5 fp32 amax histories and scales each, 128 · 5 · 4 · (1024 + 1) B (or · (1 + 1) with
// --amax-history 1, Megatron-Core's default); its linears save their inputs in fp8, h + f = 18,432
// fewer bytes per token and layer than bf16 (Activations.LowPrecisionRecipesSaveQuantizedLinear-
// Inputs), 4096 tokens here.
TEST(Cli, Fp8SavedInputsAndAmaxHistory) {
  const auto bf16 = json_of(tally("memory --model llama-3-8b --seq 4096 --json"));
  const auto fp8 = json_of(tally("memory --model llama-3-8b --seq 4096 --precision fp8 --json"));
  EXPECT_NEAR(fp8["items_gb"]["scaling_metadata"].get<double>(), 128 * 20500 / 1e9, 1e-12);
  EXPECT_NEAR(bf16["activations"]["per_layer_gb"].get<double>() -
                  fp8["activations"]["per_layer_gb"].get<double>(),
              4096.0 * 18432 / 1e9, 1e-9);
  const auto one = json_of(tally("memory --model llama-3-8b --precision fp8 --amax-history 1 "
                                 "--json"));
  EXPECT_NEAR(one["items_gb"]["scaling_metadata"].get<double>(), 128 * 40 / 1e9, 1e-12);
  EXPECT_NE(one["convention"].get<std::string>().find("amax history 1 "), std::string::npos);
  const auto plan = json_of(tally("plan --model llama-3-8b --gpu h100-80g --gpus 8 "
                                  "--global-batch 64 --seq 8192 --precision fp8 --json"));
  EXPECT_GT(plan["best"]["states_gb"]["scaling_metadata"].get<double>(), 0);
  for (const char* bad : {"memory --model llama-3-8b --precision fp8 --amax-history 0",
                          "plan --model llama-3-8b --gpu h100-80g --precision fp8 "
                          "--amax-history -3"}) {
    const auto r = tally(bad);
    EXPECT_EQ(r.rc, 2) << bad;
    EXPECT_NE(r.err.find("--amax-history"), std::string::npos) << bad << ": " << r.err;
  }
}

// Note [fp8 operand layouts] on the command line, in the label and in --json. Llama 3 8B's
// 6,979,321,856 linear weights (counted by hand in test_comm_collectives.cpp): with --gpu b200
// (compute capability 10.0) fp8 keeps 1 B of copies per weight, without a GPU 2 B (TN only
// assumed).
TEST(Cli, Fp8WeightCopiesFollowTheGpu) {
  const auto none = json_of(tally("memory --model llama-3-8b --precision fp8 --json"));
  const auto b200 = json_of(tally("memory --model llama-3-8b --precision fp8 --gpu b200 --json"));
  EXPECT_EQ(none["bytes_per_param"]["low_precision_copies"].get<double>(), 2.0);
  EXPECT_EQ(b200["bytes_per_param"]["low_precision_copies"].get<double>(), 1.0);
  EXPECT_NEAR(b200["items_gb"]["low_precision_copies"].get<double>(), 6.979321856, 1e-9);
  const std::string b200_label = b200["convention"];
  EXPECT_NE(b200_label.find("the weight alone (compute capability 10.0"), std::string::npos);
  EXPECT_NE(none["convention"].get<std::string>().find("assumed"), std::string::npos);
  const auto plan = json_of(tally("plan --model llama-3-8b --gpu b200 --gpus 8 --global-batch 64 "
                                  "--seq 8192 --precision fp8 --json"));
  EXPECT_EQ(plan["request"]["compute_capability"].get<int>(), 100);
  EXPECT_EQ(plan["request"]["weight_copy_bytes_per_param"].get<double>(), 1.0);
}

// Note [fp8 all-gather] on the command line: `comm` at ZeRO-3 over 8 with
// --fsdp-float8-all-gather gathers 2N − L bytes where bf16 gathers 2N (N = 8,030,261,248, L the
// linear weights above); the label and --json say so; only --precision fp8 at ZeRO-3 may ask.
TEST(Cli, FsdpGathersFloat8) {
  const char* comm = "comm --model llama-3-8b --dp 8 --zero 3 --precision fp8 --json";
  const auto bf16 = json_of(tally(comm));
  const auto fp8 = json_of(tally(std::string(comm) + " --fsdp-float8-all-gather"));
  auto gather = [](const nlohmann::json& j) {
    for (const auto& it : j["items"])
      if (it["kind"] == "zero-param-gather") return it["bytes_per_call"].get<double>();
    return -1.0;
  };
  const double N = 8030261248.0, L = 6979321856.0;
  EXPECT_NEAR(gather(fp8) / gather(bf16), (2 * N - L) / (2 * N), 1e-12);
  EXPECT_NEAR(fp8["fp8_gather_share"].get<double>(), L / N, 1e-15);
  EXPECT_NE(fp8["convention"].get<std::string>().find("float8"), std::string::npos);
  const auto plan = json_of(tally("plan --model llama-3-8b --gpu b200 --gpus 8 --global-batch 64 "
                                  "--seq 8192 --precision fp8 --fsdp-float8-all-gather --json"));
  EXPECT_TRUE(plan["request"]["fsdp_float8_all_gather"].get<bool>());
  EXPECT_NE(plan["convention"].get<std::string>().find("enable_fsdp_float8_all_gather"),
            std::string::npos);
  for (const char* bad : {"comm --model llama-3-8b --dp 8 --zero 3 --precision mxfp8 "
                          "--fsdp-float8-all-gather",
                          "comm --model llama-3-8b --dp 8 --zero 1 --precision fp8 "
                          "--fsdp-float8-all-gather",
                          "plan --model llama-3-8b --gpu b200 --fsdp-float8-all-gather"}) {
    const auto r = tally(bad);
    EXPECT_EQ(r.rc, 2) << bad;
    EXPECT_TRUE(r.err.find("--fsdp-float8-all-gather") != std::string::npos ||
                r.err.find("zero") != std::string::npos)
        << bad << ": " << r.err;
  }
}

// Note [fp8 parameters] on the command line: `memory --fp8-param-gather` drops the bf16 copy of
// the linear weights. Llama 3 70B by hand (config.json: h 8192, kv 1024, f 28672, 80 layers): per
// layer q and o 8192², k and v 8192·1024, gate, up, down 8192·28672 = 855,638,016 linear weights,
// 68,451,041,280 in all; on one of 4 stages 2 B × 68,451,041,280 / 4 = 34.2255 GB fewer params;
// grads, moments and the MXFP8 copies unchanged. nvfp4 (bf16 weights in Megatron-Bridge's recipe)
// and bf16 refuse it naming the flag; plan and comm carry it in --json.
TEST(Cli, Fp8ParametersDropTheBf16LinearWeights) {
  const std::string mem =
      "memory --model llama-3-70b --pp 4 --dp 16 --zero 1 --precision mxfp8 --json";
  const auto plain = json_of(tally(mem));
  const auto fp8 = json_of(tally(mem + " --fp8-param-gather"));
  const double L = 80 * (2 * 8192.0 * 8192 + 2 * 8192.0 * 1024 + 3 * 8192.0 * 28672);
  EXPECT_DOUBLE_EQ(L, 68451041280.0);
  EXPECT_NEAR(plain["items_gb"]["params"].get<double>() - fp8["items_gb"]["params"].get<double>(),
              2 * L / 4 / 1e9, 1e-6);
  for (const char* item : {"grads", "m", "v", "master"})
    EXPECT_DOUBLE_EQ(plain["items_gb"][item].get<double>(), fp8["items_gb"][item].get<double>())
        << item;
  EXPECT_TRUE(fp8["fp8_param_gather"].get<bool>());
  EXPECT_NE(fp8["convention"].get<std::string>().find("--fp8-param-gather"), std::string::npos);
  const auto plan = json_of(tally("plan --model llama-3-8b --gpu b200 --gpus 8 --global-batch 64 "
                                  "--seq 8192 --precision fp8 --fp8-param-gather --json"));
  EXPECT_TRUE(plan["request"]["fp8_param_gather"].get<bool>());
  const auto comm = json_of(tally("comm --model llama-3-8b --dp 8 --zero 1 --precision fp8 "
                                  "--fp8-param-gather --json"));
  EXPECT_TRUE(comm["fp8_param_gather"].get<bool>());
  EXPECT_GT(comm["fp8_gather_share"].get<double>(), 0.8);
  for (const char* bad : {"memory --model llama-3-70b --precision nvfp4 --fp8-param-gather",
                          "plan --model llama-3-8b --gpu b200 --precision bf16 --fp8-param-gather",
                          "comm --model llama-3-8b --dp 8 --zero 1 --fp8-param-gather"}) {
    const auto r = tally(bad);
    EXPECT_EQ(r.rc, 2) << bad;
    EXPECT_NE(r.err.find("--fp8-param-gather"), std::string::npos) << bad << ": " << r.err;
  }
}

// The flags DeepSeek-V3's Megatron-Bridge recipes need. --mtp-layers (Note [multi-token
// prediction], core/src/model.cpp): DeepSeek-V3's module by hand from its weight file's layer 61: a
// MoE layer — MLA 187,105,280 (7168·1536 + 1536·128·192 + 7168·576 + 512·128·256 + 128·128·7168),
// norms 16,384 (2·7168 + 1536 + 512), 257 experts of 3·7168·2048 = 11,318,329,344, router 256·7168
// + 256 = 1,835,264 — plus the projection 2·7168² = 102,760,448 and three norms 3·7168:
// 11,610,068,224 beside the main model's 671,026,419,200. The report names the module; fine-tuning,
// --params and more modules than layers are refused.
TEST(Cli, DeepSeekV3RecipeFlags) {
  const auto mem = json_of(tally("memory --model deepseek-v3 --mtp-layers 1 --json"));
  EXPECT_EQ(mem["n_params"].get<long long>(), 671026419200LL + 11610068224LL) << mem.dump();
  EXPECT_EQ(mem["model"], "deepseek-v3 + 1 MTP module");
  const auto plan = json_of(tally("compare --model deepseek-v3 --mtp-layers 1 --gpu b300 "
                                  "--gpus 256 --global-batch 4096 --seq 4096 --precision mxfp8 "
                                  "--pp 8 --ep 8 --zero 1 --micro-batch 2 "
                                  "--alternative double-gpus --json"));
  EXPECT_EQ(plan["options"][0]["eval"]["stage_layers"],
            nlohmann::json::parse("[8, 8, 8, 8, 8, 8, 8, 5]"));
  // --recompute-modules (core/types.hpp RecomputeModules): mla_up_proj keeps no q, k, v — per
  // layer 2·4096·128·(192 + 192 + 128) bytes at micro-batch 1, s 4096, TP 1 — on the PP 8
  // layout's fullest stage, 8 layers × in-flight micro-batches, so activations fall.
  const std::string base = "compare --model deepseek-v3 --gpu b300 --gpus 256 --global-batch 4096 "
                           "--seq 4096 --pp 8 --ep 8 --zero 1 --micro-batch 1 "
                           "--alternative double-gpus --json";
  const auto none = json_of(tally(base));
  const auto up = json_of(tally(base + " --recompute-modules mla_up_proj"));
  EXPECT_LT(up["options"][0]["eval"]["activations_gb"].get<double>(),
            none["options"][0]["eval"]["activations_gb"].get<double>());
  EXPECT_GT(up["options"][0]["eval"]["step_seconds"].get<double>(),
            none["options"][0]["eval"]["step_seconds"].get<double>());
  expect_bad_input(base + " --recompute-modules moe", {"--recompute-modules"});
  // `tally memory` takes them too, by the same inventory, and says so in its convention.
  const auto mem_none = json_of(tally("memory --model deepseek-v3 --seq 4096 --json"));
  const auto mem_up = json_of(
      tally("memory --model deepseek-v3 --seq 4096 --recompute-modules mla_up_proj --json"));
  EXPECT_LT(mem_up["activations"]["blocks_phase_gb"].get<double>(),
            mem_none["activations"]["blocks_phase_gb"].get<double>());
  EXPECT_NE(mem_up["activations"]["convention"].get<std::string>().find("mla_up_proj"),
            std::string::npos);
  expect_bad_input("memory --params 7B --mtp-layers 1", {"--mtp-layers"});
  expect_bad_input("plan --model llama-3-8b --mtp-layers 33", {"--mtp-layers", "0..32"});
  expect_bad_input("memory --model llama-3-8b --method lora --mtp-layers 1", {"mtp-layers"});
}

}  // namespace
}  // namespace test_cli_moe
