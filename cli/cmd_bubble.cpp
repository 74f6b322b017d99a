// `tally bubble`: the pipeline ledger.
#include <fmt/core.h>

#include <memory>
#include <optional>

#include "commands.hpp"
#include "common.hpp"
#include "html_pages.hpp"
#include "html_report.hpp"
#include "tally/core/pipeline.hpp"

namespace tally::cli {

namespace {

struct BubbleOptions {
  OutputOptions out;
  int pp = 1, micro_batches = 1, interleave = 1;
  double ratio = 2.0, max_bubble = 0.10;
  std::optional<double> forward_ms;  // unset: fractions and slots only, no times
  std::optional<std::string> html;   // --html FILE
};

void run_bubble(const BubbleOptions& o) {
  PipelineSetup setup{.stages = o.pp, .micro_batches = o.micro_batches, .interleave = o.interleave,
                      .backward_forward_ratio = o.ratio};
  if (o.forward_ms) setup.forward_time_s = *o.forward_ms / 1e3;
  const PipelineResult r = bubble(setup);
  const int min_m = min_micro_batches_for_bubble(o.pp, o.max_bubble, o.interleave);
  nlohmann::json j = {{"command", "bubble"},
                      {"convention", r.convention()},
                      {"pp", o.pp},
                      {"micro_batches", o.micro_batches},
                      {"interleave", o.interleave},
                      {"bubble_fraction", r.bubble_fraction},
                      {"utilisation", 1.0 - r.bubble_fraction},
                      {"ideal_slots", r.ideal_slots},
                      {"total_slots", r.total_slots},
                      {"max_bubble", o.max_bubble},
                      {"min_micro_batches_for_max_bubble", min_m}};
  if (r.total_time_s) {
    j["ideal_time_s"] = *r.ideal_time_s;
    j["bubble_time_s"] = *r.bubble_time_s;
    j["total_time_s"] = *r.total_time_s;
  }
  require_finite(j);  // Note [no inf or nan in output], for the text report too
  if (o.html)
    html::write_file("--html", *o.html,
                     html::page(bubble_page({.stages = o.pp, .given_micro_batches = o.micro_batches,
                                             .interleave = o.interleave,
                                             .max_bubble = o.max_bubble})));
  if (o.out.json) {
    print_json(j);
    return;
  }
  fmt::print("tally bubble  [{}]\n", r.convention());
  fmt::print("  bubble fraction   {:>8.2f} %   (utilisation {:.2f} %)\n", 100 * r.bubble_fraction,
             100 * (1 - r.bubble_fraction));
  fmt::print("  time slots        {:>8g} ideal, {:g} total\n", r.ideal_slots, r.total_slots);
  if (r.total_time_s)
    fmt::print("  time              {:>8.3f} ms ideal + {:.3f} ms bubble = {:.3f} ms\n",
               1e3 * *r.ideal_time_s, 1e3 * *r.bubble_time_s, 1e3 * *r.total_time_s);
  fmt::print("  smallest M with bubble <= {:.1f} % at P = {}: {}\n", 100 * o.max_bubble, o.pp, min_m);
}

}  // namespace

void register_bubble(CLI::App& app) {
  auto o = std::make_shared<BubbleOptions>();
  auto* cmd = app.add_subcommand("bubble", "pipeline bubble of GPipe / 1F1B / interleaved schedules");
  add_output_flags(cmd, o->out);
  cmd->add_option("--pp", o->pp, "pipeline stages P")->required()->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--micro-batches", o->micro_batches, "micro-batches per step M")
      ->required()
      ->check(CLI::Range(1, 1 << 24));
  cmd->add_option("--interleave", o->interleave, "model chunks per stage v (interleaved 1F1B)")
      ->check(CLI::Range(1, 1024));
  cmd->add_option("--backward-ratio", o->ratio, "backward / forward time per micro-batch")
      ->check(finite_in(0, 100))
      ->capture_default_str();
  cmd->add_option("--forward-ms", o->forward_ms,
                  "forward time of one micro-batch on one stage, ms (adds times)")
      ->check(finite_in(0, 1e9));
  cmd->add_option("--max-bubble", o->max_bubble, "target bubble fraction for the smallest-M line")
      ->check(finite_in(1e-6, 0.999999))
      ->capture_default_str();
  cmd->add_option("--html", o->html,
                  "also write the bubble against M (1F1B and interleaved) as a self-contained "
                  "HTML page to FILE");
  cmd->callback([o] { run_bubble(*o); });
}

}  // namespace tally::cli
