// HTML report writer. Coordinates are printed with std::to_chars (locale
// independent, fixed two decimals) so the page is byte-stable.
#include "reports/report_html.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <map>
#include <numbers>
#include <string>
#include <tuple>
#include <vector>

#include "reports/report_text.hpp"
#include "reports/xml_escape.hpp"

namespace kvcheck::reports {
namespace {

using detail::xml_escape;
using properties::QueryObservation;
using properties::ReadTag;
using properties::RunObservation;
using properties::StepObservation;

// Runs pictured when none failed, and at most when many failed (the summary
// table still lists every run).
constexpr std::size_t kPassingRunsPictured = 3;
constexpr std::size_t kFailingRunsPictured = 50;
// Rings larger than this are drawn as runs of equally coloured slots.
constexpr std::int64_t kMaxSlotElements = 1024;
// Rings up to this size get a position label inside every slot.
constexpr std::int64_t kMaxLabelledSlots = 160;
// Shared prefixes listed per run.
constexpr std::size_t kPrefixesListed = 32;
// Steps listed per run table (failing steps are always listed, up to this many).
constexpr std::size_t kStepsListed = 100;
// Bars drawn per chart.
constexpr std::size_t kMaxBars = 64;

std::string num(double v) {
  char buffer[64];
  const auto r = std::to_chars(buffer, buffer + sizeof buffer, v, std::chars_format::fixed, 2);
  std::string s(buffer, r.ptr);
  // Trim "12.50" -> "12.5", "12.00" -> "12" to keep the SVG small.
  while (!s.empty() && s.back() == '0') s.pop_back();
  if (!s.empty() && s.back() == '.') s.pop_back();
  if (s == "-0") s = "0";
  return s;
}

// What a slot holds, judged against the pictured query (docs/semantics.md "What is judged").
enum class SlotClass { kVisible, kOverwritten, kExtra, kStale, kEmpty, kHeld };

const char* class_name(SlotClass c) {
  switch (c) {
    case SlotClass::kVisible: return "visible";
    case SlotClass::kOverwritten: return "overwritten";
    case SlotClass::kExtra: return "extra";
    case SlotClass::kStale: return "stale";
    case SlotClass::kEmpty: return "empty";
    case SlotClass::kHeld: return "held";
  }
  return "empty";
}

const char* class_colour(SlotClass c) {
  switch (c) {
    case SlotClass::kVisible: return "#4caf50";
    case SlotClass::kOverwritten: return "#e53935";
    case SlotClass::kExtra: return "#8e24aa";
    case SlotClass::kStale: return "#f0c36d";
    case SlotClass::kEmpty: return "#e0e0e0";
    case SlotClass::kHeld: return "#90caf9";
  }
  return "#e0e0e0";
}

const char* class_legend(SlotClass c) {
  switch (c) {
    case SlotClass::kVisible: return "visible row, correct";
    case SlotClass::kOverwritten: return "visible row overwritten";
    case SlotClass::kExtra: return "extra read (not visible)";
    case SlotClass::kStale: return "stale / out of window";
    case SlotClass::kEmpty: return "empty";
    case SlotClass::kHeld: return "holds a row (no query)";
  }
  return "";
}

struct Slot {
  std::int64_t held = -1;      // position held (-1 empty, -2 another request, -3 unknown)
  std::int64_t expected = -1;  // visible position the query wanted here, if overwritten
  bool read = false;           // read by the pictured query
  SlotClass cls = SlotClass::kEmpty;
};

std::int64_t floor_mod(std::int64_t a, std::int64_t m) {
  const std::int64_t r = a % m;
  return r < 0 ? r + m : r;
}

// The slots of one state's block, held sparsely: the slots whose contents
// the step recorded (rings up to 512 rows) and the slots the pictured query
// read or lost; every other slot is unknown, drawn as empty. A trace's
// capacity may be 2^40 - 1 rows while it touched a handful: the picture
// costs what was touched, never the capacity.
struct RingSlots {
  std::int64_t rows = 1;
  std::map<std::int64_t, Slot> touched;

  static Slot unknown() {
    Slot s;
    s.held = -3;
    return s;
  }
  Slot at(std::int64_t i) const {
    const auto it = touched.find(i);
    return it == touched.end() ? unknown() : it->second;
  }
  Slot& slot(std::int64_t i) { return touched.try_emplace(i, unknown()).first->second; }
};

// Classifies the slots of the step's state block for query `q` (may be null).
// Read slots are judged by the tag they held at the read; the others by the
// ring contents after the step.
RingSlots classify_ring(const StepObservation& step, const QueryObservation* q, std::int64_t ring_rows) {
  RingSlots ring;
  ring.rows = ring_rows;
  const auto recorded = std::min(ring_rows, static_cast<std::int64_t>(step.ring_positions.size()));
  for (std::int64_t i = 0; i < recorded; ++i)
    ring.slot(i).held = step.ring_positions[static_cast<std::size_t>(i)];
  const auto visible = [&](std::int64_t p) {
    return q != nullptr && p >= q->visible_first && p <= q->position;
  };
  for (auto& [i, s] : ring.touched) {
    if (s.held == -1 || s.held == -3) {
      s.cls = SlotClass::kEmpty;
    } else if (q == nullptr) {
      s.cls = s.held >= 0 ? SlotClass::kHeld : SlotClass::kStale;
    } else {
      s.cls = s.held >= 0 && visible(s.held) ? SlotClass::kVisible : SlotClass::kStale;
    }
  }
  if (q == nullptr) return ring;

  // The block is slots [state * S, state * S + S) (the oracle's layout);
  // reads outside it are extra reads and show in the tables, not the ring.
  std::int64_t base = 0;
  const bool in_range = !__builtin_mul_overflow(step.state, ring_rows, &base);
  // Extra reads as a sorted set: a forged read list may hold millions.
  const auto tag_less = [](const ReadTag& a, const ReadTag& b) {
    return std::tie(a.slot, a.request, a.position, a.write_seq) <
           std::tie(b.slot, b.request, b.position, b.write_seq);
  };
  std::vector<ReadTag> extras = q->extra;
  std::sort(extras.begin(), extras.end(), tag_less);
  for (const ReadTag& r : q->reads) {
    if (!in_range || r.slot < base || r.slot - base >= ring_rows) continue;
    Slot& s = ring.slot(r.slot - base);
    s.read = true;
    s.held = r.request < 0 ? -1 : (r.request != step.request ? -2 : r.position);
    const bool is_extra = std::binary_search(extras.begin(), extras.end(), r, tag_less);
    if (r.request == step.request && visible(r.position)) {
      s.cls = SlotClass::kVisible;
    } else if (is_extra) {
      s.cls = SlotClass::kExtra;
    } else {
      s.cls = SlotClass::kOverwritten;
    }
  }
  // An overwritten position p is one whose oracle slot (p mod S in the block)
  // held another row, or a stale write of p, when read (properties/runner.cpp).
  // Mark that slot even when the row it held is visible for another query
  // position (S < W) or carries p with an old write_seq: p was lost there.
  for (const std::int64_t p : q->overwritten) {
    Slot& s = ring.slot(floor_mod(p, ring_rows));
    s.cls = SlotClass::kOverwritten;
    s.expected = p;
  }
  return ring;
}

// Runs of equal class around the ring, [first, end) each, from the touched
// slots alone (every slot between two touched ones is unknown: empty).
struct SlotRun {
  std::int64_t first = 0, end = 0;
  SlotClass cls = SlotClass::kEmpty;
};

std::vector<SlotRun> slot_runs(const RingSlots& ring) {
  std::vector<SlotRun> runs;
  const auto add = [&runs](std::int64_t first, std::int64_t end, SlotClass cls) {
    if (first >= end) return;
    if (!runs.empty() && runs.back().cls == cls && runs.back().end == first) {
      runs.back().end = end;
    } else {
      runs.push_back({first, end, cls});
    }
  };
  std::int64_t next = 0;  // the first slot not yet in a run
  for (const auto& [i, s] : ring.touched) {
    add(next, i, SlotClass::kEmpty);
    add(i, i + 1, s.cls);
    next = i + 1;
  }
  add(next, ring.rows, SlotClass::kEmpty);
  return runs;
}

std::string held_label(std::int64_t held) {
  if (held == -2) return "\u00d7";  // another request's row
  if (held < 0) return "";
  return std::to_string(held);
}

// Annular sector from angle a0 to a1 (radians, 0 = up, clockwise).
std::string sector_path(double cx, double cy, double r_in, double r_out, double a0, double a1) {
  const auto x = [&](double r, double a) { return num(cx + r * std::sin(a)); };
  const auto y = [&](double r, double a) { return num(cy - r * std::cos(a)); };
  const int large = (a1 - a0) > std::numbers::pi ? 1 : 0;
  std::string d = "M" + x(r_out, a0) + "," + y(r_out, a0);
  d += "A" + num(r_out) + "," + num(r_out) + " 0 " + std::to_string(large) + " 1 " + x(r_out, a1) + "," +
       y(r_out, a1);
  d += "L" + x(r_in, a1) + "," + y(r_in, a1);
  d += "A" + num(r_in) + "," + num(r_in) + " 0 " + std::to_string(large) + " 0 " + x(r_in, a0) + "," +
       y(r_in, a0);
  return d + "Z";
}

std::string ring_svg(const RunObservation& run, const StepObservation& step, std::int64_t query_index) {
  const std::int64_t ring_rows = step.ring_positions.empty()
                                     ? std::max<std::int64_t>(run.ring_rows, 1)
                                     : static_cast<std::int64_t>(step.ring_positions.size());
  const QueryObservation* q =
      query_index >= 0 ? &step.queries[static_cast<std::size_t>(query_index)] : nullptr;
  const RingSlots slots = classify_ring(step, q, ring_rows);

  constexpr double kCx = 330, kCy = 300, kOut = 250, kIn = 185;  // left margin for "slot N" ticks
  constexpr double kTau = 2 * std::numbers::pi;
  const double width = kTau / static_cast<double>(ring_rows);
  const double gap = ring_rows <= kMaxSlotElements ? std::min(width * 0.08, 0.01) : 0;

  std::string svg =
      "<svg class=\"ring\" width=\"880\" height=\"600\" "
      "viewBox=\"0 0 880 600\" role=\"img\">\n";
  svg += "<title>ring of " + std::to_string(ring_rows) + " slots, state " + std::to_string(step.state) +
         "</title>\n";

  if (ring_rows <= kMaxSlotElements) {
    for (std::int64_t i = 0; i < ring_rows; ++i) {
      const Slot s = slots.at(i);
      const double a0 = width * static_cast<double>(i) + gap / 2;
      const double a1 = width * static_cast<double>(i + 1) - gap / 2;
      std::string tip =
          "slot " + std::to_string(step.state * ring_rows + i) + " (ring " + std::to_string(i) + "): ";
      tip += s.held == -1   ? "empty"
             : s.held == -2 ? "another request's row"
             : s.held == -3 ? "unknown"
                            : "position " + std::to_string(s.held);
      if (s.expected >= 0) tip += "; query needed position " + std::to_string(s.expected);
      if (s.read) tip += "; read";
      svg += "<path class=\"slot " + std::string(class_name(s.cls)) + "\" d=\"" +
             sector_path(kCx, kCy, kIn, kOut, a0, a1) + "\" fill=\"" + class_colour(s.cls) + "\"";
      svg += s.read ? " stroke=\"#222\" stroke-width=\"1.2\"" : " stroke=\"#fff\" stroke-width=\"0.5\"";
      svg += "><title>" + xml_escape(tip) + "</title></path>\n";
    }
  } else {
    // Too many slots to draw one by one: one arc per run of equal classes.
    for (const SlotRun& run_of : slot_runs(slots)) {
      svg += "<path class=\"slots " + std::string(class_name(run_of.cls)) + "\" d=\"" +
             sector_path(kCx, kCy, kIn, kOut, width * static_cast<double>(run_of.first),
                         width * static_cast<double>(run_of.end)) +
             "\" fill=\"" + class_colour(run_of.cls) + "\"><title>ring slots " +
             std::to_string(run_of.first) + ".." + std::to_string(run_of.end - 1) + ": " +
             class_legend(run_of.cls) + "</title></path>\n";
    }
  }

  // Labels: the position each slot holds, written along the radius so that
  // up to ~160 slots stay legible; larger rings label only overwritten slots.
  const double mid = (kIn + kOut) / 2;
  const double arc = width * mid;
  const double font = std::clamp(arc * 0.75, 5.0, 14.0);
  const bool inside = ring_rows <= kMaxLabelledSlots;
  const auto label_slot = [&](std::int64_t i, const Slot& s) {
    if (!inside && s.cls != SlotClass::kOverwritten) return;
    const std::string label = held_label(s.held);
    if (label.empty()) return;
    const double a = width * (static_cast<double>(i) + 0.5);
    double deg = a * 180 / std::numbers::pi - 90;  // text runs outward along the radius
    const bool flip = deg > 90;                    // left half: keep the text upright
    if (flip) deg -= 180;
    const double r = inside ? mid : kOut + 6;
    const std::string anchor = inside ? "middle" : (flip ? "end" : "start");
    const double size = inside ? font : 8;
    svg += "<text class=\"label\" x=\"" + num(kCx + r * std::sin(a)) + "\" y=\"" +
           num(kCy - r * std::cos(a)) + "\" font-size=\"" + num(size) + "\" text-anchor=\"" + anchor +
           "\" dominant-baseline=\"central\" transform=\"rotate(" + num(deg) + " " +
           num(kCx + r * std::sin(a)) + " " + num(kCy - r * std::cos(a)) + ")\"" +
           (s.cls == SlotClass::kOverwritten || s.cls == SlotClass::kExtra
                ? " fill=\"#fff\" font-weight=\"bold\""
                : "") +
           ">" + xml_escape(label) + "</text>\n";
  };
  if (inside) {
    for (std::int64_t i = 0; i < ring_rows; ++i) label_slot(i, slots.at(i));
  } else {
    for (const auto& [i, s] : slots.touched) label_slot(i, s);
  }

  // Slot index ticks at eight points around the ring (ring-relative index).
  const std::int64_t tick_every = std::max<std::int64_t>(1, (ring_rows + 7) / 8);
  for (std::int64_t i = 0; i < ring_rows; i += tick_every) {
    const double a = width * static_cast<double>(i);
    const double r = kOut + (ring_rows > kMaxLabelledSlots ? 30 : 12);
    // Anchor away from the ring so side labels do not run into it.
    const double side = std::sin(a);
    const char* anchor = side > 0.3 ? "start" : side < -0.3 ? "end" : "middle";
    svg += "<line x1=\"" + num(kCx + kOut * std::sin(a)) + "\" y1=\"" + num(kCy - kOut * std::cos(a)) +
           "\" x2=\"" + num(kCx + (kOut + 8) * std::sin(a)) + "\" y2=\"" +
           num(kCy - (kOut + 8) * std::cos(a)) + "\" stroke=\"#555\"/>\n";
    svg += "<text class=\"tick\" x=\"" + num(kCx + r * std::sin(a)) + "\" y=\"" + num(kCy - r * std::cos(a)) +
           "\" font-size=\"10\" fill=\"#555\" text-anchor=\"" + anchor +
           "\" dominant-baseline=\"central\">slot " + std::to_string(i) + "</text>\n";
  }

  // Centre: what is pictured.
  std::vector<std::string> lines;
  lines.push_back("step " + std::to_string(step.step) + " \u00b7 " + step.kind);
  lines.push_back("state " + std::to_string(step.state) + ", S = " + std::to_string(ring_rows));
  if (q != nullptr) {
    lines.push_back("query at position " + std::to_string(q->position));
    lines.push_back("visible " + std::to_string(q->visible_first) + ".." + std::to_string(q->position));
    lines.push_back(std::to_string(q->overwritten.size()) + " overwritten, " +
                    std::to_string(q->missing.size()) + " missing, " + std::to_string(q->extra.size()) +
                    " extra");
  } else {
    lines.push_back("no query in this step");
  }
  // The runner records ring contents only for small rings; then only the
  // slots this query read are known.
  if (step.ring_positions.empty()) lines.push_back("(ring not recorded: read slots only)");
  double y = kCy - 9.0 * static_cast<double>(lines.size() - 1);
  for (std::size_t i = 0; i < lines.size(); ++i, y += 18) {
    svg += "<text x=\"" + num(kCx) + "\" y=\"" + num(y) + "\" font-size=\"" + (i == 2 ? "15" : "13") +
           "\" text-anchor=\"middle\"" + (i == 2 ? " font-weight=\"bold\"" : "") + ">" +
           xml_escape(lines[i]) + "</text>\n";
  }

  // Legend.
  double ly = 40;
  svg += "<text x=\"680\" y=\"" + num(ly) + "\" font-size=\"13\" font-weight=\"bold\">slot holds</text>\n";
  const SlotClass legend[] = {SlotClass::kVisible, SlotClass::kOverwritten, SlotClass::kExtra,
                              SlotClass::kStale, SlotClass::kEmpty};
  for (const SlotClass c : legend) {
    ly += 24;
    svg += "<rect x=\"680\" y=\"" + num(ly - 8) + "\" width=\"16\" height=\"16\" fill=\"" + class_colour(c) +
           "\" stroke=\"#999\" stroke-width=\"0.5\"/><text x=\"704\" y=\"" + num(ly) +
           "\" font-size=\"12\" dominant-baseline=\"central\">" + class_legend(c) + "</text>\n";
  }
  ly += 24;
  svg += "<rect x=\"680\" y=\"" + num(ly - 8) +
         "\" width=\"16\" height=\"16\" fill=\"#fff\" stroke=\"#222\" stroke-width=\"1.2\"/><text x=\"704\" "
         "y=\"" +
         num(ly) + "\" font-size=\"12\" dominant-baseline=\"central\">read by this query</text>\n";
  ly += 30;
  const char* notes[] = {"labels: position held", "\u00d7: another request's row",
                         "read slots: tag at the read", "others: ring after the step"};
  for (const char* n : notes) {
    svg +=
        "<text x=\"680\" y=\"" + num(ly) + "\" font-size=\"11\" fill=\"#555\">" + xml_escape(n) + "</text>\n";
    ly += 16;
  }
  svg += "</svg>\n";
  return svg;
}

std::string bar_chart_svg(const StepObservation& step, std::int64_t focus) {
  const std::size_t n = std::min(step.queries.size(), kMaxBars);
  std::int64_t max_count = 1;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& q = step.queries[i];
    max_count =
        std::max<std::int64_t>(max_count, static_cast<std::int64_t>(q.overwritten.size() + q.missing.size()));
  }
  const double bar = n <= 8 ? 48 : n <= 32 ? 20 : 10;
  const double left = 44, top = 30, plot_h = 180;
  const double w = left + bar * static_cast<double>(n) + 20;
  const double h = top + plot_h + 50;
  std::string svg = "<svg class=\"bars\" width=\"" + num(std::max(w, 460.0)) + "\" height=\"" + num(h) +
                    "\" viewBox=\"0 0 " + num(std::max(w, 460.0)) + " " + num(h) + "\" role=\"img\">\n";
  svg += "<text x=\"" + num(left) +
         "\" y=\"16\" font-size=\"13\" font-weight=\"bold\">overwritten (red) and missing "
         "(orange) rows per query</text>\n";
  // Axis with ticks at 0, max/2, max.
  svg += "<line x1=\"" + num(left) + "\" y1=\"" + num(top) + "\" x2=\"" + num(left) + "\" y2=\"" +
         num(top + plot_h) + "\" stroke=\"#555\"/>\n";
  svg += "<line x1=\"" + num(left) + "\" y1=\"" + num(top + plot_h) + "\" x2=\"" + num(w - 10) + "\" y2=\"" +
         num(top + plot_h) + "\" stroke=\"#555\"/>\n";
  for (const std::int64_t t : {std::int64_t{0}, max_count / 2, max_count}) {
    const double ty = top + plot_h - plot_h * static_cast<double>(t) / static_cast<double>(max_count);
    svg += "<text x=\"" + num(left - 6) + "\" y=\"" + num(ty) +
           "\" font-size=\"10\" text-anchor=\"end\" dominant-baseline=\"central\">" + std::to_string(t) +
           "</text>\n";
  }
  const std::size_t label_every = n <= 16 ? 1 : (n + 15) / 16;
  for (std::size_t i = 0; i < n; ++i) {
    const auto& q = step.queries[i];
    const double x = left + bar * static_cast<double>(i) + bar * 0.15;
    const double bw = bar * 0.7;
    const auto over = static_cast<double>(q.overwritten.size());
    const auto miss = static_cast<double>(q.missing.size());
    const double oh = plot_h * over / static_cast<double>(max_count);
    const double mh = plot_h * miss / static_cast<double>(max_count);
    const bool is_focus = static_cast<std::int64_t>(i) == focus;
    const std::string stroke = is_focus ? " stroke=\"#222\" stroke-width=\"1.5\"" : "";
    svg += "<rect class=\"bar\" x=\"" + num(x) + "\" y=\"" + num(top + plot_h - oh) + "\" width=\"" +
           num(bw) + "\" height=\"" + num(oh) + "\" fill=\"#e53935\"" + stroke + "><title>query " +
           std::to_string(q.position) + ": " + std::to_string(q.overwritten.size()) +
           " overwritten</title></rect>\n";
    if (miss > 0) {
      svg += "<rect x=\"" + num(x) + "\" y=\"" + num(top + plot_h - oh - mh) + "\" width=\"" + num(bw) +
             "\" height=\"" + num(mh) + "\" fill=\"#fb8c00\"><title>query " + std::to_string(q.position) +
             ": " + std::to_string(q.missing.size()) + " missing</title></rect>\n";
    }
    if (bar >= 20) {
      svg += "<text x=\"" + num(x + bw / 2) + "\" y=\"" + num(top + plot_h - oh - mh - 4) +
             "\" font-size=\"10\" text-anchor=\"middle\">" +
             std::to_string(q.overwritten.size() + q.missing.size()) + "</text>\n";
    }
    if (i % label_every == 0) {
      svg += "<text x=\"" + num(x + bw / 2) + "\" y=\"" + num(top + plot_h + 14) +
             "\" font-size=\"10\" text-anchor=\"middle\"" + (is_focus ? " font-weight=\"bold\"" : "") + ">" +
             std::to_string(q.position) + "</text>\n";
    }
  }
  svg += "<text x=\"" + num(left + bar * static_cast<double>(n) / 2) + "\" y=\"" + num(top + plot_h + 34) +
         "\" font-size=\"11\" text-anchor=\"middle\" fill=\"#555\">query position" +
         (step.queries.size() > n
              ? " (first " + std::to_string(n) + " of " + std::to_string(step.queries.size()) + ")"
              : std::string()) +
         "</text>\n";
  svg += "</svg>\n";
  return svg;
}

// Block tables listed per page section, entries per table, lifetimes listed.
constexpr std::size_t kTablesListed = 16;
constexpr std::size_t kEntriesListed = 64;
constexpr std::size_t kLifetimesListed = 64;

// A paged run at its pictured step: every request's block table (logical
// block -> physical block), coloured for the pictured query, and the
// lifetimes of the blocks (reports/report.hpp, PagedView).
std::string paged_html(const RunObservation& run, std::int64_t step_index, std::int64_t focus) {
  const PagedView view = paged_view(run, step_index);
  const auto& step = run.steps[static_cast<std::size_t>(step_index)];
  const QueryObservation* q = focus >= 0 ? &step.queries[static_cast<std::size_t>(focus)] : nullptr;
  const std::int64_t b = view.block_size;
  std::string out = "<p>Block tables of layer " + std::to_string(view.layer) + " after step " +
                    std::to_string(view.through_step) + " (" + xml_escape(step.kind) + "), blocks of " +
                    std::to_string(b) + " rows, pool of " + std::to_string(run.pool_blocks) + " blocks" +
                    (q != nullptr ? ", coloured for the read of query " + std::to_string(q->position) +
                                        " of request " + std::to_string(step.request)
                                  : std::string()) +
                    ": " + xml_escape(paged_counts_text(view)) + ".</p>\n";
  out += "<table class=\"block-tables\">\n<tr><th>request</th><th>logical block \u2192 physical block</th></tr>\n";
  std::size_t tables = 0;
  for (const auto& table : view.tables) {
    if (tables++ == kTablesListed) {
      out += "<tr><td colspan=\"2\">\u2026 " + std::to_string(view.tables.size() - kTablesListed) +
             " more requests</td></tr>\n";
      break;
    }
    out += "<tr><td>" + std::to_string(table.request) + "</td><td class=\"mono\">";
    for (std::size_t i = 0; i < table.entries.size() && i < kEntriesListed; ++i) {
      const auto& e = table.entries[i];
      const std::int64_t lo = e.logical * b, hi = lo + b - 1;
      SlotClass cls = e.held ? SlotClass::kHeld : SlotClass::kEmpty;
      if (q != nullptr && table.request == step.request) {
        const bool seen = hi >= q->visible_first && lo <= q->position;
        cls = seen ? SlotClass::kVisible : (e.held ? SlotClass::kStale : SlotClass::kEmpty);
        for (const std::int64_t p : q->overwritten)
          if (p >= lo && p <= hi) cls = SlotClass::kOverwritten;
        for (const std::int64_t p : q->missing)
          if (p >= lo && p <= hi) cls = SlotClass::kOverwritten;
      }
      const std::string tip = "positions " + std::to_string(lo) + ".." + std::to_string(hi) + " in block " +
                              std::to_string(e.physical) + (e.held ? "" : "; the block was written again since");
      out += "<span class=\"block " + std::string(class_name(cls)) +
             "\" style=\"display:inline-block;padding:0 4px;margin:1px;border-radius:3px;background:" +
             class_colour(cls) + "\" title=\"" + xml_escape(tip) + "\">" + std::to_string(e.logical) + "\u2192" +
             std::to_string(e.physical) + (e.held ? "" : "\u00d7") + "</span> ";
    }
    if (table.entries.size() > kEntriesListed)
      out += "\u2026 " + std::to_string(table.entries.size() - kEntriesListed) + " more";
    out += "</td></tr>\n";
  }
  out += "</table>\n<p class=\"context\">green: holds rows the query sees; red: holds a row it lost; yellow: "
         "held, out of its window; blue: held by another request; grey \u00d7: written again since.</p>\n";
  out += "<table class=\"block-lifetimes\">\n<tr><th>block</th><th>request</th><th>logical block</th>"
         "<th>first written</th><th>last used</th><th>then</th></tr>\n";
  for (std::size_t i = 0; i < view.lifetimes.size() && i < kLifetimesListed; ++i) {
    const auto& t = view.lifetimes[i];
    const std::string then =
        t.ended_step < 0 ? std::string("still held")
                         : "step " + std::to_string(t.ended_step) + ": request " + std::to_string(t.next_request) +
                               "'s block " + std::to_string(t.next_logical);
    out += std::string("<tr") + (t.ended_step >= 0 && t.next_request != t.request ? " class=\"reused\"" : "") +
           "><td>" + std::to_string(t.block) + "</td><td>" + std::to_string(t.request) + "</td><td>" +
           std::to_string(t.logical) + "</td><td>" + std::to_string(t.first_written_step) + "</td><td>" +
           std::to_string(t.last_used_step) + "</td><td>" + xml_escape(then) + "</td></tr>\n";
  }
  if (view.lifetimes.size() > kLifetimesListed)
    out += "<tr><td colspan=\"6\">\u2026 " + std::to_string(view.lifetimes.size() - kLifetimesListed) +
           " more (see the JSON report)</td></tr>\n";
  return out + "</table>\n";
}

std::string badge(bool passed) {
  return passed ? "<span class=\"badge pass\">PASS</span>" : "<span class=\"badge fail\">FAIL</span>";
}

std::string steps_table(const RunObservation& run, std::int64_t pictured) {
  std::string out =
      "<table class=\"steps\">\n<tr><th>step</th><th>kind</th><th>layer</th><th>request</th>"
      "<th>state</th><th>first position</th><th>queries</th><th>overwritten per query</th>"
      "<th>missing</th><th>extra</th><th>collisions<br>same / outside / replaced</th>"
      "<th>max eps</th><th>note</th></tr>\n";
  std::size_t listed = 0, failing_listed = 0, omitted = 0;
  for (std::size_t i = 0; i < run.steps.size(); ++i) {
    const auto& s = run.steps[i];
    const bool failed = step_failed(s);
    const bool show = static_cast<std::int64_t>(i) == pictured ||
                      (failed ? failing_listed < kStepsListed : listed < kStepsListed);
    if (!show) {
      ++omitted;
      continue;
    }
    (failed ? failing_listed : listed) += 1;
    // The step's counts as the text gives them: the largest output error
    // over the queries that read correctly; none such: "not judged".
    const StepCounts counts = step_counts(s);
    const std::string max_eps = counts.worst_query >= 0 ? format_double(counts.max_eps_units)
                                : s.queries.empty()     ? std::string()
                                                        : std::string("not judged");
    std::string note = s.error.empty() ? std::string() : "refusal: " + s.error;
    if (const auto* prefix = prefix_begun_at(run, s); prefix != nullptr)
      note += (note.empty() ? "" : "; ") + prefix_text(*prefix);
    if (s.expectation_failed) note += (note.empty() ? "" : "; ") + ("expectation: " + s.expectation_detail);
    if (const std::string resident = resident_text(s); !resident.empty()) note += (note.empty() ? "" : "; ") + resident;
    const std::string cls = static_cast<std::int64_t>(i) == pictured ? " class=\"pictured\""
                            : failed                                 ? " class=\"failed\""
                                                                     : "";
    out += "<tr" + cls + "><td>" + std::to_string(s.step) + "</td><td>" + xml_escape(s.kind) +
           (s.order.empty() ? "" : " <small>" + xml_escape(s.order) + "</small>") + "</td><td>" +
           std::to_string(s.layer) + "</td><td>" + std::to_string(s.request) + "</td><td>" +
           std::to_string(s.state) + "</td><td>" + std::to_string(s.first_position) + "</td><td>" +
           std::to_string(s.queries.size()) + "</td><td class=\"mono\">" + xml_escape(overwritten_counts(s)) +
           "</td><td>" + std::to_string(counts.missing) + "</td><td>" + std::to_string(counts.extra) +
           "</td><td>" + std::to_string(s.collisions.same_step) + " / " +
           std::to_string(s.collisions.outside_block) + " / " + std::to_string(s.collisions.replaced_needed) +
           (s.collisions.other_layer > 0 ? " / " + std::to_string(s.collisions.other_layer) + " other-layer"
                                         : "") +
           "</td><td>" + xml_escape(max_eps) + "</td><td>" + xml_escape(note) + "</td></tr>\n";
  }
  if (omitted != 0) {
    out += "<tr><td colspan=\"13\">\u2026 " + std::to_string(omitted) +
           " more steps (see the JSON report)</td></tr>\n";
  }
  return out + "</table>\n";
}

constexpr const char* kStyle =
    R"(body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1200px;padding:0 16px;color:#222}
h1{font-size:22px}h2{font-size:18px;margin-top:32px;border-bottom:1px solid #ddd;padding-bottom:4px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}th,td{border:1px solid #ccc;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f3f3f3}tr.failed td{background:#fdecea}tr.pictured td{background:#f9c9c4}
.badge{display:inline-block;padding:1px 7px;border-radius:4px;font-weight:bold;font-size:12px;color:#fff}
.pass{background:#2e7d32}.fail{background:#c62828}.mono,code,pre{font-family:ui-monospace,Menlo,Consolas,monospace}
pre{background:#f6f6f6;padding:8px;overflow-x:auto;font-size:12px}.figs{display:flex;flex-wrap:wrap;gap:16px;align-items:flex-start}
.context{color:#555}svg text{font-family:system-ui,sans-serif}svg .label{font-family:ui-monospace,Menlo,monospace}
)";

}  // namespace

// The runs table, the check's section and the pictured runs of `report`
// (the page's own, or one part's): headings `h`, run anchors `anchor` + index.
std::string runs_and_check_html(const Report& report, const std::string& h, const std::string& anchor) {
  std::string out;
  // The counts first: what ran, what was refused or skipped, what was not
  // output-checked (a verdict names what it looked at).
  // (a check's own counts head its section below).
  if (!report.check)
    out += "<p class=\"counts\">" + xml_escape(run_counts_text(run_counts(report))) + "</p>\n";
  // Summary table.
  out +=
      "<" + h + ">Runs</" + h + ">\n<table "
      "class=\"runs\">\n<tr><th>verdict</th><th>scenario</th><th>backend</th><th>fault</th>"
      "<th>window</th><th>S</th><th>format</th><th>steps</th><th>queries</th><th>lost rows</th><th>extra "
      "reads</th>"
      "<th>collisions</th><th>output failures</th><th>max eps</th><th>first failure</th></tr>\n";
  std::vector<std::size_t> pictured;
  for (std::size_t i = 0; i < report.runs.size(); ++i) {
    if (!report.runs[i].passed && pictured.size() < kFailingRunsPictured) pictured.push_back(i);
  }
  if (pictured.empty()) {
    for (std::size_t i = 0; i < report.runs.size() && i < kPassingRunsPictured; ++i) pictured.push_back(i);
  }
  for (std::size_t i = 0; i < report.runs.size(); ++i) {
    const auto& r = report.runs[i];
    const bool linked = std::find(pictured.begin(), pictured.end(), i) != pictured.end();
    const std::string name = xml_escape(r.scenario_name);
    const std::string verdict =
        r.skipped ? std::string("<span class=\"badge\">SKIP</span>") : badge(r.passed);
    out += std::string("<tr") + (r.passed ? "" : " class=\"failed\"") + "><td>" + verdict + "</td><td>" +
           (linked ? "<a href=\"#" + anchor + std::to_string(i) + "\">" + name + "</a>" : name) + "</td><td>" +
           xml_escape(r.backend) + "</td><td>" + xml_escape(r.fault) + "</td><td>" +
           std::to_string(r.window) + " " + xml_escape(r.window_convention) +
           (r.layer_window_keys.empty() ? std::string() : "<br>layers " + xml_escape(layer_windows_text(r))) +
           "</td><td>" +
           std::to_string(r.ring_rows) + "</td><td>" +
           xml_escape(r.format + (r.output_format.empty() ? "" : ", outputs " + r.output_format)) + "</td><td>" +
           std::to_string(steps_observed(r)) + "</td><td>" + std::to_string(r.queries) + "</td><td>" +
           std::to_string(r.lost_rows) + "</td><td>" + std::to_string(r.extra_reads) + "</td><td>" +
           std::to_string(r.collisions) + "</td><td>" + std::to_string(r.output_failures) + "</td><td>" +
           xml_escape(format_double(r.max_eps_units)) + "</td><td>" +
           xml_escape(r.skipped ? r.skip_reason : r.first_failure) + "</td></tr>\n";
  }
  out += "</table>\n";

  if (report.check) {
    const auto& c = *report.check;
    out += "<" + h + ">Property check " + badge(c.passed()) + "</" + h + ">\n<p>" + xml_escape(check_counts_text(c)) +
           ".</p>\n";
    if (c.side_by_side) {
      out += "<p class=\"side-by-side\">" + xml_escape(side_by_side_text(*c.side_by_side)) + ".</p>\n";
      if (!c.side_by_side->differences.empty()) {
        out += "<ul class=\"differences\">\n";
        for (const auto& d : c.side_by_side->differences) out += "<li>" + xml_escape(d) + "</li>\n";
        out += "</ul>\n";
      }
    }
    if (!c.coverage.empty()) {
      out +=
          "<table class=\"coverage\">\n<tr><th>coverage "
          "class</th><th>cases</th><th>minimum</th><th></th></tr>\n";
      for (const auto& k : c.coverage) {
        out += std::string("<tr") + (k.met() ? "" : " class=\"failed\"") + "><td>" + xml_escape(k.name) +
               "</td><td>" + std::to_string(k.count) + "</td><td>" + std::to_string(k.minimum) + "</td><td>" +
               badge(k.met()) + "</td></tr>\n";
      }
      out += "</table>\n";
    }
    if (!c.counterexample_file.empty()) {
      out += "<p>counterexample: <code>" + xml_escape(c.counterexample_file) + "</code></p>\n";
    }
    if (c.shows_failing_case_seed())
      out += "<p>failing case seed: <code>" + std::to_string(c.failing_case_seed) + "</code></p>\n";
    if (c.depends_on_earlier) {
      out += "<p class=\"failed\">" +
             xml_escape(earlier_cases_text(*c.depends_on_earlier, c.failing_case_seed)) + "</p>\n";
      if (!c.depends_on_earlier->reproduced)
        out += "<p>first failure in its process: " + xml_escape(c.depends_on_earlier->first_failure_there) +
               "</p>\n";
    }
    if (!c.replay_command.empty())
      out += "<p>replay: <code>" + xml_escape(c.replay_command) + "</code></p>\n";
  }

  for (const std::size_t i : pictured) {
    const auto& r = report.runs[i];
    out += "<section class=\"run\" id=\"" + anchor + std::to_string(i) + "\">\n<" + h + ">" + badge(r.passed) +
           " " + xml_escape(r.scenario_name) + "</" + h + ">\n";
    if (!r.passed) out += "<pre>" + xml_escape(run_explanation(report, r)) + "</pre>\n";
    // The step to picture: the first failing one, else the last with queries.
    const std::int64_t step_index = pictured_step(r);
    if (step_index >= 0 && r.block_size > 0) {
      // A paged cache has no ring: its block tables and block lifetimes.
      const auto& s = r.steps[static_cast<std::size_t>(step_index)];
      const std::int64_t focus = focus_query(s);
      out += paged_html(r, step_index, focus);
      if (!s.queries.empty()) out += "<div class=\"figs\">\n" + bar_chart_svg(s, focus) + "</div>\n";
    } else if (step_index >= 0) {
      const auto& s = r.steps[static_cast<std::size_t>(step_index)];
      const std::int64_t focus = focus_query(s);
      out += "<p>Ring of state " + std::to_string(s.state) + " at " +
             (focus >= 0
                  ? "the read of query " + std::to_string(s.queries[static_cast<std::size_t>(focus)].position)
                  : std::string("the end")) +
             " in step " + std::to_string(s.step) + " (" + xml_escape(s.kind) + ").</p>\n";
      out += "<div class=\"figs\">\n" + ring_svg(r, s, focus);
      if (!s.queries.empty()) out += bar_chart_svg(s, focus);
      out += "</div>\n";
    } else {
      out += "<p>No steps were observed.</p>\n";
    }
    if (!r.prefixes.empty()) {
      // The requests that began from a shared prefix (the step table notes each at its begin).
      out += "<p>Shared prefixes:</p>\n<ul class=\"prefixes\">\n";
      for (const std::string& line : prefix_lines(r, -1, kPrefixesListed)) out += "<li>" + xml_escape(line) + "</li>\n";
      out += "</ul>\n";
    }
    out += steps_table(r, step_index);
    out += "</section>\n";
  }
  return out;
}

std::string report_html(const Report& report) {
  const auto& ctx = report.context;
  std::string out = "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n";
  out += "<title>kvcheck report: " + std::string(report.passed() ? "PASS" : "FAIL") + "</title>\n";
  out += "<style>\n" + std::string(kStyle) + "</style>\n</head>\n<body>\n";
  out += "<h1>kvcheck report " + badge(report.passed()) + "</h1>\n";
  out += "<p class=\"context\">kvcheck " + xml_escape(ctx.tool_version) + " \u00b7 backend " +
         xml_escape(ctx.backend) + " \u00b7 fault " + xml_escape(ctx.fault) + " \u00b7 seed " +
         std::to_string(ctx.seed) + " \u00b7 reference " + std::to_string(ctx.precision_bits) + " bits</p>\n";
  if (!ctx.command.empty()) out += "<p>command: <code>" + xml_escape(ctx.command) + "</code></p>\n";

  if (!report.runs.empty() || report.check || report.parts.empty())
    out += runs_and_check_html(report, "h2", "run-");
  // A command of several parts (the demo): every part the terminal printed,
  // its text, its verdict against what it is meant to show, and its own
  // check and runs pictured like the page's.
  for (std::size_t k = 0; k < report.parts.size(); ++k) {
    const ReportPart& part = report.parts[k];
    const std::string word = part_verdict(part);
    const bool good = part.as_meant();
    out += "<section class=\"part\" id=\"part-" + std::to_string(k) + "\">\n<h2>" +
           (good ? "<span class=\"badge pass\">" : "<span class=\"badge fail\">") + word + "</span> " +
           xml_escape(part.title) + "</h2>\n";
    if (part.planted_fault)
      out += "<p>A planted fault: this part is meant to fail; it shows what it should when kvcheck catches "
             "the fault.</p>\n";
    if (!part.context.command.empty())
      out += "<p>command: <code>" + xml_escape(part.context.command) + "</code></p>\n";
    if (!part.text.empty()) out += "<pre>" + xml_escape(part.text) + "</pre>\n";
    if (!part.runs.empty() || part.check)
      out += runs_and_check_html(part_report(part), "h3", "part-" + std::to_string(k) + "-run-");
    out += "</section>\n";
  }
  if (!report.parts.empty())
    out += "<p class=\"counts\">" + xml_escape(verdict_line(report)) + "</p>\n";
  out += "</body>\n</html>\n";
  return out;
}

}  // namespace kvcheck::reports
