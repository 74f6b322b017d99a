#include "serve_api.hpp"

#include <filesystem>
#include <new>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "commands.hpp"
#include "dispatch.hpp"
#include "flags.hpp"
#include "format.hpp"
#include "tally/core/presets.hpp"
#include "tally/core/types.hpp"
#include "tally/io/request.hpp"

namespace tally::cli {

namespace {

constexpr std::string_view kCommands[] = {"plan", "memory", "compare"};

// A value in a message: at most 60 characters, control characters as '?', so the line stays one.
std::string shown(std::string_view v) {
  std::string s(v.substr(0, 60));
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x20) c = '?';
  return v.size() > 60 ? s + "..." : s;
}

// Keys the server sets or refuses: it always adds --json; --html writes a file (format=html
// returns the page); --help answers with no object.
void check_key(const io::RequestFlag& f) {
  if (f.name == "json")
    throw InvalidInput("request body: \"json\": tally serve always answers with the --json object");
  if (f.name == "html")
    throw InvalidInput("request body: \"html\": tally serve writes no files (POST "
                       "/api/plan?format=html answers with the page)");
  if (f.name == "help" || f.name == "help-all")
    throw InvalidInput("request body: \"" + f.name + "\": see `tally plan|memory|compare --help`");
}

// --model, --gpu and --calibration: a preset or the file's JSON text (Note [JSON text for a
// file]); a value that names a file is refused, since the server reads none. Any other value goes
// to the command, whose message names it ("not a preset (…) nor a config.json file").
void check_no_path(const io::RequestFlag& f) {
  if (f.name != "model" && f.name != "gpu" && f.name != "calibration") return;
  for (const std::string& v : f.values) {
    if (is_json_text(v) || (f.name == "model" && model_preset(v)) ||
        (f.name == "gpu" && cluster_preset(v)))
      continue;
    std::error_code ec;
    const bool names_a_file = f.name == "calibration" || v.find('/') != std::string::npos ||
                              v.ends_with(".json") || std::filesystem::exists(v, ec);
    if (names_a_file)
      throw InvalidInput("--" + f.name + " = '" + shown(v) +
                         "': tally serve reads no files: send the file's JSON (an object, or its "
                         "text) as \"" + f.name + "\"");
  }
}

// The command line a request stands for: tally <command> --json [--html=(page)] --key=value …
// (`--key=value`, so a value starting with '-' is never read as a flag; an empty value as its own
// word, since CLI11 reads `--key=` as a missing value).
std::vector<std::string> command_words(std::string_view command, bool html,
                                       const std::vector<io::RequestFlag>& flags) {
  std::vector<std::string> words = {"tally", std::string(command), "--json"};
  if (html) words.push_back("--html=(served)");  // Answers.page keeps it; no file is written
  for (const io::RequestFlag& f : flags) {
    check_key(f);
    check_no_path(f);
    if (f.values.empty()) words.push_back("--" + f.name);
    for (const std::string& v : f.values) {
      if (v.empty()) {  // as typed: `--model ""` gets the empty-value refusal (Note [empty values])
        words.push_back("--" + f.name);
        words.emplace_back();
      } else {
        words.push_back("--" + f.name + "=" + v);
      }
    }
  }
  return words;
}

CommandOutcome run_words(std::string_view command, const std::vector<std::string>& words,
                         const Answers& answers) {
  CLI::App app{"tally"};
  app.name("tally");
  app.require_subcommand(1);
  if (command == "plan") register_plan(app, answers);
  else if (command == "memory") register_memory(app, answers);
  else register_compare(app, answers);
  refuse_empty_values(app);  // Note [empty values], as main does
  std::vector<const char*> argv;
  for (const std::string& w : words) argv.push_back(w.c_str());
  std::ostringstream help;
  return run_command_line(app, int(argv.size()), argv.data(), help);
}

}  // namespace

bool is_api_command(std::string_view command) {
  for (const std::string_view c : kCommands)
    if (command == c) return true;
  return false;
}

Reply error_reply(int status, const std::string& line) {
  const nlohmann::json j = {{"error", line}};
  return {.status = status,
          .body = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"};
}

Reply api_reply(std::string_view command, std::string_view format, std::string_view body) {
  try {
    if (!is_api_command(command))
      return error_reply(404, "tally: error: /api/" + shown(command) +
                                  ": no such command (plan, memory, compare)");
    if (format != "" && format != "json" && format != "html")
      throw InvalidInput("format = '" + shown(format) + "': json (the default) or html");
    const bool html = format == "html";
    if (html && command == "memory")
      throw InvalidInput("format = 'html': tally memory has no page (plan and compare have)");
    const std::vector<std::string> words = command_words(command, html, io::parse_request(body));
    std::optional<nlohmann::json> object;
    std::optional<html::Page> page;
    const Answers answers{
        .json = [&](const nlohmann::json& j) { object = j; },
        .page = [&](const std::string&, const html::Page& p) { page = p; }};
    const CommandOutcome out = run_words(command, words, answers);
    if (out.exit_code != kOk)
      return error_reply(out.exit_code == kBadInput ? 400 : 500, out.error);
    if (html && page)
      return {.status = 200, .content_type = "text/html; charset=utf-8", .body = page->body};
    if (!html && object) return {.status = 200, .body = object->dump(2) + "\n"};
    return error_reply(500, "tally: error: tally " + std::string(command) + " gave no answer");
  } catch (const InvalidInput& e) {
    return error_reply(400, std::string("tally: error: ") + e.what());
  } catch (const std::bad_alloc&) {
    return error_reply(500, "tally: error: out of memory");
  } catch (const std::exception& e) {
    return error_reply(500, std::string("tally: error: ") + e.what());
  }
}

}  // namespace tally::cli
