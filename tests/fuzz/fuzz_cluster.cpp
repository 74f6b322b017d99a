// Fuzz harness: the cluster file reader (io/include/tally/io/cluster_file.hpp).
//
// The input is a cluster JSON file. Checked (Note [fuzz contract] in fuzz_check.hpp): parse_cluster
// (in memory) and load_cluster (the file) agree, value or message; an accepted cluster is JSON,
// passes ClusterSpec::validate(), and every figure in it is finite and not subnormal. io has no
// cluster writer, so there is no round trip to check.
#include <cmath>

#include "fuzz_check.hpp"
#include "tally/io/cluster_file.hpp"

namespace tally::fuzz {
namespace {

// Every double of a ClusterSpec, in declaration order.
std::vector<double> figures(const ClusterSpec& c) {
  return {c.gpu.memory_bytes,      c.gpu.peak_fp32_flops,      c.gpu.peak_tf32_flops,
          c.gpu.peak_bf16_flops,   c.gpu.peak_fp8_flops,       c.intra_node.bandwidth_bps,
          c.intra_node.latency_s,  c.inter_node.bandwidth_bps, c.inter_node.latency_s,
          c.failure_rate_per_hour, c.checkpoint_write_bps,     c.mfu};
}

bool same_cluster(const ClusterSpec& a, const ClusterSpec& b) {
  const auto fa = figures(a), fb = figures(b);
  for (std::size_t i = 0; i < fa.size(); ++i)
    if (!same_bits(fa[i], fb[i])) return false;
  return a.gpu.name == b.gpu.name && a.gpus_per_node == b.gpus_per_node;
}

}  // namespace
}  // namespace tally::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace tally::fuzz;
  using namespace tally::io;
  const auto file = read_json_both_ways(
      data, size, "cluster.json", "parse_cluster", [](std::string_view t, const std::string& src) { return parse_cluster(t, src); },
      "load_cluster", [](const fs::path& path) { return load_cluster(path); }, same_cluster);
  if (!file.ok()) return 0;
  const tally::ClusterSpec& c = *file.value;
  const auto valid = attempt("ClusterSpec::validate", [&] { c.validate(); });
  FUZZ_CHECK(valid.ok(), "an accepted cluster file does not validate: " + valid.error);
  for (const double v : figures(c)) expect_sane_figure("load_cluster: a figure", v);
  return 0;
}
