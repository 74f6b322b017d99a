// A mixture-of-experts layer with expert parallelism (issue 15; tally/engine/experiments/moe.hpp,
// engine/runtime/moe_layer.hpp) over real processes on loopback:
//   equivalence  float64 output and every gradient (router, experts, shared expert, input) vs the
//                single-process layer (a dense formulation: every expert on every token, gated;
//                no slot buffers, no exchange) <= 1e-10 relative at ep = 4, 2 (sub-groups of one
//                4-rank launch) and 1; the copies dropped at capacity agree exactly;
//   bytes        against hand arithmetic: S = T·k·c_f·h·8 bytes scattered per all-to-all, S(ep−1)/ep
//                sent (pairwise exchange, Thakur, Rabenseifner & Gropp 2005), 4 per layer
//                (dispatch + combine, forward + backward; Megatron-Core's MoE token dispatcher);
//                with C rounded up (c_f = 1.1) the padded E·C slots travel instead;
//   memory       fp32 parameters + gradients + Adam m, v per rank = 16 bytes x (router E·h + shared
//                3·f_s·h + E/ep experts of 3·f·h or 2·f·h), counted by hand;
//   the CLI      bad input exits 2 with one line naming the flag; `tally launch -- tally run moe
//                --json` reports measured beside predicted (a dropless GeLU layer, c_f = E/k).
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "rank_harness.hpp"
#include "../support/subprocess.hpp"
#include "tally/engine/experiments/moe.hpp"

#ifndef TALLY_BINARY
#error "TALLY_BINARY must name the tally executable"
#endif

namespace tally::engine::exp_moe {
namespace {

using nlohmann::json;
using subprocess::Ran;
using subprocess::rank_lines;
using subprocess::run_command;

constexpr double kLimit_s = 90;  // one run of 4 ranks on a loaded 2-core box; ctest's 300 s backstop

TEST(MoeOptions, BadInputNamesTheFlagAndRange) {
  auto message = [](MoeOptions o, int world) -> std::string {
    try {
      o.validate(world);
    } catch (const InvalidInput& e) {
      return e.what();
    }
    return "no throw";
  };
  MoeOptions o;
  o.ep = {3};
  EXPECT_EQ(message(o, 3), "--ep = 3: must divide --experts = 8 (each rank holds experts/ep; "
                           "allowed: 1, 2, 4, 8)");
  EXPECT_EQ(message(o, 4), "--ep = 3: must divide the world size 4 (EP groups of adjacent ranks; "
                           "allowed: 1, 2, 4)");
  o.ep = {2};
  o.layer.top_k = 9;
  EXPECT_EQ(message(o, 2), "--top-k = 9: must be in [1, --experts = 8]");
  o.layer.top_k = 2;
  o.layer.capacity_factor = 0.5;
  EXPECT_EQ(message(o, 2), "--capacity-factor = 0.5: must be in [1, 64] (core's range; 1 = the "
                           "balanced share)");
}

// Hand arithmetic for one variant: T tokens, k, c_f, h; N_local states in fp32 Adam.
void expect_variant(const MoeVariant& v, const MoeOptions& o, double slots_per_rank) {
  const MoeConfig& l = o.layer;
  SCOPED_TRACE("ep=" + std::to_string(v.ep));
  EXPECT_LE(v.max_output_rel_diff, 1e-10);
  EXPECT_LE(v.max_grad_rel_diff, 1e-10) << v.worst_grad;
  EXPECT_EQ(v.dropped, v.reference_dropped);
  const double ep = v.ep;
  const double S = slots_per_rank * double(l.hidden) * 8;  // float64 tokens scattered
  EXPECT_EQ(v.all_to_all_calls, 4);                         // ep = 1 too: counted, 0 bytes
  EXPECT_DOUBLE_EQ(v.all_to_all_bytes, 4 * S * (ep - 1) / ep);
  const double m = l.mlp == MlpKind::gelu ? 2 : 3;
  const double local = double(l.experts * l.hidden) + m * double(l.shared_ffn * l.hidden) +
                       double(l.experts) / ep * m * double(l.ffn * l.hidden);
  EXPECT_DOUBLE_EQ(v.state_bytes, 16 * local);
  EXPECT_DOUBLE_EQ(v.predicted_states.bytes.total(), 16 * local);
}

// One launch of 4 ranks: EP groups of 4, then of 2 ({0,1}, {2,3}); SwiGLU with a shared expert,
// c_f = 1: C = 32·2/8 = 8 slots, exactly T·k/E, so every byte figure equals core's.
TEST(MoeEquivalence, Ep4And2OnFourRanks) {
  const auto run = harness::run_ranks(4, kLimit_s, [](const DistEnv& env) {
    MoeOptions o{.ep = {4, 2}, .tokens = 32, .timeout_s = 60};
    o.layer.shared_ffn = 8;
    const MoeResult r = run_moe(env, o);
    ASSERT_EQ(r.variants.size(), 2u);
    EXPECT_EQ(r.n_params, 8 * 16 + 3 * 8 * 16 + 8 * 3 * 32 * 16);
    for (const MoeVariant& v : r.variants) {
      expect_variant(v, o, 32 * 2 * 1.0);
      EXPECT_EQ(v.capacity, 8);
      EXPECT_TRUE(v.capacity_exact);
      EXPECT_DOUBLE_EQ(v.predicted.ep.bytes_per_rank, v.all_to_all_bytes);
    }
    EXPECT_EQ(r.variants[1].group, env.rank / 2);
    for (const MoeCheck& c : moe_checks(r)) EXPECT_TRUE(c.ok) << c.what << ": " << c.measured;
  });
  EXPECT_TRUE(run.all_ok()) << run.describe();
}

// GeLU, c_f = 1.1 on T = 20: C = ⌈1.1·20·2/8⌉ = ⌈5.5⌉ = 6, E·C = 48 slots travel where core's
// balanced expectation is T·k·c_f = 44; ep = 1 runs the same layer with no exchange.
TEST(MoeEquivalence, RoundedCapacitySendsThePaddedSlots) {
  const auto run = harness::run_ranks(2, kLimit_s, [](const DistEnv& env) {
    MoeOptions o{.ep = {2, 1}, .tokens = 20, .timeout_s = 60};
    o.layer.mlp = MlpKind::gelu;
    o.layer.capacity_factor = 1.1;
    const MoeResult r = run_moe(env, o);
    ASSERT_EQ(r.variants.size(), 2u);
    for (const MoeVariant& v : r.variants) {
      expect_variant(v, o, 48);
      EXPECT_EQ(v.capacity, 6);
      EXPECT_FALSE(v.capacity_exact);
    }
    EXPECT_DOUBLE_EQ(r.variants[0].predicted.ep.bytes_per_call, 44 * 16 * 8 / 2.0);
    for (const MoeCheck& c : moe_checks(r)) EXPECT_TRUE(c.ok) << c.what << ": " << c.measured;
  });
  EXPECT_TRUE(run.all_ok()) << run.describe();
}

std::vector<std::string> as_rank0_of(int k, const std::vector<std::string>& flags) {
  return subprocess::as_rank0_of(TALLY_BINARY, "moe", k, flags);
}

TEST(MoeCli, BadInputExitsTwoWithOneLine) {
  const Ran a = run_command(as_rank0_of(2, {"--ep", "2", "--experts", "3"}), kLimit_s);
  EXPECT_EQ(a.exit_code, 2) << a.err;
  EXPECT_NE(a.err.find("--ep = 2: must divide --experts = 3"), std::string::npos) << a.err;
  EXPECT_EQ(std::count(a.err.begin(), a.err.end(), '\n'), 1) << a.err;
  const Ran b = run_command(as_rank0_of(1, {"--top-k", "9"}), kLimit_s);
  EXPECT_EQ(b.exit_code, 2) << b.err;
  EXPECT_NE(b.err.find("--top-k = 9: must be in [1, --experts = 8]"), std::string::npos) << b.err;
  const Ran c = run_command(as_rank0_of(1, {"--capacity-factor", "0.5"}), kLimit_s);
  EXPECT_EQ(c.exit_code, 2) << c.err;
  EXPECT_NE(c.err.find("--capacity-factor"), std::string::npos) << c.err;
  EXPECT_EQ(std::count(c.err.begin(), c.err.end(), '\n'), 1) << c.err;
}

// Dropless: c_f = E/k = 4 gives C = T = 32 slots, so no copy is dropped; S = 32·2·4·16·8.
TEST(MoeCli, JsonMeasuredBesidePredicted) {
  const Ran r = run_command(
      {TALLY_BINARY, "launch", "--nproc", "2", "--timeout", "80", "--", TALLY_BINARY, "run", "moe",
       "--ep", "2", "--mlp", "gelu", "--capacity-factor", "4", "--json", "--timeout", "60"},
      kLimit_s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_TRUE(rank_lines(r.out, 1).empty()) << "rank 0 reports";
  const auto lines = rank_lines(r.out, 0);
  ASSERT_EQ(lines.size(), 1u) << r.out;
  const json j = json::parse(lines[0]);
  EXPECT_EQ(j["experiment"], "moe");
  EXPECT_TRUE(j["ok"].get<bool>()) << j["failed_checks"].dump();
  ASSERT_EQ(j["variants"].size(), 1u);
  const json& v = j["variants"][0];
  const double S = 32 * 2 * 4 * 16 * 8.0;
  EXPECT_EQ(v["capacity_slots"], 32);
  EXPECT_DOUBLE_EQ(v["dropped"]["measured"].get<double>(), 0);
  EXPECT_DOUBLE_EQ(v["bytes_per_all_to_all"]["measured"].get<double>(), S / 2);
  EXPECT_DOUBLE_EQ(v["bytes_per_all_to_all"]["ratio"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(v["all_to_all_bytes_per_layer"]["predicted"].get<double>(), 4 * S / 2);
  EXPECT_DOUBLE_EQ(v["model_state_bytes_fp32"]["ratio"].get<double>(), 1.0);
  EXPECT_NE(r.err.find("moe ep=2: f64 output diff "), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tally::engine::exp_moe
