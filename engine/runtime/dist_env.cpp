#include "tally/engine/dist_env.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "tally/core/types.hpp"

namespace tally::engine {

namespace {

std::string required_variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr)
    throw InvalidInput(std::string(name) +
                       " is not set: start ranks with `tally launch` or torchrun (they set RANK, "
                       "WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT)");
  return value;
}

int integer_variable(const char* name, int lo, int hi) {
  const std::string text = required_variable(name);
  int value = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || ptr != end)
    throw InvalidInput(std::string(name) + " = '" + text + "': not an integer");
  if (value < lo || value > hi)
    throw InvalidInput(std::string(name) + " = " + text + ": must be in [" + std::to_string(lo) +
                       ", " + std::to_string(hi) + "]");
  return value;
}

}  // namespace

void DistEnv::validate() const {
  if (world_size < 1 || world_size > kMaxWorldSize)
    throw InvalidInput("WORLD_SIZE = " + std::to_string(world_size) + ": must be in [1, " +
                       std::to_string(kMaxWorldSize) + "]");
  if (rank < 0 || rank >= world_size)
    throw InvalidInput("RANK = " + std::to_string(rank) + " vs WORLD_SIZE = " +
                       std::to_string(world_size) + ": RANK must be in [0, WORLD_SIZE)");
  if (local_rank < 0 || local_rank >= world_size)
    throw InvalidInput("LOCAL_RANK = " + std::to_string(local_rank) + " vs WORLD_SIZE = " +
                       std::to_string(world_size) + ": LOCAL_RANK must be in [0, WORLD_SIZE)");
  if (master_addr.empty()) throw InvalidInput("MASTER_ADDR is empty: give rank 0's host");
  if (master_port < 1 || master_port > 65535)
    throw InvalidInput("MASTER_PORT = " + std::to_string(master_port) + ": must be in [1, 65535]");
}

DistEnv DistEnv::from_environment() {
  DistEnv env;
  env.world_size = integer_variable("WORLD_SIZE", 1, kMaxWorldSize);
  env.rank = integer_variable("RANK", 0, kMaxWorldSize - 1);
  env.local_rank = integer_variable("LOCAL_RANK", 0, kMaxWorldSize - 1);
  env.master_addr = required_variable("MASTER_ADDR");
  env.master_port = integer_variable("MASTER_PORT", 1, 65535);
  env.validate();
  return env;
}

bool is_loopback_address(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

// Note [free ports]. A port that bind(0) returns is free only until something else takes it, and
// on Linux bind(0) and connect() draw from the same ephemeral range (ip_local_port_range,
// 32768–60999 by default): bind(0) hands out odd ports, connect() prefers even ones for the
// client side of every outgoing connection. So port + 1 of a bind(0) port is exactly where
// another process's next Gloo or store connection lands, and a listener cannot bind a port an
// established connection holds (EADDRINUSE, SO_REUSEADDR or not). That is what made a drill of
// two launchers on this host wait its whole join timeout (64 s in a `ctest -j 2` run): node 0
// could not serve the launchers' store at port + 1, node 1 retried the connection until the
// timeout, and the job, its ranks already done, still passed. So the ports are drawn outside the
// ephemeral range, where neither connect() nor another bind(0) can take them, and each of the
// `count` ports is bound (SO_REUSEADDR, as c10d's and Gloo's servers bind) before it is returned.
namespace {

constexpr int kFirstCandidatePort = 10000;  // below: well-known and registered services

// The kernel's ephemeral range, [32768, 60999] where /proc does not say.
std::pair<int, int> ephemeral_range() {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  if (f >> lo >> hi && lo >= 1 && lo <= hi && hi <= 65535) return {lo, hi};
  return {32768, 60999};
}

// A socket bound to port on every IPv4 address, as the stores' servers bind (so a listener on any
// address of this host counts), or -1; port 0 lets the kernel choose.
int bound_socket(int port, bool reuse) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw std::runtime_error(std::string("find_free_port: socket: ") + strerror(errno));
  const int one = 1;
  if (reuse) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(std::uint16_t(port));
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// True when port … port + count − 1 all bind at once.
bool all_bind(int first, int count) {
  std::vector<int> fds;
  for (int p = first; p < first + count; ++p) {
    const int fd = bound_socket(p, true);
    if (fd < 0) break;
    fds.push_back(fd);
  }
  const bool ok = int(fds.size()) == count;
  for (int fd : fds) close(fd);
  return ok;
}

}  // namespace

std::pair<int, int> ephemeral_port_range() { return ephemeral_range(); }

int find_free_port(int count) {
  if (count < 1 || count > kMaxFreePorts)
    throw std::invalid_argument("find_free_port: count = " + std::to_string(count) +
                                ": must be in [1, " + std::to_string(kMaxFreePorts) + "]");
  const auto [lo, hi] = ephemeral_range();
  // First ports whose block lies below the range (from kFirstCandidatePort) or above it.
  std::vector<std::pair<int, int>> spans;
  if (lo - count >= kFirstCandidatePort) spans.push_back({kFirstCandidatePort, lo - count});
  if (hi + 1 <= 65536 - count) spans.push_back({hi + 1, 65536 - count});
  int candidates = 0;
  for (const auto& [a, b] : spans) candidates += b - a + 1;
  std::mt19937 gen(std::random_device{}());
  for (int attempt = 0; attempt < 200 && candidates > 0; ++attempt) {
    int pick = std::uniform_int_distribution<int>(0, candidates - 1)(gen);
    for (const auto& [a, b] : spans) {
      if (pick <= b - a) {
        if (all_bind(a + pick, count)) return a + pick;
        break;
      }
      pick -= b - a + 1;
    }
  }
  // No room outside the range (an unusual ip_local_port_range): the kernel's choice, its
  // neighbours checked.
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int fd = bound_socket(0, false);
    if (fd < 0) break;
    sockaddr_in addr{};
    socklen_t len = sizeof addr;
    const int got = getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0
                        ? ntohs(addr.sin_port)
                        : -1;
    close(fd);
    if (got > 0 && got + count - 1 <= 65535 && all_bind(got, count)) return got;
  }
  throw std::runtime_error("find_free_port: found no " + std::to_string(count) +
                           " consecutive free port(s) on this host");
}

// Note [prompt connect]. c10d 1.13's TCPStore client retries a refused connection once a second,
// so a rank (or a launcher) that dials before the server has bound waits up to a second more
// than it needs to: measured with /usr/bin/python3's c10d (the same 1.13), a client started 0.05,
// 0.2 or 0.5 s before its server connected at 1.01 s every time, one started with it at once. The
// ranks of a launch start together and rank 0 binds after loading libtorch, so this is the common
// case: `tally launch --nproc 2 -- tally run gloo-smoke` took 1.5 s, or 2.4–2.6 s when it was hit.
// And the launchers' store of a drill, its launchers started together, was still unjoined when a
// sub-run's rank died a second in ("node 1 never joined" in every elastic drill's report). So the
// client first dials with its own non-blocking connects, every 10 ms, and hands over to the store
// once something listens; the probes' connections close at once, which the server takes as a
// client that left.
void await_listener(const std::string& host, int port, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(timeout_s));
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return;
  const std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> list(found, &freeaddrinfo);
  const auto listening = [&](const addrinfo& a) {
    const int fd = socket(a.ai_family, a.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a.ai_protocol);
    if (fd < 0) return false;
    bool ok = connect(fd, a.ai_addr, a.ai_addrlen) == 0;
    if (!ok && errno == EINPROGRESS) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd p{.fd = fd, .events = POLLOUT, .revents = 0};
      int err = 0;
      socklen_t len = sizeof err;
      ok = poll(&p, 1, int(std::clamp<std::int64_t>(left.count(), 1, 1000))) == 1 &&
           getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
    }
    close(fd);
    return ok;
  };
  for (;;) {
    for (const addrinfo* a = list.get(); a != nullptr; a = a->ai_next)
      if (listening(*a)) return;
    if (Clock::now() >= deadline)
      throw std::runtime_error("nothing accepted a connection at " + host + ":" +
                               std::to_string(port) + " within the timeout of " +
                               format_number(timeout_s) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

}  // namespace tally::engine
