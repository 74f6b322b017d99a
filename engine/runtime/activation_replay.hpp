// Tensors of a forward pass that are freed after it and recomputed just before the backward that
// reads them: the mechanism behind the selective recompute policies of TpGpt (tp_model.hpp, Note
// [selective recompute policies]). Internal: torch types.
//
// Note [replayed activations]
// Autograd keeps what each operation saved until that operation's backward runs. A selective
// policy keeps some of those tensors and recomputes the rest from the kept ones — PyTorch's
// selective checkpointing (torch.utils.checkpoint with a policy) does it with saved-tensor hooks,
// which libtorch's C++ API does not expose. Here the forward runs as usual, and each tensor the
// policy does not keep (the target: a whole, dense tensor of its own storage, e.g. a
// LayerNorm's output) is then
//   freed     its storage resized to zero bytes (zero_strategy.hpp free_storage, as ZeRO-3 frees
//             its gathered parameters: Note [gather and free]) at the end of the block's forward,
//             so the operations that saved it hold a shape and no memory;
//   restored  by a hook on the gradient of the saving operation's output (Tensor::register_hook:
//             it runs before that operation's backward reads what it saved): the storage regrown
//             and refilled, under no_grad, by the entry's recompute function from tensors the
//             graph keeps, written through a tensor of its own version counter (regrow_storage),
//             so autograd does not see the saved tensor modified.
// The recompute functions capture detached handles only (a handle carrying its grad_fn would make
// a cycle node → hook → tensor → node, which would never be freed), and an entry drops them once
// it has restored its target: what stays alive between forward and backward is exactly the kept
// set. No collective runs in a recompute unless its function issues one. Without autograd (a
// no_grad forward, e.g. full recompute's own forward) nothing is added and nothing freed.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <memory>
#include <vector>

namespace tally::engine {

class ActivationReplay {
 public:
  // Active iff autograd records the forward (GradMode) at construction.
  ActivationReplay();
  bool active() const { return active_; }

  // Registers `target` (dense, from its storage's start, covering it) to be freed by release()
  // and recomputed by `recompute` (its values, same shape, from detached handles). Returns the
  // entry's index; -1 when inactive.
  int add(const at::Tensor& target, std::function<at::Tensor()> recompute);
  // Before the backward of the operation that produced `output`, restores `entries` in order
  // (an entry already restored is skipped; -1 entries are ignored).
  void before_backward(const at::Tensor& output, const std::vector<int>& entries);
  // Frees every entry's storage: call once the forward no longer reads them.
  void release();

 private:
  struct Entry {
    at::Tensor target;                    // detached handle on the freed storage
    std::function<at::Tensor()> recompute;
  };
  static void restore(Entry& e);
  bool active_;
  std::vector<std::shared_ptr<Entry>> entries_;
};

}  // namespace tally::engine
