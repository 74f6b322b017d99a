// `tally plan` (the main job) and `tally compare`: search every layout, print the plan in the
// seed's shape — plan, accounts (账), reasons (理由), failure criteria (失败判据), validation plan
// (验证计划), reliability — then the alternatives.
#include <fmt/core.h>

#include <chrono>
#include <memory>
#include <optional>

#include "commands.hpp"
#include "common.hpp"
#include "html_pages.hpp"
#include "html_report.hpp"
#include "plan_report.hpp"
#include "tally/core/hardware.hpp"
#include "tally/core/pipeline.hpp"
#include "tally/core/planner.hpp"
#include "tally/core/presets.hpp"

namespace tally::cli {

namespace {

struct PlanOptions {
  OutputOptions out;
  ModelOptions model{.model = std::string(kDefaultModel)};
  ClusterOptions cluster;
  int gpus = 8, top = 5, max_tp = 0, max_pp = 0, max_cp = 0, max_ep = 0;
  double capacity_factor = 1;
  int max_route_nodes = 0;
  int amax_history = kTeAmaxHistory;
  LoraOptions lora;                              // plan --method lora|qlora
  std::string loss = "fused";
  std::string kernels = "fused";
  std::string grad_accumulation = "fused";
  std::string flash_kernel = "fa2";
  std::vector<std::string> recompute_policies;  // unset: all of them
  std::vector<std::string> recompute_modules;   // Megatron-Core's: mla_up_proj, mlp
  std::vector<int> pp_layers;                    // compare: layers per stage; unset: the planner's
  std::int64_t global_batch = 256, seq = 2048;
  std::string precision = "bf16", optimizer = "adam", attention = "flash";
  std::optional<std::string> time_model;  // unset: operators, or utilisation if --utilisation
  MemoryBudgetOptions memory;
  double restart_minutes = 8;
  // Unset: the cluster preset's / the core's default (Note [numbers on the command line]).
  double overlap_slowdown = kOverlapSlowdown;
  std::optional<double> failure_rate, write_bps, days, tokens, checkpoint_bytes, utilisation;
  bool no_overlap_dp = false, overlap_dp = false, no_overlap_param_gather = false,
       tp_overlap = false, no_tp_grad_overlap = false, pp_scatter_gather = false,
       ep_overlap = false, no_dropout = false,
       dropout = false, exhaustive = false,
       fsdp_float8_all_gather = false, fp8_param_gather = false;
  // compare
  std::vector<std::string> alternatives;
  std::optional<int> dp;  // unset: GPUs / (TP·PP·CP)
  int tp = 1, pp = 1, cp = 1, ep = 1, zero = 0, interleave = 1;
  std::optional<int> etp;          // compare: unset = --tp
  std::string etp_search = "any";  // plan: tp | 1 | any
  bool sp = false;
  std::int64_t micro_batch = 1;
  std::optional<std::int64_t> grad_accum;  // unset: B / (dp·b)
  std::string recompute = "none";
  std::optional<std::string> html;  // plan --html FILE
};

PlanRequest make_request(const PlanOptions& o) {
  PlanRequest r{.model = *resolve_model(o.model), .cluster = resolve_cluster(o.cluster),
                .gpus = o.gpus, .global_batch = o.global_batch, .seq = o.seq,
                .precision = precision_from(o.precision), .optimizer = optimizer_from(o.optimizer),
                .headroom = o.memory.headroom,
                .allocator_allowance = o.memory.allocator_allowance,
                .runtime_bytes = o.memory.runtime_mib * kMiB, .overlap_dp = !o.no_overlap_dp,
                .overlap_param_gather = !o.no_overlap_param_gather, .tp_overlap = o.tp_overlap,
                .tp_grad_overlap = !o.no_tp_grad_overlap,
                .pp_scatter_gather = o.pp_scatter_gather,
                .ep_overlap = o.ep_overlap, .overlap_slowdown = o.overlap_slowdown,
                .capacity_factor = o.capacity_factor, .max_route_nodes = o.max_route_nodes,
                .amax_history = o.amax_history,
                .fsdp_float8_all_gather = o.fsdp_float8_all_gather,
                .fp8_param_gather = o.fp8_param_gather,
                .loss = *parse_loss(o.loss), .kernels = *parse_kernels(o.kernels),
                .grad_accumulation = *parse_grad_accumulation(o.grad_accumulation),
                .flash_kernel = *parse_flash_kernel(o.flash_kernel),
                .restart_hours = o.restart_minutes / 60};
  if (o.no_dropout) r.dropout = false;
  if (o.dropout) r.dropout = true;
  r.recompute_modules = recompute_modules_from(o.recompute_modules);
  if (o.failure_rate) r.cluster.failure_rate_per_hour = *o.failure_rate;
  if (o.write_bps) r.cluster.checkpoint_write_bps = *o.write_bps;
  if (o.utilisation) r.cluster.mfu = *o.utilisation;
  // --utilisation names the seed's one-number model, so it selects it unless told otherwise.
  r.time_model = o.time_model ? *parse_time_model(*o.time_model)
                 : o.utilisation ? TimeModel::utilisation
                                 : TimeModel::operators;
  if (o.days) r.run_hours = *o.days * 24;
  if (o.tokens) r.run_tokens = *o.tokens;
  if (o.checkpoint_bytes) r.checkpoint_bytes = *o.checkpoint_bytes;
  return r;
}

// `tally plan --method lora|qlora`: core/finetune_plan.hpp.
void run_finetune_plan(const PlanOptions& o, const PlanRequest& req, const LoraSetup& setup,
                       const Answers& answers) {
  if (o.max_tp || o.max_pp || o.max_cp || o.max_ep || o.exhaustive || !o.recompute_policies.empty())
    throw InvalidInput("--method " + o.lora.method +
                       ": the fine-tuning plan is data parallel with or without gradient "
                       "checkpointing (no --max-tp/--max-pp/--max-cp/--max-ep/--exhaustive/"
                       "--recompute-policies)");
  const auto t0 = std::chrono::steady_clock::now();
  const FineTunePlan p = plan_finetune(req, setup, o.top);
  const double search_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const nlohmann::json j = finetune_plan_json(p, search_s);
  require_finite(j);  // Note [no inf or nan in output], for the text report too
  // The page first: an unwritable path fails before anything is printed.
  if (o.html) answers.page(*o.html, finetune_page(p, o.out.size_unit()));
  if (o.out.json)
    answers.json(j);
  else
    print_finetune_plan(p, search_s, o.out.size_unit());
}

void run_plan(const PlanOptions& o, const Answers& answers) {
  const PlanRequest req = make_request(o);
  if (const auto setup = lora_setup(o.lora, req.precision, req.optimizer)) {
    run_finetune_plan(o, req, *setup, answers);
    return;
  }
  SearchSpace space{.max_tp = o.max_tp, .max_pp = o.max_pp, .max_cp = o.max_cp,
                    .max_ep = o.max_ep,
                    .expert_tp = o.etp_search == "tp"  ? SearchSpace::ExpertTp::tp
                                 : o.etp_search == "1" ? SearchSpace::ExpertTp::one
                                                       : SearchSpace::ExpertTp::both,
                    .prune = !o.exhaustive, .top = o.top};
  if (o.html) space.max_points = kHtmlPlanPoints;  // Note [plan points]
  if (!o.recompute_policies.empty()) {
    space.recomputes.clear();
    for (const auto& name : o.recompute_policies) space.recomputes.push_back(recompute_from(name));
  }
  if (o.attention == "any") space.attentions = {Attention::flash, Attention::materialized};
  else space.attentions = {attention_from(o.attention)};
  const auto t0 = std::chrono::steady_clock::now();
  const PlanResult res = plan(req, space);
  const double search_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::vector<Suggestion> suggestions =
      res.feasible() ? std::vector<Suggestion>{} : suggest_changes(req, space);
  const nlohmann::json j = plan_json(res, search_s, suggestions);
  require_finite(j);  // Note [no inf or nan in output], for the text report too
  if (o.html) {  // the page first: an unwritable path fails before anything is printed
    const std::vector<Reason> reasons =
        res.feasible() ? explain_plan(req, res.best.front()) : std::vector<Reason>{};
    answers.page(*o.html, plan_page(res, reasons, suggestions, search_s, o.out.size_unit()));
  }
  if (o.out.json)
    answers.json(j);
  else
    print_plan(res, search_s, o.out.size_unit(), suggestions);
}

void run_compare(const PlanOptions& o, const Answers& answers) {
  const PlanRequest req = make_request(o);
  req.validate();  // a flag at odds with the others is bad input, not an invalid option: exit 2
  Layout base{.dp = o.dp.value_or(0), .tp = o.tp, .pp = o.pp, .cp = o.cp,
              .interleave = o.interleave, .ep = o.ep, .etp = o.etp.value_or(0), .sp = o.sp,
              .zero = o.zero, .micro_batch = o.micro_batch,
              .recompute = recompute_from(o.recompute), .attention = attention_from(o.attention)};
  if (!o.dp) {
    const std::int64_t mp = std::int64_t(o.tp) * o.pp * o.cp;
    if (req.gpus % mp != 0)
      throw InvalidInput("--tp × --pp × --cp = " + std::to_string(mp) + " must divide --gpus = " +
                         std::to_string(req.gpus));
    base.dp = int(req.gpus / mp);
  }
  if (!o.pp_layers.empty()) {  // any split: every stage's layers (core/pipeline.hpp)
    check_stage_list(o.pp_layers, int(req.model.layers), o.pp, o.interleave);
    base.stage_layer_list = std::make_shared<const std::vector<int>>(o.pp_layers);
  }
  if (o.grad_accum) {
    base.grad_accum = *o.grad_accum;
  } else {
    const std::int64_t per = std::int64_t(base.dp) * base.micro_batch;
    if (req.global_batch % per != 0)
      throw InvalidInput("--global-batch = " + std::to_string(req.global_batch) +
                         " is not a multiple of dp × --micro-batch = " + std::to_string(per));
    base.grad_accum = req.global_batch / per;
  }
  std::vector<Alternative> alts;
  for (const auto& a : o.alternatives) alts.push_back(*parse_alternative(a));
  if (alts.empty())
    alts = {Alternative::double_micro_batch, Alternative::recompute_double_seq,
            Alternative::double_gpus};
  const auto rows = compare_alternatives(req, base, alts);
  const nlohmann::json j = compare_json(rows);
  require_finite(j);  // Note [no inf or nan in output], for the text report too
  if (o.html) answers.page(*o.html, compare_page(rows, o.out.size_unit()));
  if (o.out.json)
    answers.json(j);
  else
    print_compare(rows, o.out.size_unit());
}

void add_request_flags(CLI::App* cmd, PlanOptions& o) {
  add_output_flags(cmd, o.out);
  add_model_flags(cmd, o.model);
  add_cluster_flags(cmd, o.cluster);
  cmd->add_option("--gpus", o.gpus, "GPUs G")->check(CLI::Range(1, 1 << 24))->capture_default_str();
  cmd->add_option("--global-batch", o.global_batch, "sequences per optimizer step B")
      ->check(CLI::Range(std::int64_t(1), kMaxGlobalBatch))
      ->capture_default_str();
  cmd->add_option("--seq", o.seq, "sequence length T")
      ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 24))
      ->capture_default_str();
  cmd->add_option("--precision", o.precision, kPrecisionHelp)
      ->check(one_of(precision_names()))
      ->capture_default_str();
  cmd->add_option("--optimizer", o.optimizer, "adam | adamw | adam-8bit | sgd | sgd-momentum")
      ->check(one_of(allowed_optimizers()))
      ->capture_default_str();
  add_recompute_modules_flag(cmd, o.recompute_modules);
  add_memory_budget_flags(cmd, o.memory);
  add_loss_flag(cmd, o.loss);
  cmd->add_option("--kernels", o.kernels,
                  "fused (each norm, rotary, activation one kernel: Megatron-LM, Transformer "
                  "Engine, torch.compile) | eager (uncompiled PyTorch as torchtitan's Llama: every "
                  "operator its own kernel through HBM) | local (Megatron-LM's own modules, "
                  "--transformer-impl local, all of Megatron-LM before Transformer Engine: fused, "
                  "plus each linear bias added and its gradient summed in kernels of their own and "
                  "materialised attention's context copied); the time model only")
      ->check(one_of(allowed_kernels()))
      ->capture_default_str();
  cmd->add_option("--grad-accumulation", o.grad_accumulation,
                  "fused (each micro-batch's weight-gradient GEMM adds into the gradient buffer: "
                  "Megatron-Core --gradient-accumulation-fusion) | autograd (PyTorch's "
                  "AccumulateGrad adds each later micro-batch's gradients in a kernel of its own, "
                  "3 x the gradient bytes: DDP under no_sync, FSDP; the time model only)")
      ->check(one_of(allowed_grad_accumulations()))
      ->capture_default_str();
  cmd->add_option("--flash-kernel", o.flash_kernel,
                  "fa2 (FlashAttention-2, PyTorch SDPA's flash backend) | cudnn (cuDNN's fused "
                  "attention, Transformer Engine's on Hopper and later: measured on one H200, "
                  "1.5-2x fa2's speed; Hopper presets or a --calibration only) | "
                  "fa1 (FlashAttention 1 and the 2022-23 Triton kernels no faster, e.g. "
                  "llm-foundry's MPT attn_impl triton: 2/3 of fa2's speed, Dao 2023); flash "
                  "attention's kernel, the time model only")
      ->check(one_of(allowed_flash_kernels()))
      ->capture_default_str();
  cmd->add_option("--capacity-factor", o.capacity_factor,
                  "MoE: expert slots as a multiple of the balanced share (token-dropping "
                  "capacity factor; 1 = dropless, balanced routing)")
      ->check(finite_in(1, 64))
      ->capture_default_str();
  add_route_flag(cmd, o.max_route_nodes);
  add_amax_history_flag(cmd, o.amax_history);
  add_fsdp_float8_flag(cmd, o.fsdp_float8_all_gather);
  add_fp8_param_gather_flag(cmd, o.fp8_param_gather);
  cmd->add_flag("--no-overlap-dp", o.no_overlap_dp,
                "put DP/ZeRO gradient reduction on the critical path (the seed's accounting; "
                "default: overlapped with backward but for the last bucket, as PyTorch DDP)")
      ->excludes(cmd->add_flag("--overlap-dp", o.overlap_dp, "the default, kept as an alias"));
  cmd->add_flag("--no-overlap-param-gather", o.no_overlap_param_gather,
                "ZeRO-1/2 parameter all-gather exposed (DeepSpeed; default: overlapped with the "
                "next forward, Megatron --overlap-param-gather)");
  cmd->add_flag("--ep-overlap", o.ep_overlap,
                "hide MoE all-to-alls behind another micro-batch's kernels (Megatron-Core "
                "--overlap-moe-expert-parallel-comm, DeepSeek's DualPipe; default: exposed)");
  cmd->add_flag("--tp-overlap", o.tp_overlap,
                "hide TP collectives behind GEMMs (Transformer Engine comm-GEMM overlap; default: "
                "exposed)");
  cmd->add_flag("--no-tp-grad-overlap", o.no_tp_grad_overlap,
                "TP input-gradient collectives in backward exposed (Megatron-LM before 2021-08, "
                "PyTorch DTensor; default: behind the weight-gradient GEMM, as Megatron-LM's "
                "async all-reduce and Transformer Engine do)");
  cmd->add_option("--overlap-slowdown", o.overlap_slowdown,
                  "how much slower kernels run beside a collective they hide, fraction (default "
                  "0.189: Lee et al. 2025's average over A100, H100, MI250, MI210; 0 = a hidden "
                  "collective is free)")
      ->check(finite_in(0, 1))
      ->capture_default_str();
  add_pp_scatter_gather_flag(cmd, o.pp_scatter_gather);
  cmd->add_flag("--no-dropout", o.no_dropout,
                "no dropout masks or kernels (default: the model's config; Llama-family: none)")
      ->excludes(cmd->add_flag("--dropout", o.dropout,
                               "count dropout masks and kernels even if the model's config has none"));
  cmd->add_option("--time-model", o.time_model,
                  "operators (each kernel on the GPU's roofline; default) | utilisation (the "
                  "seed's hardware FLOPs / (G · peak · u))")
      ->check(one_of({"operators", "utilisation"}));
  cmd->add_option("--utilisation", o.utilisation,
                  "u for --time-model utilisation, fraction of peak FLOP/s (default: the GPU "
                  "preset's / calibration's); giving it selects that model")
      ->check(finite_in(kUtilisationBounds.lo, kUtilisationBounds.hi));
  cmd->add_option("--failure-rate", o.failure_rate,
                  "failures per GPU-hour λ (default 1.97e-5, Llama 3's fleet; the seed's "
                  "scenarios use 3e-6; 0 = no failures expected)")
      ->check(finite_in(kFailureRateBounds.lo, kFailureRateBounds.hi));
  add_bandwidth_flag(cmd, "--write-bandwidth", "--write-gbps", o.write_bps,
                     "aggregate checkpoint write bandwidth (default: the cluster's, 1GB/s per "
                     "node)",
                     kBandwidthBpsBounds.lo, kBandwidthBpsBounds.hi);
  cmd->add_option("--restart-minutes", o.restart_minutes, "R: detect + restart + reload, minutes")
      ->check(finite_in(0, 1e6))
      ->capture_default_str();
  add_size_flag(cmd, "--checkpoint-size", "--checkpoint-gb", o.checkpoint_bytes,
                "checkpoint size (default: params + m + v + master, no gradients)", 1, 1e21);
  auto* days = cmd->add_option("--days", o.days, "run length in days (expected failures)")
                   ->check(finite_in(1e-6, 1e5));
  auto* tokens = cmd->add_option("--tokens", o.tokens,
                                 "token budget; run length = tokens / the best plan's tokens/s")
                     ->check(finite_in(1, 1e18));
  days->excludes(tokens);
}

}  // namespace

void register_plan(CLI::App& app, const Answers& answers) {
  auto o = std::make_shared<PlanOptions>();
  auto* cmd = app.add_subcommand(
      "plan", "search every parallel layout and write the plan (default: the seed's 7B on 8 × "
              "a100-80g, global batch 256, T 2048)");
  add_request_flags(cmd, *o);
  cmd->add_option("--top", o->top, "alternatives listed after the best plan")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->add_option("--max-tp", o->max_tp, "largest TP degree searched (default: GPUs per node)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--max-pp", o->max_pp, "largest PP degree searched")->check(CLI::Range(1, 1024));
  cmd->add_option("--max-cp", o->max_cp, "largest CP degree searched")->check(CLI::Range(1, 1024));
  cmd->add_option("--max-ep", o->max_ep,
                  "largest expert-parallel degree searched (MoE models; default: every EP "
                  "dividing the experts whose EP x ETP divides tp × cp × dp)")
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--etp", o->etp_search,
                  "expert TP searched (MoE models): tp (Megatron-Core's default), 1 (each "
                  "expert whole on a rank; with SP when TP > 1) or any (both)")
      ->check(one_of({"tp", "1", "any"}))
      ->capture_default_str();
  cmd->add_option("--attention", o->attention, "flash | materialized | any")
      ->check(one_of({"flash", "materialized", "any"}))
      ->capture_default_str();
  cmd->add_option("--recompute-policies", o->recompute_policies,
                  "recompute policies searched, comma-separated (default: all — none, selective, "
                  "full, save-matmuls, op-sac; op-sac only for dense layers)")
      ->delimiter(',')
      ->check(one_of(allowed_recomputes()));
  cmd->add_flag("--exhaustive", o->exhaustive, "disable pruning (same answer, slower)");
  cmd->add_option("--html", o->html,
                  "also write the plan as a self-contained HTML page (charts and tables) to FILE");
  add_lora_flags(cmd, o->lora);
  cmd->callback([o, cmd, answers] {
    note_lora_flags(cmd, o->lora);
    run_plan(*o, answers);
  });
}

void register_compare(CLI::App& app, const Answers& answers) {
  auto o = std::make_shared<PlanOptions>();
  o->micro_batch = 4;
  o->zero = 2;
  auto* cmd = app.add_subcommand(
      "compare", "cost a base layout and named alternatives side by side, naming each one's "
                 "tightest wall (default base: the seed's plan 1 — ZeRO-2, micro-batch 4)");
  add_request_flags(cmd, *o);
  cmd->add_option("--dp", o->dp, "base DP degree (default: GPUs / (TP·PP·CP))")->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--tp", o->tp, "base TP degree")->check(CLI::Range(1, 1024));
  cmd->add_option("--pp", o->pp, "base PP degree")->check(CLI::Range(1, 1024));
  cmd->add_option("--cp", o->cp, "base CP degree")->check(CLI::Range(1, 1024));
  cmd->add_option("--ep", o->ep,
                  "base expert-parallel degree (MoE; EP x ETP regroups tp × cp × dp: must divide "
                  "it, EP the experts)")
      ->check(CLI::Range(1, 1 << 20));
  add_etp_flag(cmd, o->etp);
  cmd->add_option("--interleave", o->interleave, "base pipeline chunks")->check(CLI::Range(1, 64));
  cmd->add_option("--pp-layers", o->pp_layers,
                  "base layers per pipeline stage, comma-separated, e.g. 7,8,8,…,8,7 (default: the "
                  "planner's split — even, or end stages lightened by the embedding and head); "
                  "with --interleave v, pp·v entries: every virtual stage's layers in model order")
      ->delimiter(',')
      ->check(CLI::Range(1, 1 << 20));
  cmd->add_flag("--sp", o->sp, "base uses sequence parallelism");
  cmd->add_option("--zero", o->zero, "base ZeRO stage")->check(CLI::Range(0, 3))->capture_default_str();
  cmd->add_option("--micro-batch", o->micro_batch, "base micro-batch")
      ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 20))
      ->capture_default_str();
  cmd->add_option("--grad-accum", o->grad_accum, "base accumulation (default: B / (dp·b))")
      ->check(CLI::Range(std::int64_t(1), std::int64_t(1) << 20));
  cmd->add_option("--recompute", o->recompute,
                  "base recompute: none | selective | full | save-matmuls | op-sac")
      ->check(one_of(allowed_recomputes()))
      ->capture_default_str();
  cmd->add_option("--attention", o->attention, "base attention: flash | materialized")
      ->check(one_of({"flash", "materialized"}))
      ->capture_default_str();
  cmd->add_option("--alternative", o->alternatives,
                  "double-micro-batch | recompute-double-seq | double-gpus (repeatable; default all)")
      ->check(one_of({"double-micro-batch", "recompute-double-seq", "double-gpus"}));
  cmd->add_option("--html", o->html,
                  "also write the options side by side as a self-contained HTML page to FILE");
  cmd->callback([o, answers] { run_compare(*o, answers); });
}

}  // namespace tally::cli
