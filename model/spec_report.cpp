#include "model/spec_report.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>
#include <vector>

#include "model/address.hpp"
#include "model/attention_lab.hpp"
#include "model/bytes.hpp"
#include "model/layer_fixture.hpp"
#include "model/trace.hpp"
#include "support/formats.hpp"

namespace kvcheck::model {

namespace {

std::string fixed(double x, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, x);
  // Print -0.000000 as 0.000000.
  std::string s = buf;
  if (s.find_first_not_of("-0.") == std::string::npos && s[0] == '-') s.erase(0, 1);
  return s;
}

std::string list(const std::vector<std::int64_t>& v) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

std::string vec(const std::vector<double>& v, int digits) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + fixed(v[i], digits);
  return s + "]";
}

std::string opt(std::optional<std::int64_t> v) {
  return v ? std::to_string(*v) : "overflow";
}

void add(std::vector<SpecLine>& out, std::string section, std::string quantity, std::string computed,
         std::string spec) {
  const bool match = computed == spec;
  out.push_back({std::move(section), std::move(quantity), std::move(computed), std::move(spec), match});
}

}  // namespace

std::vector<SpecLine> reproduce_spec() {
  std::vector<SpecLine> out;
  for (const auto window : {std::optional<std::int64_t>{}, std::optional<std::int64_t>{3}}) {
    const LabRun run = run_attention_lab(window);
    const std::string name = window ? "lab window 3" : "lab full causal";
    add(out, name, "projected rows recompute/cache",
        std::to_string(run.recompute.projected_rows) + "/" + std::to_string(run.cache.projected_rows),
        "15/5");
    add(out, name, "query-key pairs recompute/cache",
        std::to_string(run.recompute.pairs) + "/" + std::to_string(run.cache.pairs),
        window ? "31/12" : "35/15");
    add(out, name, "retained rows", std::to_string(run.cache.retained_rows), window ? "3" : "5");
    add(out, name, "last output", fixed(run.last_output[0], 6) + ", " + fixed(run.last_output[1], 6),
        window ? "3.000000, 1.000000" : "2.790791, 0.930264");
    add(out, name, "cached = recomputed within 1e-12",
        run.max_abs_difference <= 1e-12 && run.max_rel_difference <= 1e-12 ? "yes" : "no", "yes");
  }
  add(out, "bytes", "full KV, 32x8x128, 4096 ctx, 2 B", opt(kv_payload_bytes(32, 8, 128, 4096, 2)),
      "536870912");
  add(out, "bytes", "window 128 KV", opt(kv_payload_bytes(32, 8, 128, 128, 2)), "16777216");
  const std::int64_t row = format_row_bytes(ElementFormat::kFp8, 512);
  add(out, "bytes", "shared fp8 row, 512 + scales", std::to_string(row), "528");
  add(out, "bytes", "128 visible rows", opt(rows_bytes(128, row)), "67584");
  add(out, "bytes", "134 allocated rows", opt(rows_bytes(134, row)), "70752");

  const char* trace_spec[] = {"0..127 268/395 w395", "1..128 269/396 w396", "6..133 274/401 w401",
                              "7..134 275/268 w268"};
  const auto trace = ring_trace(128, 134, 2, {127, 128, 133, 134});
  for (std::size_t i = 0; i < trace.size(); ++i) {
    const TraceRow& t = trace[i];
    add(out, "ring trace W=128 S=134 b=2", "position " + std::to_string(t.position),
        std::to_string(t.logical_first) + ".." + std::to_string(t.logical_last) + " " +
            std::to_string(t.first_read_slot) + "/" + std::to_string(t.last_read_slot) + " w" +
            std::to_string(t.write_slot),
        trace_spec[i]);
  }
  const TraceRow s3 = ring_trace(128, 134, 3, {134})[0];
  add(out, "state 3", "first/last read, write at 134",
      std::to_string(s3.first_read_slot) + ", " + std::to_string(s3.last_read_slot) + ", " +
          std::to_string(s3.write_slot),
      "409, 402, 402");

  for (const auto& [ring_rows, spec] : {std::pair<std::int64_t, const char*>{128, "[5,4,3,2,1,0]"},
                                        {133, "[0,0,0,0,0,0]"},
                                        {134, "[0,0,0,0,0,0]"}}) {
    SlotOracle oracle(Ring{1, ring_rows, 128});
    apply_step(oracle, 0, 0, 0, 300, false);
    std::vector<std::int64_t> counts;
    for (const auto& l : apply_step(oracle, 0, 0, 300, 6, true)) {
      counts.push_back(static_cast<std::int64_t>(l.size()));
    }
    add(out, "verify k=5 W=128", "overwritten per query, S=" + std::to_string(ring_rows), list(counts), spec);
  }
  struct PrefillCase {
    std::int64_t rows;
    bool store_first;
    const char* spec;
  };
  for (const PrefillCase& c :
       {PrefillCase{3, true, "[]"}, PrefillCase{4, true, "[2]"}, PrefillCase{5, true, "[2,3] q5:[3]"},
        PrefillCase{3, false, "[]"}, PrefillCase{4, false, "[]"}, PrefillCase{5, false, "[]"}}) {
    SlotOracle oracle(Ring{1, 5, 3});
    apply_step(oracle, 0, 0, 0, 4, false);
    const auto lost = apply_step(oracle, 0, 0, 4, c.rows, c.store_first);
    std::string computed = list(lost[0]);
    if (lost.size() > 1 && !lost[1].empty()) computed += " q5:" + list(lost[1]);
    add(out, "prefill W=3 S=5",
        std::string(c.store_first ? "store_then_load" : "load_then_store") + " 4.." +
            std::to_string(3 + c.rows) + ", query 4 loses",
        computed, c.spec);
  }

  const LayerEvidence ev = run_layer_fixture(seed_layer_fixture());
  const char* layer_spec[] = {"[1.000000000,0.000000000,1.000000000,0.000000000]",
                              "[0.213809009,0.786190991,0.770151153,-0.420735492]",
                              "[0.629044078,0.945303958,0.374718490,-0.583589471]"};
  for (std::size_t t = 0; t < ev.steps.size(); ++t) {
    add(out, "layer cache", "output " + std::to_string(t), vec(ev.steps[t].cached_output, 9), layer_spec[t]);
    add(out, "layer cache", "output " + std::to_string(t) + " = full prefix within 1e-12",
        ev.steps[t].max_abs_difference <= 1e-12 ? "yes" : "no", "yes");
  }
  add(out, "layer cache", "projection rows full/incremental/reused",
      std::to_string(ev.full_prefix_rows) + "/" + std::to_string(ev.incremental_rows) + "/" +
          std::to_string(ev.reused_rows),
      "6/3/3");
  return out;
}

std::string spec_table(const std::vector<SpecLine>& lines) {
  std::size_t w0 = 7, w1 = 8, w2 = 8;
  for (const auto& l : lines) {
    w0 = std::max(w0, l.section.size());
    w1 = std::max(w1, l.quantity.size());
    w2 = std::max(w2, l.computed.size());
  }
  auto pad = [](const std::string& s, std::size_t w) { return s + std::string(w - s.size(), ' '); };
  std::ostringstream os;
  os << pad("section", w0) << "  " << pad("quantity", w1) << "  " << pad("computed", w2) << "  golden\n";
  os << std::string(w0 + w1 + w2 + 16, '-') << "\n";
  int matched = 0;
  for (const auto& l : lines) {
    os << pad(l.section, w0) << "  " << pad(l.quantity, w1) << "  " << pad(l.computed, w2) << "  "
       << (l.match ? "= " : "!= ") << l.spec << "\n";
    matched += l.match ? 1 : 0;
  }
  os << matched << "/" << lines.size() << " golden values (docs/semantics.md) reproduced by the reference model\n";
  return os.str();
}

}  // namespace kvcheck::model
