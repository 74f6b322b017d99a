// What `tally serve` answers: the JSON API and the page. cmd_serve.cpp does the HTTP (cpp-httplib)
// and nothing else, so this part holds no HTTP library and the CLI's tests can reach it.
#pragma once

#include <string>
#include <string_view>

namespace tally::cli {

struct Reply {
  int status = 200;  // HTTP status
  std::string content_type = "application/json";
  std::string body;
};

// The commands behind POST /api/<command>.
bool is_api_command(std::string_view command);

// POST /api/<command>?format=json|html. The body's flags (io/request.hpp) run as `tally <command>
// --json` (Note [one code path] in commands.hpp):
//   200  exactly what the command line prints: the --json object (format=json, the default), or,
//        with format=html (plan and compare, the commands with --html), the page's body as an HTML
//        fragment (the charts and tables of the --html page, drawn by the same writers);
//   400  bad input: {"error": "<the one line the command line prints on stderr>"};
//   500  a run that failed (out of memory, say), the same way.
// The server reads and writes no files: "html" is refused (format=html returns the page), and
// "model", "gpu" and "calibration" take a preset or the file's JSON (object or text), never a path.
Reply api_reply(std::string_view command, std::string_view format, std::string_view body);

// {"error": line} with `status`.
Reply error_reply(int status, const std::string& line);

// GET /: one self-contained page (serve_page.cpp).
std::string serve_page();

}  // namespace tally::cli
