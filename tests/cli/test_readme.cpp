// README's planner commands run as written. A newcomer copies them first; each line of README.md's
// code blocks that calls `build/cli/tally plan|memory|comm|bubble|reliability|compare` must exit 0
// from the source directory (its relative paths, docs/clusters/*.json, are the repository's), so a
// flag renamed or a preset dropped without README following fails here. What a line leaves out of
// the run: a trailing `# comment`, what follows a pipe or a redirection (`| jq …`, `> plan.json`);
// `--html FILE` writes into a temporary directory instead; a line with `--calibration` is not run
// (its file is one README has a reader make with `tally bench … --calibration-out` first). The
// engine's commands (`run`, `launch`, `bench`) need ranks and libtorch: the engine's tests run
// them.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "../support/subprocess.hpp"
#include "../support/temp_dir.hpp"

namespace {

struct Documented {
  int line = 0;      // README.md's line number where the command starts
  std::string args;  // what follows `build/cli/tally `
};

// Cuts a shell line at its first unquoted comment, pipe or redirection (README's commands quote
// nothing that contains them).
std::string command_part(std::string s) {
  for (const char* cut : {" #", " |", " >"}) {
    const auto at = s.find(cut);
    if (at != std::string::npos) s.resize(at);
  }
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

std::vector<Documented> readme_planner_commands(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  const std::regex command(
      R"(^\s*(?:\$ )?build/cli/tally ((?:plan|memory|comm|bubble|reliability|compare)(?: .*)?)$)");
  std::vector<Documented> out;
  bool in_block = false;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (lines[i].rfind("```", 0) == 0) {
      in_block = !in_block;
      continue;
    }
    std::smatch m;
    if (!in_block || !std::regex_match(lines[i], m, command)) continue;
    Documented d{.line = int(i) + 1, .args = m[1].str()};
    // A continued line (`\` at its end, before any comment) takes the next one.
    while (i + 1 < lines.size()) {
      std::string head = command_part(d.args);
      if (head.empty() || head.back() != '\\') break;
      head.pop_back();
      d.args = head + " " + lines[++i];
    }
    d.args = command_part(d.args);
    out.push_back(d);
  }
  return out;
}

TEST(Readme, PlannerCommandsRunAsWritten) {
  const std::vector<Documented> commands =
      readme_planner_commands(std::string(TALLY_SOURCE_DIR) + "/README.md");
  // README shows 24 such commands (2026-12-07); far fewer means the reader above stopped seeing
  // them, not that README changed.
  ASSERT_GE(commands.size(), 20u);
  const tally::test::TempDir dir("readme_commands");
  const std::regex html(R"(--html \S+)");
  int ran = 0;
  for (const Documented& d : commands) {
    if (d.args.find("--calibration") != std::string::npos) continue;
    const std::string args =
        std::regex_replace(d.args, html, "--html '" + (dir.path / "page.html").string() + "'");
    const auto r = tally::subprocess::run_command(
        {"/bin/sh", "-c",
         "cd '" + std::string(TALLY_SOURCE_DIR) + "' && '" + TALLY_BIN + "' " + args},
        50);
    EXPECT_FALSE(r.killed_at_limit) << "README.md:" << d.line << ": tally " << args;
    EXPECT_EQ(r.exit_code, 0) << "README.md:" << d.line << ": tally " << args << "\n" << r.err;
    ++ran;
  }
  EXPECT_GE(ran, 20);
}

// The reader itself, on lines whose commands are known: a continuation joins, a comment, a pipe
// and a redirection are cut, text outside a code block and the engine's commands are not taken.
TEST(Readme, ReaderTakesWhatAShellWouldRun) {
  const tally::test::TempDir dir("readme_reader");
  const auto path = dir.path / "README.md";
  std::ofstream(path) << "build/cli/tally plan --gpus 8   outside a block: prose\n"
                         "```sh\n"
                         "build/cli/tally reliability --gpus 8 \\\n"
                         "  --failure-rate 3e-6   # a comment\n"
                         "$ build/cli/tally plan --json | jq .best > plan.json\n"
                         "build/cli/tally run zero --stage 1\n"
                         "build/cli/tally compare\n"
                         "```\n";
  const std::vector<Documented> got = readme_planner_commands(path.string());
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0].line, 3);
  EXPECT_EQ(got[0].args, "reliability --gpus 8    --failure-rate 3e-6");
  EXPECT_EQ(got[1].args, "plan --json");
  EXPECT_EQ(got[2].args, "compare");
}

}  // namespace
