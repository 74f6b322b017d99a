// One rank's training state in `tally run checkpoint` (internal: torch): the data set, the MLP,
// Adam, the schedule, the sample stream, and the steps, saves and loads the run is made of
// (tally/engine/experiments/checkpoint.hpp describes the run; checkpoint.cpp drives it).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ddp_torch.hpp"
#include "mlp.hpp"
#include "optimizer_torch.hpp"
#include "sharded_checkpoint.hpp"
#include "tally/engine/experiments/checkpoint.hpp"
#include "tally/engine/lr_schedule.hpp"
#include "tally/engine/sample_stream.hpp"

namespace tally::engine::checkpoint_run {

namespace fs = std::filesystem;

// The checkpoint's groups: the parameters and Adam's moments, flat F32 (checkpoint.hpp "save").
inline const std::vector<std::string> kGroups = {"params", "adam.m", "adam.v"};

// "<dir>" without a trailing separator, so <dir>.ranks names a sibling.
fs::path normalized(const fs::path& dir);
at::Tensor flat_params(const std::vector<at::Tensor>& params);  // detached, concatenated

// n synthetic samples: x ~ N(0, 1), label = argmax of a fixed random linear teacher, from a
// generator of its own (seeded from `seed`, not the model's).
struct Dataset {
  at::Tensor x;  // [n, widths[0]] float32
  at::Tensor y;  // [n] int64 class labels
};
Dataset make_dataset(const CheckpointRunOptions& o);

struct Trainer {
  const CheckpointRunOptions& o;
  int k = 1, r = 0;
  fs::path dir;
  mlp::Mlp model;
  std::vector<at::Tensor> params;
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> layout;  // name, shape
  std::int64_t n_params = 0;
  WarmupCosineSchedule schedule;
  Adam adam;  // torch.optim.Adam's defaults; the learning rate is the schedule's
  Dataset data;
  SampleStream stream;
  std::int64_t step = 0;      // optimizer steps completed
  std::int64_t consumed = 0;  // position in the sample stream

  Trainer(const CheckpointRunOptions& options, int world_size, int rank);

  std::vector<std::int64_t> batch_indices(std::int64_t position);

  std::vector<FlatGroupData> groups() const;

  io::CheckpointIndex state_index() const;

  // The checkpoint must be of this model and this run's configuration: the same tensors, seed and
  // schedule. Anything else would silently change the experiment.
  void check_compatible(const io::CheckpointIndex& x) const;

  // Loads dir's checkpoint into params, m, v, the generator, step and consumed. nullopt: none.
  std::optional<LoadOutcome> load(Comm& comm);

  // One optimizer step over o.grad_accum micro-batches; `mid_step` runs after the first forward
  // pass (fault injection).
  StepRecord take_step(DistributedDataParallel& ddp, Comm& comm,
                       const std::vector<std::int64_t>& batch, const std::function<void()>& mid_step);

  // This replica's reference-batch loss and gradient norm (Note [consistency check]); touches
  // neither .grad nor DDP.
  std::pair<double, double> reference_loss_and_grad_norm();

  // The test hook: flips one bit of this replica's first weight.
  void perturb_weights();

  bool is_save_step(std::int64_t s) const;

  // ①②③ right after the save of the current state.
  RoundTrip roundtrip(Comm& comm);
};

}  // namespace tally::engine::checkpoint_run
