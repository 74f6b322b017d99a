// `tally serve`'s page (GET /): one self-contained document — inline CSS and script, no URL but
// the server's own API — with a form for the scenario that re-plans on every change and shows the
// `tally plan --html` page's charts, drawn by the server with the same writers (html_pages.cpp).
//
// Note [page script]
// The script keeps no plan logic: it sends the form as a request body (keys = flag names, values
// as typed: the command checks them) to POST /api/plan?format=html and places the fragment it gets
// into #charts; a 400 shows the command's one-line message and dims the charts, which belong to
// the last good scenario. Changes are debounced (typing) and superseded (an older answer arriving
// late is dropped). `?selftest=FIELD:VALUE` (the browser test: headless chromium has no scripting
// channel) waits for the first plan, sets the field, fires the same `change` event a person's edit
// fires, waits for that re-plan and writes what the page showed before and after as JSON into
// <pre id="selftest">, which `chromium --dump-dom` captures.
#include <fmt/core.h>

#include <string>
#include <vector>

#include "commands.hpp"
#include "flags.hpp"
#include "html_report.hpp"
#include "serve_api.hpp"
#include "tally/core/presets.hpp"

namespace tally::cli {

namespace {

using html::escape;

// The <select> choice that reads the textarea (id NAME-text) instead; the script tests for it.
constexpr const char* kPaste = "paste";

std::string options(const std::vector<std::string>& names, const std::string& selected) {
  std::string s;
  for (const auto& n : names)
    s += "<option" + std::string(n == selected ? " selected" : "") + ">" + escape(n) + "</option>";
  return s;
}

// A text field: the value is sent as typed (a number field would turn "1e3x" into "" silently).
std::string text_field(const std::string& name, const std::string& label, const std::string& value,
                       const std::string& hint) {
  return fmt::format("<label>{}<input name=\"{}\" value=\"{}\" placeholder=\"{}\" "
                     "inputmode=\"decimal\" spellcheck=\"false\"></label>",
                     escape(label), escape(name), escape(value), escape(hint));
}

std::string select_field(const std::string& name, const std::string& label,
                         const std::vector<std::string>& names, const std::string& selected,
                         const std::string& paste_label = "") {
  std::string s = fmt::format("<label>{}<select name=\"{}\">{}", escape(label), escape(name),
                              options(names, selected));
  if (!paste_label.empty())
    s += fmt::format("<option value=\"{}\">{}</option>", kPaste, escape(paste_label));
  return s + "</select></label>";
}

std::string paste_area(const std::string& name, const std::string& what) {
  return fmt::format("<textarea id=\"{}-text\" rows=\"7\" hidden spellcheck=\"false\" "
                     "aria-label=\"{}\" placeholder=\"{}\"></textarea>",
                     escape(name), escape(what), escape(what));
}

constexpr const char* kCss =
    "body{max-width:1100px;padding:0 16px}form{display:flex;flex-wrap:wrap;gap:8px 14px}\n"
    "fieldset{border:1px solid #ccc;padding:6px 10px;display:flex;flex-wrap:wrap;gap:6px 12px;"
    "align-items:flex-end}\nlegend{font-weight:600}\n"
    "label{display:flex;flex-direction:column;font-size:12px;color:#333}\n"
    "input,select{font:13px system-ui,sans-serif;padding:2px 4px;width:8.5em}\n"
    "select{width:auto}textarea{font:12px monospace;width:34em;flex-basis:100%}\n"
    "#status{color:#444;font-size:12px;min-height:1.4em}\n"
    "#error{color:#a00;font-weight:600;white-space:pre-wrap}\n"
    "#charts{max-width:820px}#charts.stale{opacity:.35}\n";

// Note [page script]. Plain ES2017; writes nothing to the console.
constexpr const char* kScript = R"JS(
(function () {
  'use strict';
  var form = document.getElementById('scenario'), charts = document.getElementById('charts');
  var statusEl = document.getElementById('status'), errorEl = document.getElementById('error');
  var requestEl = document.getElementById('request');
  var seq = 0, timer = 0, inflight = null, sent = '', waiters = [];
  window.addEventListener('unhandledrejection', function (e) {
    document.documentElement.setAttribute('data-tally-error', String(e.reason));
  });

  function body() {
    var b = {};
    Array.prototype.forEach.call(form.elements, function (el) {
      if (!el.name) return;
      var v = el.value.trim();
      if (el.tagName === 'SELECT' && el.value === 'paste')
        v = document.getElementById(el.name + '-text').value;
      if (v !== '') b[el.name] = v;
    });
    return JSON.stringify(b);
  }
  function settle(outcome) {
    var w = waiters;
    waiters = [];
    w.forEach(function (f) { f(outcome); });
  }
  function nextPlan() { return new Promise(function (resolve) { waiters.push(resolve); }); }
  function fail(message) {
    errorEl.textContent = message;
    errorEl.hidden = false;
    charts.classList.add('stale');
    statusEl.textContent = '';
    settle({error: message});
  }
  function replan() {
    var text = body();
    if (text === sent) return;
    sent = text;
    var mine = ++seq;
    if (inflight) inflight.abort();
    inflight = new AbortController();
    requestEl.textContent = text;
    statusEl.textContent = 'planning…';
    fetch('/api/plan?format=html', {method: 'POST', body: text, signal: inflight.signal,
                                    headers: {'Content-Type': 'application/json'}})
      .then(function (r) { return r.text().then(function (t) { return {r: r, t: t}; }); })
      .then(function (x) {
        if (mine !== seq) return;
        if (!x.r.ok) {
          var message = 'HTTP ' + x.r.status;
          try { message = JSON.parse(x.t).error; } catch (e) { /* keep the status */ }
          fail(message);
          return;
        }
        errorEl.hidden = true;
        charts.classList.remove('stale');
        charts.innerHTML = x.t;
        document.documentElement.setAttribute('data-tally-charts',
            String(charts.querySelectorAll('svg.chart').length));
        statusEl.textContent = 'the plan for the scenario above';
        settle({});
      })
      .catch(function (e) {
        if (e.name === 'AbortError' || mine !== seq) return;
        sent = '';
        fail(String(e));
      });
  }
  function schedule(ev) {
    clearTimeout(timer);
    timer = setTimeout(replan, ev && ev.type === 'input' ? 300 : 0);
  }
  form.addEventListener('input', schedule);
  form.addEventListener('change', schedule);
  form.addEventListener('submit', function (ev) { ev.preventDefault(); schedule(); });
  Array.prototype.forEach.call(form.querySelectorAll('select'), function (sel) {
    var area = document.getElementById(sel.name + '-text');
    if (!area) return;
    sel.addEventListener('change', function () { area.hidden = sel.value !== 'paste'; });
  });

  // Note [page script]: the browser test's hook.
  function hash(s) {
    var h = 5381;
    for (var i = 0; i < s.length; i++) h = (h * 33 + s.charCodeAt(i)) >>> 0;
    return h.toString(16);
  }
  function snapshot() {
    var title = charts.querySelector('h1'), plan = charts.querySelector('p.plan');
    return {title: title ? title.textContent : '', plan: plan ? plan.textContent : '',
            charts: charts.querySelectorAll('svg.chart').length,
            marks: charts.querySelectorAll('svg.chart circle, svg.chart rect, svg.chart polygon').length,
            texts: charts.querySelectorAll('svg.chart text').length,
            hash: hash(charts.innerHTML), error: errorEl.hidden ? '' : errorEl.textContent};
  }
  var first = nextPlan();
  var test = /[?&]selftest=([^&]*)/.exec(location.search);
  if (test) {
    var spec = decodeURIComponent(test[1]), colon = spec.indexOf(':');
    var name = spec.slice(0, colon), value = spec.slice(colon + 1);
    first.then(function () {
      var before = snapshot(), field = form.elements[name], out = document.getElementById('selftest');
      var done = function (result) {
        out.textContent = JSON.stringify(result);
        document.documentElement.setAttribute('data-tally-selftest', 'done');
      };
      if (!field) { done({error: 'no field ' + name}); return; }
      var after = nextPlan();
      field.value = value;
      field.dispatchEvent(new Event('change', {bubbles: true}));
      after.then(function () {
        done({field: name, value: value, before: before, after: snapshot()});
      });
    });
  }
  replan();
})();
)JS";

}  // namespace

std::string serve_page() {
  // The plan command's own defaults (CLI11 keeps them), so the form starts where `tally plan` does.
  CLI::App app;
  register_plan(app);
  const CLI::App* plan = app.get_subcommand("plan");
  auto dflt = [&](const std::string& flag) { return plan->get_option(flag)->get_default_str(); };

  std::string form = "<form id=\"scenario\" autocomplete=\"off\">";
  form += "<fieldset><legend>Model</legend>" +
          select_field("model", "preset", model_preset_names(), std::string(kDefaultModel),
                       "config.json (paste)") +
          paste_area("model", "a Hugging Face config.json (its text)") + "</fieldset>";
  form += "<fieldset><legend>Cluster</legend>" +
          select_field("gpu", "GPU", cluster_preset_names(), dflt("--gpu"),
                       "cluster JSON (paste)") +
          text_field("gpus", "GPUs", dflt("--gpus"), dflt("--gpus")) +
          paste_area("gpu", "a cluster JSON (docs/formats.md)") + "</fieldset>";
  form += "<fieldset><legend>Batch</legend>" +
          text_field("global-batch", "global batch (sequences)", dflt("--global-batch"),
                     dflt("--global-batch")) +
          text_field("seq", "sequence length", dflt("--seq"), dflt("--seq")) +
          select_field("precision", "precision", precision_names(), dflt("--precision")) +
          select_field("optimizer", "optimizer", allowed_optimizers(), dflt("--optimizer")) +
          "</fieldset>";
  form += "<fieldset><legend>Limits</legend>" +
          text_field("max-tp", "max TP", "", "GPUs per node") +
          text_field("max-pp", "max PP", "", "any") + text_field("max-cp", "max CP", "", "any") +
          text_field("headroom", "headroom (fraction)", dflt("--headroom"), dflt("--headroom")) +
          select_field("unit", "unit", {"GB", "GiB"}, dflt("--unit")) + "</fieldset></form>\n";

  const std::string body =
      "<h1>tally serve — plan a training run</h1>\n" + form +
      "<p id=\"status\" role=\"status\" aria-live=\"polite\"></p>\n"
      "<p id=\"error\" role=\"alert\" hidden></p>\n"
      "<div id=\"charts\"></div>\n"
      "<details><summary>the request this page sends: POST /api/plan (format=json for the "
      "--json object)</summary><pre id=\"request\"></pre></details>\n"
      "<pre id=\"selftest\" hidden></pre>\n<script>" +
      std::string(kScript) + "</script>\n";
  // The empty icon keeps the browser from asking for /favicon.ico.
  return "<!DOCTYPE html>\n<html lang=\"en\"><head>" + html::head("tally serve", kCss) +
         "<link rel=\"icon\" href=\"data:,\"></head>\n<body>\n" + body + "</body></html>\n";
}

}  // namespace tally::cli
