// `tally run fault-drill --elastic` (tally/engine/experiments/elastic_drill.hpp): the hosts'
// launchers of each sub-run (threads of this process, or this host's alone), their JSON lines
// read back, the checkpoint inspected with io, the resumed steps set beside the reference's.
#include "tally/engine/experiments/elastic_drill.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

#include "drill_driver.hpp"
#include "tally/core/types.hpp"
#include "tally/engine/experiments/checkpoint.hpp"
#include "tally/engine/temp_directory.hpp"
#include "tally/io/checkpoint.hpp"
#include "run_helpers.hpp"

namespace tally::engine {

namespace fs = std::filesystem;
using drill::Driver;
using drill::kDrillGlobalBatch;
using drill::SubRun;
using drill::Topology;
using nlohmann::json;

namespace {



// Rank 0's result event of a sub-run, or nullptr.
const json* result_of(const SubRun& s) { return s.find(0, "result"); }

// Runs this process's hosts of each sub-run (drill::run_hosts).
class ElasticRunner {
 public:
  ElasticRunner(const ElasticDrillOptions& o, const fs::path& work)
      : o_(o),
        driver_({.tally_binary = o.tally_binary,
                 .collective_timeout_s = o.collective_timeout_s,
                 .launch_timeout_s = o.launch_timeout_s,
                 .steps = o.steps,
                 .save_every = o.save_every},
                work) {}

  // Sub-run `index` on `nnodes` hosts, returned in the order of `hosts`.
  std::vector<SubRun> run(int index, const std::string& what, const fs::path& dir,
                          const std::vector<std::string>& extra, int nnodes,
                          const std::vector<int>& hosts) {
    return drill::run_hosts(driver_, index, what, dir, extra,
                            Topology{.nnodes = nnodes,
                                     .nproc = o_.nproc_per_node,
                                     .master_addr = o_.master_addr,
                                     .master_port = o_.master_port,
                                     .join_timeout_s = o_.join_timeout_s},
                            hosts);
  }

 private:
  const ElasticDrillOptions& o_;
  Driver driver_;
};

std::vector<int> in_range(const std::vector<int>& hosts, int end) {
  std::vector<int> out;
  for (int h : hosts)
    if (h < end) out.push_back(h);
  return out;
}

// The host-0 SubRun of `runs` (played for `hosts`), or nullptr.
const SubRun* host0(const std::vector<SubRun>& runs, const std::vector<int>& hosts) {
  for (std::size_t i = 0; i < hosts.size(); ++i)
    if (hosts[i] == 0) return &runs[i];
  return nullptr;
}

bool checks_all_agree(const json& result, int* count) {
  *count = 0;
  bool agree = true;
  for (const json& c : result.value("consistency_checks", json::array())) {
    *count += 1;
    agree = agree && c["disagreeing_ranks"].empty();
  }
  return agree;
}

}  // namespace

double ElasticStep::loss_rel_diff() const { return rel_diff(loss, reference_loss); }
double ElasticStep::grad_norm_rel_diff() const { return rel_diff(grad_norm, reference_grad_norm); }

double ElasticDrillResult::max_loss_rel_diff() const {
  double m = 0;
  for (const ElasticStep& s : steps) m = std::max(m, s.loss_rel_diff());
  return m;
}

double ElasticDrillResult::max_grad_norm_rel_diff() const {
  double m = 0;
  for (const ElasticStep& s : steps) m = std::max(m, s.grad_norm_rel_diff());
  return m;
}

bool ElasticDrillResult::host0_here() const {
  return std::find(hosts_here.begin(), hosts_here.end(), 0) != hosts_here.end();
}

bool ElasticDrillResult::ok() const {
  const ElasticDrillOptions& o = options;
  bool all = leftover_pids.empty();
  for (const DrillLaunch& l : reference) all = all && l.exit_code == 0;
  for (const DrillLaunch& l : loss) all = all && l.exit_code == 1;
  if (!host0_here()) {  // the lost host (or another survivor): its part went as planned
    const bool lost_here = std::find(hosts_here.begin(), hosts_here.end(), o.nnodes - 1) !=
                           hosts_here.end();
    const bool survivor_here = std::any_of(hosts_here.begin(), hosts_here.end(),
                                           [&](int h) { return h < o.nnodes - 1; });
    return all && (!lost_here || kill_unix_s > 0) && (!survivor_here || resume.exit_code == 0);
  }
  const std::int64_t c = (o.kill_at_step - 1) / o.save_every * o.save_every;
  const bool numbers_equal = !steps.empty() && std::int64_t(steps.size()) == o.steps - c &&
                             std::all_of(steps.begin(), steps.end(), [&](const ElasticStep& s) {
                               return s.consumed_samples == s.reference_consumed_samples &&
                                      s.loss_rel_diff() <= o.tolerance &&
                                      s.grad_norm_rel_diff() <= o.tolerance;
                             });
  return all && loss_named && checkpoint_verifies && checkpoint_step == c &&
         checkpoint_world_size == o.world_before() && resume.exit_code == 0 &&
         loaded_world_size == o.world_before() && resumed_world_size == o.world_after() &&
         resume_step == c && reference_step == c && resume_consumed == reference_consumed &&
         resume_consumed == c * global_batch && numbers_equal && final_step == o.steps &&
         checks_agree;
}

void ElasticDrillOptions::validate() const {
  const auto bad = [](const std::string& flag, const std::string& value, const std::string& rule) {
    throw InvalidInput(flag + " = " + value + ": " + rule);
  };
  const auto i = [](std::int64_t v) { return std::to_string(v); };
  if (nnodes < 2 || nnodes > 4) bad("--nnodes", i(nnodes), "must be in [2, 4] (hosts before the loss)");
  if (nproc_per_node < 1 || nproc_per_node > 4)
    bad("--nproc-per-node", i(nproc_per_node), "must be in [1, 4]");
  if (kDrillGlobalBatch % (std::int64_t(nnodes) * (nnodes - 1) * nproc_per_node) != 0)
    bad("--nproc-per-node", i(nproc_per_node),
        "--nnodes × (--nnodes − 1) × --nproc-per-node = " +
            i(std::int64_t(nnodes) * (nnodes - 1) * nproc_per_node) + " must divide the batch of " +
            i(kDrillGlobalBatch) + " (micro-batches of one size before and after the loss)");
  drill::validate_hosts_and_schedule(*this);
  if (consistency_every < 0 || consistency_every > steps)
    bad("--consistency-every", i(consistency_every),
        "must be in [0, --steps = " + i(steps) + "] (0 = never)");
  if (!(tolerance >= 0 && tolerance < 1)) bad("--tolerance", format_number(tolerance), "must be in [0, 1)");
}

ElasticDrillResult run_elastic_drill(const ElasticDrillOptions& options) {
  options.validate();
  ElasticDrillResult res;
  res.options = options;
  ElasticDrillOptions& o = res.options;
  if (o.tally_binary.empty()) o.tally_binary = fs::read_symlink("/proc/self/exe").string();
  res.global_batch = kDrillGlobalBatch;
  for (int h = 0; h < o.nnodes; ++h)
    if (o.node_rank < 0 || o.node_rank == h) res.hosts_here.push_back(h);
  WorkDirectory work_dir(o.work_dir, "tally-elastic-drill", o.keep_work_dir);
  o.work_dir = res.work_dir = work_dir.path();
  const fs::path work = o.work_dir;
  const int N = o.nnodes, K = o.nproc_per_node;
  for (int q = (N - 1) * K; q < N * K; ++q) res.lost_ranks.push_back(q);
  const auto common = [&](std::int64_t accum) {
    return std::vector<std::string>{"--grad-accum", std::to_string(accum), "--consistency-every",
                                    std::to_string(o.consistency_every)};
  };

  {
    ElasticRunner runner(o, work);
    // 1. The uninterrupted reference at N·K ranks.
    const std::vector<SubRun> ref =
        runner.run(0, "reference (uninterrupted, " + std::to_string(N) + " hosts)",
                   work / "ckpt-reference", common(o.accum_before()), N, res.hosts_here);
    for (const SubRun& s : ref) res.reference.push_back(s.launch);
    std::map<std::int64_t, json> ref_steps;
    const SubRun* ref0 = host0(ref, res.hosts_here);
    if (ref0 != nullptr) {
      const json* result = result_of(*ref0);
      if (ref0->launch.exit_code != 0 || result == nullptr)
        throw std::runtime_error("fault-drill --elastic: the uninterrupted reference run failed: " +
                                 ref0->launch.message + " " + ref0->error_line(0));
      for (const json& s : (*result)["steps"]) ref_steps[s["step"].get<std::int64_t>()] = s;
      res.checks_agree = checks_all_agree(*result, &res.reference_checks);
    }

    // 2. The loss of the last host: all its ranks die mid-step.
    std::vector<std::string> kill = common(o.accum_before());
    for (const std::string& a :
         {std::string("--kill-rank"), std::to_string((N - 1) * K), std::string("--kill-count"),
          std::to_string(K), std::string("--kill-at-step"), std::to_string(o.kill_at_step),
          std::string("--kill-phase"), std::string("mid-step")})
      kill.push_back(a);
    const fs::path dir = work / "ckpt-elastic";
    const std::vector<SubRun> lost =
        runner.run(1, "lose host " + std::to_string(N - 1) + " (" +
                          (K == 1 ? "rank " + std::to_string(N - 1)
                                  : "ranks " + std::to_string((N - 1) * K) + "–" +
                                        std::to_string(N * K - 1)) +
                          ") mid-step at step " + std::to_string(o.kill_at_step),
                   dir, kill, N, res.hosts_here);
    for (std::size_t i = 0; i < lost.size(); ++i) {
      res.loss.push_back(lost[i].launch);
      for (int q : res.lost_ranks)
        if (const json* e = lost[i].find(q, "fault_injected")) {
          const double t = (*e)["unix_s"].get<double>();
          res.kill_unix_s = res.kill_unix_s > 0 ? std::min(res.kill_unix_s, t) : t;
        }
    }
    if (const SubRun* l0 = host0(lost, res.hosts_here)) {
      // Host 0's launcher names a rank of the lost host (read from the launchers' store), or
      // host 0's own rank failed first, its CommError naming only ranks of the lost host.
      bool named = l0->launch.message.find("on node " + std::to_string(N - 1) + " (host") !=
                   std::string::npos;
      for (int q = 0; q < K && !named; ++q)
        if (const json* e = l0->find(q, "comm_failure")) {
          const auto ranks = (*e)["lost_ranks"].get<std::vector<int>>();
          named = !ranks.empty() && std::all_of(ranks.begin(), ranks.end(), [&](int x) {
            return x >= (N - 1) * K;
          });
        }
      res.loss_named = l0->launch.exit_code == 1 && named;
      if (res.kill_unix_s > 0) res.loss_to_exit_s = l0->launch.end_unix_s - res.kill_unix_s;
      try {
        const io::CheckpointIndex x = io::verify_checkpoint(dir);
        res.checkpoint_step = x.step;
        res.checkpoint_world_size = x.world_size;
        res.checkpoint_verifies = true;
      } catch (const InvalidInput&) {
      }
    }

    // 3. The remaining hosts resume at (N − 1)·K ranks with accumulation N: the same batch.
    const std::vector<int> survivors = in_range(res.hosts_here, N - 1);
    if (!survivors.empty()) {
      std::vector<std::string> resume = common(o.accum_after());
      resume.push_back("--resume");
      const std::vector<SubRun> again =
          runner.run(2, "resume on " + std::to_string(N - 1) + " host(s) at world size " +
                            std::to_string(o.world_after()),
                     dir, resume, N - 1, survivors);
      const SubRun* a0 = host0(again, survivors);
      res.resume = (a0 != nullptr ? *a0 : again.front()).launch;
      if (a0 != nullptr) {
        const json* started = a0->find(0, "started");
        const json* result = result_of(*a0);
        if (started != nullptr && result != nullptr && (*started)["resumed"].get<bool>()) {
          res.restart_s = (*started)["unix_s"].get<double>() - res.resume.start_unix_s;
          res.loaded_world_size = (*started)["loaded_world_size"];
          res.resumed_world_size = (*result)["world_size"];
          res.resume_step = (*started)["step"];
          res.resume_consumed = (*started)["consumed_samples"];
          res.reference_step = res.resume_step;
          if (auto it = ref_steps.find(res.resume_step); it != ref_steps.end())
            res.reference_consumed = it->second["consumed_samples"];
          for (const json& s : (*result)["steps"]) {
            ElasticStep e{.step = s["step"],
                          .consumed_samples = s["consumed_samples"],
                          .loss = s["loss"],
                          .grad_norm = s["grad_norm"]};
            if (auto it = ref_steps.find(e.step); it != ref_steps.end()) {
              e.reference_consumed_samples = it->second["consumed_samples"];
              e.reference_loss = it->second["loss"];
              e.reference_grad_norm = it->second["grad_norm"];
            }
            res.steps.push_back(e);
          }
          res.final_step = (*result)["final_step"];
          res.checks_agree = checks_all_agree(*result, &res.resume_checks) && res.checks_agree &&
                             res.reference_checks > 0 && res.resume_checks > 0;
        }
      }
    }
    if (res.host0_here() || o.node_rank < 0)
      res.leftover_pids = drill::processes_mentioning(work / "ckpt-");
  }
  res.work_dir_removed = work_dir.remove();
  return res;
}

}  // namespace tally::engine
