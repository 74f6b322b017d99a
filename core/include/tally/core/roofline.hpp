// Kernel time on one GPU: a roofline with a shape-aware GEMM efficiency (the operator model's
// clock; core/operators.hpp lists the operators).
//
// Legend: m, n = GEMM output rows and columns, k = inner (reduction) size, B = independent GEMMs of
// the same shape (batched: attention heads × sequences), SM = streaming multiprocessors,
// Tm × Tn = output tile one SM computes, peak = tensor-core FLOP/s for the dtype, W = HBM bytes/s.
//
// Note [GEMM efficiency]
// A GEMM's output is cut into ⌈m/Tm⌉·⌈n/Tn⌉ tiles per batch, spread over the SMs in waves of SM
// tiles; the last wave may leave SMs idle (wave quantisation) and edge tiles compute padding (tile
// quantisation) — NVIDIA, "Matrix Multiplication Background User's Guide", §§ "Tile Quantization",
// "Wave Quantization". The useful fraction is
//     q(Tm, Tn) = B·m·n / (⌈B·⌈m/Tm⌉·⌈n/Tn⌉ / SM⌉ · SM · Tm · Tn).
// cuBLAS's heuristics choose among tile shapes; tally tries the kernel's large tile and its halves
// down to 64 in each dimension, each halving costing KernelPerf::half_tile_efficiency (less reuse
// per byte loaded), and keeps the best. The inner dimension amortises each tile's fixed costs:
// k / (k + k½); the smaller outer dimension amortises packing an operand (KernelPerf::gemm_half_mn,
// 0 on the GPU presets: tile quantisation charges thin GEMMs there). So
//     η(m, n, k, B) = min(ceiling, gemm_fraction · max over tiles [q · half_tile_efficiency^halvings]
//                                  · k/(k + k½) · min(m, n)/(min(m, n) + mn½))
// and time = max(2·B·m·n·k / (peak · η), bytes / (W · memory_fraction)) + kernel overhead.
// gemm_fraction is the large-GEMM throughput over peak from published or measured cuBLAS figures
// (cited per preset in presets.cpp); the ceiling (KernelPerf::gemm_ceiling) is the best any shape
// was measured to reach — without it a shape that quantises better than the anchor shape would
// run faster than the published maximum (A100: 280 of 312 TFLOP/s for a 2304 × 9216 × 32768
// weight gradient, above the 271.2 maximum). No end-to-end utilisation enters anywhere.
#pragma once

#include <cstdint>
#include <vector>

#include "tally/core/hardware.hpp"
#include "tally/core/types.hpp"

namespace tally {

// η of Note [GEMM efficiency], in (0, 1]. m, n, k >= 1, batch >= 1; throws InvalidInput otherwise.
double gemm_efficiency(const KernelPerf& kp, std::int64_t m, std::int64_t n, std::int64_t k,
                       double batch = 1);

// Note [GEMM residuals]
// The GEMM terms above (efficiency fraction, k and m·n saturation, tiles, overhead) are fitted to
// a calibration's grid (fit_gemm_perf), and no five numbers follow a BLAS: on this project's CPU
// (2026-12-06, `tally bench gemm`'s 64 default shapes) the fit missed its own points by 0.77–1.49×
// of their time — thin GEMMs (m = 8–32 against n, k = 1024–2048) fitted too slow, small ones (n
// or k = 16–128) too fast — and off the grid by up to 2.7× (32 × 32 × 32: 30.5 µs measured, 11.2
// modelled); on the H200 probe's 277 shapes by 0.27–1.41× (cuBLAS's split-K on m, n = 128 with
// k = 16384 ran 3.7× faster than the tiles predict). And the terms fitted to one grid price
// another's shapes differently: the engine GPT's batched (128 × 128 × 64) · 16 attention GEMMs
// moved 1.8 → 3.3 ms per micro-batch between the default grid and a denser one. So a calibration
// keeps each measured GEMM's ratio r = measured / modelled time (the fitted terms at burst clock,
// sustained_gemm = 1), and a GEMM of shape (m, n, k) in batches of b takes the fitted time × exp of
// the weighted mean of the ln r of the measured GEMMs of its kind — single (b = 1) or batched (b >
// 1) — weights 1/d⁴ at distance d in (log2 m, log2 n, log2 k, log2 b): the measured time at a
// measured shape (exactly), near its neighbours between them, toward the nearest edge's off the
// grid (a power above the dimensions keeps far points' weight small). Single and batched are not
// mixed: on a CPU the cold single GEMM's fixed cost (30 µs for 32³, after the cache flush of Note
// [cold-cache GEMMs]) is paid once per batched call, not once per matrix, so a single GEMM's ratio
// would charge a batch b times over. A GEMM of a kind no measured GEMM shares, and every GEMM of a
// preset (its terms come from published figures, not a grid), takes the factor 1.
double gemm_residual(const KernelPerf& kp, std::int64_t m, std::int64_t n, std::int64_t k,
                     double batch = 1);

// The roofline of one kernel: max(flops / flops_per_s, bytes / (W · memory_fraction)) plus the
// GPU's per-kernel overhead. flops_per_s is the rate the kernel's FLOPs run at (peak · η for a
// GEMM or fused attention, the fp32 CUDA-core peak for elementwise math).
double roofline_seconds(const GpuSpec& gpu, double flops, double flops_per_s, double bytes);
// The same with the kernel's own fixed cost (a GEMM's from its GpuSpec::gemm_kernels).
double roofline_seconds(const GpuSpec& gpu, double flops, double flops_per_s, double bytes,
                        double overhead_s);

// Note [attention table]
// A fused-attention kernel's speed depends on its shape: on one H200 (tests/data/h200_probe_ops
// .json) cuDNN's causal forward ran at 0.30 of the peak at head dim 64 and 0.45–0.54 at 128, rising
// with the sequence (2048 → 8192). One fraction per GPU cannot carry that, so a calibration's
// measured shapes become KernelPerf::attention_table and a kernel of head dim d and q query rows
// takes: the points whose head dim is nearest d (in log2; a tie goes to the larger), among them
// the fraction linear in log(seq) between the two points around q (the end point's outside them;
// points of one shape averaged). The sequence is the kernel's query rows (op.m): a CP chunk runs
// as a shorter sequence. Empty table: the GPU's two fractions.
// backward: the backward kernel's figure (a recompute replays the forward).
double attention_fraction(const KernelPerf& kp, bool backward, std::int64_t head_dim,
                          std::int64_t seq);
// The same lookup in one table of measured points (not empty).
double attention_table_fraction(const std::vector<KernelPerf::AttentionFraction>& table,
                                bool backward, std::int64_t head_dim, std::int64_t seq);

// One measured GEMM (`tally bench gemm`, bench/gpu/probe.py): B-batched (m × k)·(k × n).
struct GemmSample {
  std::int64_t m = 0, n = 0, k = 0;
  double batch = 1;
  double seconds = 0;  // median
};

// Note [GEMM calibration]: the kernel constants of Note [GEMM efficiency] fitted to measured GEMMs
// of one GPU at one precision — what the issue calls calibrating by micro-benchmarks, never by
// training runs. For each k½ in {0 … 2048}, per-kernel overhead in {0 … 50 µs} and either the
// half-tile efficiency in {0.5 … 1} (a tile that can halve: a GPU's, mn½ = 0) or mn½ in {0 … 32}
// (a 1 × 1 tile: a CPU's) on a grid, gemm_fraction is the median of what each sample implies; the
// combination with the least squared log-error of predicted over measured time wins. sm_count and
// the tile come from `base`. Throws InvalidInput with fewer than 3 samples or a non-positive time.
KernelPerf fit_gemm_perf(KernelPerf base, double peak_flops, const std::vector<GemmSample>& samples);

// Throws InvalidInput naming the field unless every KernelPerf figure is in range and the GPU has
// sm_count >= 1 and memory_bps within kBandwidthBpsBounds.
void validate_kernel_perf(const GpuSpec& gpu);

}  // namespace tally
