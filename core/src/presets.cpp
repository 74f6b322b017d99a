#include "tally/core/presets.hpp"

#include <algorithm>
#include <tuple>
#include <utility>

#include "tally/core/roofline.hpp"

namespace tally {

namespace {

ModelSpec llama_like(std::string name, std::int64_t h, std::int64_t L, std::int64_t a,
                     std::int64_t kv, std::int64_t f, std::int64_t V) {
  // Llama and Mistral train without dropout (their configs: attention_dropout 0).
  return ModelSpec{.name = std::move(name), .hidden = h, .layers = L, .heads = a, .kv_heads = kv,
                   .ffn = f, .vocab = V, .dropout = false, .mlp = MlpKind::swiglu,
                   .norm = NormKind::rmsnorm, .position = PositionKind::rotary};
}

std::vector<ModelSpec> build_models() {
  std::vector<ModelSpec> v;
  // The seed's generic 7B: h 4096, 32 layers, 32 heads, FFN h×4h ("单层最大是 FFN（h×4h）"),
  // and the round N = 7e9 its ledgers use (112 GB = 16N). Vocabulary 32000 as in Llama-2.
  {
    ModelSpec m{.name = "seed-7b", .hidden = 4096, .layers = 32, .heads = 32, .kv_heads = 32,
                .ffn = 16384, .vocab = 32000, .mlp = MlpKind::gelu, .norm = NormKind::layernorm,
                .position = PositionKind::rotary};
    m.nominal_params = 7e9;
    v.push_back(m);
  }
  // meta-llama/Llama-2-{7,13,70}b-hf config.json; Touvron et al. 2023, Table 1 (6.74B / 13.0B / 69.0B).
  v.push_back(llama_like("llama-2-7b", 4096, 32, 32, 32, 11008, 32000));
  v.push_back(llama_like("llama-2-13b", 5120, 40, 40, 40, 13824, 32000));
  v.push_back(llama_like("llama-2-70b", 8192, 80, 64, 8, 28672, 32000));
  // meta-llama/Meta-Llama-3-{8,70}B config.json (8.03B, 70.6B).
  v.push_back(llama_like("llama-3-8b", 4096, 32, 32, 8, 14336, 128256));
  v.push_back(llama_like("llama-3-70b", 8192, 80, 64, 8, 28672, 128256));
  // meta-llama/Llama-3.1-405B config.json; Dubey et al. 2024 Table 3 (405B: 126 layers, 16384,
  // 128 heads, 8 kv heads, FFN 53248).
  v.push_back(llama_like("llama-3.1-405b", 16384, 126, 128, 8, 53248, 128256));
  // mistralai/Mistral-7B-v0.1 config.json (7.24B; sliding_window 4096 on every layer).
  {
    ModelSpec m = llama_like("mistral-7b", 4096, 32, 32, 8, 14336, 32000);
    m.attention_window = 4096;
    m.window_layers = 32;
    v.push_back(m);
  }
  // mistralai/Mixtral-8x7B-v0.1 config.json: 8 experts, 2 per token (46.7B total, 12.9B active).
  {
    ModelSpec m = llama_like("mixtral-8x7b", 4096, 32, 32, 8, 14336, 32000);
    m.experts = 8;
    m.experts_per_token = 2;
    v.push_back(m);
  }
  // DeepSeek-V3 (HF deepseek-ai/DeepSeek-V3 config.json, model_type deepseek_v3): h 7168, 61 layers,
  // 128 heads, MLA with q_lora_rank 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64, v 128; the
  // first 3 layers dense (intermediate_size 18432), then 256 routed experts of 2048, 8 per token,
  // and 1 shared expert of 2048; router with e_score_correction_bias; vocab 129280, untied. The
  // 14B multi-token-prediction module (num_nextn_predict_layers 1) is not part of the 671B main
  // model (DeepSeek-V3 technical report §4.2 / README_WEIGHTS.md) and is not counted.
  {
    ModelSpec m = llama_like("deepseek-v3", 7168, 61, 128, 128, 2048, 129280);
    m.experts = 256;
    m.experts_per_token = 8;
    m.shared_experts = 1;
    m.shared_expert_ffn = 2048;
    m.dense_layers = 3;
    m.dense_ffn = 18432;
    m.router_bias = true;
    m.q_lora_rank = 1536;
    m.kv_lora_rank = 512;
    m.qk_nope_head_dim = 128;
    m.qk_rope_head_dim = 64;
    m.v_head_dim = 128;
    v.push_back(m);
  }
  // Qwen3-30B-A3B and Qwen3-235B-A22B (HF Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B config.json,
  // model_type qwen3_moe; the same shapes in zyzshishui/slime scripts/models/qwen3-30B-A3B.sh and
  // qwen3-235B-A22B.sh): head_dim 128, q/k RMSNorm, 128 experts, 8 per token, no shared experts,
  // every layer MoE (mlp_only_layers empty), vocab 151936, untied.
  {
    ModelSpec m = llama_like("qwen3-30b-a3b", 2048, 48, 32, 4, 768, 151936);
    m.attn_head_dim = 128;
    m.qk_norm = true;
    m.experts = 128;
    m.experts_per_token = 8;
    v.push_back(m);
    m = llama_like("qwen3-235b-a22b", 4096, 94, 64, 4, 1536, 151936);
    m.attn_head_dim = 128;
    m.qk_norm = true;
    m.experts = 128;
    m.experts_per_token = 8;
    v.push_back(m);
  }
  // gpt-oss-120b and gpt-oss-20b (HF openai/gpt-oss-{120b,20b} config.json, model_type gpt_oss;
  // transformers GptOssConfig): h 2880, 64 heads of 64, 8 kv heads, attention_bias true, a sink
  // per head, experts of 2880 with biases and a biased router, 4 per token; 36 layers × 128
  // experts and 24 × 32; vocab 201088, untied. Alternating sliding-window layers (sliding_window
  // 128, layer_types: sliding first, then full) change no count, only the flash kernels' work.
  // rope_scaling yarn with factor 32 (attention factor 0.1·ln 32 + 1) and swiglu_limit 7.0
  // change no count either, only the kernels Megatron-Core runs (Note [GPT-OSS kernels]).
  for (const auto& [name, layers, experts] :
       {std::tuple{"gpt-oss-120b", 36, 128}, std::tuple{"gpt-oss-20b", 24, 32}}) {
    ModelSpec m = llama_like(name, 2880, layers, 64, 8, 2880, 201088);
    m.attn_head_dim = 64;
    m.linear_bias = true;
    m.attention_sinks = true;
    m.rotary_attention_scale = yarn_attention_factor(32);
    m.glu_clamp = 7.0;
    m.attention_window = 128;
    m.window_layers = layers / 2;
    m.experts = experts;
    m.experts_per_token = 4;
    m.router_bias = true;
    v.push_back(m);
  }
  // GPT-3 175B: Brown et al. 2020, Table 2.1 (h 12288, 96 layers, 96 heads, context 2048); GPT-2 BPE
  // vocabulary 50257, learned positions, tied embeddings, biases, LayerNorm, 4h GeLU MLP.
  v.push_back(ModelSpec{.name = "gpt3-175b", .hidden = 12288, .layers = 96, .heads = 96,
                        .kv_heads = 96, .ffn = 49152, .vocab = 50257, .max_positions = 2048,
                        .tied_embeddings = true, .linear_bias = true, .mlp = MlpKind::gelu,
                        .norm = NormKind::layernorm, .position = PositionKind::learned});
  // GPT-2 small (openai-community/gpt2 config.json: n_embd 768, n_layer 12, n_head 12, n_ctx 1024):
  // 124M parameters; the engine's default ≈0.1B test model has this shape.
  v.push_back(ModelSpec{.name = "gpt2-124m", .hidden = 768, .layers = 12, .heads = 12,
                        .kv_heads = 12, .ffn = 3072, .vocab = 50257, .max_positions = 1024,
                        .tied_embeddings = true, .linear_bias = true, .mlp = MlpKind::gelu,
                        .norm = NormKind::layernorm, .position = PositionKind::learned});
  return v;
}

const std::vector<ModelSpec>& models() {
  static const std::vector<ModelSpec> v = build_models();
  return v;
}

// Memory: the capacity nvidia-smi reports, in MiB (A100-40GB 40960, A100-80GB 81920,
// H100-SXM 81559, H200-SXM 143771), so "80 GB" is 80 GiB = 85.9 GB.
// Peak dense FLOP/s: NVIDIA A100 datasheet (fp32 19.5T, tf32 156T, bf16 312T) and H100 SXM
// datasheet (fp32 67T, tf32 495T, bf16 989T, fp8 1979T), without sparsity; H200 SXM has H100's core.
// HBM bandwidth (datasheets): A100 40GB 1.555 TB/s, A100 80GB SXM 2.039 TB/s, H100 SXM 3.35 TB/s,
// H200 SXM 4.8 TB/s. SMs: A100 108, H100/H200 SXM 132 (NVIDIA Ampere and Hopper whitepapers).
//
// Kernel efficiencies (core/roofline.hpp Note [GEMM efficiency]):
//  - Large-GEMM throughput: the best bf16 torch.matmul over a brute-force shape search ("maximum
//    achievable matmul FLOPS", stas00/ml-engineering compute/accelerator/README.md): A100 SXM
//    271.2 of 312 TFLOP/s at 1024×10240×5120, H100 SXM 794.5 of 989 at 2048×2048×13312 ("H200 is the
//    same"). gemm_fraction is set so that the model's η at that published shape equals the
//    published ratio, and the ratio is the ceiling no shape exceeds, since it is the best of the
//    search (tests/core/test_roofline.cpp checks both); nothing else is fitted.
//  - Tiles: 256×128 is cuBLAS's most efficient tile (NVIDIA, "Matrix Multiplication Background
//    User's Guide" §2.3). On the A100 each halving is assumed to cost 10 % (the guide ranks smaller
//    tiles as less efficient without a figure) and the inner-dimension half-saturation k½ = 128
//    elements is two 64-wide k-blocks of pipeline fill — both assumptions: no measured A100 table.
//  - A100 power cap (Note [power cap] below, for the H200): in training the A100 SXM sits at its
//    400 W limit, and a GEMM on normally distributed data there runs slower than a short search's
//    burst. H. He, "Strangely, Matrix Multiplications on GPUs Run Faster When Given 'Predictable'
//    Data!" (thonking.ai, 2024) timed a 16-bit cuBLAS 8192³ on an A100 at 257 TFLOP/s with
//    torch.randn inputs and 295 with zeros — the same kernel; zeros flip fewer transistors and
//    stay under the cap, so the gap is the cap. The preset's burst η at 8192³ is the search's
//    271.2 (its ceiling), so sustained_gemm = 257 / 271.2 = 0.948: one published A100 figure, the
//    shape terms unchanged, nothing taken from the dev set of training runs (which it moves:
//    median |error| Table 4 7.9 → 4.7 %, Table 5 10.7 → 7.4 %, Table 1 13.0 → 9.8 %).
//  - H100/H200 and B200: every kernel constant is the fit of Note [GEMM calibration] to XLA's
//    measured bf16 GEMM table (openxla/xla default_matmul_perf_table.txtpb; 375 shapes, b 1–4 and
//    m, n, k 256–4096, per GPU; tests/data/xla_gemm_bf16.json), and the ceiling is the table's best:
//    H100 804.7 of 989.4 TFLOP/s (stas00's MAMF search found 794.5, 1.3 % apart), B200 1670.5 of
//    2250. The fit: H100 fraction 0.9589, k½ 512, each tile halving 0.70, 2 µs per kernel; B200
//    0.9519, k½ 1024, 0.65, 2 µs (tests/validation/test_gemm_tables.cpp re-fits and compares).
//    Before, the H100 preset (A100's assumed k½ and tile cost) ran these GEMMs a median 1.7× faster
//    than measured; small and thin GEMMs are where the assumptions were wrong.
//  - Flash attention: FlashAttention-2 (Dao 2023, §4.1) reaches 50–73 % of A100 peak forward and
//    lower backward; tally takes 0.6 forward and 0.45 backward of peak on A100; Hopper (H100 and
//    H200) takes FlashAttention-2 as one H200 ran it (Note [Hopper attention]).
//  - Streaming kernels: 0.85 of HBM bandwidth (an A100 memcopy reaches 1355 of 1555 GB/s, 87 %,
//    PTsolvers/gpu-workshop-JuliaCon23#7).
// Links: NVLink 3 600 GB/s, NVLink 4 900 GB/s and NVLink 5 1.8 TB/s bidirectional → 300 / 450 /
// 900 GB/s per direction;
// one HDR (200 Gb/s = 25 GB/s) or NDR (400 Gb/s = 50 GB/s) InfiniBand NIC per GPU (DGX A100 / H100:
// eight compute HCAs per node, Narayanan et al. 2021 §5). Achieved NCCL bus bandwidth: A100 NVLink
// ≈230 of 300 GB/s (NCCL maintainer, NVIDIA/nccl-tests#149); H100 NVLink ≈370 of 450 GB/s with ring
// (NVIDIA/nccl-tests#212; NVLink SHARP all-reduce reaches ≈480, not modelled); HDR ≈24 of 25 GB/s
// per NIC (NVIDIA/nccl-tests#119), NDR 46–48 of 50 (NVIDIA/nccl-tests#290) → 0.94.
// Latency per ring step: NCCL's own tuning model, ring/Simple protocol (NVIDIA/nccl
// src/graph/tuning.cc hwLat): 3.4 µs over NVLink, 14 µs over the network.
// MFU (the legacy utilisation time model only): Narayanan et al. 2021 sustain 52 % of A100 peak at
// 175B → 0.5; Llama 3 (Dubey et al. 2024, Table 4) reports 38–43 % BF16 MFU on H100 → 0.4.

// gemm_fraction such that gemm_efficiency at the published shape equals the published ratio, and
// that ratio as the ceiling no shape exceeds (it is the best of a brute-force shape search).
KernelPerf anchored(KernelPerf k, std::int64_t m, std::int64_t n, std::int64_t kk, double ratio) {
  k.gemm_fraction = 1.0;
  k.gemm_ceiling = 1.0;
  k.gemm_fraction = std::min(1.0, ratio / gemm_efficiency(k, m, n, kk));
  k.gemm_ceiling = ratio;  // the published figure is the best over all shapes
  return k;
}

GpuSpec a100(std::string name, double mib, double hbm_bps) {
  GpuSpec g{.name = std::move(name), .memory_bytes = mib * kMiB, .peak_fp32_flops = 19.5e12,
            .peak_tf32_flops = 156e12, .peak_bf16_flops = 312e12, .peak_fp8_flops = 0,
            .memory_bps = hbm_bps, .compute_capability = 80,
            .kernels = anchored(KernelPerf{.sm_count = 108, .gemm_half_k = 128,
                                           .half_tile_efficiency = 0.9,
                                           .attention_forward_fraction = 0.6,
                                           .attention_backward_fraction = 0.45,
                                           .memory_fraction = 0.85},
                                1024, 10240, 5120, 271.2 / 312)};
  // He 2024: cuBLAS 8192³ on randn inputs at the 400 W cap (see above).
  g.kernels.sustained_gemm = 257e12 / (g.peak_bf16_flops * gemm_efficiency(g.kernels, 8192, 8192,
                                                                              8192));
  return g;
}
// Kernel constants fitted to a measured GEMM table (Note [GEMM calibration]); the ceiling is the
// table's best GEMM over the peak.
KernelPerf measured(KernelPerf k, double fraction, double half_k, double tile, double overhead_s,
                    double best_flops, double peak_flops) {
  k.gemm_fraction = fraction;
  k.gemm_half_k = half_k;
  k.half_tile_efficiency = tile;
  k.kernel_overhead_s = overhead_s;
  k.gemm_ceiling = best_flops / peak_flops;
  return k;
}

// Note [Hopper attention]: FlashAttention-2 as one Hopper ran it. SDPA's FlashAttention-2 backend
// on one H200 (tests/data/h200_probe_ops.json, Note [power cap] below; bf16, causal, each call
// timed alone) reached 0.20–0.28 of the peak forward and 0.18–0.29 backward on executed FLOPs
// over five shapes (head dims 64 and 128, sequences 2048–8192, grouped-query included), medians
// 0.2648 and 0.2543. FlashAttention-2 is compute-bound, and the H100 SXM has the H200's die — the
// same 132 SMs, boost clock and tensor cores; the HBM alone differs — so both Hopper presets take
// those medians. The H100 preset had taken Dao 2023's best H100 figure (§4.1, Fig. 7: up to ≈335
// TFLOP/s, as 0.35 forward and 0.3 backward of the peak), above every causal shape measured here.
// The five shapes as a per-shape table (Note [attention table], core/roofline.hpp) were tried and
// not kept: they predicted the H200's own steps worse (median |error| 2.7 → 5.8 %; the
// FlashAttention-2 step at sequence 8192 1.067 → 1.090, its shape's point above the median),
// so the presets keep one figure each and a calibration carries the table.

// Note [cuDNN attention]: the fused attention Transformer Engine runs on Hopper and later (NVIDIA
// NeMo's docs: with both applicable, TE prefers cuDNN's flash attention on Hopper+ and Tri Dao's
// on Ampere), FlashKernel::cudnn. The same probe timed SDPA's CUDNN_ATTENTION backend on the same
// five shapes: 0.30–0.58 of the peak forward and 0.26–0.52 backward, 1.5–2× FlashAttention-2 —
// most at head dim 128, least at 64 — so one figure cannot carry it and the Hopper presets keep
// the five points as a table (Note [attention table], core/roofline.hpp: the nearest head dim,
// linear in log sequence, the end points beyond). Only Hopper was measured: the other presets
// carry none and `--flash-kernel cudnn` is refused on them, unless a calibration's measured
// attention (the kernel its probe ran) prices it.
std::vector<KernelPerf::AttentionFraction> hopper_cudnn_attention() {
  return {{.head_dim = 128, .seq = 2048, .forward = 0.4527, .backward = 0.4094},
          {.head_dim = 128, .seq = 4096, .forward = 0.5186, .backward = 0.4456},
          {.head_dim = 128, .seq = 8192, .forward = 0.5353, .backward = 0.4760},
          {.head_dim = 64, .seq = 2048, .forward = 0.3002, .backward = 0.2608},
          {.head_dim = 128, .seq = 8192, .forward = 0.5768, .backward = 0.5171}};
}

KernelPerf hopper_kernels() {
  KernelPerf k = measured(KernelPerf{.sm_count = 132, .attention_forward_fraction = 0.2648,
                                     .attention_backward_fraction = 0.2543,
                                     .memory_fraction = 0.85},
                          0.9589, 512, 0.70, 2e-6, 804.715405124361e12, 989.4e12);
  k.cudnn_attention_table = hopper_cudnn_attention();
  return k;
}

// Hopper's fp8 GEMM constants (GpuSpec::fp8_gemm). XLA's sm_90 fp8 columns run 4096³ at
// 2424–2620 TFLOP/s, above the dense fp8 peak (1978.9), so they are no measurement tally can use
// (test_gemm_tables.cpp). Two published H100 SXM tables of torch._scaled_mm (e4m3, bf16 out) are:
// pytorch/pytorch#143465 (per-tensor scales, 5 shapes, 1239–1347 TFLOP/s) and sgl-project/sglang
// #34318 (row-wise scales, 5 shapes, 1351–1520), kept in tests/data/published_fp8_gemm_h100.json.
// Ten large shapes cannot pin k½ or the tile cost, so bf16's shape terms stay and one number
// moves: gemm_fraction, set so that the median of published / predicted over the ten is 1, with
// the best published GEMM (1520 TFLOP/s, 0.768 of the peak) as the ceiling. Predicted: −17 %
// (k = 1280) … +5 %. fp8 then runs large GEMMs ≈ 1.7× bf16's speed, not 2× (B200's table: 1.2×
// on its whole grid).
KernelPerf hopper_fp8_kernels() {
  KernelPerf k = hopper_kernels();
  k.gemm_fraction = 0.759049;
  k.gemm_ceiling = 1520e12 / 1978.9e12;
  return k;
}

// Note [power cap]: H200's kernels as one H200 ran them (tests/data/h200_probe_*.json and
// h200_power_probe.json, recorded 2026-12-04 by bench/gpu/probe.py and warm_probe.py on one H200
// SXM, 700 W limit, PyTorch 2.11 + CUDA 13.0; tests/validation/test_h200_kernels.cpp re-derives
// the numbers below and checks the steps).
//  - GEMMs. Alone, in short bursts, the H200 runs what XLA's table says: the probe's grid at
//    ≥ 10 GFLOP a median 0.97× the preset's time, 8192³ at 799 TFLOP/s (the preset: 803.5) with
//    the SM clock at its 1980 MHz boost. Back to back the board sits at its 700 W limit
//    (nvidia-smi: power ≈ 690 W, clocks_event_reasons 0x4 = software power cap) and the SM clock
//    falls to ≈ 1470 MHz: 8192³ runs at 676 TFLOP/s (0.85 of the burst). A training step is in
//    that regime (≈ 685 W, 1500–1830 MHz over the probe's Llama step), and so were the steps'
//    own 45 GEMMs (forward, dgrad and wgrad of every linear layer of the probe's three models,
//    timed after the steps): measured / the preset's burst prediction, median 1.128 (1.07–1.13
//    over four timings). sustained_gemm = 1 / 1.128136: the shape terms stay XLA's, one number
//    moves, as Hopper's fp8 constants do. fp8 GEMMs lose the same to the cap
//    (tests/data/h200_cap_probe.json, bench/gpu/cap_probe.py: torch._scaled_mm 8192³ e4m3,
//    per-tensor scales, 1465 TFLOP/s in bursts, 1236 back to back, 0.844, beside bf16's 0.835
//    in the same run), so the H200's fp8 constants take the same factor. The H100 SXM (the same
//    die and the same 700 W limit; its HBM3 draws less than the H200's HBM3e) is not measured
//    here and takes the same factor since 2026-12-07, for bf16 and fp8. Its GEMMs meet the same
//    cap (He 2024, thonking.ai: on the H100 large matmuls are power-limited), and Ujeniya et al.
//    2026 (arXiv 2604.11391) found an H100 slightly ahead of an H200 on compute-bound DGEMM
//    across power caps from 200 to 700 W: its own factor lies between the H200's and 1, nearer
//    the H200's. The burst figure 1, which it had kept, is the one value the mechanism rules
//    out; the measured neighbour prices the H100's GEMMs slightly slow, by what its smaller HBM
//    power leaves the SMs (not measured).
//  - Attention at the cap (since 2026-12-07). Flash attention runs on the same tensor cores at
//    the same SM clock, and its fractions — the probe's, Dao's for the A100 and the presets'
//    others — were timed one call at a time, as the probe's GEMM grid that matched the burst
//    table, not back to back at the cap: every preset's attention takes its GEMMs' factor
//    (KernelPerf::sustained_gemm, operators.cpp). Attention's own power draw at the cap, a
//    softmax's exponentials beside the MMAs, was not measured: an assumption that it throttles as
//    a GEMM does.
//  - Attention: SDPA's FlashAttention-2 backend (torch.nn.attention.SDPBackend.FLASH_ATTENTION)
//    on five causal shapes (head dims 64 and 128, sequence 2048–8192, grouped-query included),
//    median executed-FLOP fraction of the peak 0.2648 forward and 0.2543 backward, under Dao's
//    H100 figure of 0.35 forward; both Hopper presets take them (Note [Hopper attention]).
//    Recent PyTorch's default backend on this GPU is cuDNN's (0.27–0.58 forward, rising with head
//    dim and sequence); `--calibration` of the probe's output takes those.
//  - Streaming: the probe's 1 GiB copy moved 4.197 TB/s, 0.874 of the 4.8 TB/s datasheet figure:
//    the 0.85 above stands (3 % apart).
constexpr double kHopperSustainedGemm = 1 / 1.128136;

// H100 and H200 differ in memory alone: every kernel constant is the same die's.
GpuSpec hopper(std::string name, double mib, double hbm_bps) {
  GpuSpec g{.name = std::move(name), .memory_bytes = mib * kMiB, .peak_fp32_flops = 67e12,
            .peak_tf32_flops = 494.7e12, .peak_bf16_flops = 989.4e12,
            .peak_fp8_flops = 1978.9e12, .memory_bps = hbm_bps, .compute_capability = 90,
            .kernels = hopper_kernels(), .fp8_gemm = hopper_fp8_kernels()};
  g.kernels.sustained_gemm = kHopperSustainedGemm;  // Note [power cap]
  g.fp8_gemm->sustained_gemm = kHopperSustainedGemm;
  return g;
}

GpuSpec h200() { return hopper("h200", 143771, 4.8e12); }

// B200 (HGX/DGX, 1000 W): peaks without sparsity bf16 2.25, fp8 4.5 PFLOP/s (NVIDIA's B200
// figures as pytorch/ao's roofline utilities carry them), tf32 1.1, fp32 0.08 PFLOP/s (NVIDIA
// Blackwell architecture technical brief, HGX B200 at 1000 W); 148 SMs, 178.35 GiB and
// 7680-bit × 3996 MHz × 2 = 7.672 TB/s HBM3e from a device query (pytorch/ao#4002). Attention:
// Dao 2023's best H100 FlashAttention-2 figure, 0.35 forward and 0.3 backward of the peak, and
// streaming at Hopper's 0.85 (assumed; no published Blackwell figure used yet).

// Blackwell's GEMM constants: B200's fit to XLA's measured table, the ceiling the same fraction of
// each part's peak (B300 and the 1200/1400 W GB parts: no measured table yet — an assumption).
KernelPerf blackwell_kernels(int sms, double peak_bf16) {
  return measured(KernelPerf{.sm_count = sms, .attention_forward_fraction = 0.35,
                             .attention_backward_fraction = 0.3, .memory_fraction = 0.85},
                  0.9519, 1024, 0.65, 2e-6, 1670.467342710337e12 / 2.25e15 * peak_bf16,
                  peak_bf16);
}

// Blackwell's fp8 GEMM constants (GpuSpec::fp8_gemm): B200's fit to the same table's e4m3 × e4m3
// → bf16 column at the 4.5 PFLOP/s fp8 peak (fraction 0.9982, k½ 2048, 0.60 per tile halving, 2 µs
// per kernel; best GEMM 3279.7 TFLOP/s, 73 % of the peak against bf16's 74 %, but fp8 GEMMs need
// a far longer k to reach it: a median 1.2× bf16's speed on the table's shapes;
// tests/validation/test_gemm_tables.cpp). The other Blackwell parts take the same fractions of
// their fp8 peaks (an assumption, as for bf16). Hopper's fp8 constants: hopper_fp8_kernels above.
KernelPerf blackwell_fp8_kernels(int sms, double peak_fp8) {
  return measured(KernelPerf{.sm_count = sms}, 0.998162, 2048, 0.60, 2e-6,
                  3279.676742e12 / 4.5e15 * peak_fp8, peak_fp8);
}

// Blackwell's nvfp4 GEMM constants (GpuSpec::fp4_gemm). A published B200 table of cuBLAS's own
// block-scaled FP4 GEMM (deepseek-ai/DeepGEMM#348, the cublasTest 13.3 column: seven shapes, m
// 128–8192, 338–5239 TFLOP/s; tests/data/published_fp4_gemm_b200.json) — MXF4, which runs on the
// same FP4 tensor cores as NVFP4 at the same dense peak (an assumption: no NVFP4 cuBLAS table was
// found). Seven points cannot pin the shape terms, so B200's fp8 fit keeps them (low-precision GEMMs
// need the long k½ = 2048 there too) and one number moves: the fraction 0.998162 → 0.630331, the
// value at which the median of published / predicted over the seven is 1, with the best published
// GEMM (5239 TFLOP/s at 8192³, 0.582 of the 9 PFLOP/s peak) as the ceiling. Predicted / published:
// 0.82–1.40 (the k = 2048 shapes fastest); bf16's fractions at the fp4 peak, which nvfp4 took
// before, ran all seven 1.26–2.40× fast. The other Blackwell parts take the same fractions of
// their fp4 peaks (an assumption, as for bf16 and fp8).
KernelPerf blackwell_fp4_kernels(int sms, double peak_fp4) {
  return measured(KernelPerf{.sm_count = sms}, 0.630331, 2048, 0.60, 2e-6,
                  5239e12 / 9e15 * peak_fp4, peak_fp4);
}

// Blackwell parts without a device query here; peaks without sparsity. Sources:
//  - GB200 (B200 at 1200 W in GB200 NVL72): bf16 2.5, fp8 5, tf32 1.25 PFLOP/s, fp32 90 TFLOP/s
//    (NVIDIA Blackwell architecture technical brief, as tabulated by G. Lockwood,
//    glennklockwood.com/garden/processors/B200); 186 GB and 8 TB/s = the rack's 13.4 TB and
//    576 TB/s over 72 GPUs (NVIDIA GB200 NVL72 specifications); 148 SMs (the B200 die).
//  - B300 (HGX, 1100 W): bf16 2.25, fp8 4.5, tf32 1.125 PFLOP/s, fp32 75 TFLOP/s (NVIDIA, via
//    glennklockwood.com/garden/processors/B300); 288 GB HBM3e (DGX B300: 2.3 TB over 8) at 8 TB/s.
//  - GB300 (1400 W in GB300 NVL72): bf16 2.5, fp8 5 PFLOP/s (the rack's 180 and 360 PFLOP/s over
//    72), 287.5 GB and 8 TB/s (the rack's 20.7 TB and 576 TB/s over 72; NVIDIA GB300 NVL72
//    specifications, tabulated at verda.com/blog/gb300-nvl72-architecture); tf32 and fp32 taken
//    as B300's. B300/GB300: 160 SMs (Blackwell Ultra).
// Dense FP4 peaks (no sparsity): B200 9 PFLOP/s (DGX B200 datasheet: 144 PFLOP/s FP4 inference
// over 8 GPUs, with sparsity); GB200 10 (GB200 NVL72: 1,440 PFLOP/s FP4 with sparsity over 72);
// B300 and GB300 15 (NVIDIA Blackwell Ultra: 15 PFLOP/s dense NVFP4 per GPU).
// Compute capability (NVIDIA's table, developer.nvidia.com/cuda-gpus): A100 8.0; H100, H200 9.0;
// B200, GB200 10.0; B300, GB300 10.3.
GpuSpec b200() {
  return GpuSpec{.name = "b200", .memory_bytes = 178.35 * kGiB, .peak_fp32_flops = 80e12,
                 .peak_tf32_flops = 1.1e15, .peak_bf16_flops = 2.25e15, .peak_fp8_flops = 4.5e15,
                 .peak_fp4_flops = 9e15, .memory_bps = 7.672e12, .compute_capability = 100,
                 .kernels = blackwell_kernels(148, 2.25e15),
                 .fp8_gemm = blackwell_fp8_kernels(148, 4.5e15),
                 .fp4_gemm = blackwell_fp4_kernels(148, 9e15)};
}

GpuSpec blackwell(std::string name, double bytes, double bps, double fp32, double tf32,
                  double bf16, double fp8, double fp4, int sms, int compute_capability) {
  return GpuSpec{.name = std::move(name), .memory_bytes = bytes, .peak_fp32_flops = fp32,
                 .peak_tf32_flops = tf32, .peak_bf16_flops = bf16, .peak_fp8_flops = fp8,
                 .peak_fp4_flops = fp4, .memory_bps = bps,
                 .compute_capability = compute_capability,
                 .kernels = blackwell_kernels(sms, bf16),
                 .fp8_gemm = blackwell_fp8_kernels(sms, fp8),
                 .fp4_gemm = blackwell_fp4_kernels(sms, fp4)};
}

std::vector<std::pair<std::string, ClusterSpec>> build_clusters() {
  const LinkSpec nvlink3{.bandwidth_bps = 300e9, .latency_s = 3.4e-6};
  const LinkSpec nvlink4{.bandwidth_bps = 450e9, .latency_s = 3.4e-6};
  const LinkSpec hdr{.bandwidth_bps = 25e9, .latency_s = 14e-6};
  const LinkSpec ndr{.bandwidth_bps = 50e9, .latency_s = 14e-6};
  const LinkSpec nvlink5{.bandwidth_bps = 900e9, .latency_s = 3.4e-6};
  const LinkSpec xdr{.bandwidth_bps = 100e9, .latency_s = 14e-6};  // 800 Gb/s (ConnectX-8)
  auto rack = [](ClusterSpec c) {
    c.gpus_per_node = 4;
    c.nics_per_node = 4;
    c.nvlink_domain = 72;
    return c;
  };
  auto make = [](GpuSpec g, LinkSpec intra, LinkSpec inter, double intra_fraction,
                 double inter_fraction, double mfu) {
    return ClusterSpec{.gpu = std::move(g), .gpus_per_node = 8, .intra_node = intra,
                       .inter_node = inter, .nics_per_node = 8,
                       .intra_bus_fraction = intra_fraction, .inter_bus_fraction = inter_fraction,
                       .comm_model = CommModel::nccl, .mfu = mfu};
  };
  return {
      {"a100-40g", make(a100("a100-40g", 40960, 1.555e12), nvlink3, hdr, 230.0 / 300, 24.0 / 25, 0.5)},
      {"a100-80g", make(a100("a100-80g", 81920, 2.039e12), nvlink3, hdr, 230.0 / 300, 24.0 / 25, 0.5)},
      {"h100-80g", make(hopper("h100-80g", 81559, 3.35e12), nvlink4, ndr, 370.0 / 450, 0.94, 0.4)},
      {"h200", make(h200(), nvlink4, ndr, 370.0 / 450, 0.94, 0.4)},
      // DGX B200: NVLink 5, 1.8 TB/s per GPU bidirectional; eight ConnectX-7 400 Gb/s NICs. NVLink's
      // achieved bus fraction, the latencies and u are Hopper's (assumed until measured).
      {"b200", make(b200(), nvlink5, ndr, 370.0 / 450, 0.94, 0.4)},
      {"b300", make(blackwell("b300", 288e9, 8e12, 75e12, 1.125e15, 2.25e15, 4.5e15, 15e15, 160, 103), nvlink5,
                    xdr, 370.0 / 450, 0.94, 0.4)},
      // Rack systems: 18 hosts (compute trays) of 4 GPUs, one NIC per GPU (GB200: ConnectX-7
      // 400 Gb/s; GB300: ConnectX-8 800 Gb/s), all 72 GPUs on one NVLink 5 switch fabric.
      {"gb200-nvl72", rack(make(blackwell("gb200", 186e9, 8e12, 90e12, 1.25e15, 2.5e15, 5e15, 10e15, 148, 100),
                                nvlink5, ndr, 370.0 / 450, 0.94, 0.4))},
      {"gb300-nvl72", rack(make(blackwell("gb300", 287.5e9, 8e12, 75e12, 1.125e15, 2.5e15, 5e15, 15e15, 160, 103),
                                nvlink5, xdr, 370.0 / 450, 0.94, 0.4))},
  };
}

const std::vector<std::pair<std::string, ClusterSpec>>& clusters() {
  static const auto v = build_clusters();
  return v;
}

}  // namespace

std::optional<ModelSpec> model_preset(std::string_view name) {
  for (const auto& m : models())
    if (m.name == name) return m;
  return std::nullopt;
}

const std::vector<std::string>& model_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& m : models()) n.push_back(m.name);
    return n;
  }();
  return names;
}

std::optional<ClusterSpec> cluster_preset(std::string_view name) {
  for (const auto& [n, c] : clusters())
    if (n == name) return c;
  return std::nullopt;
}

const std::vector<std::string>& cluster_preset_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& kv : clusters()) n.push_back(kv.first);
    return n;
  }();
  return names;
}

}  // namespace tally
