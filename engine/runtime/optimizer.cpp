// Adam and SGD (optimizer_torch.hpp, Note [mixed-precision Adam]).
#include <algorithm>
#include <cmath>
#include <string>

#include "optimizer_torch.hpp"
#include "tally/core/types.hpp"

namespace tally::engine {

void AdamOptions::validate() const {
  auto bad = [](const char* name, double v, const char* range) {
    throw InvalidInput(std::string(name) + " = " + format_number(v) + ": must be " + range);
  };
  if (!(lr > 0) || !std::isfinite(lr)) bad("lr", lr, "finite and > 0");
  if (!(beta1 >= 0 && beta1 < 1)) bad("beta1", beta1, "in [0, 1)");
  if (!(beta2 >= 0 && beta2 < 1)) bad("beta2", beta2, "in [0, 1)");
  if (!(eps > 0) || !std::isfinite(eps)) bad("eps", eps, "finite and > 0");
}

Adam::Adam(std::vector<at::Tensor> params, const AdamOptions& options) : options_(options) {
  options_.validate();
  if (params.empty()) return;
  const at::ScalarType type = params.front().scalar_type();
  std::int64_t n = 0;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& p = params[i];
    if (!p.is_floating_point())
      throw InvalidInput(std::string("Adam: parameter dtype ") + c10::toString(p.scalar_type()) +
                         ": must be a floating type");
    if (p.scalar_type() != type)
      throw InvalidInput("Adam: parameter " + std::to_string(i) + " dtype " +
                         c10::toString(p.scalar_type()) + " vs parameter 0 dtype " +
                         c10::toString(type) + ": all must match");
    n += p.numel();
  }
  at::NoGradGuard no_grad;
  const bool own = type == at::kFloat || type == at::kDouble;
  const auto state = at::TensorOptions().dtype(own ? type : at::kFloat);
  m_ = at::zeros({n}, state);
  v_ = at::zeros({n}, state);
  if (!own) master_ = at::empty({n}, state);
  std::int64_t offset = 0;
  for (auto& p : params) {
    const auto view = [&](const at::Tensor& flat) {
      return flat.narrow(0, offset, p.numel()).view(p.sizes());
    };
    Slot s{.param = p, .master = own ? p : view(master_), .m = view(m_), .v = view(v_)};
    if (!own) s.master.copy_(p);  // exact: every 16-bit float is an fp32 one
    slots_.push_back(std::move(s));
    offset += p.numel();
  }
}

void Adam::step() { step_at(options_.lr); }

void Adam::step_at(double lr) {
  std::vector<at::Tensor> grads;
  grads.reserve(slots_.size());
  for (const Slot& s : slots_) grads.push_back(s.param.grad());
  apply(grads, lr);
}

void Adam::step_with(const std::vector<at::Tensor>& grads) {
  TALLY_INVARIANT(grads.size() == slots_.size());
  apply(grads, options_.lr);
}

void Adam::apply(const std::vector<at::Tensor>& grads, double lr) {
  at::NoGradGuard no_grad;
  steps_ += 1;
  const double t = double(steps_);
  const double b1 = options_.beta1, b2 = options_.beta2;
  const double step_size = lr / (1 - std::pow(b1, t));
  const double bias_correction2_sqrt = std::sqrt(1 - std::pow(b2, t));
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    if (!grads[i].defined()) continue;
    Slot& s = slots_[i];
    TALLY_INVARIANT(grads[i].numel() == s.param.numel());
    const at::Tensor g_all = grads[i].reshape(-1), w_all = s.master.view(-1);
    const at::Tensor m_all = s.m.view(-1), v_all = s.v.view(-1);
    const std::int64_t n = w_all.numel();
    for (std::int64_t i0 = 0; i0 < n; i0 += kAdamChunkElements) {
      const std::int64_t len = std::min(kAdamChunkElements, n - i0);
      const at::Tensor g = g_all.narrow(0, i0, len).to(w_all.scalar_type());
      at::Tensor m = m_all.narrow(0, i0, len), v = v_all.narrow(0, i0, len);
      at::Tensor w = w_all.narrow(0, i0, len);
      m.mul_(b1).add_(g, 1 - b1);
      v.mul_(b2).addcmul_(g, g, 1 - b2);
      // torch's (√v / √(1 − β2^t)) + ε, with one temporary instead of two.
      w.addcdiv_(m, v.sqrt().div_(bias_correction2_sqrt).add_(options_.eps), -step_size);
    }
    if (!s.master.is_same(s.param)) s.param.copy_(s.master);  // round into the 16-bit parameter
  }
}

void Adam::zero_grad() {
  for (Slot& s : slots_) s.param.mutable_grad() = at::Tensor();
}

void Adam::load_moments(const at::Tensor& flat_m, const at::Tensor& flat_v) {
  TALLY_INVARIANT(flat_m.numel() == m_.numel() && flat_v.numel() == v_.numel());
  at::NoGradGuard no_grad;
  m_.copy_(flat_m.reshape(-1));
  v_.copy_(flat_v.reshape(-1));
}

void sgd_step(const std::vector<at::Tensor>& params, double lr) {
  at::NoGradGuard no_grad;
  for (auto p : params)
    if (p.grad().defined()) p.add_(p.grad(), -lr);
}

void zero_grad(const std::vector<at::Tensor>& params) {
  for (auto p : params) p.mutable_grad() = at::Tensor();
}

}  // namespace tally::engine
