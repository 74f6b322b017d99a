// `tally bench gemm` and `tally bench memory` (engine/bench/kernels.cpp): one process times
// libtorch's float32 matrix product over an (m, n, k) grid, or its streaming kernels over working
// sets, prints a table or JSON, and with --calibration-out FILE writes the kernels section of a
// calibration — merged into FILE when it exists, so `bench allreduce`, `bench gemm` and
// `bench memory` build one file that `tally bench ddp|run zero --calibration FILE` predict from.
// Exit codes: 0 ok, 2 bad input.
#include <fmt/core.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "common.hpp"
#include "run_registry.hpp"
#include "tally/engine/bench/kernels.hpp"
#include "tally/engine/comm.hpp"
#include "tally/engine/dist_env.hpp"
#include "tally/io/calibration.hpp"
#include "tally/io/files.hpp"

namespace tally::cli::bench_kernels {

namespace {

struct TimingFlags {
  int threads = 1, warmup = 2, samples = 7;
  double min_sample_ms = 2;
  std::string clock = "wall";
  bool json = false;
  std::string calibration_out;
  engine::BenchKernelTiming timing() const {
    return {.threads = threads, .warmup = warmup, .samples = samples,
            .min_sample_s = min_sample_ms / 1e3,
            .clock = clock == "cpu" ? engine::TimerClock::process_cpu : engine::TimerClock::wall};
  }
};

void add_timing_flags(CLI::App& cmd, TimingFlags& f) {
  cmd.add_option("--threads", f.threads,
                 "torch intra-op threads (set OPENBLAS_NUM_THREADS to the same for BLAS)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd.add_option("--warmup", f.warmup, "untimed calls per point")
      ->check(CLI::Range(0, 1000))
      ->capture_default_str();
  cmd.add_option("--samples", f.samples, "timed samples per point (statistics over them)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd.add_option("--min-sample-ms", f.min_sample_ms,
                 "each sample repeats the kernel until it lasts this long, ms")
      ->check(finite_in(0.01, 1e4))
      ->capture_default_str();
  cmd.add_option("--clock", f.clock,
                 "wall | cpu: time the wall clock, or this process's CPU time (what `tally run "
                 "health-check` times: calibrate it with --threads 1 --clock cpu, gemm with "
                 "--cache warm; on a busy host the wall clock counts other processes' turns)")
      ->check(one_of({"wall", "cpu"}))
      ->capture_default_str();
  cmd.add_flag("--json", f.json, "print one JSON object instead of the table");
  cmd.add_option("--calibration-out", f.calibration_out,
                 "write (or merge into) a calibration JSON: the kernels section");
}

// FILE's calibration if it exists (to merge into), else a new one; checked before the benchmark.
io::Calibration calibration_to_merge(const std::string& path, const std::string& what) {
  io::Calibration c;
  if (path.empty()) return c;
  const auto parent = std::filesystem::absolute(path).parent_path();
  if (!std::filesystem::is_directory(parent))
    throw InvalidInput("--calibration-out = '" + path + "': directory " + parent.string() +
                       " does not exist");
  if (std::filesystem::exists(path)) c = io::load_calibration(path);
  c.source = c.source.empty() || !std::filesystem::exists(path) ? what : c.source + "; " + what;
  return c;
}

void write_calibration(const std::string& path, const io::Calibration& c) {
  try {
    io::write_text_atomically(path, io::calibration_to_json(c));
  } catch (const std::system_error& e) {
    throw std::runtime_error("--calibration-out: " + std::string(e.what()));
  }
}

double us(double s) { return s * 1e6; }

// Under `tally launch --nproc s` (WORLD_SIZE >= 2) the ranks time side by side (Note [side-by-side
// kernels], engine/bench/kernels.hpp): a Comm over them; alone (no launch, or s = 1), none.
std::unique_ptr<engine::Comm> side_by_side_ranks() {
  if (std::getenv("WORLD_SIZE") == nullptr) return nullptr;
  const engine::DistEnv env = engine::DistEnv::from_environment();
  if (env.world_size < 2) return nullptr;
  return std::make_unique<engine::Comm>(env);
}

// Rank 0 of side-by-side ranks, or a process alone, prints and writes the calibration.
bool speaks(const std::unique_ptr<engine::Comm>& ranks) { return !ranks || ranks->rank() == 0; }

// The table's line for side-by-side timing; empty alone.
std::string side_by_side_line(int ranks) {
  if (ranks < 2) return "";
  return fmt::format("# {} ranks side by side (tally launch): a barrier before each point, each "
                     "figure the mean over the ranks of its own median (Note [side-by-side "
                     "kernels])\n",
                     ranks);
}

// ---- tally bench gemm ------------------------------------------------------------------------

struct GemmFlags : TimingFlags {
  std::vector<std::int64_t> m = engine::BenchGemmOptions{}.m, n = engine::BenchGemmOptions{}.n,
                            k = engine::BenchGemmOptions{}.k,
                            batch = engine::BenchGemmOptions{}.batch;
  std::string cache = "cold";  // Note [cold-cache GEMMs]
};

void run_gemm(const GemmFlags& f) {
  engine::BenchGemmOptions o{.m = f.m, .n = f.n, .k = f.k, .batch = f.batch,
                             .timing = f.timing()};
  o.timing.cold = f.cache == "cold";
  try {
    o.validate();
  } catch (const InvalidInput& e) {
    throw InvalidInput(std::string("bench gemm: ") + e.what());
  }
  io::Calibration c = calibration_to_merge(
      f.calibration_out, "tally bench gemm (float32 at::mm, " + f.cache + " caches)");
  const std::unique_ptr<engine::Comm> ranks = side_by_side_ranks();
  const engine::BenchGemmResult r = engine::run_bench_gemm(o, ranks.get());
  if (!speaks(ranks)) return;
  if (!f.calibration_out.empty()) {
    if (!c.kernels) c.kernels = io::KernelCalibration{};
    engine::add_to_calibration(r, *c.kernels);
    write_calibration(f.calibration_out, c);
  }
  if (f.json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& row : r.rows)
      rows.push_back({{"m", row.m}, {"n", row.n}, {"k", row.k}, {"batch", row.batch},
                      {"seconds_median", row.time.median_s}, {"seconds_min", row.time.min_s},
                      {"seconds_max", row.time.max_s}, {"flops_per_s", row.flops_per_s},
                      {"rank_seconds_median", row.rank_median_s}});
    print_json({{"command", "bench gemm"},
                {"dtype", "float32"},
                {"threads", o.timing.threads},
                {"ranks_side_by_side", r.ranks},
                {"cache", f.cache},
                {"time_convention",
                 o.timing.cold ? "per call: each sample is one at::mm_out after a read of twice "
                                 "the last-level cache; median/min/max over samples"
                               : "per call: each sample repeats at::mm_out until it lasts "
                                 "min_sample_ms; median/min/max over samples"},
                {"flops_convention", "2·batch·mnk per call (batch > 1: one at::bmm_out)"},
                {"rows", rows},
                {"best_flops_per_s", r.best_flops_per_s},
                {"calibration_out", f.calibration_out.empty() ? nlohmann::json(nullptr)
                                                              : nlohmann::json(f.calibration_out)}});
    return;
  }
  fmt::print("# tally bench gemm: C(m x n) = A(m x k) B(k x n), float32 at::mm_out, {} thread(s), "
             "{} caches; per call, median over {} samples; GFLOP/s = 2mnk / time / 1e9\n",
             o.timing.threads, f.cache, o.timing.samples);
  fmt::print("{}", side_by_side_line(r.ranks));
  // A batch column only where a batch was asked for: the plain table stays as it was.
  const bool batched = o.batch != std::vector<std::int64_t>{1};
  if (batched)
    fmt::print("# batch b > 1: b products in one at::bmm_out; GFLOP/s counts all b\n");
  fmt::print("# {}{:>6} {:>6} {:>6} {:>11} {:>9}\n",
             batched ? fmt::format("{:>6} ", "batch") : "", "m", "n", "k", "med_us", "GFLOP/s");
  for (const auto& row : r.rows)
    fmt::print("  {}{:>6} {:>6} {:>6} {:>11.2f} {:>9.2f}\n",
               batched ? fmt::format("{:>6} ", row.batch) : "", row.m, row.n, row.k,
               us(row.time.median_s), row.flops_per_s / 1e9);
  fmt::print("# best {:.2f} GFLOP/s (the host's peak for the fit)\n", r.best_flops_per_s / 1e9);
  if (!f.calibration_out.empty())
    fmt::print("# kernels.gemm written to {}\n", f.calibration_out);
}

void register_gemm(CLI::App& bench) {
  auto f = std::make_shared<GemmFlags>();
  CLI::App* cmd = bench.add_subcommand(
      "gemm", "time float32 matrix products over an (m, n, k) grid (calibrates the operator model)");
  cmd->footer("One process, no launch needed; under `tally launch --nproc s` the s ranks time "
              "side by side, as a run's ranks compute at once (a barrier before each shape; "
              "each figure the mean over ranks; rank 0 prints and writes). "
              "Every combination of --m, --n, --k (and --batch) is timed. "
              "--calibration-out FILE writes kernels.gemm and the best GFLOP/s as peak_flops "
              "(merged into FILE if it exists: GEMMs timed on the same device before keep "
              "their shapes, a shape timed again takes the new time, so a batched grid adds to "
              "a single one); `tally bench ddp|run zero --calibration FILE` "
              "then predict their step time from it.");
  for (auto [flag, dims, help] :
       {std::tuple{"--m", &f->m, "rows of A and C"}, std::tuple{"--n", &f->n, "columns of B and C"},
        std::tuple{"--k", &f->k, "inner size"}})
    cmd->add_option(flag, *dims, std::string(help) + ", comma-separated, each in [1, 16384]")
        ->delimiter(',')
        ->check(CLI::Range(std::int64_t{1}, std::int64_t{16384}))
        ->capture_default_str();
  cmd->add_option("--batch", f->batch,
                  "independent products per call, comma-separated, each in [1, 4096] (b > 1: "
                  "one at::bmm_out over b of them, as attention multiplies its heads)")
      ->delimiter(',')
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{4096}))
      ->capture_default_str();
  add_timing_flags(*cmd, *f);
  cmd->add_option("--cache", f->cache,
                  "cold | warm: read twice the last-level cache before each call and time one "
                  "call per sample (a training step's GEMMs find their weights out of cache), or "
                  "repeat the call on the same operands until --min-sample-ms (cache-resident)")
      ->check(one_of({"cold", "warm"}))
      ->capture_default_str();
  cmd->callback([f] { run_gemm(*f); });
}

// ---- tally bench memory ----------------------------------------------------------------------

struct MemoryFlags : TimingFlags {
  std::vector<double> sizes_mib;
};

// The probe's shape is engine::kStreamingProbe's, printed from it.
std::string streaming_convention() {
  const engine::GptProbeShape& p = engine::kStreamingProbe;
  return fmt::format(
      "each family's libtorch kernel as the engine's GPT calls it, warm, on one layer of C {}, "
      "a {}, T {}, B {}; bytes = core's bytes of that operator at that shape; GB/s = bytes / "
      "median per-call time (the calibration's streaming_kernels: a family runs no faster in the "
      "operator model, Note [streaming kernel families])",
      p.hidden, p.heads, p.seq, p.micro_batch);
}

void run_memory(const MemoryFlags& f) {
  engine::BenchMemoryOptions o{.timing = f.timing()};
  if (!f.sizes_mib.empty()) {
    o.working_set_bytes.clear();
    for (double s : f.sizes_mib) o.working_set_bytes.push_back(s * kMiB);
  }
  try {
    o.validate();
  } catch (const InvalidInput& e) {
    throw InvalidInput(std::string("bench memory: ") + e.what());
  }
  io::Calibration c =
      calibration_to_merge(f.calibration_out, "tally bench memory (float32 a.add_(b))");
  if (!f.calibration_out.empty() && !c.kernels)
    throw InvalidInput("--calibration-out = '" + f.calibration_out +
                       "': has no kernels section yet; run `tally bench gemm --calibration-out " +
                       f.calibration_out + "` first (the section needs its peak_flops)");
  const std::unique_ptr<engine::Comm> ranks = side_by_side_ranks();
  const engine::BenchMemoryResult r = engine::run_bench_memory(o, ranks.get());
  if (!speaks(ranks)) return;
  if (!f.calibration_out.empty()) {
    engine::add_to_calibration(r, *c.kernels);
    write_calibration(f.calibration_out, c);
  }
  if (f.json) {
    nlohmann::json streaming = nlohmann::json::array();
    for (const auto& row : r.streaming)
      streaming.push_back({{"kernel", row.kernel}, {"op", row.op}, {"call", row.call},
                           {"bytes", row.bytes}, {"seconds_median", row.time.median_s},
                           {"bytes_per_s", row.bytes_per_s}});
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& row : r.rows)
      rows.push_back({{"working_set_bytes", row.working_set_bytes},
                      {"add_seconds_median", row.add.median_s},
                      {"add_bytes_per_s", row.add_bps},
                      {"copy_seconds_median", row.copy.median_s},
                      {"copy_bytes_per_s", row.copy_bps},
                      {"zero_seconds_median", row.zero.median_s},
                      {"zero_bytes_per_s", row.zero_bps},
                      {"rank_add_seconds_median", row.rank_add_median_s}});
    print_json({{"command", "bench memory"},
                {"dtype", "float32"},
                {"threads", o.timing.threads},
                {"ranks_side_by_side", r.ranks},
                {"bandwidth_convention",
                 "add: a.add_(b, alpha), 3 streams of W/2 bytes; copy: a.copy_(b), 2 streams; "
                 "zero: a.zero_(), 1 stream; bytes/s = streams * W/2 / median per-call time"},
                {"rows", rows},
                {"overhead_convention",
                 "a.add_(b, alpha) on 16 floats (128 bytes), warm: a streaming kernel's fixed "
                 "cost per call, median seconds (the calibration's memory_overhead_s)"},
                {"overhead_seconds_median", r.overhead.median_s},
                {"streaming_convention", streaming_convention()},
                {"streaming_kernels", streaming},
                {"calibration_out", f.calibration_out.empty() ? nlohmann::json(nullptr)
                                                              : nlohmann::json(f.calibration_out)}});
    return;
  }
  fmt::print("# tally bench memory: float32, {} thread(s); W = working set (two arrays of W/2); "
             "add = a.add_(b, alpha) moves 3 x W/2, copy = a.copy_(b) 2 x W/2, zero = a.zero_() "
             "1 x W/2; GB = 1e9 B\n",
             o.timing.threads);
  fmt::print("{}", side_by_side_line(r.ranks));
  fmt::print("# {:>12} {:>11} {:>10} {:>11} {:>10} {:>11} {:>10}\n", "W_MiB", "add_us",
             "add_GB/s", "copy_us", "copy_GB/s", "zero_us", "zero_GB/s");
  for (const auto& row : r.rows)
    fmt::print("  {:>12.3f} {:>11.2f} {:>10.2f} {:>11.2f} {:>10.2f} {:>11.2f} {:>10.2f}\n",
               row.working_set_bytes / kMiB, us(row.add.median_s), row.add_bps / 1e9,
               us(row.copy.median_s), row.copy_bps / 1e9, us(row.zero.median_s),
               row.zero_bps / 1e9);
  fmt::print("# fixed cost per call: add on 16 floats (128 B), warm: {:.2f} us median\n",
             us(r.overhead.median_s));
  fmt::print("# streaming kernel families: {}\n", streaming_convention());
  fmt::print("# {:>16} {:>16} {:>11} {:>11} {:>9}  {}\n", "kernel", "core_op", "bytes",
             "med_us", "GB/s", "call");
  for (const auto& row : r.streaming)
    fmt::print("  {:>16} {:>16} {:>11.0f} {:>11.2f} {:>9.2f}  {}\n", row.kernel, row.op,
               row.bytes, us(row.time.median_s), row.bytes_per_s / 1e9, row.call);
  if (!f.calibration_out.empty())
    fmt::print("# kernels.memory_curve (add), memory_overhead_s and streaming_kernels written to "
               "{}\n",
               f.calibration_out);
}

void register_memory(CLI::App& bench) {
  auto f = std::make_shared<MemoryFlags>();
  CLI::App* cmd = bench.add_subcommand(
      "memory", "time streaming kernels over working sets from cache to DRAM (calibrates the "
                "operator model's memory passes)");
  cmd->footer("One process, no launch needed; under `tally launch --nproc s` the s ranks time "
              "side by side, as `bench gemm` does. --calibration-out FILE merges "
              "kernels.memory_curve "
              "(the add bandwidth by working set), memory_bytes_per_s (its largest), "
              "memory_overhead_s (the add's time on 16 floats: a streaming kernel's fixed cost) "
              "and streaming_kernels (gelu, softmax, mask and norm, forward and backward, timed "
              "on the engine's kernels: each family's rate in core's bytes) into FILE, which "
              "`tally bench gemm --calibration-out FILE` must"
              " have written first.");
  cmd->add_option("--sizes-mib", f->sizes_mib,
                  "working sets W in MiB (2^20 B), comma-separated (default 0.25,1,4,16,64,256)")
      ->delimiter(',')
      ->check(finite_in(1.0 / 256, 16384));
  add_timing_flags(*cmd, *f);
  cmd->callback([f] { run_memory(*f); });
}

void register_kernel_benches(CLI::App& app) {
  CLI::App& bench = command_group(app, "bench", kBenchDescription);
  register_gemm(bench);
  register_memory(bench);
}

const RegisterCommand kRegisterKernelBenches{register_kernel_benches};

}  // namespace

}  // namespace tally::cli::bench_kernels
