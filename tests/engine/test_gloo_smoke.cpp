// Foundation smoke test: a real 2-rank Gloo all-reduce over a c10d TCPStore on loopback, talking to
// c10d directly (no tally code in the path), so a broken libtorch / Gloo install fails here first.
//
// Ranks are forked child processes. The fork happens before the child creates any torch or Gloo
// thread (the parent never touches torch), and the parent waits with a deadline and SIGKILLs
// stragglers, so the test can fail but never hang.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

namespace {

constexpr auto kCollectiveTimeout = std::chrono::seconds(20);
constexpr double kTestLimit_s = 40;  // whole test, both ranks; under the ctest TIMEOUT of 60 s
constexpr int kWorldSize = 2;
constexpr int kCount = 1001;         // odd, so no chunking hides an off-by-one

// Rank 0 hosts the store on a port the kernel picks (port 0) and tells the other rank through a
// pipe; nothing else can take that port between bind and use.
int run_rank(int rank, int port_pipe[2]) {
  c10d::TCPStoreOptions store_opts;
  store_opts.isServer = rank == 0;
  store_opts.numWorkers = kWorldSize;
  store_opts.waitWorkers = false;
  store_opts.timeout = kCollectiveTimeout;
  std::uint16_t port = 0;
  if (rank == 0) {
    store_opts.port = 0;
  } else if (read(port_pipe[0], &port, sizeof port) != sizeof port) {
    return 10;
  } else {
    store_opts.port = port;
  }
  auto store = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", store_opts);
  if (rank == 0) {
    port = store->getPort();
    for (int r = 1; r < kWorldSize; ++r)
      if (write(port_pipe[1], &port, sizeof port) != sizeof port) return 11;
  }
  auto pg_opts = c10d::ProcessGroupGloo::Options::create(kCollectiveTimeout);
  pg_opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, kWorldSize, pg_opts);

  // Element i of rank r holds (r + 1) * (i + 1): small integers, so the float sum is exact.
  std::vector<at::Tensor> tensors{at::arange(1, kCount + 1, at::kFloat) * float(rank + 1)};
  pg->allreduce(tensors)->wait(kCollectiveTimeout);
  const float* got = tensors[0].data_ptr<float>();
  const float rank_sum = kWorldSize * (kWorldSize + 1) / 2;  // Σ (r + 1) = 3
  int wrong = 0;
  for (int i = 0; i < kCount; ++i)
    if (got[i] != rank_sum * float(i + 1)) {
      if (wrong++ < 5)
        std::fprintf(stderr, "rank %d: element %d = %g vs expected %g\n", rank, i, got[i],
                     rank_sum * float(i + 1));
    }
  return wrong == 0 ? 0 : 1;
}

}  // namespace

TEST(GlooSmoke, TwoRankAllReduceOverTcpStoreIsExact) {
  int port_pipe[2];
  ASSERT_EQ(pipe(port_pipe), 0);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < kWorldSize; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 12;
      try {
        code = run_rank(rank, port_pipe);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
      }
      std::fflush(nullptr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  close(port_pipe[0]);
  close(port_pipe[1]);

  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(kTestLimit_s);
  std::vector<int> status(kWorldSize, -1);
  int running = kWorldSize;
  while (running > 0 && std::chrono::steady_clock::now() < deadline) {
    for (int r = 0; r < kWorldSize; ++r) {
      if (status[r] != -1) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        status[r] = st;
        --running;
      }
    }
    poll(nullptr, 0, 20);
  }
  for (int r = 0; r < kWorldSize; ++r) {
    if (status[r] != -1) continue;
    kill(pids[r], SIGKILL);
    waitpid(pids[r], &status[r], 0);
    ADD_FAILURE() << "rank " << r << " still running after " << kTestLimit_s << " s; killed";
  }
  for (int r = 0; r < kWorldSize; ++r) {
    EXPECT_TRUE(WIFEXITED(status[r])) << "rank " << r << " died by signal " << WTERMSIG(status[r]);
    if (WIFEXITED(status[r])) {
      EXPECT_EQ(WEXITSTATUS(status[r]), 0) << "rank " << r;
    }
  }
}
