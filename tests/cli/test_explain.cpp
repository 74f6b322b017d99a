// `tally explain` (DESIGN.md §3): the ledgers' index and the seed's errata (DESIGN.md §1). Every
// expected figure is computed here from the seed's inputs and the cited formulas, or quoted from
// DESIGN.md §1 — never read back from tally.
#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "run_tally.hpp"

#ifndef TALLY_SOURCE_DIR
#error "TALLY_SOURCE_DIR must name the source tree"
#endif

namespace tally::test_explain {
namespace {

using tally::cli_test::json_of;
using tally::cli_test::tally;

// figure `what` of erratum n (ASSERTs both exist).
nlohmann::json figure(const nlohmann::json& j, int n, const std::string& what) {
  for (const auto& e : j["errata"])
    if (e["number"] == n)
      for (const auto& f : e["figures"])
        if (f["what"] == what) return f;
  ADD_FAILURE() << "erratum " << n << " has no figure '" << what << "'";
  return nlohmann::json{{"value", NAN}, {"seed_says", nullptr}, {"unit", ""}};
}

std::string slurp(const std::string& relative) {
  std::ifstream in(std::string(TALLY_SOURCE_DIR) + "/" + relative);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Erratum 1 at the seed's inputs (seed §A4): C = 112 GB / 2 GB/s = 56 s, R = 5 + 3 min,
// λ = 3e-6 per GPU-hour. Young 1974: √(2·C·M); lost fraction C/T + (T/2 + R)/M. DESIGN.md §1:
// ≈15 min at MTBF 2 h, ≈1.13 h (Daly ≈1.11 h) at 8192 GPUs, where 24 h would cost ≈30 %.
TEST(Explain, ErratumOneIsYoungsIntervalAtTheSeedsInputs) {
  const auto j = json_of(tally("explain erratum-1 --json"));
  ASSERT_EQ(j["errata"].size(), 1u);
  const double c = 56.0 / 3600, r = 8.0 / 60, mtbf = 1 / (8192 * 3e-6);
  const auto young2 = figure(j, 1, "MTBF 2 h (f = 0.5/h): Young's interval");
  EXPECT_NEAR(young2["value"].get<double>(), 60 * std::sqrt(2 * c * 2), 1e-9);
  EXPECT_EQ(young2["unit"], "min");
  EXPECT_EQ(young2["seed_says"], "5.28 h");  // the seed's √(55.8 / (4 · 0.5))
  EXPECT_NEAR(figure(j, 1, "8192 GPUs: MTBF")["value"].get<double>(), mtbf, 1e-9);
  EXPECT_NEAR(figure(j, 1, "8192 GPUs: Young's interval")["value"].get<double>(),
              std::sqrt(2 * c * mtbf), 1e-9);
  EXPECT_EQ(figure(j, 1, "8192 GPUs: Young's interval")["seed_says"], "24.1 h");
  // Daly 2006 (FGCS 22) eq. 37: √(2CM)·[1 + ⅓√(C/2M) + (1/9)(C/2M)] − C; DESIGN.md: ≈1.11 h.
  const double x = c / (2 * mtbf);
  const double daly = std::sqrt(2 * c * mtbf) * (1 + std::sqrt(x) / 3 + x / 9) - c;
  EXPECT_NEAR(daly, 1.11, 0.005);
  EXPECT_NEAR(figure(j, 1, "8192 GPUs: Daly's interval")["value"].get<double>(), daly, 1e-9);
  EXPECT_NEAR(figure(j, 1, "8192 GPUs: time lost at Daly's interval")["value"].get<double>(),
              100 * (c / daly + (daly / 2 + r) / mtbf), 1e-9);
  const auto at24 = figure(j, 1, "8192 GPUs: time lost at the seed's 24 h");
  EXPECT_NEAR(at24["value"].get<double>(), 100 * (c / 24 + (12 + r) / mtbf), 1e-9);
  EXPECT_EQ(at24["unit"], "%");
  EXPECT_EQ(at24["seed_says"], "≈7.7 %");
}

// Erratum 2 (seed §A4 (3)): S = b·s·h·2 B = 4·2048·4096·2, each all-reduce 2S(t−1)/t at t = 8;
// 4 a layer without recompute, 6 when full recompute replays the forward two; 32 layers.
TEST(Explain, ErratumTwoCountsFourAllReducesALayer) {
  const auto j = json_of(tally("explain erratum-2 --json"));
  const double per_call = 2 * 7.0 / 8 * (4.0 * 2048 * 4096 * 2);
  EXPECT_NEAR(figure(j, 2, "per layer, no recompute")["value"].get<double>(), 4 * per_call / 1e6,
              1e-6);
  EXPECT_EQ(figure(j, 2, "per layer, no recompute")["seed_says"], "≈700 MB");
  EXPECT_NEAR(figure(j, 2, "per step, no recompute")["value"].get<double>(),
              32 * 4 * per_call / 1e9, 1e-9);
  EXPECT_NEAR(figure(j, 2, "per layer, full recompute")["value"].get<double>(),
              6 * per_call / 1e6, 1e-6);
  EXPECT_NEAR(figure(j, 2, "per step, full recompute")["value"].get<double>(),
              32 * 6 * per_call / 1e9, 1e-9);
}

// Erratum 3 (Korthikanti et al. 2022 Eq. 1 with flash attention: 34·s·b·h per layer, the 5as/h
// scores never stored): DESIGN.md §1's ≈36.5 GB at micro-batch 4, ≈9.1 GB at 1, over 32 layers.
TEST(Explain, ErratumThreeIsTheSeedsNineGigabytesAtMicroBatchOne) {
  const auto j = json_of(tally("explain erratum-3 --json"));
  const auto b4 = figure(j, 3, "micro-batch 4"), b1 = figure(j, 3, "micro-batch 1");
  EXPECT_NEAR(b4["value"].get<double>(), 34.0 * 2048 * 4 * 4096 * 32 / 1e9, 0.1);
  EXPECT_NEAR(b1["value"].get<double>(), 34.0 * 2048 * 1 * 4096 * 32 / 1e9, 0.05);
  EXPECT_EQ(b4["seed_says"], "≈9 GB");
  EXPECT_EQ(b4["unit"], "GB");
}

// Erratum 4 (ZeRO paper §7): S = 7e9 · 2 B, k = 8. DP's all-reduce 2S(k−1)/k = 24.5 GB; ZeRO-2 a
// reduce-scatter and an all-gather, S(k−1)/k each: the same 24.5 GB; ZeRO-3 1.5×. The seed's
// "halves" is the reduce-scatter alone, 12.25 GB.
TEST(Explain, ErratumFourZeroTwoMovesAsMuchAsDp) {
  const auto j = json_of(tally("explain erratum-4 --json"));
  const double s = 7e9 * 2;
  EXPECT_DOUBLE_EQ(figure(j, 4, "DP (all-reduce), per rank")["value"].get<double>(),
                   2 * s * 7 / 8 / 1e9);
  const auto z2 = figure(j, 4, "ZeRO-2, per rank");
  EXPECT_DOUBLE_EQ(z2["value"].get<double>(), 2 * s * 7 / 8 / 1e9);
  EXPECT_EQ(z2["seed_says"], "12.25 GB, the reduce-scatter alone");
  EXPECT_DOUBLE_EQ(figure(j, 4, "ZeRO-3, per rank")["value"].get<double>(),
                   3 * s * 7 / 8 / 1e9);
}

// `errata` shows the four in order; the text names each and the tests that pin it, and each test
// it names exists in the tree (a renamed test would leave the pointer dangling).
TEST(Explain, ErrataNameTheTestsThatPinThem) {
  const auto j = json_of(tally("explain errata --json"));
  ASSERT_EQ(j["errata"].size(), 4u);
  std::string sources;
  for (const char* f : {"tests/core/test_reliability.cpp", "tests/core/test_comm.cpp",
                        "tests/core/test_activations.cpp"})
    sources += slurp(f);
  for (int n = 1; n <= 4; ++n) {
    const auto& e = j["errata"][n - 1];
    EXPECT_EQ(e["number"], n);
    ASSERT_FALSE(e["pinned_by"].empty()) << n;
    for (const auto& t : e["pinned_by"]) {
      const std::string name = t;
      const std::string suite = name.substr(0, name.find('.'));
      const std::string test = name.substr(name.find('.') + 1);
      EXPECT_NE(sources.find("TEST(" + suite + ", " + test + ")"), std::string::npos) << name;
    }
  }
  const auto text = tally("explain errata");
  ASSERT_EQ(text.rc, 0) << text.err;
  for (const char* s : {"erratum 1 · checkpoint interval", "erratum 2 · TP traffic per layer",
                        "erratum 3 · activation figure", "erratum 4 · \"ZeRO-2 halves",
                        "(seed: ≈7.7 %)", "pinned by: StepTraffic.Erratum2_TpPerLayerAndPerStep"})
    EXPECT_NE(text.out.find(s), std::string::npos) << s << "\n" << text.out;
}

// The index: DESIGN.md §1's six ledgers, each with a command that exists and a section of
// docs/ledgers.md whose heading names it.
TEST(Explain, IndexPointsEachLedgerAtItsCommandAndSection) {
  const auto j = json_of(tally("explain --json"));
  EXPECT_TRUE(j["topic"].is_null());
  const std::vector<std::string> names = {"model states", "activations", "communication",
                                          "pipeline",     "compute",     "reliability"};
  ASSERT_EQ(j["ledgers"].size(), names.size());
  const std::string docs = slurp("docs/ledgers.md");
  for (std::size_t i = 0; i < names.size(); ++i) {
    const auto& l = j["ledgers"][i];
    EXPECT_EQ(l["ledger"], names[i]);
    const std::string command = l["shown_by"];
    const std::string sub = command.substr(6, command.find(' ', 6) - 6);  // after "tally "
    EXPECT_EQ(tally(sub + " --help").rc, 0) << command;
    // "§2" → a heading "## 2. Activations"
    const std::string section = l["docs"].get<std::string>().substr(std::string("§").size());
    std::string title = names[i];
    title[0] = char(std::toupper(title[0]));
    EXPECT_NE(docs.find("## " + section + ". " + title), std::string::npos) << names[i];
  }
  EXPECT_EQ(tally("explain").rc, 0);
}

// One line, exit 2, naming the value and the topics allowed.
TEST(Explain, UnknownTopicExitsTwoNamingIt) {
  tally::cli_test::expect_bad_input("explain erratum-5", {"topic", "erratum-5", "errata"});
  tally::cli_test::expect_bad_input("explain errata --unit GiB", {"--unit"});
}

}  // namespace
}  // namespace tally::test_explain
