// The engine's optimizers, torch-free half: Adam's options (the class is engine/runtime/
// optimizer_torch.hpp, internal). One Adam serves every caller — DDP training, the ZeRO strategies
// (on a flat shard), the checkpoint run (at a scheduled learning rate) and the GPT memory profile.
#pragma once

namespace tally::engine {

// torch.optim.Adam's hyper-parameters and defaults (amsgrad = false, weight_decay = 0).
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  void validate() const;  // throws InvalidInput naming the field and value
};

}  // namespace tally::engine
