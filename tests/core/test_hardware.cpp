// ClusterSpec::validate: the physical bounds of core/hardware.hpp (issue 8 item 6). A figure such as
// 5e-324 passes a "(0, x]" check and then turns every time into inf; the bounds refuse it while
// every preset (real systems) passes.
#include "tally/core/hardware.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <string>

#include "tally/core/presets.hpp"

namespace tally::test_hardware {
namespace {

ClusterSpec a100() { return *cluster_preset("a100-80g"); }

// validate() throws InvalidInput whose message names `field`.
void expect_rejected(const std::function<void(ClusterSpec&)>& edit, const std::string& field) {
  ClusterSpec c = a100();
  edit(c);
  try {
    c.validate();
    ADD_FAILURE() << field << ": accepted";
  } catch (const InvalidInput& e) {
    EXPECT_NE(std::string(e.what()).find(field), std::string::npos) << e.what();
  }
}

TEST(Hardware, EveryPresetIsInsideTheBounds) {
  for (const auto& name : cluster_preset_names()) {
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(cluster_preset(name)->validate());
  }
}

TEST(Hardware, SubnormalNanAndInfiniteFiguresAreRejected) {
  const double tiny = std::numeric_limits<double>::denorm_min();  // 5e-324
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const double bad : {tiny, nan, inf, -1.0, 0.0}) {
    SCOPED_TRACE(bad);
    expect_rejected([&](ClusterSpec& c) { c.mfu = bad; }, "mfu");
    expect_rejected([&](ClusterSpec& c) { c.intra_node.bandwidth_bps = bad; }, "intra-node bandwidth");
    expect_rejected([&](ClusterSpec& c) { c.inter_node.bandwidth_bps = bad; }, "inter-node bandwidth");
    if (bad != 0.0)  // 0 = per node × nodes
      expect_rejected([&](ClusterSpec& c) { c.checkpoint_write_bps = bad; }, "checkpoint write");
    expect_rejected([&](ClusterSpec& c) { c.checkpoint_write_bps_per_node = bad; },
                    "checkpoint write bandwidth per node");
    expect_rejected([&](ClusterSpec& c) { c.gpu.memory_bytes = bad; }, "gpu memory");
    expect_rejected([&](ClusterSpec& c) { c.gpu.peak_bf16_flops = bad; }, "peak_bf16");
  }
  for (const double bad : {nan, inf, -1.0, 2.0}) {
    expect_rejected([&](ClusterSpec& c) { c.failure_rate_per_hour = bad; }, "failure rate");
    expect_rejected([&](ClusterSpec& c) { c.inter_node.latency_s = bad; }, "inter-node latency");
  }
}

TEST(Hardware, BoundsAreInclusiveAndZeroMeansNoneForOptionalPeaks) {
  ClusterSpec c = a100();
  c.mfu = kUtilisationBounds.lo;  // 0.001
  c.inter_node.bandwidth_bps = kBandwidthBpsBounds.lo;  // 1 MB/s
  c.failure_rate_per_hour = 0;  // no failures: allowed (reported in words by the CLI)
  c.intra_node.latency_s = 0;
  c.gpu.peak_fp8_flops = 0;  // an A100 has no FP8 tensor cores
  EXPECT_NO_THROW(c.validate());
  expect_rejected([](ClusterSpec& x) { x.gpu.peak_fp8_flops = 1; }, "peak_fp8");
}

}  // namespace
}  // namespace tally::test_hardware
