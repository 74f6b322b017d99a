// PpStage (pp_model.hpp): one pipeline stage of the engine's GPT, executing core's schedule.
#include "pp_model.hpp"

#include <chrono>
#include <string>

#include "comm_p2p.hpp"
#include "comm_torch.hpp"
#include "tally/core/types.hpp"
#include "run_helpers.hpp"

namespace tally::engine {

namespace {

using Clock = std::chrono::steady_clock;

double sent_bytes(const Comm& c) { return c.counters()[Collective::send_recv].bytes_sent; }

}  // namespace

GptStageModel::GptStageModel(Gpt& full) : full_(full), mask_(causal_mask(full->config.seq)) {}

// GptImpl::forward's two ends, on the same modules (gpt_model.cpp): token embedding + positions
// on virtual stage 0; ln_f, the tied LM head and lm_loss on the last.
torch::Tensor GptStageModel::embed(const torch::Tensor& idx) {
  return full_->wte->forward(idx) + full_->wpe.narrow(0, 0, idx.size(1));  // (B, T, C)
}

torch::Tensor GptStageModel::block(int layer, const torch::Tensor& x) {
  return full_->blocks[std::size_t(layer)]->as<GptBlock>()->forward(x, mask_);
}

torch::Tensor GptStageModel::head_loss(const torch::Tensor& x, const torch::Tensor& targets) {
  return lm_loss(torch::matmul(full_->ln_f->forward(x), full_->wte->weight.t()), targets);
}

std::vector<std::int64_t> GptStageModel::boundary_shape(std::int64_t B, std::int64_t T) const {
  return {B, T, full_->config.hidden};
}

torch::TensorOptions GptStageModel::options() const { return full_->wte->weight.options(); }
int GptStageModel::layers() const { return int(full_->config.layers); }
torch::Tensor& GptStageModel::tied_embedding_grad() { return full_->wte->weight.mutable_grad(); }

PpStage::PpStage(Gpt& full, Comm& pp, const std::vector<int>& layers_per_stage, int interleave)
    : owned_(std::make_unique<GptStageModel>(full)), full_(&full), model_(*owned_), pp_(pp),
      v_(interleave) {
  lay_out(layers_per_stage);
}

PpStage::PpStage(StageModel& model, Comm& pp, const std::vector<int>& layers_per_stage,
                 int interleave)
    : model_(model), pp_(pp), v_(interleave) {
  lay_out(layers_per_stage);
}

void PpStage::lay_out(const std::vector<int>& layers_per_stage) {
  const int P = pp_.world_size();
  TALLY_INVARIANT(v_ >= 1);
  // Each stage's layers over its chunks, or every virtual stage's (Note [uneven virtual stages]).
  const std::vector<int> chunks = virtual_stage_layers(layers_per_stage, P, v_);
  first_layer_.push_back(0);
  for (const int n : chunks) first_layer_.push_back(first_layer_.back() + n);
  TALLY_INVARIANT(first_layer_.back() == model_.layers());
}

int PpStage::tag(int sender_virtual, int micro_batch, bool backward, int M) const {
  return (sender_virtual * M + micro_batch) * 2 + (backward ? 1 : 0);
}

torch::Tensor PpStage::run_blocks(int j, torch::Tensor x) {
  for (int l = first_layer_[std::size_t(j)]; l < first_layer_[std::size_t(j) + 1]; ++l)
    x = model_.block(l, x);
  return x;
}

// Note [executing a schedule]
// The stage walks its list once. A forward receives its input (unless it is virtual stage 0),
// runs its blocks, and posts the send of its output (unless it is the last virtual stage, which
// computes the loss instead); a backward receives the output's gradient (unless last), runs
// autograd from the saved output, and posts the send of its input's gradient (unless first).
// Receives block: that is the wait a schedule's bubble is made of. Sends are posted and waited
// later (every completed one after each operation, the rest at the end), so no two stages can
// block in sends to each other; the schedules' dependency graphs are acyclic (core checks that
// they complete in simulation), so every receive is eventually served.
PpStageRecord PpStage::step(const std::vector<PipelineOp>& ops, const torch::Tensor& idx,
                            const torch::Tensor& targets, const TrackingAllocatorScope* memory,
                            const PpOpHooks* hooks) {
  const int P = pp_.world_size(), V = P * v_, M = int(idx.size(0));
  const auto opts = model_.options();
  const std::vector<std::int64_t> shape = model_.boundary_shape(idx.size(1), idx.size(2));
  PpStageRecord r;
  std::map<std::pair<int, int>, Saved> saved;  // (micro-batch, chunk)
  std::vector<PendingCollective> sends;
  auto reap = [&](bool all) {
    for (std::size_t i = 0; i < sends.size();) {
      if (all || sends[i].done()) {
        sends[i].wait();
        sends.erase(sends.begin() + std::ptrdiff_t(i));
      } else {
        ++i;
      }
    }
  };
  const std::int64_t base = memory ? memory->counters().allocated_bytes : 0;
  double forward_added = 0;
  int forwards = 0;
  pp_.barrier();
  const auto start = Clock::now();
  for (const PipelineOp& op : ops) {
    const int j = virtual_stage(op.chunk);
    const std::int64_t before = memory ? memory->counters().allocated_bytes : 0;
    if (op.kind == PipelineOpKind::forward) {
      Saved s;
      auto t = Clock::now();
      if (j > 0) {
        s.input = torch::empty(shape, opts);
        recv(pp_, s.input, (j - 1) % P, tag(j - 1, op.micro_batch, false, M));
        s.input.requires_grad_(true);
      }
      r.wait_s += seconds_since(t);
      if (hooks && hooks->before) hooks->before(op);
      t = Clock::now();
      torch::Tensor x = j == 0 ? model_.embed(idx[op.micro_batch]) : s.input;
      x = run_blocks(j, x);
      if (j == V - 1) {
        s.output = model_.head_loss(x, targets[op.micro_batch]) / double(M);
        r.loss += s.output.item<double>();
      } else {
        s.output = x;
      }
      const double dt = seconds_since(t);
      r.compute_s += dt;
      r.forward_s += dt;
      if (hooks && hooks->after) hooks->after(op);
      if (j < V - 1) {
        const double b0 = sent_bytes(pp_);
        sends.push_back(send_async(pp_, s.output.detach(), (j + 1) % P,
                                   tag(j, op.micro_batch, false, M)));
        r.activation_send_bytes.push_back(sent_bytes(pp_) - b0);
      }
      saved[{op.micro_batch, op.chunk}] = std::move(s);
    } else {
      auto it = saved.find({op.micro_batch, op.chunk});
      TALLY_INVARIANT(it != saved.end());  // core's schedules run each forward before its backward
      Saved s = std::move(it->second);
      saved.erase(it);
      auto t = Clock::now();
      torch::Tensor grad;
      if (j < V - 1) {
        grad = torch::empty(shape, opts);
        recv(pp_, grad, (j + 1) % P, tag(j + 1, op.micro_batch, true, M));
      }
      r.wait_s += seconds_since(t);
      if (hooks && hooks->before) hooks->before(op);
      t = Clock::now();
      if (j < V - 1)
        s.output.backward(grad);
      else
        s.output.backward();
      const double dt = seconds_since(t);
      r.compute_s += dt;
      r.backward_s += dt;
      if (hooks && hooks->after) hooks->after(op);
      if (j > 0) {
        const double b0 = sent_bytes(pp_);
        sends.push_back(send_async(pp_, s.input.grad(), (j - 1) % P,
                                   tag(j, op.micro_batch, true, M)));
        r.gradient_send_bytes.push_back(sent_bytes(pp_) - b0);
      }
    }
    reap(false);
    r.executed.push_back(op);
    if (memory) {
      const std::int64_t now = memory->counters().allocated_bytes;
      r.held_bytes_after_op.push_back(now - base);
      if (op.kind == PipelineOpKind::forward) {
        forward_added += double(now - before);
        ++forwards;
      }
    }
  }
  const auto t = Clock::now();
  reap(true);
  r.wait_s += seconds_since(t);
  r.elapsed_s = seconds_since(start);
  if (forwards > 0) r.bytes_per_forward = forward_added / forwards;
  return r;
}

void PpStage::reduce_tied_embedding() {
  const int P = pp_.world_size();
  if (P == 1 || !(first() || last())) return;
  torch::Tensor& g = model_.tied_embedding_grad();
  const int peer = first() ? P - 1 : 0;
  const int kTag = Comm::kMaxUserTag - 1;  // above every schedule tag of a sane run
  torch::Tensor mine = g.clone();
  torch::Tensor theirs = torch::empty_like(g);
  PendingCollective sent = send_async(pp_, mine, peer, kTag);
  recv(pp_, theirs, peer, kTag);
  sent.wait();
  torch::NoGradGuard no_grad;
  g.add_(theirs);
}

std::vector<int> PpStage::own_layers() const {
  std::vector<int> layers;
  const int P = pp_.world_size();
  for (int c = 0; c < v_; ++c) {
    const int j = c * P + pp_.rank();
    for (int l = first_layer_[std::size_t(j)]; l < first_layer_[std::size_t(j) + 1]; ++l)
      layers.push_back(l);
  }
  return layers;
}

std::vector<std::string> PpStage::own_parameters() const {
  std::vector<std::string> names;
  if (full_ == nullptr) return names;
  const int P = pp_.world_size();
  if (first()) names.insert(names.end(), {"wte.weight", "wpe"});
  if (last()) {
    if (!first()) names.push_back("wte.weight");
    names.insert(names.end(), {"ln_f.weight", "ln_f.bias"});
  }
  for (int c = 0; c < v_; ++c) {
    const int j = c * P + pp_.rank();
    for (int l = first_layer_[std::size_t(j)]; l < first_layer_[std::size_t(j) + 1]; ++l)
      for (const auto& p : (*full_)->blocks[std::size_t(l)]->named_parameters())
        names.push_back("blocks." + std::to_string(l) + "." + p.key());
  }
  return names;
}

}  // namespace tally::engine
