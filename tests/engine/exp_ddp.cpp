// tally's DistributedDataParallel (engine/runtime/ddp_torch.hpp) over real processes on loopback:
// the bucket plan; 5 steps of DDP training equal one process on the full batch for world sizes
// 2, 3, 4 and bucket sizes from one parameter per bucket to one bucket; replicas stay bit-equal;
// bf16-mixed training runs, learns and reports the bytes it really sent; no_sync and misuse; a
// rank dying mid-backward fails the others with CommError within the timeout. A torch TU: the
// parent process never touches torch (the ranks are forked children, rank_harness.hpp).
#include <gtest/gtest.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "comm_torch.hpp"
#include "ddp_torch.hpp"
#include "mlp.hpp"
#include "optimizer_torch.hpp"
#include "rank_harness.hpp"
#include "tally/core/comm.hpp"

namespace tally::engine::exp_ddp {
namespace {

constexpr double kTimeout_s = 20;  // per collective
constexpr double kLimit_s = 55;    // one run of k ranks; ctest TIMEOUT is the backstop
const std::vector<std::int64_t> kWidths = {8, 16, 16, 4};  // 6 tensors, 484 parameters
constexpr std::int64_t kRows = 24;                         // divisible by 2, 3 and 4

TEST(DdpBuckets, ReverseOrderClosedAtTheCap) {
  const std::vector<double> bytes = {512, 64, 1024, 64, 256, 16};  // kWidths in float32
  using Plan = std::vector<std::vector<std::size_t>>;
  EXPECT_EQ(compute_bucket_assignment_by_size(bytes, 1), (Plan{{5}, {4}, {3}, {2}, {1}, {0}}));
  EXPECT_EQ(compute_bucket_assignment_by_size(bytes, 300), (Plan{{5, 4, 3}, {2}, {1, 0}}));
  EXPECT_EQ(compute_bucket_assignment_by_size(bytes, 25 * kMiB), (Plan{{5, 4, 3, 2, 1, 0}}));
  EXPECT_EQ(compute_bucket_assignment_by_size({}, 1), Plan{});
  EXPECT_THROW((DdpOptions{.bucket_cap_bytes = 0}.validate()), InvalidInput);
  EXPECT_THROW((AdamOptions{.beta2 = 1}.validate()), InvalidInput);
}

// PyTorch's {first, cap} bucket limits (ddp.hpp, Note [first bucket] in ddp.cpp): only the first
// bucket in reduction order closes at the smaller limit.
TEST(DdpBuckets, FirstBucketClosesAtItsOwnCap) {
  const std::vector<double> bytes = {512, 64, 1024, 64, 256, 16};
  using Plan = std::vector<std::vector<std::size_t>>;
  EXPECT_EQ(compute_bucket_assignment_by_size(bytes, 25 * kMiB, 200), (Plan{{5, 4}, {3, 2, 1, 0}}));
  EXPECT_EQ(compute_bucket_assignment_by_size(bytes, 300, 1), (Plan{{5}, {4, 3}, {2}, {1, 0}}));
  EXPECT_EQ(compute_bucket_assignment_by_size(bytes, 300, 300),
            compute_bucket_assignment_by_size(bytes, 300));
  EXPECT_EQ(DdpOptions{}.first_bucket_cap_bytes, 1 * kMiB);  // dist._DEFAULT_FIRST_BUCKET_BYTES
  EXPECT_THROW((DdpOptions{.first_bucket_cap_bytes = 0}.validate()), InvalidInput);
}

double max_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double d = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    d = std::max(d, (a[i].detach().to(at::kDouble) - b[i].detach().to(at::kDouble))
                        .abs().max().item<double>());
  return d;
}

// Every rank's flat parameters vs rank 0's (a float32 broadcast; bf16 widens exactly).
double diff_vs_rank0(Comm& comm, const std::vector<at::Tensor>& params) {
  at::Tensor flat = mlp::flat_values(params).to(at::kFloat);
  at::Tensor rank0 = flat.clone();
  broadcast(comm, rank0, 0);
  return (flat - rank0).abs().max().item<double>();
}

struct Sweep {
  int k;
  double cap_bytes;
  std::size_t buckets;
  std::string name;
};

void PrintTo(const Sweep& s, std::ostream* os) { *os << s.name; }

class DdpTraining : public ::testing::TestWithParam<Sweep> {};

TEST_P(DdpTraining, FiveStepsEqualFullBatchTraining) {
  const Sweep sw = GetParam();
  const auto result = harness::run_ranks(sw.k, kLimit_s, [&](const DistEnv& env) {
    Comm comm(env, {.timeout_s = kTimeout_s});
    const int k = env.world_size, r = env.rank;
    at::manual_seed(100 + r);  // a different init on every rank: the broadcast must fix it
    mlp::Mlp model = mlp::make_mlp(kWidths);
    DistributedDataParallel ddp(comm, model.parameters(), {.bucket_cap_bytes = sw.cap_bytes});
    at::manual_seed(100);      // rank 0's init, for the single-process reference
    mlp::Mlp ref = mlp::make_mlp(kWidths);
    EXPECT_EQ(max_diff(model.parameters(), ref.parameters()), 0.0) << "broadcast from rank 0";
    EXPECT_EQ(ddp.buckets().size(), sw.buckets);

    at::manual_seed(5);
    const at::Tensor X = at::randn({kRows, kWidths.front()});
    const at::Tensor y = at::randint(0, kWidths.back(), {kRows}, at::kLong);
    const std::vector<at::Tensor> params = model.parameters(), ref_params = ref.parameters();
    for (int step = 0; step < 5; ++step) {
      zero_grad(params);
      at::cross_entropy_loss(model.forward(X.slice(0, r, kRows, k)), y.slice(0, r, kRows, k))
          .backward();
      ddp.finish_gradient_sync();
      sgd_step(params, 0.1);
      zero_grad(ref_params);
      at::cross_entropy_loss(ref.forward(X), y).backward();
      sgd_step(ref_params, 0.1);
    }
    EXPECT_LT(max_diff(params, ref_params), 1e-5) << "DDP vs one process on the full batch";
    const DdpStats s = ddp.stats();
    EXPECT_EQ(s.backward_passes, 5);
    EXPECT_EQ(s.sync_events, 5);
    EXPECT_EQ(s.bucket_all_reduces, 5 * std::int64_t(sw.buckets));
    EXPECT_EQ(comm.counters()[Collective::all_reduce].calls, s.bucket_all_reduces);
    EXPECT_DOUBLE_EQ(s.wire_bytes_per_sync, 484 * 4);
    double per_sync = 0;  // the core's formula, bucket by bucket
    for (const auto& b : ddp.buckets()) {
      double bucket_bytes = 0;
      for (std::size_t i : b) bucket_bytes += double(params[i].nbytes());
      per_sync += collective_bytes_per_rank(Collective::all_reduce, bucket_bytes, k);
    }
    EXPECT_DOUBLE_EQ(s.gradient_bytes_sent, 5 * per_sync);
    EXPECT_EQ(diff_vs_rank0(comm, params), 0.0) << "replicas must be identical (atol 0)";
  });
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

// Note [bucket buffers]: after finish .grad is a view of the reduced bucket, yet a gradient the
// caller kept is never overwritten by a later step, and gradients left in place accumulate as
// copies would. The model is never stepped, so every synchronized backward averages to the
// full-batch gradient g.
TEST(DdpBucketViews, KeptGradientsNeverChangeAndAccumulationStillAdds) {
  const auto result = harness::run_ranks(2, kLimit_s, [&](const DistEnv& env) {
    Comm comm(env, {.timeout_s = kTimeout_s});
    const int k = env.world_size, r = env.rank;
    at::manual_seed(100);
    mlp::Mlp model = mlp::make_mlp(kWidths);
    mlp::Mlp ref = model.clone();
    DistributedDataParallel ddp(comm, model.parameters(), {.bucket_cap_bytes = 300});
    ASSERT_EQ(ddp.buckets().size(), 3u);  // {5, 4, 3}, {2}, {1, 0}
    at::manual_seed(5);
    const at::Tensor X = at::randn({kRows, kWidths.front()});
    const at::Tensor y = at::randint(0, kWidths.back(), {kRows}, at::kLong);
    const std::vector<at::Tensor> params = model.parameters(), ref_params = ref.parameters();
    at::cross_entropy_loss(ref.forward(X), y).backward();
    std::vector<at::Tensor> g, g2;  // full-batch gradient, and twice it
    for (const auto& p : ref_params) {
      g.push_back(p.grad().clone());
      g2.push_back(p.grad() * 2);
    }
    const auto sync_step = [&] {
      at::cross_entropy_loss(model.forward(X.slice(0, r, kRows, k)), y.slice(0, r, kRows, k))
          .backward();
      ddp.finish_gradient_sync();
    };
    const auto grads = [&] {
      std::vector<at::Tensor> out;
      for (const auto& p : params) out.push_back(p.grad());
      return out;
    };
    sync_step();
    EXPECT_LT(max_diff(grads(), g), 1e-6);
    const at::Tensor held = params[0].grad(), held_copy = held.clone();  // bucket 2's buffer

    zero_grad(params);  // set to none: buckets 0 and 1 are reused, bucket 2 is still held
    sync_step();
    EXPECT_TRUE(held.equal(held_copy)) << "a gradient the caller kept was overwritten";
    EXPECT_LT(max_diff(grads(), g), 1e-6);
    EXPECT_EQ(ddp.stats().bucket_buffer_reallocations, 1);

    sync_step();  // no zero_grad: the averages accumulate into the .grad views, as into copies
    EXPECT_LT(max_diff(grads(), g2), 1e-6);
    EXPECT_EQ(ddp.stats().bucket_buffer_reallocations, 4);  // every bucket's views were alive

    zero_grad(params);
    sync_step();
    EXPECT_LT(max_diff(grads(), g), 1e-6);
    EXPECT_EQ(ddp.stats().bucket_buffer_reallocations, 4);
    EXPECT_TRUE(held.equal(held_copy));
  });
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

std::vector<Sweep> sweeps() {
  std::vector<Sweep> out;
  for (int k : {2, 3, 4}) {
    const std::string w = "k" + std::to_string(k) + "_";
    out.push_back({k, 1, 6, w + "OneParamPerBucket"});
    out.push_back({k, 300, 3, w + "Cap300B"});
    out.push_back({k, 25 * kMiB, 1, w + "Default25MiB"});
    out.push_back({k, 1e15, 1, w + "Huge"});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(WorldsAndBuckets, DdpTraining, ::testing::ValuesIn(sweeps()),
                         [](const auto& info) { return info.param.name; });

// Communication overlaps the backward pass: with one parameter per bucket and the first layer's
// gradient made slow on every rank (a 300 ms sleep in its hook), the buckets of the later layers,
// started from their hooks, are measured complete before the backward pass ends.
TEST(DdpOverlap, LaterBucketsCompleteWhileBackwardStillRuns) {
  const auto result = harness::run_ranks(2, kLimit_s, [](const DistEnv& env) {
    Comm comm(env, {.timeout_s = kTimeout_s});
    at::manual_seed(1);
    mlp::Mlp model = mlp::make_mlp(kWidths);
    DistributedDataParallel ddp(comm, model.parameters(), {.bucket_cap_bytes = 1});
    model.weights[0].register_hook([](const at::Tensor& g) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      return g;
    });
    at::manual_seed(5);
    const at::Tensor X = at::randn({kRows, kWidths.front()});
    const at::Tensor y = at::randint(0, kWidths.back(), {kRows}, at::kLong);
    at::cross_entropy_loss(model.forward(X), y).backward();
    // Buckets {5}, {4}, {3}, {2} (layers 2 and 1) were started before layer 0's gradient.
    EXPECT_GE(ddp.stats().buckets_done_during_backward, 4);
    ddp.finish_gradient_sync();
    EXPECT_EQ(ddp.stats().bucket_all_reduces, 6);
  });
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

// bf16 parameters and gradients, fp32 master weights and Adam moments; Gloo reduces in float32
// (Note [bf16 on Gloo] in ddp.cpp), and the counters say so.
TEST(DdpMixed, Bf16TrainingLearnsAndCountsFloat32OnTheWire) {
  const auto result = harness::run_ranks(2, kLimit_s, [](const DistEnv& env) {
    Comm comm(env, {.timeout_s = kTimeout_s});
    const int k = env.world_size, r = env.rank;
    at::manual_seed(11);
    mlp::Mlp model = mlp::make_mlp(kWidths, at::kBFloat16);
    const std::vector<at::Tensor> params = model.parameters();
    DistributedDataParallel ddp(comm, params);
    Adam adam(params, {.lr = 1e-2});
    EXPECT_DOUBLE_EQ(adam.state_bytes(), 484.0 * (4 + 4 + 4));  // master + m + v, fp32
    at::manual_seed(5);
    const at::Tensor X = at::randn({kRows, kWidths.front()}).to(at::kBFloat16);
    const at::Tensor y = at::randint(0, kWidths.back(), {kRows}, at::kLong);
    std::vector<double> losses;
    constexpr int kSteps = 30;
    for (int step = 0; step < kSteps; ++step) {
      adam.zero_grad();
      const at::Tensor loss = at::cross_entropy_loss(
          model.forward(X.slice(0, r, kRows, k)).to(at::kFloat), y.slice(0, r, kRows, k));
      loss.backward();
      ddp.finish_gradient_sync();
      EXPECT_EQ(params[0].grad().scalar_type(), at::kBFloat16);
      adam.step();
      losses.push_back(loss.item<double>());
    }
    EXPECT_EQ(params[0].scalar_type(), at::kBFloat16);
    const DdpStats s = ddp.stats();
    EXPECT_EQ(s.grad_dtype, "bfloat16");
    EXPECT_EQ(s.wire_dtype, "float32");
    EXPECT_DOUBLE_EQ(s.wire_bytes_per_sync, 484 * 4);  // 4 bytes per gradient on the wire, not 2
    EXPECT_DOUBLE_EQ(s.gradient_bytes_sent,
                     kSteps * collective_bytes_per_rank(Collective::all_reduce, 484 * 4, k));
    at::Tensor l = at::tensor(losses, at::kDouble);
    all_reduce(comm, l, ReduceOp::average);
    const double first = l.slice(0, 0, 5).mean().item<double>();
    const double last = l.slice(0, kSteps - 5, kSteps).mean().item<double>();
    EXPECT_LT(last, 0.8 * first) << "bf16-mixed loss " << first << " → " << last;
    if (r == 0) std::fprintf(stderr, "bf16-mixed: mean loss of steps 1-5 %.4f, 26-30 %.4f\n", first, last);
    EXPECT_EQ(diff_vs_rank0(comm, params), 0.0);
  });
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

TEST(DdpGloo, GlooHasNoBFloat16AllReduce) {
  // Note [bf16 on Gloo]: if this starts failing, Gloo learned bf16 and DDP could send 2 bytes.
  const auto result = harness::run_ranks(1, kLimit_s, [](const DistEnv&) {
    auto store = c10::make_intrusive<c10d::HashStore>();
    auto opts = c10d::ProcessGroupGloo::Options::create(std::chrono::milliseconds(10000));
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    c10d::ProcessGroupGloo group(store, 0, 1, opts);
    std::vector<at::Tensor> f32{at::ones({4}, at::kFloat)};
    EXPECT_NO_THROW(group.allreduce(f32)->wait());
    std::vector<at::Tensor> bf16{at::ones({4}, at::kBFloat16)};
    bool threw = false;
    try {
      group.allreduce(bf16)->wait();
    } catch (const std::exception& e) {
      threw = true;
      EXPECT_NE(std::string(e.what()).find("Invalid scalar type"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(threw) << "ProcessGroupGloo all-reduced bfloat16: revisit Note [bf16 on Gloo]";
  });
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

// Accumulation scopes, and the misuse finish_gradient_sync() reports instead of stepping on
// unsynchronized gradients.
TEST(DdpNoSync, AccumulatesWithoutSendingAndRejectsMisuse) {
  const auto result = harness::run_ranks(2, kLimit_s, [](const DistEnv& env) {
    Comm comm(env, {.timeout_s = kTimeout_s});
    const int k = env.world_size, r = env.rank;
    at::manual_seed(3);
    mlp::Mlp model = mlp::make_mlp(kWidths, at::kDouble);
    const std::vector<at::Tensor> params = model.parameters();
    DistributedDataParallel ddp(comm, params, {.bucket_cap_bytes = 1});
    at::manual_seed(5);
    const at::Tensor X = at::randn({kRows, kWidths.front()}, at::kDouble);
    const at::Tensor y = at::randint(0, kWidths.back(), {kRows}, at::kLong);
    auto loss = [&](int part) {  // two halves of this rank's rows
      const at::Tensor xr = X.slice(0, r, kRows, k), yr = y.slice(0, r, kRows, k);
      return at::cross_entropy_loss(model.forward(xr.slice(0, part, xr.size(0), 2)),
                                    yr.slice(0, part, yr.size(0), 2));
    };
    EXPECT_THROW(ddp.finish_gradient_sync(), std::logic_error);  // nothing to finish
    {
      auto scope = ddp.no_sync();
      (loss(0) / 2).backward();
    }
    EXPECT_EQ(comm.counters()[Collective::all_reduce].calls, 0);
    EXPECT_THROW(ddp.finish_gradient_sync(), std::logic_error);  // only a no_sync pass
    (loss(1) / 2).backward();
    EXPECT_EQ(comm.counters()[Collective::all_reduce].calls, 6);  // one per bucket
    ddp.finish_gradient_sync();
    // The accumulated, averaged gradient is the full-batch gradient of all 24 rows.
    mlp::Mlp ref = model.clone();
    at::cross_entropy_loss(ref.forward(X), y).backward();
    EXPECT_LT((mlp::flat_grads(params) - mlp::flat_grads(ref.parameters())).abs().max().item<double>(),
              1e-12);
    EXPECT_EQ(ddp.stats().backward_passes, 2);
    EXPECT_EQ(ddp.stats().no_sync_backward_passes, 1);
    EXPECT_EQ(ddp.stats().sync_events, 1);
    // Two synchronized backward passes without finish in between: reported, not silently summed.
    loss(0).backward();
    loss(1).backward();
    EXPECT_THROW(ddp.finish_gradient_sync(), std::logic_error);
  });
  EXPECT_TRUE(result.all_ok()) << result.describe();
}

TEST(DdpFailure, RankDyingMidBackwardFailsTheOthersWithCommError) {
  constexpr double kShortTimeout_s = 8;
  const auto result = harness::run_ranks(3, kLimit_s, [](const DistEnv& env) {
    Comm comm(env, {.timeout_s = kShortTimeout_s});
    at::manual_seed(1);
    mlp::Mlp model = mlp::make_mlp(kWidths);
    DistributedDataParallel ddp(comm, model.parameters(), {.bucket_cap_bytes = 1});
    if (env.rank == 1)  // dies when the first layer's gradient arrives: later buckets are in flight
      model.weights[0].register_hook([](const at::Tensor& g) {
        std::fflush(nullptr);
        _exit(3);
        return g;
      });
    at::manual_seed(5);
    const at::Tensor X = at::randn({kRows, kWidths.front()});
    const at::Tensor y = at::randint(0, kWidths.back(), {kRows}, at::kLong);
    const auto start = std::chrono::steady_clock::now();
    at::cross_entropy_loss(model.forward(X), y).backward();
    try {
      ddp.finish_gradient_sync();
      ADD_FAILURE() << "rank " << env.rank << ": finish_gradient_sync() returned";
    } catch (const CommError& e) {
      const double waited_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_LT(waited_s, kShortTimeout_s + 5) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(env.rank) + ": all-reduce"),
                std::string::npos)
          << e.what();
      std::fprintf(stderr, "rank %d after %.2f s: %s\n", env.rank, waited_s, e.what());
    }
    EXPECT_THROW(ddp.finish_gradient_sync(), CommError);  // the Comm stays failed
  });
  ASSERT_EQ(result.ranks.size(), 3u);
  EXPECT_TRUE(result.ranks[0].ok()) << result.describe();
  EXPECT_TRUE(result.ranks[2].ok()) << result.describe();
  EXPECT_TRUE(WIFEXITED(result.ranks[1].status) && WEXITSTATUS(result.ranks[1].status) == 3)
      << result.describe();
  EXPECT_LT(result.elapsed_s, kLimit_s) << result.describe();
}

}  // namespace
}  // namespace tally::engine::exp_ddp
