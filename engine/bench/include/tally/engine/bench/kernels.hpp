// `tally bench gemm` and `tally bench memory`: the kernel micro-benchmarks that calibrate the
// operator model (core/roofline.hpp, core/mlp_step.hpp) on this host, in one process, with
// libtorch's CPU kernels — the same at::mm and elementwise kernels the engine's runs call.
//
// gemm: for every (m, n, k) of the grid, C (m × n) = A (m × k) · B (k × n) in float32 with
//   at::mm_out into a preallocated C, A and B from randn; per-call time by time_calls (harness);
//   FLOP/s = 2mnk / median. The best FLOP/s over the grid is the host's "peak" the fitted
//   fractions are relative to (a CPU has no datasheet tensor-core peak tally can read).
// memory: for every working set W (bytes), two float32 arrays a, b of W/2 bytes each;
//   add   a.add_(b, α)    3 streams of W/2: read a, read b, write a — the commonest kernel form of
//                         the engine's optimizer and gradient passes (Note [host step model]);
//   copy  a.copy_(b)      2 streams of W/2;
//   zero  a.zero_()       1 stream of W/2 (a fill: what Note [host step model]'s zeroing costs).
//   Bandwidth = streams · W/2 / median; the add curve is the calibration's memory_curve, its
//   largest working set (DRAM) the memory_bytes_per_s.
//   Then the add on 16 floats (128 bytes): its time is the kernel's fixed cost per call, the
//   calibration's memory_overhead_s.
//   Then the streaming kernel families (Note [streaming kernel families], core/src/operators.cpp):
//   each family's libtorch kernel as the engine's GPT calls it (gpt_model.cpp), timed warm on one
//   layer of the GPT that bench/predict_vs_measured.sh runs (kStreamingProbe: C 256, a 4, T 128,
//   B 4), its bytes core's own for that operator at that shape (gpt_stage_ops); the calibration's
//   streaming_kernels. Rate = core's bytes / median.
//
// Note [cold-cache GEMMs]
// In a training step each GEMM finds its weight out of the caches: the weight was last touched a
// step earlier, and since then the other layers' GEMMs and the optimizer (Adam's 20 streams over
// every parameter, Note [host step model]) have moved far more than the last-level cache through
// them. Timing at::mm_out over and over on the same operands (warm) measures the GEMM with A, B and
// C cache-resident instead. Measured on the 2-core VM (2026-12-03, the eight GEMMs of `run zero`'s
// default MLP at 32 rows, each alone): 5.1 ms warm, 7.9 ms each after a flush; the same eight
// back to back in the step's order took 10.7 ms, and the engine's forward + backward 10.5 ms.
// So `bench gemm` times cold by default: before every call, warm-up or timed, it reads a buffer of
// twice the last-level cache (cache_flush_bytes; read only, so the evicted lines are clean and no
// write-back lands in the timed call) and each sample is one call (time_cold_calls) — as Triton's
// do_bench clears the GPU's L2 before each timed call. `--cache warm` keeps the repeated timing.
// bench memory needs no flush: its working sets are the cache levels it measures.
//
// Note [side-by-side kernels]
// The engine's runs put k ranks on this host at once, and they compute at once: between two
// collectives every rank runs the same kernels at the same time, on its own core but sharing the
// last-level cache and DRAM with the others. A kernel timed alone misses that. Measured on the
// 2-core VM (2026-12-06): `run zero`'s forward GEMM (32 × 1024 × 1024, cold) took 906–938 µs
// alone and 964–1088 µs while a second process timed the same; the default grid, priced by its
// fit at `run zero`'s 32 rows per rank, came out 3 % and 18 % slower on the two ranks timing it
// together, their DRAM add bandwidth 8 % and 22 % lower (an earlier, unaligned try — a second
// `bench gemm` started beside the first — read 1.054× over the grid: docs/ledgers.md §5). So
// under `tally launch --nproc s` (each rank a Comm) bench gemm and bench memory time side by
// side: a barrier before every point (before_point), so the s ranks time the same kernel at the
// same moment, as a step's ranks run theirs; then each statistic of each point is the mean over
// the ranks (min and max: over all), the same on every rank (a rank's own medians stay in
// rank_median_s). The calibration's device says "s ranks side by side" (a run of k ranks on c
// cores computes min(k, c) at once). Tried as the host report's calibration for k >= 2 and not
// kept: over 72 paired predictions of `run zero` at k = 2 and 4 from three reports (2026-12-06),
// the kernels timed alone minutes earlier predicted as well or better (mean |log(measured /
// predicted)| 0.094 alone, 0.102 side by side, 0.096 with side-by-side GEMMs and DRAM alone;
// within ±15 % 59, 51, 54 of 72; bench/calibration_ab): the effect is real but below this VM's
// drift, and the side-by-side DRAM figure is the noisier (docs/ledgers.md §5, *Kernels side by
// side*).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tally/engine/bench/harness.hpp"
#include "tally/io/calibration.hpp"

namespace tally::engine {

struct BenchKernelTiming {
  int threads = 1;                 // torch intra-op threads (and OPENBLAS via the caller's env)
  int warmup = 2;                  // W untimed calls
  int samples = 7;                 // S timed samples
  double min_sample_s = 2e-3;      // each sample repeats the call to last at least this
  TimerClock clock = TimerClock::wall;  // health-check: process_cpu
  // Flush the caches before every call and time one call per sample (Note [cold-cache GEMMs]);
  // min_sample_s is then unused. bench gemm's default; health-check times warm.
  bool cold = false;
  // Called before each point is timed (each GEMM shape; each working set's add, copy and zero;
  // the overhead's add, copy and zero; each streaming family): side by side, a barrier (Note
  // [side-by-side kernels]). Empty: nothing.
  std::function<void()> before_point;
  void validate() const;           // InvalidInput naming the flag
};

class Comm;

struct BenchGemmOptions {
  std::vector<std::int64_t> m = {8, 32, 128, 512};
  std::vector<std::int64_t> n = {16, 128, 1024, 2048};
  std::vector<std::int64_t> k = {16, 128, 1024, 2048};
  // b > 1: b independent products in one at::bmm_out, as the engine's attention multiplies its
  // (B, a', ·, ·) heads (Note [GEMM residuals], core/roofline.hpp: batched calls are priced on
  // batched points).
  std::vector<std::int64_t> batch = {1};
  BenchKernelTiming timing;
  void validate() const;           // each dimension in [1, 16384], batch in [1, 4096]; at most
                                   // 4096 shapes
};

struct GemmRow {
  std::int64_t m = 0, n = 0, k = 0, batch = 1;
  TimeStats time;                  // per call (side by side: the mean over ranks)
  double flops_per_s = 0;          // 2·batch·mnk / median
  std::vector<double> rank_median_s;  // side by side: each rank's own median, rank order
};

struct BenchGemmResult {
  BenchGemmOptions options;
  std::vector<GemmRow> rows;       // batch-major, then m, then n, then k
  double best_flops_per_s = 0;
  int ranks = 1;                   // side by side (Note [side-by-side kernels])
};

// `ranks`: when given with two or more ranks, every rank times the grid side by side (Note
// [side-by-side kernels]) and all return the same result; collective failures throw CommError.
BenchGemmResult run_bench_gemm(const BenchGemmOptions& options, Comm* ranks = nullptr);
// The flush buffer of Note [cold-cache GEMMs]: twice the last-level cache `llc_bytes`, at least
// 64 MiB (also when the size is unknown: 0) and at most 1 GiB.
double cache_flush_bytes(double llc_bytes);
// This host's last-level cache (sysconf: L3, else L2), bytes; 0 when the system does not say.
double last_level_cache_bytes();
// One shape of that grid, on the calling thread's current torch thread count. Each timed call runs
// at::mm_out (batch > 1: at::bmm_out) `repeat` times (1 for the benchmark; `tally run
// health-check` repeats it on the rank it is told to slow down, so that rank's call takes
// `repeat` times as long whatever the load).
GemmRow time_gemm(std::int64_t m, std::int64_t n, std::int64_t k, const BenchKernelTiming& timing,
                  int repeat = 1, std::int64_t batch = 1);

// One transformer layer of the engine's GPT (gpt.hpp): C, a, T, B.
struct GptProbeShape {
  std::int64_t hidden = 256, heads = 4, seq = 128, micro_batch = 4;
};

struct BenchMemoryOptions {
  // 256 KiB … 256 MiB by 4×: from the core's cache to DRAM on common hosts.
  std::vector<double> working_set_bytes = {262144.0, 1048576.0, 4194304.0, 16777216.0, 67108864.0,
                                           268435456.0};
  BenchKernelTiming timing;
  void validate() const;           // each in [4 KiB, 16 GiB]
};

struct MemoryRow {
  double working_set_bytes = 0;
  TimeStats add, copy, zero;       // per call (side by side: the mean over ranks)
  double add_bps = 0, copy_bps = 0, zero_bps = 0;
  std::vector<double> rank_add_median_s;  // side by side: each rank's own add median
};

// One streaming kernel family timed on the engine's kernel at kStreamingProbe.
struct StreamingKernelRow {
  std::string kernel;              // the family: "gelu", "norm.backward", … (core kernel_family)
  std::string op;                  // core's operator whose bytes it is: "norm-1.backward"
  std::string call;                // the libtorch call timed: "at::gelu(x, \"tanh\")"
  double bytes = 0;                // core's bytes of `op` at the probe shape
  TimeStats time;                  // per call
  double bytes_per_s = 0;          // bytes / median
};

// The GPT layer the families are timed on (bench/predict_vs_measured.sh's run 3d shape).
inline constexpr GptProbeShape kStreamingProbe{.hidden = 256, .heads = 4, .seq = 128,
                                               .micro_batch = 4};

// The families timed: gelu, softmax, mask, norm, each with its backward.
std::vector<StreamingKernelRow> time_streaming_kernels(
    const BenchKernelTiming& timing, const GptProbeShape& shape = kStreamingProbe);

struct BenchMemoryResult {
  BenchMemoryOptions options;
  std::vector<MemoryRow> rows;     // ascending working set
  std::vector<StreamingKernelRow> streaming;  // time_streaming_kernels at kStreamingProbe
  // a.add_(b, α) on kOverheadElements floats, warm: a streaming kernel's fixed cost per call
  // (the calibration's memory_overhead_s, Note [memory kernel overhead] in core/src/operators.cpp).
  TimeStats overhead;
  int ranks = 1;                   // side by side (Note [side-by-side kernels])
};
inline constexpr std::int64_t kOverheadElements = 16;

// `ranks` as run_bench_gemm's.
BenchMemoryResult run_bench_memory(const BenchMemoryOptions& options, Comm* ranks = nullptr);
// One working set of that sweep (rounded down to whole float32 pairs); `repeat` as in time_gemm.
MemoryRow time_memory(double working_set_bytes, const BenchKernelTiming& timing, int repeat = 1);

// The device a calibration of this host's kernels names: "cpu, libtorch 1 thread", and for GEMMs
// timed cold (Note [cold-cache GEMMs]) "cpu, libtorch 1 thread, cold caches" — another device to
// whoever times warm (health-check refuses it); timed by s >= 2 ranks at once, ", s ranks side by
// side" after it (Note [side-by-side kernels]).
std::string host_device_name(int threads, bool cold = false, int side_by_side = 1);

// The results as the calibration's kernels section (fp32; sm_count = threads): a gemm result sets
// device, peak_flops, sm_count and gemm — merged by shape (m, n, k, batch) into the GEMMs already
// there when they were timed on the same device (peak: the best of both), else replacing them; a
// memory result memory_curve, memory_bytes_per_s, memory_overhead_s and streaming_kernels.
void add_to_calibration(const BenchGemmResult& r, io::KernelCalibration& k);
void add_to_calibration(const BenchMemoryResult& r, io::KernelCalibration& k);

}  // namespace tally::engine
