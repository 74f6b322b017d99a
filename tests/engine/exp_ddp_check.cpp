// `tally run ddp-check` end to end through the real binary under `tally launch` at world sizes 2
// and 4: every acceptance criterion of the seed's ddp_check.py (①–⑤) asserted on the numbers in
// each rank's JSON; plus PyTorch itself as a peer — the seed's ddp_check.py verbatim under `tally
// launch`, and its gradients (tests/engine/data/ddp_grads.py) against tally's. No torch here: the
// ranks are separate processes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../support/subprocess.hpp"

#ifndef TALLY_BINARY
#error "TALLY_BINARY must name the tally executable"
#endif

namespace {

using tally::subprocess::rank_lines;
using tally::subprocess::Ran;
using tally::subprocess::run_command;
using nlohmann::json;

constexpr double kLimit_s = 90;  // whole launch; a rank needs ~2 s, a loaded 2-core box more
const std::string kPython = "/usr/bin/python3";
// The PyTorch peer is part of the test: without it the test fails, never skips.
const std::string kNoTorch =
    kPython + " cannot import torch (scripts/install-deps.sh installs python3-torch)";
const std::string kData = std::string(TALLY_SOURCE_DIR) + "/tests/engine/data/";

std::vector<std::string> launch(int k, std::vector<std::string> command) {
  std::vector<std::string> args = {TALLY_BINARY, "launch", "--nproc", std::to_string(k),
                                   "--timeout", "75", "--"};
  args.insert(args.end(), command.begin(), command.end());
  return args;
}

// Each rank's one-line JSON object.
std::vector<json> rank_json(const Ran& r, int k) {
  std::vector<json> out;
  for (int rank = 0; rank < k; ++rank) {
    const auto lines = rank_lines(r.out, rank);
    EXPECT_EQ(lines.size(), 1u) << "rank " << rank << ":\n" << r.out;
    out.push_back(lines.empty() ? json() : json::parse(lines[0], nullptr, false));
    EXPECT_FALSE(out.back().is_discarded()) << lines[0];
  }
  return out;
}

class DdpCheck : public ::testing::TestWithParam<int> {};

TEST_P(DdpCheck, EveryCriterionHoldsOnEveryRank) {
  const int k = GetParam();
  const Ran r = run_command(
      launch(k, {TALLY_BINARY, "run", "ddp-check", "--json", "--timeout", "40"}), kLimit_s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  const std::vector<json> ranks = rank_json(r, k);
  double grad_norm_rank0 = 0;
  for (int rank = 0; rank < k; ++rank) {
    const json& j = ranks[rank];
    SCOPED_TRACE("rank " + std::to_string(rank) + ": " + j.dump());
    EXPECT_EQ(j["rank"], rank);
    EXPECT_EQ(j["world_size"], k);  // ③ world size
    EXPECT_EQ(j["samples"], 64 / k);
    // ① DDP's averaged gradient is the full-batch gradient (float32).
    EXPECT_LT(j["max_grad_error"].get<double>(), 1e-5);
    // ② after one SGD step every replica equals rank 0's, exactly.
    EXPECT_EQ(j["max_param_diff_vs_rank0"].get<double>(), 0.0);
    // ③ loss and gradient norm are reported and plausible: 4 classes, loss near ln 4.
    EXPECT_GT(j["local_loss"].get<double>(), 0.5);
    EXPECT_LT(j["local_loss"].get<double>(), 3.0);
    EXPECT_GT(j["local_grad_norm"].get<double>(), 0.0);
    EXPECT_GT(j["ddp_grad_norm"].get<double>(), 0.0);
    // ④ DDP is "sum then divide by world", checked by hand on 2.weight.
    EXPECT_EQ(j["manual_param"], "2.weight");
    EXPECT_LT(j["manual_all_reduce_error"].get<double>(), 1e-6);
    EXPECT_TRUE(j["ok"].get<bool>());
    // One sync event, one bucket (676 float32 gradients < 25 MiB), bytes from 2S(k−1)/k.
    const double S = 676 * 4;
    EXPECT_EQ(j["buckets"], 1);
    EXPECT_EQ(j["ddp"]["sync_events"], 1);
    EXPECT_EQ(j["ddp"]["bucket_all_reduces"], 1);
    EXPECT_EQ(j["ddp"]["wire_dtype"], "float32");
    EXPECT_DOUBLE_EQ(j["ddp"]["wire_bytes_per_sync"].get<double>(), S);
    EXPECT_DOUBLE_EQ(j["ddp"]["gradient_bytes_sent"].get<double>(), 2 * S * (k - 1) / k);
    // The Comm saw the bucket plus ④'s hand-written all-reduce; two broadcasts (start, ②).
    EXPECT_EQ(j["comm"]["all_reduce_calls"], 2);
    EXPECT_EQ(j["comm"]["broadcast_calls"], 2);
    // Everyone holds the same averaged gradient.
    if (rank == 0) grad_norm_rank0 = j["ddp_grad_norm"].get<double>();
    EXPECT_EQ(j["ddp_grad_norm"].get<double>(), grad_norm_rank0);
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, DdpCheck, ::testing::Values(2, 4),
                         [](const auto& info) { return "k" + std::to_string(info.param); });

TEST(DdpCheckText, PrintsEachCriterionAndItsNumbers) {
  const Ran r = run_command(launch(2, {TALLY_BINARY, "run", "ddp-check", "--timeout", "40"}),
                            kLimit_s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 2; ++rank) {
    const auto lines = rank_lines(r.out, rank);
    ASSERT_EQ(lines.size(), 6u) << r.out;
    EXPECT_EQ(lines[0].rfind("ddp-check: rank " + std::to_string(rank) + " of world 2", 0), 0u);
    EXPECT_NE(lines[1].find("③ loss "), std::string::npos) << lines[1];
    EXPECT_NE(lines[2].find("① max|g_ddp − g_full| = "), std::string::npos) << lines[2];
    EXPECT_NE(lines[3].find("(atol 0): ok"), std::string::npos) << lines[3];
    EXPECT_NE(lines[4].find("④ all_reduce(g)/world by hand on 2.weight"), std::string::npos);
    EXPECT_NE(lines[2].find(": ok"), std::string::npos) << lines[2];
  }
}

TEST(DdpCheckInput, WorldSizeNotDividingTheBatchIsBadInput) {
  const Ran r = run_command(launch(3, {TALLY_BINARY, "run", "ddp-check"}), kLimit_s);
  EXPECT_EQ(r.exit_code, 1) << r.err;  // launch: a rank failed (each exits 2)
  EXPECT_NE(r.err.find("WORLD_SIZE = 3: ddp-check needs a world size dividing its 64 samples"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("exited with status 2"), std::string::npos) << r.err;
}

bool python_has_torch() {
  if (access(kPython.c_str(), X_OK) != 0) return false;
  return run_command({kPython, "-c", "import torch"}, 60).exit_code == 0;
}

// The seed's script, verbatim, under `tally launch` (torchrun's environment contract).
TEST(DdpCheckPeer, SeedScriptPassesUnderTallyLaunch) {
  ASSERT_TRUE(python_has_torch()) << kNoTorch;
  const Ran r = run_command(launch(2, {kPython, kData + "ddp_check.py"}), kLimit_s);
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  for (int rank = 0; rank < 2; ++rank)
    EXPECT_NE(r.out.find("[rank " + std::to_string(rank) + "] [rank " + std::to_string(rank) +
                         "/2] max|g_ddp - g_full| = "),
              std::string::npos)
        << r.out;
}

// PyTorch's DistributedDataParallel and tally's, same model, same data, same Gloo: the averaged
// gradients agree within 1e-6 (and the initial weights exactly, which proves the nn.Linear init).
TEST(DdpCheckPeer, TallyGradientsEqualPyTorchDdpGradients) {
  ASSERT_TRUE(python_has_torch()) << kNoTorch;
  const Ran py = run_command(launch(2, {kPython, kData + "ddp_grads.py"}), kLimit_s);
  ASSERT_EQ(py.exit_code, 0) << py.out << py.err;
  const auto py_lines = rank_lines(py.out, 0);
  ASSERT_EQ(py_lines.size(), 1u) << py.out;
  const json p = json::parse(py_lines[0]);

  const Ran t = run_command(
      launch(2, {TALLY_BINARY, "run", "ddp-check", "--json", "--grads", "--timeout", "40"}),
      kLimit_s);
  ASSERT_EQ(t.exit_code, 0) << t.out << t.err;
  const json j = rank_json(t, 2)[0];

  EXPECT_EQ(p["parameter_names"], j["parameter_names"]);
  // nn.Linear's init reproduced bit for bit (float32 values, exact in JSON's doubles).
  EXPECT_EQ(p["initial_parameters"].get<std::vector<double>>(),
            j["initial_parameters"].get<std::vector<double>>());
  const auto pg = p["averaged_gradients"].get<std::vector<double>>();
  const auto tg = j["averaged_gradients"].get<std::vector<double>>();
  ASSERT_EQ(pg.size(), 676u);
  ASSERT_EQ(tg.size(), pg.size());
  double max_diff = 0;
  for (std::size_t i = 0; i < pg.size(); ++i) max_diff = std::max(max_diff, std::abs(pg[i] - tg[i]));
  EXPECT_LT(max_diff, 1e-6) << "PyTorch DDP vs tally DDP, max |Δg|";
  std::cout << "PyTorch DDP vs tally DDP: max |Δg| = " << max_diff << " over " << pg.size()
            << " gradients\n";
}

}  // namespace
