// `tally serve`: the planner behind a local page (issue 13). cpp-httplib (Debian's
// libcpp-httplib-dev) speaks HTTP; every reply's content comes from serve_api.cpp, which runs the
// commands themselves (Note [one code path] in commands.hpp). Linked into `tally` only: neither
// core, io nor tally-engine sees the HTTP library.
//
// Note [serve lifecycle]
//  - Listens on --host (127.0.0.1: this machine only) and --port (0: a free port); once the socket
//    listens, prints one line, "tally serve: listening on http://127.0.0.1:PORT/", which is what
//    scripts and tests wait for.
//  - SIGINT and SIGTERM are blocked in every thread and taken by one thread with sigwait, which
//    stops the server: in-flight requests finish, the workers are joined, exit 0. A signal that
//    arrives before the accept loop has started waits for it (httplib's stop() does nothing before).
//  - Request bodies are at most io::kMaxRequestBytes (413 above); keep-alive connections idle at
//    most 1 s, so a browser's open connection delays the shutdown by at most that.
//  - Bound to a loopback address, requests must name it in their Host header (127.0.0.1, localhost
//    or [::1] and the port): a web page elsewhere cannot reach the API through a DNS name that
//    resolves to 127.0.0.1 (DNS rebinding). The API has no side effect (no file is read or
//    written), so a cross-site POST can learn nothing.
#include <arpa/inet.h>
#include <httplib.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <thread>

#include "commands.hpp"
#include "serve_api.hpp"
#include "tally/core/types.hpp"
#include "tally/io/request.hpp"

namespace tally::cli {

namespace {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
};

// Every address `host` resolves to is loopback (127.0.0.0/8 or ::1); throws InvalidInput naming
// --host when it resolves to none.
bool loopback_only(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &found); rc != 0)
    throw InvalidInput("--host = '" + host + "': not an address of this machine (" +
                       gai_strerror(rc) + ")");
  bool loopback = true;
  for (const addrinfo* a = found; a; a = a->ai_next) {
    if (a->ai_family == AF_INET)
      loopback = loopback && (ntohl(reinterpret_cast<const sockaddr_in*>(a->ai_addr)->sin_addr.s_addr) >> 24) == 127;
    else if (a->ai_family == AF_INET6)
      loopback = loopback && IN6_IS_ADDR_LOOPBACK(&reinterpret_cast<const sockaddr_in6*>(a->ai_addr)->sin6_addr);
  }
  freeaddrinfo(found);
  return loopback;
}

std::string url(const std::string& host, int port) {
  const bool v6 = host.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port) + "/";
}

// Note [no compression]: Debian's cpp-httplib is built with brotli and zlib, and compresses every
// text body set with set_content when the client accepts it — brotli at its slowest quality, which
// took 2–4 s for the plan page's 0.56 MB in chromium (measured). A body given by a content provider
// of known length goes out as it is: on loopback the bytes cost nothing.
void reply(httplib::Response& res, const Reply& r) {
  res.status = r.status;
  auto body = std::make_shared<const std::string>(r.body);
  res.set_content_provider(body->size(), r.content_type.c_str(),
                           [body](std::size_t offset, std::size_t length, httplib::DataSink& sink) {
                             return sink.write(body->data() + offset, length);
                           });
}

void add_routes(httplib::Server& svr) {
  svr.Get("/", [](const httplib::Request&, httplib::Response& res) {
    reply(res, {.content_type = "text/html; charset=utf-8", .body = serve_page()});
  });
  svr.Post(R"(/api/([^/]*))", [](const httplib::Request& req, httplib::Response& res) {
    reply(res, api_reply(req.matches[1].str(), req.get_param_value("format"), req.body));
  });
  svr.Get(R"(/api/.*)", [](const httplib::Request&, httplib::Response& res) {
    reply(res, error_reply(405, "tally: error: the API takes POST with a JSON body (docs/json.md)"));
  });
  // 404, 413 and the like from httplib itself: the same {"error": …} shape as the API's.
  svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.has_header("Content-Type")) return;  // an API reply already
    const std::string why =
        res.status == 413   ? "request body: larger than " +
                                  std::to_string(io::kMaxRequestBytes) + " bytes"
        : res.status == 404 ? "no such page: " + req.path.substr(0, 80) +
                                  " (the page is /, the API /api/plan, /api/memory, /api/compare)"
                            : "HTTP status " + std::to_string(res.status);
    reply(res, error_reply(res.status, "tally: error: " + why));
  });
  svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
    reply(res, error_reply(500, "tally: error: the request failed inside the server"));
  });
}

// Note [serve lifecycle]: Host must name this loopback server.
void require_loopback_host(httplib::Server& svr, int port) {
  svr.set_pre_routing_handler([port](const httplib::Request& req, httplib::Response& res) {
    const std::string host = req.get_header_value("Host"), p = ":" + std::to_string(port);
    for (const char* name : {"127.0.0.1", "localhost", "[::1]"})
      if (host == name + p) return httplib::Server::HandlerResponse::Unhandled;
    reply(res, error_reply(403, "tally: error: Host '" + host.substr(0, 80) +
                                    "' is not this server's loopback address"));
    return httplib::Server::HandlerResponse::Handled;
  });
}

void run_serve(const ServeOptions& o) {
  const bool loopback = loopback_only(o.host);
  sigset_t stop_signals;  // Note [serve lifecycle]: blocked here, before any thread starts
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  httplib::Server svr;
  // httplib's default socket options set SO_REUSEPORT, under which a second server on the same
  // port starts and silently shares it; SO_REUSEADDR alone refuses that and still lets a restart
  // bind at once while old connections sit in TIME_WAIT.
  svr.set_socket_options([](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  svr.set_payload_max_length(io::kMaxRequestBytes);
  svr.set_keep_alive_timeout(1);
  add_routes(svr);
  errno = 0;
  const int port = o.port == 0 ? svr.bind_to_any_port(o.host)
                               : (svr.bind_to_port(o.host, o.port) ? o.port : -1);
  if (port <= 0)
    throw std::runtime_error("serve: cannot listen on " + o.host + ":" + std::to_string(o.port) +
                             (errno ? std::string(": ") + std::strerror(errno) : std::string()));
  if (loopback) require_loopback_host(svr, port);
  std::cout << "tally serve: listening on " << url(o.host, port) << " (Ctrl-C stops)" << std::endl;

  std::atomic<bool> listening_over{false};
  std::atomic<int> caught{0};
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    caught = sig;
    while (!listening_over) {  // a signal before the accept loop started waits for it
      if (svr.is_running()) {
        svr.stop();
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  const bool ok = svr.listen_after_bind();
  listening_over = true;
  if (!caught) pthread_kill(waiter.native_handle(), SIGTERM);  // wake the waiter
  waiter.join();
  if (!ok && !caught) throw std::runtime_error("serve: the server stopped accepting connections");
  std::cerr << "tally serve: stopped (" << (caught == SIGINT ? "SIGINT" : "SIGTERM") << ")\n";
}

}  // namespace

void register_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  auto* cmd = app.add_subcommand(
      "serve", "a local web page: change the scenario, see the plan and its charts (and the JSON "
               "API behind it: POST /api/plan, /api/memory, /api/compare)");
  cmd->add_option("--host", o->host,
                  "address to listen on (default: this machine only; 0.0.0.0 = every interface)")
      ->capture_default_str();
  cmd->add_option("--port", o->port, "TCP port (0 = a free one, printed)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  cmd->callback([o] { run_serve(*o); });
}

}  // namespace tally::cli
