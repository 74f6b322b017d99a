// `tally serve` (issue 13): a real server process on a free loopback port, driven by cpp-httplib's
// client and by Debian's headless chromium. The API's answers are compared with the command line's
// own output for the same scenario (Note [one code path] in cli/commands.hpp): the same JSON object,
// the same one-line message for bad input, the same page body as `--html`.
#include <gtest/gtest.h>
#include <httplib.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "../support/chromium.hpp"
#include "../support/subprocess.hpp"
#include "tally_run.hpp"

namespace test_serve {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using tally::clitest::slurp;
using tally::clitest::tally;
using tally::clitest::TallyRun;

// `tally serve --port 0` as a child process; port() is what it printed.
class Server {
 public:
  explicit Server(const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args{TALLY_BIN, "serve", "--port", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    proc_ = std::make_unique<tally::subprocess::Started>(args);
    const std::string line = proc_->wait_for_line("listening on", 20);
    std::smatch m;
    if (std::regex_search(line, m, std::regex(R"(http://127\.0\.0\.1:(\d+)/)")))
      port_ = std::stoi(m[1].str());
  }
  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/"; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30, 0);
    return c;
  }
  tally::subprocess::Started& process() { return *proc_; }

 private:
  std::unique_ptr<tally::subprocess::Started> proc_;
  int port_ = 0;
};

httplib::Result post(const Server& s, const std::string& path, const std::string& body) {
  return s.client().Post(path.c_str(), body, "application/json");
}

// One scenario twice: the API's body and the command line's flags.
struct Case {
  std::string command, body;
  std::vector<std::string> flags;
  // `tally COMMAND --json FLAGS…`
  TallyRun on_the_command_line() const {
    std::vector<std::string> args{command, "--json"};
    args.insert(args.end(), flags.begin(), flags.end());
    return tally(args);
  }
};

// The --json object without the search's wall-clock seconds (the only field two runs differ in).
json without_timing(json j) {
  if (j.contains("search")) j["search"].erase("seconds");
  return j;
}

// The same scenario through the API and the command line: the same object.
TEST(Serve, ApiAnswersWithTheCommandLinesJson) {
  Server s;
  ASSERT_GT(s.port(), 0) << s.process().err();
  const std::string llama = slurp(std::string(TALLY_TEST_DATA) + "/llama-2-7b.json");
  for (const Case& c :
       {Case{"plan", R"({"gpus": 64, "seq": 4096, "headroom": 0.2})",
             {"--gpus", "64", "--seq", "4096", "--headroom", "0.2"}},
        Case{"plan", R"({"model": )" + llama + R"(, "gpus": 16, "max-tp": 2})",
             {"--model", std::string(TALLY_TEST_DATA) + "/llama-2-7b.json", "--gpus", "16",
              "--max-tp", "2"}},
        Case{"memory",
             R"({"model": "llama-3-8b", "seq": 8192, "micro-batch": 1, "tp": 4, "sp": true,
                 "recompute": "selective", "dropout": false})",
             {"--model", "llama-3-8b", "--seq", "8192", "--micro-batch", "1", "--tp", "4", "--sp",
              "--recompute", "selective"}},
        Case{"compare", R"({"gpus": 16, "alternative": ["double-micro-batch", "double-gpus"]})",
             {"--gpus", "16", "--alternative", "double-micro-batch", "--alternative",
              "double-gpus"}}}) {
    const auto r = post(s, "/api/" + c.command, c.body);
    ASSERT_TRUE(r) << c.command;
    EXPECT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "application/json");
    const TallyRun cli = c.on_the_command_line();
    ASSERT_EQ(cli.rc, 0) << cli.err;
    EXPECT_EQ(without_timing(json::parse(r->body)), without_timing(json::parse(cli.out)))
        << c.command << " " << c.body;
  }
  EXPECT_EQ(s.process().stop(SIGTERM, 10), 0) << s.process().err();
}

// Bad input: 400 and, as "error", exactly the line the command line prints on stderr.
TEST(Serve, BadInputGetsTheCommandLinesLine) {
  Server s;
  ASSERT_GT(s.port(), 0) << s.process().err();
  for (const Case& c : {
           Case{"plan", R"({"gpus": 0})", {"--gpus", "0"}},
           Case{"plan", R"({"headroom": "nan"})", {"--headroom", "nan"}},
           Case{"plan", R"({"precision": "fp7"})", {"--precision", "fp7"}},
           Case{"plan", R"({"model": "llama-9"})", {"--model", "llama-9"}},
           Case{"plan", R"({"model": ""})", {"--model", ""}},
           Case{"plan", R"({"model": "{\"hidden_size\": 4096.5}"})",
                {"--model", R"({"hidden_size": 4096.5})"}},
           Case{"plan", R"({"gpu": "{\"preset\": \"h100-80g\", \"gpus_per_node\": 0}"})",
                {"--gpu", R"({"preset": "h100-80g", "gpus_per_node": 0})"}},
           Case{"memory", R"({"params": "7e9", "ep": 3, "dp": 6})",
                {"--params", "7e9", "--ep", "3", "--dp", "6"}},
           Case{"compare", R"({"tp": 3})", {"--tp", "3"}},
       }) {
    const auto r = post(s, "/api/" + c.command, c.body);
    ASSERT_TRUE(r) << c.body;
    EXPECT_EQ(r->status, 400) << c.body;
    const TallyRun cli = c.on_the_command_line();
    ASSERT_EQ(cli.rc, 2) << c.body;
    ASSERT_EQ(cli.err.find('\n'), cli.err.size() - 1) << cli.err;  // one line
    EXPECT_EQ(json::parse(r->body).value("error", ""), cli.err.substr(0, cli.err.size() - 1))
        << c.body;
  }
  EXPECT_EQ(s.process().stop(SIGTERM, 10), 0);
}

// Sends `bytes` on a fresh connection, half-closes it and returns what comes back before the
// server closes (or 10 s pass): for requests no HTTP client would send.
std::string raw_exchange(int port, const std::string& bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(std::uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string got;
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == ssize_t(bytes.size())) {
    shutdown(fd, SHUT_WR);
    timeval tv{.tv_sec = 10, .tv_usec = 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char buf[4096];
    for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) got.append(buf, std::size_t(n));
  }
  close(fd);
  return got;
}

// What only the server refuses: a file it would read or write, a key that is no flag, a body that is
// no JSON object, a body over 1 MiB; after all of them it still answers.
TEST(Serve, MalformedRequestsAreRefusedAndTheServerLives) {
  Server s;
  ASSERT_GT(s.port(), 0) << s.process().err();
  const fs::path written = fs::temp_directory_path() / ("tally_serve_" + std::to_string(getpid()) +
                                                        ".html");
  struct Refusal {
    std::string path, body;
    int status;
    std::string says;  // a piece of the error line
  };
  const std::string deep(100000, '[');
  for (const Refusal& c : {
           Refusal{"/api/plan", "{", 400, "request body: not valid JSON"},
           Refusal{"/api/plan", "", 400, "request body: not valid JSON"},
           Refusal{"/api/plan", "[1, 2]", 400, "request body: top level is an array"},
           Refusal{"/api/plan", deep, 400, "request body: nesting depth"},
           Refusal{"/api/plan", std::string("{\"gpus\": 8}\0x", 13), 400, "NUL"},
           Refusal{"/api/plan", R"({"gpus": 8, "gpus": 16})", 400, "appears twice"},
           Refusal{"/api/plan", R"({"GPUs": 8})", 400, "must be a flag name"},
           Refusal{"/api/plan", R"({"gpus": [8, [16]]})", 400, "gpus[1]"},
           Refusal{"/api/plan", R"({"model": "x\u0000y"})", 400, "NUL"},
           Refusal{"/api/plan", R"({"no-such-flag": 1})", 400, "--no-such-flag"},
           Refusal{"/api/plan", R"({"html": ")" + written.string() + R"("})", 400, "writes no files"},
           Refusal{"/api/plan", R"({"help": true})", 400, "--help"},
           Refusal{"/api/plan", R"({"model": "/etc/hostname"})", 400, "reads no files"},
           Refusal{"/api/plan", R"({"gpu": "cluster.json"})", 400, "reads no files"},
           Refusal{"/api/plan", R"({"calibration": "x"})", 400, "reads no files"},
           Refusal{"/api/plan?format=xml", "{}", 400, "format = 'xml'"},
           Refusal{"/api/memory?format=html", "{}", 400, "has no page"},
           Refusal{"/api/launch", "{}", 404, "no such command"},
           Refusal{"/api/plan", std::string((1 << 20) + 1, ' '), 413, "larger than 1048576 bytes"},
       }) {
    const auto r = post(s, c.path, c.body);
    ASSERT_TRUE(r) << c.path << " " << c.body.substr(0, 60);
    EXPECT_EQ(r->status, c.status) << c.body.substr(0, 60) << " → " << r->body;
    const std::string error = json::parse(r->body).value("error", "");
    EXPECT_EQ(error.rfind("tally: error: ", 0), 0u) << error;
    EXPECT_NE(error.find(c.says), std::string::npos) << c.body.substr(0, 60) << " → " << error;
  }
  EXPECT_FALSE(fs::exists(written));
  {  // GET on the API, an unknown page, a foreign Host header (DNS rebinding), bytes that are no
     // HTTP, a body shorter than its Content-Length
    auto cl = s.client();
    EXPECT_EQ(cl.Get("/api/plan")->status, 405);
    EXPECT_EQ(cl.Get("/nope")->status, 404);
    EXPECT_EQ(cl.Get("/", {{"Host", "evil.example:80"}})->status, 403);
    // A 400, or a reset when the server closes with bytes unread: either way, no answer and no crash.
    for (const std::string& junk : {std::string("GARBAGE\r\n\r\n"),
                                    std::string("\0\xff\x01 / HTTP/9\r\n\r\n", 17)}) {
      const std::string got = raw_exchange(s.port(), junk);
      EXPECT_TRUE(got.empty() || got.rfind("HTTP/1.1 400", 0) == 0) << got;
    }
    raw_exchange(s.port(), "POST /api/plan HTTP/1.1\r\nHost: 127.0.0.1:" +
                               std::to_string(s.port()) + "\r\nContent-Length: 100\r\n\r\n{");
  }
  const auto ok = post(s, "/api/plan", R"({"gpus": 8})");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
  EXPECT_TRUE(json::parse(ok->body)["feasible"].get<bool>());
  EXPECT_TRUE(s.process().running());
  EXPECT_EQ(s.process().stop(SIGTERM, 10), 0) << s.process().err();
}

// The search's wall-clock milliseconds in the summary table, the only text two runs differ in.
std::string without_search_ms(const std::string& page) {
  return std::regex_replace(page, std::regex(R"(pruned, [0-9.]+ ms)"), "pruned, (t) ms");
}

// format=html: the body of the page `tally plan --html` and `tally compare --html` write.
TEST(Serve, HtmlFormatIsTheBodyOfTheHtmlPage) {
  Server s;
  ASSERT_GT(s.port(), 0) << s.process().err();
  const fs::path d = fs::temp_directory_path() / ("tally_serve_html_" + std::to_string(getpid()));
  fs::create_directories(d);
  for (const std::string command : {"plan", "compare"}) {
    const auto r = post(s, "/api/" + command + "?format=html", R"({"gpus": 16, "unit": "GiB"})");
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(r->get_header_value("Content-Type"), "text/html; charset=utf-8");
    const fs::path file = d / (command + ".html");
    ASSERT_EQ(tally({command, "--gpus", "16", "--unit", "GiB", "--html", file.string()}).rc, 0);
    const std::string page = slurp(file);
    const auto from = page.find("<body>\n") + 7, to = page.rfind("<script>");
    ASSERT_LT(from, to);
    EXPECT_EQ(without_search_ms(r->body), without_search_ms(page.substr(from, to - from)))
        << command;
    EXPECT_NE(r->body.find("<svg class=\"chart\" id=\"memory\""), std::string::npos);
  }
  fs::remove_all(d);
  EXPECT_EQ(s.process().stop(SIGTERM, 10), 0);
}

// SIGTERM and SIGINT stop it cleanly (exit 0), also with a keep-alive connection open; bad flags
// and a port in use are one line each.
TEST(Serve, SignalsStopItAndBadFlagsAreOneLine) {
  for (const int sig : {SIGTERM, SIGINT}) {
    Server s;
    ASSERT_GT(s.port(), 0) << s.process().err();
    auto cl = s.client();
    cl.set_keep_alive(true);
    ASSERT_EQ(cl.Get("/")->status, 200);
    EXPECT_EQ(s.process().stop(sig, 10), 0) << s.process().err();
    EXPECT_NE(s.process().err().find(sig == SIGINT ? "stopped (SIGINT)" : "stopped (SIGTERM)"),
              std::string::npos)
        << s.process().err();
  }
  const TallyRun help = tally({"serve", "--help"});
  EXPECT_EQ(help.rc, 0);
  EXPECT_NE(help.out.find("--port"), std::string::npos) << help.out;
  const TallyRun port = tally({"serve", "--port", "70000"});
  EXPECT_EQ(port.rc, 2);
  EXPECT_EQ(port.err, "tally: error: --port: Value 70000 not in range 0 to 65535\n");
  const TallyRun host = tally({"serve", "--host", "no-such-host.invalid"});
  EXPECT_EQ(host.rc, 2);
  EXPECT_EQ(host.err.rfind("tally: error: --host = 'no-such-host.invalid': ", 0), 0u) << host.err;
  Server first;
  ASSERT_GT(first.port(), 0);
  const TallyRun busy = tally({"serve", "--port", std::to_string(first.port())});
  EXPECT_EQ(busy.rc, 1);
  EXPECT_EQ(busy.err, "tally: error: serve: cannot listen on 127.0.0.1:" +
                          std::to_string(first.port()) + ": Address already in use\n");
  EXPECT_EQ(first.process().stop(SIGTERM, 10), 0);
}

std::string unescape_html(std::string s) {
  for (const auto& [from, to] : {std::pair{"&lt;", "<"}, {"&gt;", ">"}, {"&quot;", "\""},
                                 {"&#39;", "'"}, {"&amp;", "&"}})
    for (std::size_t p; (p = s.find(from)) != std::string::npos;) s.replace(p, strlen(from), to);
  return s;
}

// The page's self-test result (Note [page script] in cli/serve_page.cpp), from the dumped DOM.
json selftest_of(const std::string& dom) {
  std::smatch m;
  if (!std::regex_search(dom, m, std::regex(R"(<pre id="selftest"[^>]*>([^<]*)</pre>)")))
    return nullptr;
  return json::parse(unescape_html(m[1].str()), nullptr, false);
}

// The page in headless chromium: it plans on load and draws the plan page's six charts; its own
// script then sets "GPUs" to 64 and fires the change event a person's edit fires; the page re-plans
// and redraws: the plan shown before and after is the command line's for 8 and 64 GPUs. A bad value
// shows the command line's message. Then a screenshot.
TEST(ServeBrowser, PageReplansWhenAFieldChanges) {
  if (const std::string why = tally::chromium::why_no_browser(); !why.empty()) GTEST_SKIP() << why;
  const std::string bin = tally::chromium::find_chromium();
  Server s;
  ASSERT_GT(s.port(), 0) << s.process().err();
  const fs::path d = fs::temp_directory_path() / ("tally_serve_browser_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  const tally::chromium::Browser br{bin, d / "profile"};
  // Virtual time runs ahead while nothing is pending; a fetch holds it (the re-plan completes).
  const std::string budget = "--virtual-time-budget=30000";

  const auto r = br.run({budget, "--dump-dom"}, s.url() + "?selftest=gpus:64");
  ASSERT_FALSE(r.killed_at_limit);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("data-tally-selftest=\"done\""), std::string::npos) << r.out.substr(0, 2000);
  EXPECT_EQ(r.out.find("data-tally-error=\""), std::string::npos);
  EXPECT_EQ(r.err.find(":CONSOLE"), std::string::npos) << r.err;
  const json t = selftest_of(r.out);
  ASSERT_TRUE(t.is_object()) << r.out.substr(0, 2000);
  const auto plan8 = json::parse(tally({"plan", "--json"}).out);
  const auto plan64 = json::parse(tally({"plan", "--json", "--gpus", "64"}).out);
  const json& before = t["before"];
  const json& after = t["after"];
  EXPECT_EQ(before["plan"], "Plan: " + plan8["best"]["layout"].get<std::string>());
  EXPECT_EQ(after["plan"], "Plan: " + plan64["best"]["layout"].get<std::string>());
  EXPECT_NE(before["title"].get<std::string>().find("on 8 × a100-80g"), std::string::npos);
  EXPECT_NE(after["title"].get<std::string>().find("on 64 × a100-80g"), std::string::npos);
  for (const json* x : {&before, &after}) {
    EXPECT_EQ((*x)["charts"], 6) << *x;     // memory, step, layouts, reasons ×2, reliability
    EXPECT_GT((*x)["texts"].get<int>(), 60) << *x;  // ticks, labels, legends
    EXPECT_GT((*x)["marks"].get<int>(), 100) << *x;  // bars and scatter points
    EXPECT_EQ((*x)["error"], "") << *x;
  }
  EXPECT_NE(before["hash"], after["hash"]);  // the charts were redrawn
  // The DOM holds the redrawn charts with their labels.
  for (const char* label : {">params<", ">activations<", ">usable<", ">chosen plan<", ">Daly<"})
    EXPECT_NE(r.out.find(label), std::string::npos) << label;

  // A value the command refuses: the page shows its line and keeps (dims) the last charts.
  const auto bad = br.run({budget, "--dump-dom"}, s.url() + "?selftest=gpus:0");
  ASSERT_EQ(bad.exit_code, 0) << bad.err;
  const json b = selftest_of(bad.out);
  ASSERT_TRUE(b.is_object()) << bad.out.substr(0, 2000);
  EXPECT_EQ(b["after"]["error"], "tally: error: --gpus: Value 0 not in range 1 to 16777216");
  EXPECT_EQ(b["after"]["charts"], 6);
  EXPECT_NE(bad.out.find("<div id=\"charts\" class=\"stale\">"), std::string::npos);

  const fs::path png = d / "serve.png";
  const auto shot = br.run({budget, "--screenshot=" + png.string(), "--window-size=1100,1500",
                            "--hide-scrollbars"},
                           s.url());
  ASSERT_EQ(shot.exit_code, 0) << shot.err;
  const std::string img = slurp(png);
  ASSERT_GT(img.size(), 20'000u);  // a page without its charts compresses to far less
  EXPECT_EQ(img.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  fs::remove_all(d);
  EXPECT_EQ(s.process().stop(SIGTERM, 10), 0) << s.process().err();
}

}  // namespace
}  // namespace test_serve
