#include "tally/core/compute.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

namespace tally {

namespace {

struct TokenFlops {
  double model = 0;     // forward + backward
  double hardware = 0;  // + recompute
};

// Sources in compute.hpp: 6N + 12·L·h·s; full recompute +2N + 4·L·h·s, selective +4·L·h·s.
TokenFlops token_flops(const ModelSpec& m, std::int64_t seq, Recompute r) {
  require_real(seq >= 1, "seq_len", double(seq), "must be >= 1");
  const double N = compute_params(m);
  // 2·s·a·(d_qk + d_v) per layer: QKᵀ and PV; 4·h·s when a·d = h (no MLA, no stated head_dim).
  // A sliding-window layer's span is its window, min(w, s), unmasked within it.
  // Note [multi-token prediction] (model.cpp): each MTP module's layer attends over the whole
  // sequence, and its logits come from the shared head, one more 6·V·h pass beside its own 6N.
  const double spans =
      double(m.layers - m.window_layers + m.mtp_layers) * double(seq) +
      double(m.window_layers) * double(std::min<std::int64_t>(m.attention_window, seq));
  const double attn_fwd =
      m.params_only ? 0.0 : 2.0 * double(m.heads) * double(m.qk_dim() + m.value_dim()) * spans;
  TokenFlops f;
  f.model = 6.0 * N + 3.0 * attn_fwd +
            6.0 * double(m.mtp_layers) * double(m.vocab) * double(m.hidden);
  f.hardware = f.model;
  if (r == Recompute::full) f.hardware += 2.0 * N + attn_fwd;
  if (r == Recompute::selective) f.hardware += attn_fwd;
  // save_matmuls replays only norms and activation functions: no matmul FLOPs. op_sac replays the
  // k projection, the out-projection and the MLP's up (SwiGLU) or down (GeLU) matmul: 2 FLOPs per
  // weight of each, per layer.
  if (r == Recompute::op_sac) {
    require_recompute_applies(r, m);
    const double h = double(m.hidden), f_w = double(m.ffn);
    const double k_proj = h * double(m.kv_heads * m.head_dim());
    const double o_proj = double(m.heads * m.head_dim()) * h;
    f.hardware += 2.0 * double(m.layers + m.mtp_layers) * (k_proj + o_proj + h * f_w);
  }
  return f;
}

}  // namespace

double compute_params(const ModelSpec& m) {
  const ParamCount c = count_params(m);  // validates m
  if (m.params_only || !m.nominal_params) return c.active();
  return c.active() * (*m.nominal_params / c.total());
}

double flops_per_token(const ModelSpec& m, std::int64_t seq, Recompute r) {
  return token_flops(m, seq, r).hardware;
}

double lm_head_flops_per_token(const ModelSpec& m) {
  if (m.params_only) return 0.0;
  return 6.0 * double(m.vocab) * double(m.hidden);
}

double mtp_flops_per_token(const ModelSpec& m, std::int64_t seq, Recompute r) {
  if (m.mtp_layers == 0) return 0.0;
  ModelSpec main = m;
  main.mtp_layers = 0;
  return token_flops(m, seq, r).hardware - token_flops(main, seq, r).hardware;
}

void ComputeSetup::validate() const {
  model.validate();
  require_real(seq_len >= 1, "seq_len", double(seq_len), "must be >= 1");
  require_real(global_batch >= 1, "global_batch", double(global_batch), "must be >= 1 sequences");
  require_real(gpus >= 1, "gpus", gpus, "must be >= 1");
  require_real(std::isfinite(peak_flops) && peak_flops > 0, "peak_flops", peak_flops,
          "must be > 0 FLOP/s");
  require_real(utilisation > 0 && utilisation <= 1, "utilisation", utilisation, "must be in (0, 1]");
}

ComputeResult step_compute(const ComputeSetup& setup) {
  setup.validate();
  ComputeResult r;
  r.setup = setup;
  const TokenFlops f = token_flops(setup.model, setup.seq_len, setup.recompute);
  r.params_per_token = compute_params(setup.model);
  r.tokens_per_step = double(setup.global_batch) * double(setup.seq_len);
  r.model_flops_per_token = f.model;
  r.hardware_flops_per_token = f.hardware;
  r.model_flops = f.model * r.tokens_per_step;
  r.hardware_flops = f.hardware * r.tokens_per_step;
  const double rate = double(setup.gpus) * setup.peak_flops;
  r.seconds = r.hardware_flops / (rate * setup.utilisation);
  r.mfu = r.model_flops / (r.seconds * rate);
  r.tokens_per_s = r.tokens_per_step / r.seconds;
  return r;
}

std::string ComputeResult::convention() const {
  const auto& s = setup;
  std::string c = "FLOPs per token = 6N";
  if (!s.model.params_only) c += " + 12*L*h*s (attention unmasked)";
  c += ", N = " + format_number(params_per_token) + (s.model.is_moe() ? " active" : "") + " params";
  if (s.model.mtp_layers > 0)
    c += " incl. " + std::to_string(s.model.mtp_layers) +
         " MTP module(s), each + its layer's attention + 6*V*h through the shared head";
  c += " | recompute " + std::string(to_string(s.recompute));
  if (s.recompute == Recompute::full) c += " (+2N + 4*L*h*s hardware FLOPs)";
  if (s.recompute == Recompute::selective && !s.model.params_only)
    c += " (+4*L*h*s hardware FLOPs)";
  c += " | time = hardware FLOPs / (G=" + std::to_string(s.gpus) + " x peak " +
       format_number(s.peak_flops) + " FLOP/s x utilisation " + format_number(s.utilisation) +
       ") | MFU on model FLOPs (no recompute)";
  return c;
}

}  // namespace tally
