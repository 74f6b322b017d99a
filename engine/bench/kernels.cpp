// `tally bench gemm|memory` (tally/engine/bench/kernels.hpp).
#include "tally/engine/bench/kernels.hpp"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <string>

#include "tally/core/gpt_step.hpp"
#include "tally/core/operators.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/comm.hpp"
#include "tally/engine/gpt.hpp"
#include "tally/engine/host_memory.hpp"

namespace tally::engine {

namespace {

void check_dims(const std::vector<std::int64_t>& dims, const char* flag) {
  require_int(!dims.empty() && dims.size() <= 64, flag, std::int64_t(dims.size()),
              "must list 1..64 sizes");
  for (std::int64_t d : dims) require_int(d >= 1 && d <= 16384, flag, d, "must be in [1, 16384]");
}

void before_point(const BenchKernelTiming& t) {
  if (t.before_point) t.before_point();
}

// Side by side (Note [side-by-side kernels]): the timing with a barrier before each point, or the
// timing itself when alone.
BenchKernelTiming side_by_side_timing(BenchKernelTiming t, Comm* ranks) {
  if (ranks != nullptr && ranks->world_size() >= 2) t.before_point = [ranks] { ranks->barrier(); };
  return t;
}

// Every rank's TimeStats, in the order given, merged: each statistic the mean over ranks, min and
// max over all. `own` receives each stat's per-rank medians (rank order). The same on every rank.
void merge_over_ranks(Comm& ranks, const std::vector<TimeStats*>& stats,
                      std::vector<std::vector<double>>& own) {
  constexpr std::size_t kFields = 6;
  std::vector<double> mine;
  for (const TimeStats* t : stats)
    mine.insert(mine.end(), {t->median_s, t->p10_s, t->p90_s, t->min_s, t->max_s, t->mean_s});
  const int k = ranks.world_size();
  std::vector<double> all(mine.size() * std::size_t(k));
  ranks.all_gather(ConstBuffer(mine.data(), std::int64_t(mine.size()), DType::f64),
                   Buffer(all.data(), std::int64_t(all.size()), DType::f64));
  own.assign(stats.size(), {});
  for (std::size_t i = 0; i < stats.size(); ++i) {
    TimeStats m{.min_s = std::numeric_limits<double>::infinity(), .max_s = 0};
    for (int r = 0; r < k; ++r) {
      const double* v = all.data() + std::size_t(r) * mine.size() + i * kFields;
      m.median_s += v[0] / k;
      m.p10_s += v[1] / k;
      m.p90_s += v[2] / k;
      m.min_s = std::min(m.min_s, v[3]);
      m.max_s = std::max(m.max_s, v[4]);
      m.mean_s += v[5] / k;
      own[i].push_back(v[0]);
    }
    *stats[i] = m;
  }
}

// Each kernel's bytes over its median: add 3, copy 2, zero 1 streams of W/2 (kernels.hpp).
void set_bandwidths(MemoryRow& row) {
  const double half = row.working_set_bytes / 2;
  row.add_bps = 3 * half / row.add.median_s;
  row.copy_bps = 2 * half / row.copy.median_s;
  row.zero_bps = half / row.zero.median_s;
}

// Side by side needs the ranks on one host: they are to share its caches and DRAM.
bool side_by_side(const Comm* ranks) {
  if (ranks == nullptr || ranks->world_size() < 2) return false;
  if (!ranks->on_one_host())
    throw InvalidInput("side-by-side kernel timing: the " + std::to_string(ranks->world_size()) +
                       " ranks must all run on this host (they are timed sharing its caches and "
                       "DRAM); launch them with `tally launch --nproc` on one host");
  return true;
}

}  // namespace

std::string host_device_name(int threads, bool cold, int side_by_side) {
  return "cpu, libtorch " + std::to_string(threads) + " thread" + (threads == 1 ? "" : "s") +
         (cold ? ", cold caches" : "") +
         (side_by_side >= 2 ? ", " + std::to_string(side_by_side) + " ranks side by side" : "");
}

void BenchKernelTiming::validate() const {
  require_int(threads >= 1 && threads <= 256, "--threads", threads, "must be in [1, 256]");
  require_int(warmup >= 0 && warmup <= 1000, "--warmup", warmup, "must be in [0, 1000]");
  require_int(samples >= 1 && samples <= 1000, "--samples", samples, "must be in [1, 1000]");
  // > 0: a sample of one call to a tiny GEMM could read 0 s on the clock and its FLOP/s inf.
  require_real(min_sample_s >= 1e-5 && min_sample_s <= 10, "--min-sample-ms", min_sample_s * 1e3,
               "must be in [0.01, 10000] ms");
}

void BenchGemmOptions::validate() const {
  check_dims(m, "--m");
  check_dims(n, "--n");
  check_dims(k, "--k");
  require_int(!batch.empty() && batch.size() <= 64, "--batch", std::int64_t(batch.size()),
              "must list 1..64 sizes");
  for (std::int64_t b : batch)
    require_int(b >= 1 && b <= 4096, "--batch", b, "must be in [1, 4096]");
  const std::int64_t shapes = std::int64_t(m.size() * n.size() * k.size() * batch.size());
  require_int(shapes <= 4096, "--m x --n x --k x --batch", shapes, "must be at most 4096 shapes");
  timing.validate();
  // The largest product's three fp32 matrices, b·(m·k + k·n + m·n)·4 B.
  const auto biggest = [](const std::vector<std::int64_t>& v) {
    return double(*std::max_element(v.begin(), v.end()));
  };
  const double mm = biggest(m), nn = biggest(n), kk = biggest(k), bb = biggest(batch);
  require_fits_host(bb * (mm * kk + kk * nn + mm * nn) * 4,
                    "--m " + format_number(mm) + " x --n " + format_number(nn) + " x --k " +
                        format_number(kk) + " x --batch " + format_number(bb) +
                        ": its three fp32 matrices take");
}

void BenchMemoryOptions::validate() const {
  require_int(!working_set_bytes.empty() && working_set_bytes.size() <= 64, "--sizes-mib",
              std::int64_t(working_set_bytes.size()), "must list 1..64 sizes");
  for (double w : working_set_bytes)
    require_real(w >= 4096 && w <= 16.0 * (1LL << 30), "--sizes-mib", w / double(1 << 20),
                 "must be in [0.00390625, 16384] MiB");
  timing.validate();
  // time_memory's two buffers hold the working set.
  const double w = *std::max_element(working_set_bytes.begin(), working_set_bytes.end());
  require_fits_host(w, "--sizes-mib " + format_number(w / double(1 << 20)) +
                           ": its two buffers take");
}

double cache_flush_bytes(double llc_bytes) {
  constexpr double kMiB = 1 << 20;
  return std::clamp(2 * llc_bytes, 64 * kMiB, 1024 * kMiB);
}

double last_level_cache_bytes() {
  for (int name : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long bytes = sysconf(name);
    if (bytes > 0) return double(bytes);
  }
  return 0;
}

GemmRow time_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const BenchKernelTiming& t,
                  int repeat, std::int64_t batch) {
  TALLY_INVARIANT(repeat >= 1 && batch >= 1);
  const bool batched = batch > 1;
  const at::Tensor a = batched ? at::randn({batch, m, k}) : at::randn({m, k});
  const at::Tensor b = batched ? at::randn({batch, k, n}) : at::randn({k, n});
  at::Tensor c = batched ? at::empty({batch, m, n}) : at::empty({m, n});
  GemmRow row{.m = m, .n = n, .k = k, .batch = batch};
  before_point(t);
  const auto call = [&] {
    for (int i = 0; i < repeat; ++i) batched ? at::bmm_out(c, a, b) : at::mm_out(c, a, b);
  };
  if (t.cold) {
    // Made once per process and never freed (no tensor outlives libtorch's own statics); read
    // only: a sum leaves clean lines behind (Note [cold-cache GEMMs]).
    static const at::Tensor* const flush = new at::Tensor(
        at::ones({std::int64_t(cache_flush_bytes(last_level_cache_bytes()) / 4)}));
    row.time = time_cold_calls(t.warmup, t.samples, [] { (void)flush->sum().item<float>(); },
                               call, t.clock);
  } else {
    row.time = time_calls(t.warmup, t.samples, t.min_sample_s, call, t.clock);
  }
  row.flops_per_s = 2.0 * double(batch) * double(m) * double(n) * double(k) / row.time.median_s;
  return row;
}

MemoryRow time_memory(double working_set_bytes, const BenchKernelTiming& t, int repeat) {
  TALLY_INVARIANT(repeat >= 1);
  const std::int64_t n = std::max<std::int64_t>(1, std::int64_t(working_set_bytes / 2 / 4));
  at::Tensor a = at::randn({n}), b = at::randn({n});
  MemoryRow row{.working_set_bytes = 2.0 * 4.0 * double(n)};
  // α = −1 then +1 alternately would keep a bounded; a tiny α keeps it finite over 2^30 calls.
  before_point(t);
  row.add = time_calls(t.warmup, t.samples, t.min_sample_s, [&] {
    for (int i = 0; i < repeat; ++i) a.add_(b, 1e-9);
  }, t.clock);
  before_point(t);
  row.copy = time_calls(t.warmup, t.samples, t.min_sample_s, [&] {
    for (int i = 0; i < repeat; ++i) a.copy_(b);
  }, t.clock);
  before_point(t);
  row.zero = time_calls(t.warmup, t.samples, t.min_sample_s, [&] {
    for (int i = 0; i < repeat; ++i) a.zero_();
  }, t.clock);
  set_bandwidths(row);
  return row;
}

std::vector<StreamingKernelRow> time_streaming_kernels(const BenchKernelTiming& t,
                                                       const GptProbeShape& shape) {
  const GptConfig config{.hidden = shape.hidden, .layers = 1, .heads = shape.heads, .vocab = 2,
                         .seq = shape.seq, .micro_batch = shape.micro_batch};
  GptStageSetup setup{.model = gpt_model_spec(config), .seq = shape.seq,
                      .micro_batch = shape.micro_batch, .stage_layers = 1,
                      .first_stage = false, .last_stage = false};
  const std::vector<Op> ops = gpt_stage_ops(setup);
  const auto core_bytes = [&](std::string_view name) {
    for (const Op& op : ops)
      if (op.name == name) return op.bytes;
    TALLY_INVARIANT(false && "the probe layer lacks an operator the bench times");
    return 0.0;
  };
  const std::int64_t B = shape.micro_batch, T = shape.seq, C = shape.hidden, a = shape.heads;
  at::manual_seed(0);
  // The engine's tensors (gpt_model.cpp): the MLP's (B, T, 4C), the scores (B, a, T, T) and the
  // (T, T) causal mask, the residual stream (B, T, C).
  const at::Tensor h4 = at::randn({B, T, 4 * C}), g4 = at::randn({B, T, 4 * C});
  const at::Tensor scores = at::randn({B, a, T, T}), gs = at::randn({B, a, T, T});
  const at::Tensor probs = at::softmax(scores, -1);
  const at::Tensor mask = at::ones({T, T}, at::kBool).triu(1);
  const at::Tensor x = at::randn({B, T, C}), gx = at::randn({B, T, C});
  const at::Tensor w = at::ones({C}), b = at::zeros({C});
  const auto [y, mean, rstd] = at::native_layer_norm(x, {C}, w, b, 1e-5);
  const double inf = std::numeric_limits<double>::infinity();
  struct Kernel {
    const char* op;
    const char* call;
    std::function<void()> run;
  };
  const std::vector<Kernel> kernels = {
      {"gelu", "at::gelu(x, \"tanh\")", [&] { (void)at::gelu(h4, "tanh"); }},
      {"gelu.backward", "at::gelu_backward(g, x, \"tanh\")",
       [&] { (void)at::gelu_backward(g4, h4, "tanh"); }},
      {"softmax", "at::softmax(s, -1)", [&] { (void)at::softmax(scores, -1); }},
      {"softmax.backward", "at::_softmax_backward_data(g, y, -1, float)",
       [&] { (void)at::_softmax_backward_data(gs, probs, -1, at::kFloat); }},
      {"mask", "s.masked_fill(mask, -inf)", [&] { (void)scores.masked_fill(mask, -inf); }},
      {"mask.backward", "g.masked_fill(mask, 0)", [&] { (void)gs.masked_fill(mask, 0.0); }},
      {"norm-1", "at::native_layer_norm(x, {C}, w, b)",
       [&] { (void)at::native_layer_norm(x, {C}, w, b, 1e-5); }},
      {"norm-1.backward", "at::native_layer_norm_backward(g, x, {C}, mean, rstd, w, b)",
       [&] {
         (void)at::native_layer_norm_backward(gx, x, {C}, mean, rstd, w, b, {true, true, true});
       }}};
  std::vector<StreamingKernelRow> rows;
  for (const Kernel& k : kernels) {
    StreamingKernelRow row{.kernel = std::string(kernel_family(k.op)), .op = k.op,
                           .call = k.call, .bytes = core_bytes(k.op)};
    before_point(t);
    row.time = time_calls(t.warmup, t.samples, t.min_sample_s, k.run, t.clock);
    row.bytes_per_s = row.bytes / row.time.median_s;
    rows.push_back(std::move(row));
  }
  return rows;
}

BenchGemmResult run_bench_gemm(const BenchGemmOptions& o, Comm* ranks) {
  o.validate();
  at::set_num_threads(o.timing.threads);
  BenchGemmResult r{.options = o, .ranks = side_by_side(ranks) ? ranks->world_size() : 1};
  const BenchKernelTiming timing = side_by_side_timing(o.timing, ranks);
  at::manual_seed(0);
  for (std::int64_t b : o.batch)
    for (std::int64_t m : o.m)
      for (std::int64_t n : o.n)
        for (std::int64_t k : o.k) r.rows.push_back(time_gemm(m, n, k, timing, 1, b));
  if (side_by_side(ranks)) {
    std::vector<TimeStats*> stats;
    for (GemmRow& row : r.rows) stats.push_back(&row.time);
    std::vector<std::vector<double>> own;
    merge_over_ranks(*ranks, stats, own);
    for (std::size_t i = 0; i < r.rows.size(); ++i) r.rows[i].rank_median_s = own[i];
  }
  for (GemmRow& row : r.rows) {
    row.flops_per_s = 2.0 * double(row.batch) * double(row.m) * double(row.n) * double(row.k) /
                      row.time.median_s;
    r.best_flops_per_s = std::max(r.best_flops_per_s, row.flops_per_s);
  }
  return r;
}

BenchMemoryResult run_bench_memory(const BenchMemoryOptions& o, Comm* ranks) {
  o.validate();
  at::set_num_threads(o.timing.threads);
  BenchMemoryResult r{.options = o, .ranks = side_by_side(ranks) ? ranks->world_size() : 1};
  const BenchKernelTiming timing = side_by_side_timing(o.timing, ranks);
  std::vector<double> sizes = o.working_set_bytes;
  std::sort(sizes.begin(), sizes.end());
  for (double w : sizes) r.rows.push_back(time_memory(w, timing));
  r.overhead = time_memory(2.0 * 4.0 * double(kOverheadElements), timing).add;
  r.streaming = time_streaming_kernels(timing);
  if (side_by_side(ranks)) {
    std::vector<TimeStats*> stats;
    for (MemoryRow& row : r.rows) stats.insert(stats.end(), {&row.add, &row.copy, &row.zero});
    stats.push_back(&r.overhead);
    for (StreamingKernelRow& row : r.streaming) stats.push_back(&row.time);
    std::vector<std::vector<double>> own;
    merge_over_ranks(*ranks, stats, own);
    for (std::size_t i = 0; i < r.rows.size(); ++i) r.rows[i].rank_add_median_s = own[3 * i];
  }
  for (MemoryRow& row : r.rows) set_bandwidths(row);
  for (StreamingKernelRow& row : r.streaming) row.bytes_per_s = row.bytes / row.time.median_s;
  return r;
}

void add_to_calibration(const BenchGemmResult& r, io::KernelCalibration& k) {
  const std::string device =
      host_device_name(r.options.timing.threads, r.options.timing.cold, r.ranks);
  // The same device's GEMMs merge (a second grid adds its shapes, a shape timed again takes the
  // new time, the peak is the best of both); another device's are replaced.
  const bool merge = k.device == device && k.precision == "fp32" && !k.gemm.empty();
  if (!merge) k.gemm.clear();
  k.device = device;
  k.precision = "fp32";
  k.peak_flops = merge ? std::max(k.peak_flops, r.best_flops_per_s) : r.best_flops_per_s;
  k.sm_count = r.options.timing.threads;
  for (const GemmRow& row : r.rows) {
    const GemmSample g{.m = row.m, .n = row.n, .k = row.k, .batch = double(row.batch),
                       .seconds = row.time.median_s};
    const auto same = std::find_if(k.gemm.begin(), k.gemm.end(), [&](const GemmSample& x) {
      return x.m == g.m && x.n == g.n && x.k == g.k && x.batch == g.batch;
    });
    if (same != k.gemm.end())
      *same = g;
    else
      k.gemm.push_back(g);
  }
}

void add_to_calibration(const BenchMemoryResult& r, io::KernelCalibration& k) {
  if (k.device.empty()) k.device = host_device_name(r.options.timing.threads, false, r.ranks);
  k.memory_curve.clear();
  for (const MemoryRow& row : r.rows)
    k.memory_curve.push_back({.working_set_bytes = row.working_set_bytes, .bytes_per_s = row.add_bps});
  if (!r.rows.empty()) k.memory_bps = r.rows.back().add_bps;
  if (r.overhead.median_s > 0) k.memory_overhead_s = r.overhead.median_s;
  k.streaming_kernels.clear();
  for (const StreamingKernelRow& row : r.streaming)
    k.streaming_kernels.push_back(
        {.kernel = row.kernel, .bytes = row.bytes, .seconds_median = row.time.median_s});
}

}  // namespace tally::engine
