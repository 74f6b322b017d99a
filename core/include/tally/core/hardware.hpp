// Hardware as small composable types (STYLE.md, after calculon): a GPU, a link class, a cluster.
// Units are converted once, where a preset or file is read; everything here is SI: bytes, bytes/s,
// seconds, FLOP/s.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tally/core/types.hpp"

namespace tally {

// Physical bounds every hardware figure must meet, wherever it comes from (preset, cluster file,
// calibration file, command line). They reject typos, unit mix-ups and values such as 5e-324 that
// pass a "(0, x]" check and then turn every time into inf; they admit any real or near-future
// system. Units: SI (bytes, bytes/s, FLOP/s, seconds).
struct HardwareBounds {
  double lo, hi;
};
inline constexpr HardwareBounds kMemoryBytesBounds{1e6, 7.1e13};      // 1 MB .. 64 TiB per GPU
inline constexpr HardwareBounds kPeakFlopsBounds{1e9, 1e18};          // 1 GFLOP/s .. 1 EFLOP/s
inline constexpr HardwareBounds kBandwidthBpsBounds{1e6, 1e15};       // 1 MB/s .. 1 PB/s
inline constexpr HardwareBounds kLatencySBounds{0, 1};                // 0 .. 1 s per message
inline constexpr HardwareBounds kFailureRateBounds{0, 1};             // per GPU-hour
inline constexpr HardwareBounds kUtilisationBounds{1e-3, 1};          // fraction of peak
inline constexpr double kFleetFailureRatePerGpuHour = 419.0 / (54.0 * 24.0 * 16384.0);

// One link class of the α–β model: time(bytes) = latency_s + bytes / bandwidth_bps.
// bandwidth_bps is the per-GPU, per-direction bandwidth a ring step can use.
struct LinkSpec {
  double bandwidth_bps = 0;
  double latency_s = 0;
};

// How a cluster's collectives are costed (core/comm.hpp collective_time).
enum class CommModel {
  // The seed's α–β ring on the slowest link of the group: bytes per rank / one link's bandwidth.
  flat_ring,
  // NCCL as nccl-tests measures it: a group that spans nodes runs rings over NVLink and every NIC
  // (rail) its members own at once, at the links' achieved bus-bandwidth fractions.
  nccl,
};

// How close a GPU's kernels come to its peaks (the operator model, core/roofline.hpp). Each preset
// cites where its figures come from; `tally bench gemm` / `bench/gpu/` probes measure them.
struct KernelPerf {
  int sm_count = 0;                 // streaming multiprocessors: the wave size of a GEMM
  int tile_m = 256, tile_n = 128;   // output tile one SM computes in the large-GEMM kernel
  // Achieved fraction of the tensor-core peak by a large, tile-aligned GEMM (cuBLAS, bf16).
  double gemm_fraction = 0.8;
  // The most any GEMM reaches, fraction of the peak: a published "maximum achievable matmul FLOPS"
  // (the best over a brute-force shape search) or the best measured GEMM of a calibration. The
  // shape terms below can exceed the anchor shape's efficiency on better-quantised shapes; no
  // shape may run faster than the hardware was ever measured to.
  double gemm_ceiling = 1.0;
  // Inner-dimension saturation: a GEMM with inner size k runs at k / (k + gemm_half_k) of
  // gemm_fraction (prologue/epilogue and pipeline fill are amortised over k).
  double gemm_half_k = 64;
  // Outer-dimension saturation: min(m, n) / (min(m, n) + gemm_half_mn). On a GPU tile and wave
  // quantisation already charge a thin GEMM, so the presets keep 0; on a CPU (`tally bench gemm`)
  // each packed panel of one operand is reused over the other's rows, and a thin GEMM amortises
  // the packing over few of them.
  double gemm_half_mn = 0;
  // Relative efficiency of a tile half the size in one dimension (cuBLAS picks smaller tiles when
  // the large ones leave most of a wave idle; they reuse less data per byte loaded).
  double half_tile_efficiency = 0.9;
  // Fused (flash) attention, achieved fraction of the tensor-core peak on the FLOPs it executes.
  double attention_forward_fraction = 0.6;
  double attention_backward_fraction = 0.45;
  // The same measured per shape (a calibration's `kernels.attention`): when not empty it replaces
  // the two figures above, looked up by head dimension and sequence (Note [attention table],
  // core/roofline.hpp).
  struct AttentionFraction {
    std::int64_t head_dim = 0;
    std::int64_t seq = 0;
    double forward = 0, backward = 0;
  };
  std::vector<AttentionFraction> attention_table;
  // cuDNN's fused attention measured per shape (FlashKernel::cudnn, Note [cuDNN attention] in
  // core/src/presets.cpp): the Hopper presets carry one H200's; empty where it was not measured.
  // A calibration's measured attention replaces it (the kernel that probe ran).
  std::vector<AttentionFraction> cudnn_attention_table;
  // Streaming (elementwise, norm, softmax) kernels: achieved fraction of memory_bps.
  double memory_fraction = 0.85;
  // Streaming kernels of one family measured apart (Note [streaming kernel families],
  // core/src/operators.cpp): each family's measured rate in core's own bytes of that kernel per
  // second. An operator of a listed family runs no faster than its rate; empty on every preset.
  struct StreamingRate {
    std::string family;       // kernel_family() of an operator's name: "gelu", "norm.backward"
    double bytes_per_s = 0;   // core's bytes of the kernel / its measured time
  };
  std::vector<StreamingRate> streaming_rates;
  // Note [GEMM residuals] (core/roofline.hpp): each GEMM a calibration timed, as its shape and
  // batch in log2 and log(measured / the fitted terms' time); empty on every preset.
  struct GemmResidual {
    double log2_m = 0, log2_n = 0, log2_k = 0, log2_batch = 0;
    double log_ratio = 0;
  };
  std::vector<GemmResidual> gemm_residuals;
  // Per-kernel fixed cost (launch and tail), seconds; 0 = hidden by asynchronous launches.
  double kernel_overhead_s = 0;
  // The same for streaming (memory-bound) kernels where it was measured apart (`tally bench
  // memory`: a.add_ on 16 floats, Note [memory kernel overhead] in core/src/operators.cpp); unset,
  // they take kernel_overhead_s (a GPU's launch cost is one for both kinds).
  std::optional<double> memory_overhead_s;
  // Note [power cap] (core/src/presets.cpp): a training step's GEMMs run back to back at the
  // board's power limit, where the SM clock falls below the boost clock a short benchmark sees;
  // the GEMM terms above describe short benchmarks, and a GEMM's time in the step is divided by
  // this (1 = not measured, or no cap reached). Flash attention's too: the same tensor cores at
  // the same clock, its fractions (presets, probes) timed one call at a time as well.
  double sustained_gemm = 1.0;
};

struct GpuSpec {
  std::string name;
  double memory_bytes = 0;          // usable HBM capacity
  double peak_fp32_flops = 0;       // dense, no sparsity, per second
  double peak_tf32_flops = 0;
  double peak_bf16_flops = 0;       // fp16 is the same on every preset here
  double peak_fp8_flops = 0;        // 0 when the GPU has no FP8 tensor cores
  // Dense FP4 (NVFP4/MXFP4) tensor-core peak; 0 when the GPU has none. Block-scaled (MX) formats
  // run on the same 5th-generation tensor cores, so mxfp8 needs it too (Note [low precision]).
  double peak_fp4_flops = 0;
  double memory_bps = 0;            // HBM bandwidth (datasheet), bytes/s
  // CUDA compute capability, 10·major + minor (A100 80, H100/H200 90, B200/GB200 100, B300/GB300
  // 103; NVIDIA, developer.nvidia.com/cuda-gpus); 0 = not known. Decides whether per-tensor fp8
  // keeps transposed copies (Note [fp8 operand layouts], types.hpp).
  int compute_capability = 0;
  KernelPerf kernels;
  // The GEMM constants of fp8 GEMMs where measured fp8 GEMMs give them (B200: XLA's table;
  // H100/H200: two published torch._scaled_mm tables; presets.cpp); unset, fp8 GEMMs take
  // `kernels` at the fp8 peak — fast-biased, since fp8 GEMMs reach a smaller fraction of their
  // peak than bf16 ones (B200: a median 1.2× bf16's speed on the same shapes, H100 ≈ 1.7× on large
  // ones, where the peaks are 2× apart).
  std::optional<KernelPerf> fp8_gemm;
  // The GEMM constants of nvfp4 GEMMs where measured FP4 GEMMs give them (Blackwell: a published
  // B200 cuBLAS table, presets.cpp); unset, nvfp4 GEMMs take `kernels` at the fp4 peak.
  std::optional<KernelPerf> fp4_gemm;
  // The GEMM constants of precision p's GEMMs: fp8_gemm for fp8 and mxfp8 (the same fp8 tensor
  // cores, MX scales applied in the MMA: an assumption, no measured MX table), fp4_gemm for nvfp4,
  // when set, else `kernels`.
  const KernelPerf& gemm_kernels(Precision p) const;
  // Tensor-core peak of a GEMM in dtype p (fp32 → tf32; fp8 and mxfp8 → fp8; nvfp4 → fp4); 0 when
  // the GPU lacks it (supports() says so first).
  double peak_flops(Precision p) const;
  // Whether the GPU runs p's GEMMs: fp8 needs an fp8 peak, mxfp8 and nvfp4 block-scaled tensor
  // cores (an fp4 peak).
  bool supports(Precision p) const;
};

struct ClusterSpec {
  GpuSpec gpu;
  int gpus_per_node = 8;             // per host: its NICs, its checkpoint writer
  // GPUs joined by one NVLink fabric; 0 = one host's (HGX/DGX: 8). Rack systems join hosts:
  // GB200/GB300 NVL72 put 72 GPUs, 18 hosts of 4, on one NVLink switch fabric. TP and every group
  // inside a domain run over intra_node; NCCL's rings leave a domain over its members' NICs.
  int nvlink_domain = 0;
  int nvlink_domain_size() const { return nvlink_domain > 0 ? nvlink_domain : gpus_per_node; }
  LinkSpec intra_node;               // NVLink / NVSwitch
  LinkSpec inter_node;               // InfiniBand / RoCE, one NIC (rail)
  int nics_per_node = 0;             // rails per node; 0 = one per GPU (DGX-style)
  // Achieved bus bandwidth of NCCL rings as a fraction of each link's bandwidth (nccl-tests busbw
  // over the link speed); used by CommModel::nccl.
  double intra_bus_fraction = 1.0;
  double inter_bus_fraction = 1.0;
  CommModel comm_model = CommModel::flat_ring;
  // λ per GPU-hour, from a production fleet: Llama 3 405B pre-training (Dubey et al. 2024
  // §3.3.4) had 419 unexpected interruptions in 54 days on 16,384 H100s: 419 / (54·24·16384) =
  // 1.97e-5. The seed's 3e-6 ("量级参考，需核实") is an explicit input of its scenarios.
  double failure_rate_per_hour = kFleetFailureRatePerGpuHour;
  // Aggregate sharded-save bandwidth; 0 = checkpoint_write_bps_per_node × nodes (the seed's
  // scenarios give 2 GB/s explicitly).
  double checkpoint_write_bps = 0;
  // Per node, from published saves at scale: Megatron-LM 1T, 273 GB/s on 384 nodes = 0.71 GB/s
  // (Narayanan et al. 2021 §5.10); BLOOM 176B, 2.3 TB in 40 s on 48 nodes = 1.2 GB/s (BigScience
  // training chronicles); Llama 3, 2 TB/s sustained for 2048 nodes = 0.98 GB/s (Dubey et al. 2024
  // §3.3.1). tally takes 1 GB/s per node.
  double checkpoint_write_bps_per_node = 1e9;
  // The aggregate write bandwidth of `gpus` GPUs: checkpoint_write_bps if set, else per node ×
  // ⌈gpus / gpus_per_node⌉.
  double checkpoint_write_bps_for(int gpus) const;
  // Model FLOP utilisation assumed when turning FLOPs into seconds; one number per GPU type
  // (issue 5: no per-case fudge factors). Overridden by a calibration file.
  double mfu = 0.5;
  // Throws InvalidInput "<field> = <value>: must be in [lo, hi] <unit>" unless every figure is
  // finite and inside its HardwareBounds (a peak of 0 is allowed for the optional fp32/fp8 peaks).
  void validate() const;
};

}  // namespace tally
