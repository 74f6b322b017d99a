// One row of tests/data/llm_foundry_mpt.json (MosaicML llm-foundry's MPT training benchmarks,
// scripts/train/benchmarking/README.md at 061f2c7c) as tally's model, request and layout: the
// published layout fixed, nothing fitted. The pattern of torchtitan_rows.hpp; read by
// test_published_fsdp.cpp. Each choice below names the file of llm-foundry (same commit) it
// follows.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tally/core/planner.hpp"
#include "tally/core/presets.hpp"
#include "tally/core/types.hpp"

namespace tally {

// MPT (llmfoundry/models/mpt/modeling_mpt.py, configuration_mpt.py defaults; the sizes from
// scripts/train/yamls/pretrain/mpt-<model>.yaml, the fixture's "architectures"):
//  - d_model, n_layers, n_heads from the yaml; expansion_ratio 4 (ffn = 4·d_model), GELU MLP
//    (layers/ffn.py: up_proj, GELU(approximate='none'), down_proj);
//  - no_bias false: biases on every linear and on both LayerNorms (submit_benchmarks.py sets
//    norm_type low_precision_layernorm, a LayerNorm with weight and bias);
//  - learned_pos_emb true, alibi false: a wpe table of max_seq_len × d_model, and
//    submit_benchmarks.py sets max_seq_len to the row's sequence — why NumParams grows with it;
//  - tied embeddings (MPTForCausalLM refuses untied ones); vocab_size 50368;
//  - resid_pdrop, emb_pdrop, attn_pdrop 0.0: no dropout.
inline ModelSpec mpt_model(const nlohmann::json& arch, const std::string& size, std::int64_t seq) {
  const auto& a = arch["models"][size];
  const std::int64_t h = a["d_model"];
  return ModelSpec{.name = "mpt-" + size, .hidden = h, .layers = a["n_layers"],
                   .heads = a["n_heads"], .kv_heads = a["n_heads"],
                   .ffn = arch["expansion_ratio"].get<std::int64_t>() * h, .vocab = arch["vocab"],
                   .max_positions = seq, .tied_embeddings = true, .linear_bias = true,
                   .dropout = false, .mlp = MlpKind::gelu, .norm = NormKind::layernorm,
                   .position = PositionKind::learned};
}

// The request: the GPU's preset (the A100 tables' 1600 Gbps RoCE per node is the a100 presets'
// 8 × 200 Gb/s rails; the H100 table names no network, so the preset's stands), the row's GPUs,
// global batch and sequence, bf16 (amp_bf16 / bf16), decoupled AdamW (the yamls' optimizer),
// FSDP's overlap (tally's defaults: reduce-scatter behind backward, all-gathers prefetched).
//  - loss: llm-foundry's default loss_fn fused_crossentropy (modeling_mpt.py: flash-attn's
//    cross-entropy kernel), so not PyTorch's eager cross_entropy: Loss::fused;
//  - kernels: no torch.compile (submit_benchmarks.py: compile_config None unless
//    --torch_compile, which sweep.sh never passes; torch 2.0.1 image), so eager PyTorch
//    (Note [eager kernels]). For a GPT layer eager differs from fused only by the attention
//    output's transpose copy, which MPT's Triton path does not make (attention.py:
//    attn_output.view) — a copy of d_model bf16 values per token counted that MPT does not run;
//  - attention: MPT's Triton flash-attention kernel (attn_impl triton, below), FlashAttention-1's
//    class, not FlashAttention-2's (FlashKernel::fa1, Note [flash kernel generations]).
inline PlanRequest foundry_request(const nlohmann::json& arch, const nlohmann::json& run) {
  const std::int64_t seq = run["seq"];
  return PlanRequest{.model = mpt_model(arch, run["model"], seq),
                     .cluster = *cluster_preset(run["cluster"].get<std::string>()),
                     .gpus = run["gpus"], .global_batch = run["global_batch"], .seq = seq,
                     .precision = Precision::bf16, .optimizer = Optimizer::adamw,
                     .dropout = false, .loss = Loss::fused, .kernels = Kernels::eager,
                     .flash_kernel = FlashKernel::fa1};
}

// The layout: FSDP FULL_SHARD over every GPU (ZeRO-3, dp = G; no TP, PP or CP in llm-foundry's
// FSDP runs); the row's MicroBatchSize and GradAccum; Activation Checkpointing True = full
// recompute (FSDP's activation_checkpointing wraps each MPTBlock whole); attention: attn_impl
// triton (submit_benchmarks.py's default, MPT's Triton flash-attention kernel) = flash.
inline Layout foundry_layout(const nlohmann::json& run) {
  return Layout{.dp = run["gpus"], .zero = 3, .micro_batch = run["micro_batch"],
                .grad_accum = run["grad_accum"],
                .recompute = run["activation_checkpointing"].get<bool>() ? Recompute::full
                                                                          : Recompute::none,
                .attention = Attention::flash};
}

}  // namespace tally
