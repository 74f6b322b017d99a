// One register function per subcommand; each lives in its own cmd_*.cpp.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "html_report.hpp"

namespace tally::cli {

// Note [one code path]
// `tally serve` answers with the commands themselves. It turns a request body into the words of a
// command line (io/request.hpp), builds an App with the same register functions and runs the words
// through run_command_line (dispatch.hpp), as main does with argv: every check, every message and
// every JSON object is the command line's by construction, and there is no second validator or
// JSON builder to drift. Only where the answer goes differs, and that is Answers: the command line
// prints the --json object on stdout and writes the --html page to its file; the server keeps both
// for the HTTP reply.
struct Answers {
  std::function<void(const nlohmann::json&)> json;                      // the --json object
  std::function<void(const std::string& path, const html::Page&)> page;  // the --html page
  static Answers printed();  // stdout, and the file the --html flag names
};

void register_memory(CLI::App& app, const Answers& answers = Answers::printed());
void register_comm(CLI::App& app);
void register_bubble(CLI::App& app);
void register_reliability(CLI::App& app);
void register_explain(CLI::App& app);  // cmd_explain.cpp: the ledgers' index and the seed's errata
void register_plan(CLI::App& app, const Answers& answers = Answers::printed());
void register_compare(CLI::App& app, const Answers& answers = Answers::printed());
void register_serve(CLI::App& app);  // cmd_serve.cpp: linked into `tally` only (cpp-httplib)
}  // namespace tally::cli
