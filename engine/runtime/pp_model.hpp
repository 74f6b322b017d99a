// The engine's GPT decoder (gpt_model.hpp) split into pipeline stages over a PP group of P ranks
// (internal: includes torch). Narayanan et al. 2021 §2.2; the schedules are core's
// (tally/core/pipeline.hpp, Note [pipeline schedules]).
//
// Legend: P = stages (PP ranks), s = this rank's stage, v = chunks per stage, V = P·v virtual
// stages, M = micro-batches per step, B = micro-batch, T = sequence, C = hidden.
//
// Layout: virtual stage j = c·P + s is chunk c of stage s; the model's blocks are laid out over
// the virtual stages in order, virtual stage j holding stage_layers(L, P)[s] / v of them (core's
// split, so uneven stages run too), or its own count when the split names every virtual stage
// (core's virtual_stage_layers, Note [uneven virtual stages]). Virtual stage 0 adds the
// embedding (token + positions), the last one ln_f, the tied LM head and the loss. A virtual
// stage may hold no block (Megatron-Core's slot split: 0,1,…,1,0): it runs as the identity — its
// received input is its output, and in backward its input's gradient is the one it receives —
// or as the embedding or the loss alone on an end. The tied
// embedding is used on stage 0 and stage P − 1: after the step the two stages exchange its
// gradient and each adds the other's (Megatron-LM's embedding group), so both hold the full
// gradient.
//
// Messages: a forward sends its output (B, T, C) to the next virtual stage's rank, a backward
// the gradient of its input (B, T, C) to the previous one; both non-blocking (Note [non-blocking
// send] in comm.cpp), the receive blocking. A tag names (sending virtual stage, micro-batch,
// direction), so messages never match the wrong receive.
//
// Every rank builds the whole single-process model from the same seed and runs only its own
// blocks (the engine's models are tiny); the gradients land in that model's parameters.
//
// What a stage computes is a StageModel: the plain GPT's modules (GptStageModel, `tally run pp`)
// or the tensor-parallel shards of a TP group (TpGpt's, `tally run 3d`), whose blocks issue their
// TP collectives inside the stage's forwards and backwards. Every rank of a TP group runs the same
// schedule, so its members reach each TP collective in the same order; under SP the boundary
// tensor is the rank's sequence shard (B, T/t, C), sent to the same TP rank of the next stage
// (Megatron-LM's p2p under sequence parallelism).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "gpt_model.hpp"
#include "tally/core/pipeline.hpp"
#include "tally/engine/comm.hpp"
#include "tally/engine/tracking_allocator.hpp"

namespace tally::engine {

// The pieces of a model a pipeline stage runs (Note above). Layers are the model's global indices.
class StageModel {
 public:
  virtual ~StageModel() = default;
  // Virtual stage 0: token ids (B, T) → the first block's input.
  virtual torch::Tensor embed(const torch::Tensor& idx) = 0;
  // Block `layer` on its input.
  virtual torch::Tensor block(int layer, const torch::Tensor& x) = 0;
  // The last virtual stage: the last block's output → the mean cross-entropy.
  virtual torch::Tensor head_loss(const torch::Tensor& x, const torch::Tensor& targets) = 0;
  // Shape of a boundary tensor (a block's input or output) for a (B, T) micro-batch.
  virtual std::vector<std::int64_t> boundary_shape(std::int64_t B, std::int64_t T) const = 0;
  virtual torch::TensorOptions options() const = 0;
  virtual int layers() const = 0;
  // The tied embedding's gradient (stages 0 and P − 1 exchange it).
  virtual torch::Tensor& tied_embedding_grad() = 0;
};

// The single-process GPT's modules (GptImpl::forward's pieces, gpt_model.cpp).
class GptStageModel final : public StageModel {
 public:
  explicit GptStageModel(Gpt& full);
  torch::Tensor embed(const torch::Tensor& idx) override;
  torch::Tensor block(int layer, const torch::Tensor& x) override;
  torch::Tensor head_loss(const torch::Tensor& x, const torch::Tensor& targets) override;
  std::vector<std::int64_t> boundary_shape(std::int64_t B, std::int64_t T) const override;
  torch::TensorOptions options() const override;
  int layers() const override;
  torch::Tensor& tied_embedding_grad() override;

 private:
  Gpt& full_;
  torch::Tensor mask_;
};

// What one stage did in one step.
struct PpStageRecord {
  std::vector<PipelineOp> executed;  // operations in the order they ran
  double compute_s = 0;              // inside forward / backward computation
  double wait_s = 0;                 // in receives and in waiting for posted sends
  double elapsed_s = 0;              // from the step's start (after a barrier) to its last send
  double forward_s = 0, backward_s = 0;  // compute of the forwards / backwards (all chunks)
  std::vector<double> activation_send_bytes;  // Comm counter delta of each forward send
  std::vector<double> gradient_send_bytes;    // of each backward send
  double loss = 0;                 // last stage: Σ over micro-batches of loss_m / M (the mean)
  // With a tracking allocator: bytes allocated after each operation above those before the step
  // (the activations held between operations), and the mean that one forward adds.
  std::vector<std::int64_t> held_bytes_after_op;
  double bytes_per_forward = 0;
};

// Called around each operation's computation, outside its timing and before its send: what a
// data-parallel wrapper does per micro-batch (zero_flat.hpp: ZeRO-3's gathers and frees, ZeRO-2
// and 3's reduce-scatter after each backward when there is no pipeline to defer it to).
struct PpOpHooks {
  std::function<void(const PipelineOp&)> before, after;
};

class PpStage {
 public:
  // full: the single-process model; pp: the PP group (rank = stage). layers_per_stage: core's
  // stage_layers(L, P), each entry divisible by interleave, or P·v entries, every virtual
  // stage's (checked by the caller).
  PpStage(Gpt& full, Comm& pp, const std::vector<int>& layers_per_stage, int interleave);
  // The same on any StageModel (which must outlive the stage); own_parameters() is then empty.
  PpStage(StageModel& model, Comm& pp, const std::vector<int>& layers_per_stage, int interleave);

  // One step: runs `ops` (this stage's list from core's pipeline_schedule) on micro-batches
  // idx[m], targets[m] (idx, targets: (M, B, T) int64); the loss of micro-batch m is scaled by
  // 1/M, so the gradients are those of the mean loss. Gradients accumulate in the model (zero
  // them before). memory: the tracking allocator to read, or nullptr. hooks: or nullptr.
  PpStageRecord step(const std::vector<PipelineOp>& ops, const torch::Tensor& idx,
                     const torch::Tensor& targets, const TrackingAllocatorScope* memory,
                     const PpOpHooks* hooks = nullptr);
  // Stages 0 and P − 1 add each other's gradient of the tied embedding (nothing when P = 1).
  void reduce_tied_embedding();

  // The names (Gpt's named_parameters()) of the parameters this stage uses (the Gpt constructor).
  std::vector<std::string> own_parameters() const;
  // The model's layers this stage runs (all its chunks), in increasing order.
  std::vector<int> own_layers() const;
  bool first() const { return pp_.rank() == 0; }
  bool last() const { return pp_.rank() == pp_.world_size() - 1; }

 private:
  struct Saved {
    torch::Tensor input;   // received activation (a leaf requiring grad); undefined on virtual 0
    torch::Tensor output;  // block output, or the scaled loss on the last virtual stage
  };
  int virtual_stage(int chunk) const { return chunk * pp_.world_size() + pp_.rank(); }
  int tag(int sender_virtual, int micro_batch, bool backward, int M) const;
  torch::Tensor run_blocks(int virtual_stage, torch::Tensor x);
  void lay_out(const std::vector<int>& layers_per_stage);  // fills first_layer_

  std::unique_ptr<GptStageModel> owned_;  // the Gpt constructor's
  Gpt* full_ = nullptr;                   // the same (own_parameters' names)
  StageModel& model_;
  Comm& pp_;
  int v_;
  std::vector<int> first_layer_;  // per virtual stage, and one past the end
};

}  // namespace tally::engine
