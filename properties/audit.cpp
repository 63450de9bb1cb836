#include "properties/audit.hpp"

#include <algorithm>
#include <map>
#include <optional>
#include <tuple>
#include <utility>

#include "engines/trace_cache.hpp"
#include "properties/runner.hpp"
#include "scenarios/scenario_json.hpp"
#include "scenarios/step_semantics.hpp"
#include "scenarios/trace_json.hpp"
#include "support/error.hpp"

namespace kvcheck::properties {

namespace {

using scenarios::TraceKind;
using scenarios::TraceRun;
using scenarios::TraceStep;

std::string at_line(std::int64_t line, const std::string& path) {
  return "line " + std::to_string(line) + (path.empty() ? "" : ": " + path);
}

std::string in_source(const TraceRun& run) {
  return run.source.empty() ? "" : " (in " + run.source + ")";
}

/// Where each part of the built scenario came from, to name trace lines.
struct Origins {
  std::int64_t header_line = 0;
  std::vector<std::int64_t> step_lines;     // per scenario step: its first record
  std::vector<std::int64_t> request_lines;  // per scenario request: its first record
  struct Row {
    std::int64_t line;
    std::size_t index;  // row of the record
  };
  std::vector<Row> row_lines;  // per explicit row
};

/// "steps[12].accepted" -> (12, "accepted").
bool split_indexed(const std::string& where, const std::string& prefix, std::size_t* index,
                   std::string* rest) {
  if (where.compare(0, prefix.size(), prefix) != 0) return false;
  const auto close = where.find(']', prefix.size());
  if (close == std::string::npos) return false;
  *index = static_cast<std::size_t>(std::stoull(where.substr(prefix.size(), close - prefix.size())));
  *rest = where.substr(close + 1);
  if (!rest->empty() && (*rest)[0] == '.') rest->erase(0, 1);
  return true;
}

/// Re-issues a scenario validation error at the trace line it comes from.
[[noreturn]] void rethrow_at_line(const Error& e, const Origins& o, const TraceRun& run) {
  const std::string& w = e.where();
  std::string where;
  std::size_t i = 0;
  std::string rest;
  if (split_indexed(w, "steps[", &i, &rest) && i < o.step_lines.size()) {
    where = at_line(o.step_lines[i], rest);
  } else if (split_indexed(w, "requests[", &i, &rest) && i < o.request_lines.size()) {
    where = at_line(o.request_lines[i], rest == "id" ? "request" : rest);
  } else if (split_indexed(w, "data.rows[", &i, &rest) && i < o.row_lines.size()) {
    const Origins::Row& r = o.row_lines[i];
    for (const char* field : {"k", "v", "q"}) {
      if (rest.compare(0, 1, field) == 0 && (rest.size() == 1 || rest[1] == '[')) {
        rest = std::string(field) + "[" + std::to_string(r.index) + "]" + rest.substr(1);
      }
    }
    where = at_line(r.line, rest);
  } else if (w == "cache.window") {
    where = at_line(o.header_line, "window.param");
  } else if (w.rfind("cache.layer_windows", 0) == 0) {
    where = at_line(o.header_line, w.substr(6));  // the header's own layer_windows
  } else if (w == "cache.ring_rows") {
    where = at_line(o.header_line, "capacity");
  } else if (w == "cache.states") {
    where = at_line(o.header_line, "states");
  } else if (w == "description") {
    where = at_line(o.header_line, "name");
  } else {
    where = at_line(o.header_line, w);
  }
  throw Error(e.id(), where, e.rule() + in_source(run));
}

[[noreturn]] void fail_at(ErrorId id, std::int64_t line, const std::string& path, const std::string& rule,
                          const TraceRun& run) {
  throw Error(id, at_line(line, path), rule + in_source(run));
}

}  // namespace

TraceScenario trace_scenario(const TraceRun& run) {
  const scenarios::TraceHeader& h = run.header;
  const scenarios::TraceCache tc = h.cache.value_or(scenarios::TraceCache{});
  TraceScenario out;
  scenarios::Scenario& sc = out.scenario;
  Origins origins;
  origins.header_line = run.header_line;
  sc.name = h.name;
  sc.description = "recorded trace" + (run.source.empty() ? std::string() : " " + run.source) +
                   ", run at line " + std::to_string(run.header_line);

  // Cache: the header, else the defaults; sizes not given come from the records.
  std::int32_t max_layer = 0;
  std::int64_t max_state = 0, max_slot = -1;
  for (const TraceStep& s : run.steps) {
    const std::int64_t keys = scenarios::trace_layer_window_keys(h, s.layer);
    max_layer = std::max(max_layer, s.layer);
    max_state = std::max(max_state, s.state);
    for (const std::int64_t slot : s.written) max_slot = std::max(max_slot, slot);
    if (!h.capacity) {
      for (const auto& list : scenarios::trace_read_slots(s, keys)) {
        for (const std::int64_t slot : list) max_slot = std::max(max_slot, slot);
      }
    }
  }
  scenarios::CacheConfig& c = sc.cache;
  c.window = h.window;
  c.convention = h.convention;
  c.layer_windows = h.layer_windows;  // validation names a count that disagrees with the layers
  c.q_heads = tc.q_heads;
  c.kv_heads = tc.kv_heads;
  c.head_dim = tc.head_dim;
  c.shared_row = tc.shared_row;
  c.format = tc.format;
  c.rope = tc.rope;
  c.softmax_scale = tc.softmax_scale;
  c.sink_logit = tc.sink_logit;
  c.layers = tc.layers.value_or(max_layer + 1);
  c.pool_blocks = h.pool_blocks;  // the pool the recorded cache was opened with
  c.states = h.states.value_or(max_state + 1);
  if (h.capacity) {
    c.ring_rows = *h.capacity;
  } else if (max_slot >= scenarios::kMaxRows - 2) {
    fail_at(ErrorId::kSize, run.header_line, "capacity",
            "capacity is absent and the largest slot " + std::to_string(max_slot) +
                " is too large to stand for it; give the header a capacity",
            run);
  } else {
    c.ring_rows = std::max<std::int64_t>(1, max_slot + 1);
  }
  for (const TraceStep& s : run.steps) {
    if (s.state >= c.states) {
      fail_at(ErrorId::kJsonValue, s.line, "state",
              "state " + std::to_string(s.state) + " is outside 0.." + std::to_string(c.states - 1) +
                  " (the header's states)",
              run);
    }
  }

  // Requests (in order of first appearance, each on one state) and steps
  // (one per step index, from its first record; begin records dropped).
  std::map<std::int64_t, std::pair<std::int64_t, std::int64_t>> request_state;  // request -> (state, line)
  std::map<std::int64_t, std::int64_t> first_step_of;                           // request -> step index
  std::vector<bool> has_record;  // per step: a step record seen
  for (const TraceStep& s : run.steps) {
    const auto [it, fresh] = request_state.emplace(s.request, std::pair(s.state, s.line));
    if (fresh) {
      // A begin from a shared prefix gives the request its prefix.
      sc.requests.push_back({s.request, s.state, s.kind == TraceKind::kBegin ? s.prefix : std::nullopt});
      origins.request_lines.push_back(s.line);
      first_step_of[s.request] = s.step;
    } else if (it->second.first != s.state) {
      fail_at(ErrorId::kJsonValue, s.line, "state",
              "request " + std::to_string(s.request) + " is on state " + std::to_string(it->second.first) +
                  " (line " + std::to_string(it->second.second) +
                  "); a request keeps its state until it finishes",
              run);
    }
    // A begin from the request's own rows resumes it after a preempt (docs/semantics.md "Preemption").
    const bool resume = s.prefix && s.prefix->request == s.request;
    if (s.kind == TraceKind::kBegin && first_step_of[s.request] != s.step && !resume) {
      fail_at(ErrorId::kJsonValue, s.line, "kind",
              "a begin of request " + std::to_string(s.request) + " at step " + std::to_string(s.step) +
                  ", but the request began at step " + std::to_string(first_step_of[s.request]),
              run);
    }
    const auto index = static_cast<std::size_t>(s.step);
    if (index == sc.steps.size()) {
      // A run that ends at a refused begin has no step record for that index:
      // a finish of the request stands for it (the run stops at the begin).
      scenarios::Step step;
      step.kind = scenarios::StepKind::kFinish;
      step.request = s.request;
      sc.steps.push_back(step);
      origins.step_lines.push_back(s.line);
      has_record.push_back(false);
    }
    if (s.kind == TraceKind::kBegin || has_record[index]) continue;
    sc.steps[index] = scenarios::trace_record_step(s);
    origins.step_lines[index] = s.line;
    has_record[index] = true;
  }

  // Expectations: a run that ended at a refusal keeps those of the steps before it.
  sc.expect = h.expect;
  if (sc.expect && !run.steps.empty() && run.steps.back().refused) {
    auto& list = sc.expect->overwritten;
    list.erase(std::remove_if(
                   list.begin(), list.end(),
                   [&](const scenarios::OverwriteExpectation& e) { return e.step >= run.steps.back().step; }),
               list.end());
  }

  // The schedule must be valid (docs/semantics.md "Steps") before positions mean anything.
  try {
    scenarios::validate_scenario(sc);
  } catch (const Error& e) {
    rethrow_at_line(e, origins, run);
  }
  // Each writing record writes at its request's logical length.
  {
    std::map<std::int64_t, scenarios::RequestProgress> progress = scenarios::start_progress(sc.requests);
    std::size_t next = 0;
    for (std::size_t i = 0; i < sc.steps.size(); ++i) {
      auto& p = progress[sc.steps[i].request];
      for (; next < run.steps.size() && run.steps[next].step == static_cast<std::int64_t>(i); ++next) {
        const TraceStep& s = run.steps[next];
        if (scenarios::trace_kind_writes(s.kind) && s.position != scenarios::step_first_position(p)) {
          fail_at(ErrorId::kJsonValue, s.line, "position",
                  "position " + std::to_string(s.position) + ", but request " + std::to_string(s.request) +
                      " writes at its logical length " + std::to_string(scenarios::step_first_position(p)) +
                      " here (docs/semantics.md, Steps: prefill and decode advance it, verify(k) + accept(a) by 1 + a, reset "
                      "to 0)",
                  run);
        }
      }
      scenarios::advance(p, sc.steps[i]);
    }
  }

  // Rows and outputs: explicit rows when every writing step carries them.
  // A (layer, request, position) written with one content throughout gets one
  // row without a step; one written with new content (a rejected draft's
  // position written again, a position after a reset) gets a row per writing
  // step, each with its step.
  out.judge_outputs = h.cache.has_value();
  if (!out.judge_outputs) out.outputs_note = "the header has no \"cache\" (row layout)";
  struct Candidate {
    scenarios::ExplicitRow row;  // step set
    Origins::Row origin;
  };
  std::vector<Candidate> candidates;
  for (const TraceStep& s : run.steps) {
    if (!out.judge_outputs) break;
    if (!scenarios::trace_kind_writes(s.kind) || s.refused) continue;
    const bool complete = !s.k.empty() && !s.q.empty() && !s.out.empty() && (c.shared_row || !s.v.empty());
    if (!complete) {
      out.judge_outputs = false;
      out.outputs_note = "line " + std::to_string(s.line) + " carries no k, v, q and out";
      break;
    }
    for (std::size_t r = 0; r < static_cast<std::size_t>(s.rows); ++r) {
      scenarios::ExplicitRow row;
      row.layer = s.layer;
      row.request = s.request;
      row.position = s.position + static_cast<std::int64_t>(r);
      row.step = s.step;
      row.k = s.k[r];
      if (!c.shared_row) row.v = s.v[r];
      row.q = s.q[r];
      candidates.push_back({std::move(row), {s.line, r}});
    }
  }
  if (out.judge_outputs) {
    // Per (layer, request, position): its first candidate, and whether every
    // later one carries the same content.
    struct Group {
      std::size_t first;
      bool uniform = true;
    };
    std::map<std::tuple<std::int32_t, std::int64_t, std::int64_t>, Group> groups;
    const auto key = [](const scenarios::ExplicitRow& r) {
      return std::tuple(r.layer, r.request, r.position);
    };
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      const scenarios::ExplicitRow& row = candidates[i].row;
      const auto [it, fresh] = groups.emplace(key(row), Group{i});
      if (fresh) continue;
      const scenarios::ExplicitRow& first = candidates[it->second.first].row;
      if (row.k != first.k || row.v != first.v || row.q != first.q) it->second.uniform = false;
    }
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      Candidate& cand = candidates[i];
      const Group& g = groups.at(key(cand.row));
      if (g.uniform) {
        if (g.first != i) continue;  // the same content again: one row stands for every step
        cand.row.step.reset();
      }
      sc.data.rows.push_back(std::move(cand.row));
      origins.row_lines.push_back(cand.origin);
    }
  }
  if (!out.judge_outputs) {
    sc.data.rows.clear();
    origins.row_lines.clear();
  }
  try {
    scenarios::validate_scenario(sc);
  } catch (const Error& e) {
    rethrow_at_line(e, origins, run);
  }
  return out;
}

RunObservation audit_run(const TraceRun& run, const AuditOptions& options) {
  const TraceScenario ts = trace_scenario(run);
  const std::unique_ptr<engines::CacheProvider> provider = engines::make_trace_provider(run);
  RunOptions o;
  o.backend = "trace";
  o.provider = provider.get();
  o.probes = false;
  o.check_outputs = ts.judge_outputs;
  o.precision_bits = options.precision_bits;
  o.record_reads = options.record_reads;
  o.record_ring = options.record_ring;
  o.on_query_judged = options.on_query_judged;
  RunObservation obs = run_scenario(ts.scenario, o);
  if (!ts.judge_outputs) obs.observed = "slots";
  return obs;
}

std::vector<RunObservation> audit_trace(const std::vector<TraceRun>& runs, const AuditOptions& options) {
  std::vector<RunObservation> out;
  out.reserve(runs.size());
  for (const TraceRun& run : runs) out.push_back(audit_run(run, options));
  return out;
}

}  // namespace kvcheck::properties
