// Two "hosts" on one machine with real, separate network stacks (issue 14): network namespaces
// A and B joined by a veth pair, A at 10.77.0.1/24 on veth-tally-a, B at 10.77.0.2/24 on
// veth-tally-b, loopback up in each. Nothing else is routed: B reaches A only over the veth, and a
// rank that publishes a loopback address to its peers is refused, as on real hosts.
//
// Names carry this test process's pid ("tallyns<pid>-<n>a"), so parallel test processes never
// collide; the namespaces (and the veth pair inside them) are deleted when the fixture ends, pass
// or fail, and a new fixture first deletes leftovers whose process is gone (a test SIGKILLed at
// its ctest timeout). Needs CAP_NET_ADMIN (CI runs as root): where `ip netns add` is refused the
// test is skipped with "skipped: needs CAP_NET_ADMIN"; a missing `ip` fails it
// (scripts/install-deps.sh installs iproute2).
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../support/subprocess.hpp"

namespace tally::netns {

inline constexpr const char* kPrefix = "tallyns";
inline constexpr double kIpLimit_s = 20;  // one `ip` call; each takes milliseconds

struct Host {
  std::string ns;       // namespace name
  std::string address;  // "10.77.0.1"
  std::string veth;     // "veth-tally-a"
};

// The `ip` binary, or "" when iproute2 is not installed.
inline std::string ip_binary() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (access(p, X_OK) == 0) return p;
  return "";
}

inline subprocess::Ran ip(std::vector<std::string> args) {
  args.insert(args.begin(), ip_binary());
  return subprocess::run_command(args, kIpLimit_s);
}

// argv run inside namespace `ns` (`ip netns exec` execs it: same pid, same process group).
inline std::vector<std::string> in_namespace(const std::string& ns, std::vector<std::string> argv) {
  argv.insert(argv.begin(), {ip_binary(), "netns", "exec", ns});
  return argv;
}

// Deletes namespaces named kPrefix<pid>-… whose process no longer exists.
inline void remove_leftovers() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/run/netns", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(kPrefix, 0) != 0) continue;
    const pid_t pid = pid_t(std::atol(name.c_str() + std::string(kPrefix).size()));
    if (pid > 0 && kill(pid, 0) != 0 && errno == ESRCH) ip({"netns", "del", name});
  }
}

// Runs fn on a thread that has joined namespace `ns` (setns is per thread): sockets it opens, and
// the routes and interfaces it sees, are that namespace's.
template <class Fn>
void inside(const std::string& ns, Fn&& fn) {
  std::string error;
  std::thread t([&] {
    const int fd = open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
      error = "cannot enter namespace " + ns + ": " + std::strerror(errno);
      if (fd >= 0) close(fd);
      return;
    }
    close(fd);
    fn();
  });
  t.join();
  if (!error.empty()) throw std::runtime_error(error);
}

// The two hosts. SetUp skips (no CAP_NET_ADMIN) or fails (no `ip`, a step refused); TearDown,
// which gtest runs whatever SetUp and the test did, deletes whatever SetUp created.
class TwoHosts : public ::testing::Test {
 protected:
  Host a, b;

  void SetUp() override {
    ASSERT_FALSE(ip_binary().empty()) << "no `ip` (scripts/install-deps.sh installs iproute2)";
    // Every namespace test runs WITHOUT GLOO_SOCKET_IFNAME (issue 14): ranks must find the
    // address that reaches MASTER_ADDR on their own.
    unsetenv("GLOO_SOCKET_IFNAME");
    remove_leftovers();
    static int fixtures = 0;
    const std::string stem = kPrefix + std::to_string(getpid()) + "-" + std::to_string(fixtures++);
    a = {.ns = stem + "a", .address = "10.77.0.1", .veth = "veth-tally-a"};
    b = {.ns = stem + "b", .address = "10.77.0.2", .veth = "veth-tally-b"};
    const subprocess::Ran first = ip({"netns", "add", a.ns});
    if (first.exit_code != 0)
      GTEST_SKIP() << "skipped: needs CAP_NET_ADMIN ("
                   << first.err.substr(0, first.err.find('\n')) << ")";
    created_.push_back(a.ns);
    ASSERT_EQ(step({"netns", "add", b.ns}), "");
    created_.push_back(b.ns);
    ASSERT_EQ(step({"link", "add", a.veth, "netns", a.ns, "type", "veth", "peer", "name", b.veth,
                    "netns", b.ns}),
              "");
    for (const Host* h : {&a, &b}) {
      ASSERT_EQ(step({"-n", h->ns, "addr", "add", h->address + "/24", "dev", h->veth}), "");
      ASSERT_EQ(step({"-n", h->ns, "link", "set", "lo", "up"}), "");
      ASSERT_EQ(step({"-n", h->ns, "link", "set", h->veth, "up"}), "");
    }
  }

  void TearDown() override {
    for (const std::string& ns : created_) {
      const subprocess::Ran r = ip({"netns", "del", ns});
      EXPECT_EQ(r.exit_code, 0) << "ip netns del " << ns << ": " << r.err;
    }
    created_.clear();
  }

 private:
  std::vector<std::string> created_;

  // "" when `ip args…` succeeded, else the command and its error.
  static std::string step(const std::vector<std::string>& args) {
    const subprocess::Ran r = ip(args);
    if (r.exit_code == 0) return "";
    std::string line = "ip";
    for (const auto& s : args) line += " " + s;
    return line + ": " + r.err;
  }
};

}  // namespace tally::netns
