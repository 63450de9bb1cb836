#include "properties/probes.hpp"

#include <algorithm>
#include <limits>

namespace kvcheck::properties {

using scenarios::StepKind;

std::string refusal_text(const engines::Refusal& r) {
  return r.code + (r.detail.empty() ? "" : ": " + r.detail);
}

std::vector<std::string> Prober::applicable(const scenarios::Step& step,
                                            const scenarios::RequestProgress& progress) const {
  std::vector<std::string> out;
  const bool writes = scenarios::step_rows(step) > 0;
  for (const std::string& p : caps.probes) {
    if (p == "accept-without-verify" && !progress.pending())
      out.push_back(p);
    else if (p == "accept-too-many" && progress.pending())
      out.push_back(p);
    else if (p == "begin-busy-state")
      out.push_back(p);
    else if (p == "non-finite-row" && writes && !progress.pending())
      out.push_back(p);
    else if (p != "accept-without-verify" && p != "accept-too-many" && p != "begin-busy-state" &&
             p != "non-finite-row" && step.kind == StepKind::kDecode) {
      out.push_back(p);  // the cache's own probes go in front of a decode
    }
  }
  return out;
}

std::string Prober::choose(const std::vector<std::string>& apply, std::int64_t step_index,
                           bool after_reset) const {
  if (after_reset && std::find(apply.begin(), apply.end(), "stale-revision") != apply.end()) {
    return "stale-revision";
  }
  return apply[static_cast<std::size_t>(step_index) % apply.size()];
}

std::string Prober::run(const std::string& name, engines::StepCall call,
                        const scenarios::RequestProgress& progress, const std::vector<double>& k) {
  ++sent;
  const auto before = cache.fingerprint(call.layer);
  engines::StepStatus st;
  engines::StepAnswer scratch;
  if (name == "accept-without-verify" || name == "accept-too-many") {
    call.op = engines::StepCall::Op::kStep;
    call.step.kind = StepKind::kAccept;
    call.step.accepted = name == "accept-too-many" ? progress.pending_drafts + 1 : 0;
    call.rows = 0;
    st = cache.call(call, &scratch);
  } else if (name == "begin-busy-state") {
    call.op = engines::StepCall::Op::kBegin;
    call.step.request = call.step.request + (std::int64_t{1} << 40);  // an id no schedule uses
    st = cache.call(call, &scratch);
  } else if (name == "non-finite-row") {
    std::vector<double> k_bad = k;  // the step's keys with one NaN
    k_bad[0] = std::numeric_limits<double>::quiet_NaN();
    call.k = k_bad.data();
    st = cache.call(call, &scratch);
  } else {
    st = cache.probe(name, call);
  }
  if (!st) return "probe " + name + ": the cache accepted a call it must refuse";
  if (st->code == "unsupported-probe") return "probe " + name + ": " + st->detail;
  const auto after = cache.fingerprint(call.layer);
  if (before != after) {
    return "probe " + name + ": refused (" + refusal_text(*st) + ") but the cache's storage changed";
  }
  return {};
}

}  // namespace kvcheck::properties
