// The planner is tally's hot path (issue 5). Goals: >= 1e6 layouts costed per second per core, and
// the full GPT-3 175B search on 3072 A100-80GB at global batch 1536 and the Llama 3 405B search on
// 16,384 H100 at global batch 2048, T 8192 (issue 10) each in under one second, and DeepSeek-V3 on
// 1024 H100 in fp8 with EP and expert TP (issue 15) well under it.
// Run: ./build/bench/bench_planner --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// Counters: layouts/s = layouts costed in full per second (one thread = one core); costed and
// covered = layouts costed, and costed + skipped by an exact bound, per search.
#include <benchmark/benchmark.h>

#include "tally/core/planner.hpp"
#include "tally/core/presets.hpp"

namespace {

using namespace tally;

PlanRequest gpt3_request() {
  return PlanRequest{.model = *model_preset("gpt3-175b"), .cluster = *cluster_preset("a100-80g"),
                     .gpus = 3072, .global_batch = 1536, .seq = 2048};
}

// Correctness in the same run (STYLE.md habit 9): the search must find a feasible plan whose
// layout uses every GPU and holds the global batch.
bool sane(const PlanResult& r) {
  if (!r.feasible()) return false;
  const Layout& l = r.best.front().layout;
  return std::int64_t(l.dp) * l.tp * l.pp * l.cp == r.request.gpus &&
         std::int64_t(l.dp) * l.micro_batch * l.grad_accum == r.request.global_batch &&
         r.best.front().fits;
}

void run(benchmark::State& state, const PlanRequest& req, bool prune) {
  std::uint64_t costed = 0, covered = 0;
  for (auto _ : state) {
    const PlanResult r = plan(req, SearchSpace{.prune = prune});
    if (!sane(r)) {
      state.SkipWithError("search returned no valid plan");
      return;
    }
    costed += r.evaluated;
    covered += r.evaluated + r.pruned;
    benchmark::DoNotOptimize(r.best.front().step_s);
  }
  state.counters["layouts/s"] = benchmark::Counter(double(costed), benchmark::Counter::kIsRate);
  state.counters["costed"] = benchmark::Counter(double(costed) / double(state.iterations()));
  state.counters["covered"] = benchmark::Counter(double(covered) / double(state.iterations()));
}

// Exhaustive: every layout costed in full — the evaluation rate.
void BM_Gpt3_3072_Exhaustive(benchmark::State& s) { run(s, gpt3_request(), false); }
// The product's search (exact pruning): the wall time a user waits.
void BM_Gpt3_3072_Pruned(benchmark::State& s) { run(s, gpt3_request(), true); }
// The default scenario (README's first command): the seed's 7B on 8 × A100-80GB.
void BM_Seed7B_8Gpus(benchmark::State& s) {
  run(s, PlanRequest{.model = *model_preset("seed-7b"), .cluster = *cluster_preset("a100-80g"),
                     .gpus = 8, .global_batch = 256, .seq = 2048},
      true);
}

// Llama 3 405B's scale (Dubey et al. 2024: 16,384 H100, global batch 2048 sequences of 8192).
void BM_Llama3_405B_16384_Pruned(benchmark::State& s) {
  run(s, PlanRequest{.model = *model_preset("llama-3.1-405b"), .cluster = *cluster_preset("h100-80g"), .gpus = 16384,
                     .global_batch = 2048, .seq = 8192},
      true);
}

// A mixture of experts in fp8 (README's DeepSeek-V3 command): the search adds EP and expert TP
// (e_t ∈ {1, tp}) to every layout; a user waits for it, so it too stays well under one second.
void BM_DeepSeekV3_1024_Fp8_Pruned(benchmark::State& s) {
  run(s, PlanRequest{.model = *model_preset("deepseek-v3"), .cluster = *cluster_preset("h100-80g"),
                     .gpus = 1024, .global_batch = 8192, .seq = 4096,
                     .precision = Precision::fp8},
      true);
}

BENCHMARK(BM_Gpt3_3072_Exhaustive)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_DeepSeekV3_1024_Fp8_Pruned)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Llama3_405B_16384_Pruned)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Gpt3_3072_Pruned)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Seed7B_8Gpus)->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
