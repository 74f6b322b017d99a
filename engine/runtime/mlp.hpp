// The engine's one MLP in plain ATen, for the DDP, ZeRO and checkpoint runs, the benchmark and the
// tests (internal, header-only; no torch::nn, whose headers cost a minute of compile time per TU on
// a 2-core box). Its size: core's mlp_parameters (tally/core/mlp_step.hpp).
//
//   widths = {d_0, d_1, ..., d_L}: L Linear layers d_{l} → d_{l+1} with ReLU between them, i.e.
//   nn.Sequential(Linear(d_0, d_1), ReLU(), ..., Linear(d_{L-1}, d_L)).
//
// Parameters are initialised exactly as PyTorch's nn.Linear.reset_parameters (kaiming_uniform_
// with a = √5 on the weight, then U(−1/√fan_in, 1/√fan_in) on the bias), layer by layer from the
// global generator, in float32, then cast to the requested dtype — so after torch::manual_seed(s)
// the values equal Python's `torch.manual_seed(s); nn.Sequential(...)` (the peer test checks it).
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace tally::engine::mlp {

struct Mlp {
  std::vector<at::Tensor> weights;  // layer l: [d_{l+1}, d_l]
  std::vector<at::Tensor> biases;   // layer l: [d_{l+1}]

  // nn.Module order: 0.weight, 0.bias, 2.weight, 2.bias, ... (the ReLUs take the odd indices).
  std::vector<at::Tensor> parameters() const {
    std::vector<at::Tensor> ps;
    for (std::size_t l = 0; l < weights.size(); ++l) {
      ps.push_back(weights[l]);
      ps.push_back(biases[l]);
    }
    return ps;
  }
  std::vector<std::string> parameter_names() const {
    std::vector<std::string> names;
    for (std::size_t l = 0; l < weights.size(); ++l) {
      names.push_back(std::to_string(2 * l) + ".weight");
      names.push_back(std::to_string(2 * l) + ".bias");
    }
    return names;
  }
  // x: [B, d_0] → logits [B, d_L]. dropout_masks: empty, or one [B, d_{l+1}] mask per hidden layer,
  // already scaled by 1/(1 − p), applied after its ReLU.
  at::Tensor forward(const at::Tensor& x, const std::vector<at::Tensor>& dropout_masks = {}) const {
    at::Tensor h = x;
    for (std::size_t l = 0; l < weights.size(); ++l) {
      h = forward_layer(h, weights[l], biases[l], l + 1 == weights.size());
      if (l + 1 < weights.size() && !dropout_masks.empty()) h = h * dropout_masks[l];
    }
    return h;
  }
  // Layer l: Linear, then ReLU unless it is the last (ZeRO-3 runs the layers one at a time).
  static at::Tensor forward_layer(const at::Tensor& x, const at::Tensor& weight,
                                  const at::Tensor& bias, bool last) {
    const at::Tensor y = at::linear(x, weight, bias);
    return last ? y : at::relu(y);
  }
  // Detached copies that require grad: an independent replica (the seed's ref.load_state_dict).
  Mlp clone() const {
    Mlp c;
    for (const auto& w : weights) c.weights.push_back(w.detach().clone().requires_grad_(true));
    for (const auto& b : biases) c.biases.push_back(b.detach().clone().requires_grad_(true));
    return c;
  }
};

// nn.init.kaiming_uniform_(w, a=math.sqrt(5)) bound, computed in Python's order of operations.
inline double kaiming_uniform_bound(std::int64_t fan_in) {
  const double a = std::sqrt(5.0);
  const double gain = std::sqrt(2.0 / (1 + a * a));  // calculate_gain('leaky_relu', a)
  const double std_dev = gain / std::sqrt(double(fan_in));
  return std::sqrt(3.0) * std_dev;
}

inline Mlp make_mlp(const std::vector<std::int64_t>& widths, at::ScalarType dtype = at::kFloat) {
  Mlp m;
  at::NoGradGuard no_grad;
  for (std::size_t l = 0; l + 1 < widths.size(); ++l) {
    const std::int64_t in = widths[l], out = widths[l + 1];
    at::Tensor w = at::empty({out, in}, at::kFloat);
    w.uniform_(-kaiming_uniform_bound(in), kaiming_uniform_bound(in));
    at::Tensor b = at::empty({out}, at::kFloat);
    const double bias_bound = 1 / std::sqrt(double(in));
    b.uniform_(-bias_bound, bias_bound);
    m.weights.push_back(w.to(dtype).requires_grad_(true));
    m.biases.push_back(b.to(dtype).requires_grad_(true));
  }
  return m;
}

// Flat copy of all parameters (or gradients), in parameters() order, as float64.
inline at::Tensor flat_values(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> parts;
  for (const auto& t : ts) parts.push_back(t.detach().reshape(-1).to(at::kDouble));
  return at::cat(parts);
}
inline at::Tensor flat_grads(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad());
  return flat_values(grads);
}

}  // namespace tally::engine::mlp
