// `tally run ddp-check`: the seed's ddp_check.py in C++ (one rank of it; start k ranks with
// `tally launch --nproc k -- tally run ddp-check`). Proves that data-parallel training is the
// full-batch computation split over ranks:
//
//   model  nn.Sequential(Linear(16, 32), ReLU, Linear(32, 4)) after manual_seed(1234), float32
//   data   manual_seed(7); X = randn(64, 16), y = randint(0, 4, (64,)); rank r takes rows r, r+k, …
//   ①  max|g_ddp − g_full| < 1e-5, g_full from one process on the whole batch
//   ②  after one SGD step (lr 0.1) every rank's parameters equal rank 0's (atol 0)
//   ③  world size, this rank's loss and gradient norm are printed
//   ④  a hand-written all_reduce(g)/k of one parameter's local gradient equals DDP's .grad (< 1e-6)
//   ⑤  Gloo on the CPU (the seed's no-GPU pass condition)
#pragma once

#include <string>
#include <vector>

#include "tally/engine/comm.hpp"
#include "tally/engine/ddp.hpp"
#include "tally/engine/dist_env.hpp"

namespace tally::engine {

struct DdpCheckOptions {
  double timeout_s = 60;                // rendezvous and every collective
  double bucket_cap_bytes = kDdpBucketBytes;  // DDP bucket size
  bool include_gradients = false;       // fill initial_parameters and averaged_gradients
  void validate() const;                // throws InvalidInput naming the flag and value
};

struct DdpCheckResult {
  int rank = 0;
  int world_size = 1;
  int samples = 0;  // this rank's rows of X

  // ③
  double local_loss = 0;        // cross-entropy (mean) on this rank's rows
  double full_batch_loss = 0;   // on all 64 rows, one process
  double local_grad_norm = 0;   // ‖g‖₂ of this rank's own gradient, before averaging
  double ddp_grad_norm = 0;     // ‖g‖₂ after DDP's average (equal on every rank)
  // ①
  double max_grad_error = 0;    // max|g_ddp − g_full| over all parameters
  double grad_tolerance = 1e-5;
  // ②
  double max_param_diff_vs_rank0 = 0;  // after one SGD step, vs rank 0's broadcast parameters
  // ④
  std::string manual_param;            // which parameter, torch's name ("2.weight")
  double manual_all_reduce_error = 0;  // max|all_reduce(g_local)/k − g_ddp|
  double manual_tolerance = 1e-6;

  DdpStats ddp;                 // one sync event, buckets × 1 all-reduce calls
  std::size_t buckets = 0;
  CommCounters comm;            // everything this rank sent (broadcasts and checks included)
  std::vector<std::string> parameter_names;
  std::vector<double> initial_parameters;  // flat, after the broadcast; with include_gradients
  std::vector<double> averaged_gradients;  // flat, parameter order; with include_gradients

  bool grads_ok() const { return max_grad_error < grad_tolerance; }
  bool params_ok() const { return max_param_diff_vs_rank0 == 0; }
  bool manual_ok() const { return manual_all_reduce_error < manual_tolerance; }
  bool ok() const { return grads_ok() && params_ok() && manual_ok(); }
};

// Throws InvalidInput for bad env / options, CommError when the group fails.
DdpCheckResult run_ddp_check(const DistEnv& env, const DdpCheckOptions& options = {});

}  // namespace tally::engine
