// DistEnv (torchrun's environment contract), CommOptions and chunk_range: pure checks, no ranks.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>

#include "../support/loopback_socket.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/comm.hpp"
#include "tally/engine/dist_env.hpp"

namespace tally::engine {
namespace {

class EnvVars : public ::testing::Test {
 protected:
  void SetUp() override {
    set("RANK", "1");
    set("WORLD_SIZE", "4");
    set("LOCAL_RANK", "1");
    set("MASTER_ADDR", "127.0.0.1");
    set("MASTER_PORT", "29511");
  }
  static void set(const char* name, const char* value) { setenv(name, value, 1); }
  static std::string error_of(const std::function<void()>& fn) {
    try {
      fn();
    } catch (const InvalidInput& e) {
      return e.what();
    }
    return "(no InvalidInput)";
  }
};

TEST_F(EnvVars, ReadsTorchrunVariables) {
  const DistEnv env = DistEnv::from_environment();
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.master_port, 29511);
}

TEST_F(EnvVars, MissingVariableNamesItAndHowToSetIt) {
  unsetenv("RANK");
  const std::string e = error_of([] { DistEnv::from_environment(); });
  EXPECT_NE(e.find("RANK is not set"), std::string::npos) << e;
  EXPECT_NE(e.find("tally launch"), std::string::npos) << e;
  unsetenv("MASTER_ADDR");
  set("RANK", "0");
  EXPECT_NE(error_of([] { DistEnv::from_environment(); }).find("MASTER_ADDR is not set"),
            std::string::npos);
}

TEST_F(EnvVars, InvalidValuesNameTheValueAndTheRange) {
  set("RANK", "one");
  EXPECT_EQ(error_of([] { DistEnv::from_environment(); }), "RANK = 'one': not an integer");
  set("RANK", "2x");
  EXPECT_EQ(error_of([] { DistEnv::from_environment(); }), "RANK = '2x': not an integer");
  set("RANK", "4");
  EXPECT_EQ(error_of([] { DistEnv::from_environment(); }),
            "RANK = 4 vs WORLD_SIZE = 4: RANK must be in [0, WORLD_SIZE)");
  set("RANK", "0");
  set("MASTER_PORT", "70000");
  EXPECT_EQ(error_of([] { DistEnv::from_environment(); }), "MASTER_PORT = 70000: must be in [1, 65535]");
  set("MASTER_PORT", "29500");
  set("WORLD_SIZE", "0");
  EXPECT_EQ(error_of([] { DistEnv::from_environment(); }), "WORLD_SIZE = 0: must be in [1, 4096]");
}

TEST(CommOptions, TimeoutMustBePositive) {
  EXPECT_THROW((CommOptions{.timeout_s = 0}).validate(), InvalidInput);
  EXPECT_THROW((CommOptions{.timeout_s = -1}).validate(), InvalidInput);
  EXPECT_NO_THROW((CommOptions{.timeout_s = 0.5}).validate());
}

TEST(ChunkRange, CoversTheBufferWithSizesDifferingByAtMostOne) {
  for (const std::int64_t n : {0, 1, 2, 7, 13, 1000003}) {
    for (int k = 1; k <= 9; ++k) {
      std::int64_t next = 0;
      for (int i = 0; i < k; ++i) {
        const ShardSpan c = chunk_range(n, k, i);
        EXPECT_EQ(c.offset, next) << "n=" << n << " k=" << k << " i=" << i;
        EXPECT_TRUE(c.count == n / k || c.count == n / k + 1);
        EXPECT_EQ(c.count, n / k + (i < n % k ? 1 : 0));
        next += c.count;
      }
      EXPECT_EQ(next, n) << "n=" << n << " k=" << k;
    }
  }
}

TEST(Buffer, ConvertsFromVectorsAndSpans) {
  std::vector<float> f(3);
  std::vector<double> d(5);
  const Buffer bf = f;
  const Buffer bd = std::span<double>(d);
  const ConstBuffer cf = std::as_const(f);
  EXPECT_EQ(bf.dtype, DType::f32);
  EXPECT_EQ(bf.count, 3);
  EXPECT_DOUBLE_EQ(bf.size_bytes(), 12.0);
  EXPECT_EQ(bd.dtype, DType::f64);
  EXPECT_DOUBLE_EQ(bd.size_bytes(), 40.0);
  EXPECT_EQ(cf.data, f.data());
}

// The range read here on its own (the kernel's default where /proc does not say).
std::pair<int, int> ephemeral_range_read_here() {
  std::ifstream f("/proc/sys/net/ipv4/ip_local_port_range");
  int lo = 0, hi = 0;
  if (f >> lo >> hi) return {lo, hi};
  return {32768, 60999};
}

// Note [free ports]: the ports a launch of two launchers needs (its ranks' store and the
// launchers' at port + 1) lie outside the range connect() and bind(0) draw from, and both take a
// listener. (bind(0) returned odd ports there and connect() even ones, so port + 1 of a bind(0)
// port was where the next outgoing connection landed.)
TEST(FreePort, ConsecutivePortsOutsideTheEphemeralRangeEachTakeAListener) {
  const auto [lo, hi] = ephemeral_range_read_here();
  EXPECT_EQ(ephemeral_port_range(), std::make_pair(lo, hi));
  for (int i = 0; i < 20; ++i) {
    const int p = find_free_port(2);
    SCOPED_TRACE(p);
    EXPECT_GE(p, 1024);
    EXPECT_LE(p + 1, 65535);
    for (int q : {p, p + 1}) EXPECT_TRUE(q < lo || q > hi) << lo << "–" << hi;
    const int a = tally::test::loopback_listener(p), b = tally::test::loopback_listener(p + 1);
    EXPECT_GE(a, 0);
    EXPECT_GE(b, 0);
    for (int fd : {a, b})
      if (fd >= 0) close(fd);
  }
  const int six = find_free_port(6);  // a drill's base port and its sub-runs' (port + 5)
  EXPECT_TRUE(six + 5 < lo || six > hi);
}

// Note [prompt connect]: a listener that appears 0.3 s in is found within c10d's one-second
// retry, not at it; nothing listening is a timeout naming the address; a name that does not
// resolve returns at once for the store's connect to explain.
TEST(AwaitListener, ReturnsOnceSomethingListensWellWithinASecond) {
  using Clock = std::chrono::steady_clock;
  const int port = find_free_port();
  Clock::time_point listening;
  int fd = -1;
  std::thread server([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    listening = Clock::now();  // before listen(): no connect can succeed earlier
    fd = tally::test::loopback_listener(port);
  });
  const auto start = Clock::now();
  await_listener("127.0.0.1", port, 20);
  const auto done = Clock::now();
  server.join();
  ASSERT_GE(fd, 0);
  close(fd);
  EXPECT_GE(done, listening);
  EXPECT_LT(std::chrono::duration<double>(done - listening).count(), 0.9);
  EXPECT_GE(std::chrono::duration<double>(done - start).count(), 0.29);
}

TEST(AwaitListener, NothingListeningTimesOutNamingTheAddress) {
  const int port = find_free_port();
  const auto start = std::chrono::steady_clock::now();
  try {
    await_listener("127.0.0.1", port, 0.3);
    ADD_FAILURE() << "returned with nothing listening";
  } catch (const std::runtime_error& e) {
    EXPECT_EQ(std::string(e.what()), "nothing accepted a connection at 127.0.0.1:" +
                                         std::to_string(port) + " within the timeout of 0.3 s");
  }
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.3);
}

TEST(AwaitListener, UnresolvableNameReturnsAtOnce) {
  const auto start = std::chrono::steady_clock::now();
  EXPECT_NO_THROW(await_listener("no-such-host.invalid", 29500, 20));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 19);
}

TEST(FreePort, CountOutsideItsRangeIsRefused) {
  EXPECT_THROW(find_free_port(0), std::invalid_argument);
  EXPECT_THROW(find_free_port(kMaxFreePorts + 1), std::invalid_argument);
}

TEST(FreePort, IsAUsableTcpPort) {
  const int port = find_free_port();
  EXPECT_GT(port, 0);
  EXPECT_LE(port, 65535);
  EXPECT_TRUE(is_loopback_address("127.0.0.1"));
  EXPECT_TRUE(is_loopback_address("localhost"));
  EXPECT_FALSE(is_loopback_address("10.0.0.1"));
}

}  // namespace
}  // namespace tally::engine
