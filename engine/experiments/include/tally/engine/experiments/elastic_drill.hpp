// `tally run fault-drill --elastic`: the seed's elastic recovery (方案 4 ③ 弹性: lose a machine,
// continue on the remaining ones from the last checkpoint) as a drill with its consistency
// evidence. Legend: N = hosts before the loss, K = ranks per host, B = global batch (samples per
// optimizer step), a = gradient-accumulation micro-batches per rank, c = the step of the last
// checkpoint before the loss.
//
// A "host" is one launcher's group of K ranks (engine::launch with torchrun's numbering: host i
// holds ranks i·K … i·K + K − 1). Either this process plays every host — N launchers on this
// machine, meeting over loopback — or, with node_rank ≥ 0, only host node_rank: then every host
// runs the same drill with its own node rank and a work directory they all see (a shared mount),
// as `tally launch --nnodes` is run on each host.
//
// The sequence (each step one sub-run of `tally run checkpoint`, checkpoint.hpp):
//   reference  N hosts, N·K ranks, a = N − 1, `steps` steps straight, saving every `save_every`,
//              the replicas compared every `consistency_every` steps (Note [consistency check]);
//   loss       the same run in a fresh directory, but every rank of the last host (N − 1)
//              SIGKILLs itself after the forward pass of step kill_at_step — the host is gone.
//              Every launcher must exit 1 naming a rank of that host; the last checkpoint (step
//              c) must verify;
//   resume     the remaining N − 1 hosts relaunch with --resume at world size (N − 1)·K and
//              a = N: the same B = (N·K)·(N − 1)·micro = ((N − 1)·K)·N·micro, the same micro-batch.
//              The checkpoint saved by N·K ranks is resharded onto (N − 1)·K (checkpoint.hpp ⑤).
// Evidence, each figure beside the uninterrupted run's:
//   - the resumed run starts at step c with consumed_samples equal to the reference's after step
//     c, from a checkpoint saved at world size N·K (exact);
//   - every later step's consumed_samples equals the reference's (exact), and its loss and
//     gradient norm agree within `tolerance` (relative): the weights loaded are the reference's
//     bits, but the gradient of the same global batch is now summed in another order (other
//     micro-batch and rank partial sums), so float32 rounding differs by a few ulp per step and
//     Adam carries it on — equality to the bit is not the claim, equality to rounding is;
//   - every consistency check of both runs agrees bit for bit across the ranks.
// The verdict (ok) needs all of them.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "tally/engine/experiments/fault_drill.hpp"

namespace tally::engine {

struct ElasticDrillOptions {
  std::string tally_binary;           // the executable the ranks run; empty = this process's
  int nnodes = 2;                     // N, [2, 4]
  int nproc_per_node = 2;             // K, [1, 4]
  int node_rank = -1;                 // -1: play every host here; i: only host i
  std::string master_addr = "127.0.0.1";  // host 0, as every host reaches it
  int master_port = 0;                // sub-run j uses port + 2j and + 2j + 1; 0: free (node_rank -1)
  std::int64_t steps = 8;
  std::int64_t save_every = 4;
  std::int64_t kill_at_step = 6;      // the last host dies mid-step here; after the first save
  std::int64_t consistency_every = 2; // the sub-runs' --consistency-every
  double tolerance = 1e-5;            // relative, loss and grad-norm after the resume
  double collective_timeout_s = 5;    // each rank's rendezvous and collectives
  double launch_timeout_s = 60;       // each sub-run as a whole
  double join_timeout_s = 60;         // hosts' launchers meeting (node_rank ≥ 0)
  std::filesystem::path work_dir;     // empty = a fresh temporary one (node_rank -1 only)
  bool keep_work_dir = false;
  // Throws InvalidInput naming the flag, the value and the allowed range.
  void validate() const;
  int world_before() const { return nnodes * nproc_per_node; }
  int world_after() const { return (nnodes - 1) * nproc_per_node; }
  std::int64_t accum_before() const { return nnodes - 1; }
  std::int64_t accum_after() const { return nnodes; }
};

// One step after the resume, beside the uninterrupted run's.
struct ElasticStep {
  std::int64_t step = 0;
  std::int64_t consumed_samples = 0, reference_consumed_samples = -1;
  double loss = 0, reference_loss = 0;
  double grad_norm = 0, reference_grad_norm = 0;
  double loss_rel_diff() const;       // |x − ref| / |ref|
  double grad_norm_rel_diff() const;
};

struct ElasticDrillResult {
  ElasticDrillOptions options;
  std::filesystem::path work_dir;
  std::vector<int> hosts_here;        // the hosts this process played
  std::int64_t global_batch = 0;
  // per host played here, by position in hosts_here
  std::vector<DrillLaunch> reference, loss;
  DrillLaunch resume;                 // host 0's when played here, else this host's
  std::vector<int> lost_ranks;        // the last host's
  // the loss (host 0's view)
  bool loss_named = false;            // host 0's launcher named a rank of the lost host
  double kill_unix_s = 0;             // the lost host's first fault event (when played here)
  double loss_to_exit_s = -1;         // the kill → host 0's launcher returned (when both here)
  bool checkpoint_verifies = false;
  std::int64_t checkpoint_step = -1, checkpoint_world_size = 0;
  // the resume (rank 0's), beside the reference
  double restart_s = 0;               // relaunch → checkpoint loaded
  int resumed_world_size = 0, loaded_world_size = 0;
  std::int64_t resume_step = -1, reference_step = -1;
  std::int64_t resume_consumed = -1, reference_consumed = -1;
  std::vector<ElasticStep> steps;
  std::int64_t final_step = -1;
  // Note [consistency check], both runs
  int reference_checks = 0, resume_checks = 0;
  bool checks_agree = false;
  std::vector<int> leftover_pids;
  bool work_dir_removed = false;

  double max_loss_rel_diff() const;
  double max_grad_norm_rel_diff() const;
  bool host0_here() const;
  bool ok() const;  // for host 0 the whole verdict; for another host, its part went as planned
};

// Runs this process's hosts of the drill. Throws InvalidInput for bad options, std::runtime_error
// when a sub-run cannot be started or the reference run fails.
ElasticDrillResult run_elastic_drill(const ElasticDrillOptions& options);

}  // namespace tally::engine
