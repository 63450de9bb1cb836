// Sweep writers: JSON, CSV, SVG heatmap, text table. Deterministic output only.
#include "sweep/sweep_output.hpp"

#include <algorithm>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kvcheck::sweep {

namespace {

using Json = nlohmann::ordered_json;

/// The allocation the heatmap and the slack columns compare with the minimum.
std::int64_t allocation(const SweepRow& row) {
  return row.has_formula ? row.formula_ring : row.seed_ring;
}

std::string list_text(const std::vector<std::int64_t>& v, std::size_t max_items) {
  std::string s = "[";
  for (std::size_t i = 0; i < v.size() && i < max_items; ++i) s += (i ? "," : "") + std::to_string(v[i]);
  if (v.size() > max_items) s += ",...";
  return s + "]";
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) {
    if (c == '"') q += '"';
    q += c;
  }
  return q + "\"";
}

std::string xml_text(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out += c;
    }
  }
  return out;
}

/// Linear blend of two 0xRRGGBB colours, t in [0, 1] as an integer fraction num/den.
std::string blend(unsigned a, unsigned b, std::int64_t num, std::int64_t den) {
  num = std::clamp<std::int64_t>(num, 0, den);
  auto ch = [&](int shift) {
    const std::int64_t x = (a >> shift) & 0xFF, y = (b >> shift) & 0xFF;
    return x + (y - x) * num / den;
  };
  char buf[8];
  std::snprintf(buf, sizeof buf, "#%02x%02x%02x", static_cast<unsigned>(ch(16)), static_cast<unsigned>(ch(8)),
                static_cast<unsigned>(ch(0)));
  return buf;
}

/// Colour of a slack: red shades below zero (unsafe), yellow at zero (tight),
/// greens above (rows allocated beyond the minimum), saturating at +-16.
std::string slack_colour(std::int64_t slack) {
  if (slack < 0) return blend(0xf4a582, 0xb2182b, -slack - 1, 15);
  if (slack == 0) return "#ffffbf";
  return blend(0xd9f0d3, 0x1b7837, slack - 1, 15);
}

const SweepRow* find_row(const SweepResult& r, std::int64_t w, std::int64_t k, std::int64_t c, SweepOrder o) {
  // Row index = ((wi * D + di) * C + ci) * O + oi.
  const auto& g = r.grid;
  const auto wi = std::find(g.windows.begin(), g.windows.end(), w) - g.windows.begin();
  const auto di = std::find(g.drafts.begin(), g.drafts.end(), k) - g.drafts.begin();
  const auto ci = std::find(g.chunks.begin(), g.chunks.end(), c) - g.chunks.begin();
  const auto oi = std::find(g.orders.begin(), g.orders.end(), o) - g.orders.begin();
  const auto idx =
      ((static_cast<std::size_t>(wi) * g.drafts.size() + static_cast<std::size_t>(di)) * g.chunks.size() +
       static_cast<std::size_t>(ci)) *
          g.orders.size() +
      static_cast<std::size_t>(oi);
  return idx < r.rows.size() ? &r.rows[idx] : nullptr;
}

}  // namespace

std::string sweep_json(const SweepResult& result) {
  Json doc;
  doc["schema_version"] = kSweepSchemaVersion;
  doc["name"] = "kvcheck-sweep";
  doc["description"] =
      "Minimum safe ring size per (window, drafts, chunk, prefill order), found by running the CPU "
      "backend with tags on worst-case schedules; safe-capacity bound (docs/semantics.md), the seed's W + k + 1 "
      "allocation and the user's formula are compared with it";
  Json grid;
  grid["windows"] = result.grid.windows;
  grid["drafts"] = result.grid.drafts;
  grid["chunks"] = result.grid.chunks;
  Json orders = Json::array();
  for (auto o : result.grid.orders) orders.push_back(order_file_name(o));
  grid["orders"] = orders;
  doc["grid"] = grid;
  doc["states"] = result.states;
  if (result.block_size > 0) {
    // A paged cache: min_safe_ring, spec_bound (ceil((m - 1) / B) + 1 blocks
    // per live request), seed_ring (check's pool per state) and the formula
    // are pools in blocks of block_size rows.
    doc["block_size"] = result.block_size;
    doc["unit"] = "blocks";
  }
  doc["formula"] = result.formula ? Json(*result.formula) : Json(nullptr);
  Json summary;
  summary["rows"] = result.rows.size();
  summary["spec_disagreements"] = result.spec_disagreements;
  summary["formula_safe_everywhere"] = result.formula ? Json(result.formula_unsafe_rows == 0) : Json(nullptr);
  summary["formula_unsafe_rows"] = result.formula_unsafe_rows;
  summary["replay_failures"] = result.replay_failures;
  summary["no_safe_rows"] = result.no_safe_rows;
  summary["unsupported_rows"] = result.unsupported_rows;
  summary["probes"] = result.probes;
  doc["summary"] = summary;
  Json rows = Json::array();
  for (const SweepRow& r : result.rows) {
    Json j;
    j["window"] = r.config.window_keys;
    j["drafts"] = r.config.drafts;
    j["chunk"] = r.config.chunk_rows;
    j["order"] = order_file_name(r.config.order);
    j["min_safe_ring"] = r.min_safe_ring;
    j["probes"] = r.probes;
    j["spec_bound"] = r.spec_bound;
    j["spec_agrees"] = r.spec_agrees;
    if (result.block_size > 0) j["ring_bound"] = paged_ring_bound(r.config, result.block_size);
    j["seed_ring"] = r.seed_ring;
    j["seed_slack"] = r.seed_ring - r.min_safe_ring;
    // Live caches: capacities the cache refused (a result, not an error).
    j["unsupported"] = r.unsupported;
    j["refused_capacities"] = r.refused_capacities;
    j["refusal"] = r.refusal.empty() ? Json(nullptr) : Json(r.refusal);
    if (r.has_formula) {
      j["formula_ring"] = r.formula_ring;
      j["formula_slack"] = r.formula_ring - r.min_safe_ring;
      j["formula_safe"] = r.formula_safe;
    }
    if (r.has_below) {
      Json b;
      b["ring"] = r.below_ring;
      b["hazard"] = r.below_hazard;
      b["overwritten"] = r.below_overwritten;
      b["lost_offsets"] = r.below_first_lost;
      b["collisions"] = r.below_collisions;
      b["counterexample"] = r.counterexample.empty() ? Json(nullptr) : Json(r.counterexample);
      b["replayed"] = r.replayed;
      b["replay_ok"] = r.replay_ok;
      if (!r.replay_ok) b["replay_detail"] = r.replay_detail;
      j["below"] = b;
    } else {
      j["below"] = nullptr;
    }
    rows.push_back(std::move(j));
  }
  doc["rows"] = std::move(rows);
  return doc.dump(2) + "\n";
}

std::string sweep_csv(const SweepResult& result) {
  const bool formula = result.formula.has_value();
  std::string out =
      "window,drafts,chunk,order,min_safe_ring,spec_bound,spec_agrees,seed_ring,seed_slack,"
      "below_ring,below_hazard,below_overwritten,below_collisions,counterexample,replay_ok,unsupported,"
      "refused_capacities,refusal";
  if (formula) out += ",formula_ring,formula_slack,formula_safe";
  out += "\n";
  for (const SweepRow& r : result.rows) {
    std::string over;
    for (std::size_t i = 0; i < r.below_overwritten.size(); ++i)
      over += (i ? " " : "") + std::to_string(r.below_overwritten[i]);
    out += std::to_string(r.config.window_keys) + "," + std::to_string(r.config.drafts) + "," +
           std::to_string(r.config.chunk_rows) + "," + order_file_name(r.config.order) + "," +
           std::to_string(r.min_safe_ring) + "," + std::to_string(r.spec_bound) + "," +
           (r.spec_agrees ? "true" : "false") + "," + std::to_string(r.seed_ring) + "," +
           std::to_string(r.seed_ring - r.min_safe_ring) + "," +
           (r.has_below ? std::to_string(r.below_ring) : "") + "," + csv_field(r.below_hazard) + "," +
           csv_field(over) + "," + (r.has_below ? std::to_string(r.below_collisions) : "") + "," +
           csv_field(r.counterexample) + "," + (r.replay_ok ? "true" : "false") + "," +
           (r.unsupported ? "true" : "false") + "," + std::to_string(r.refused_capacities) + "," +
           csv_field(r.refusal);
    if (formula) {
      out += "," + std::to_string(r.formula_ring) + "," + std::to_string(r.formula_ring - r.min_safe_ring) +
             "," + (r.formula_safe ? "true" : "false");
    }
    out += "\n";
  }
  return out;
}

std::string sweep_svg(const SweepResult& result) {
  const auto& g = result.grid;
  const std::int64_t nw = static_cast<std::int64_t>(g.windows.size());
  const std::int64_t nd = static_cast<std::int64_t>(g.drafts.size());
  const std::int64_t cell_w = 18;
  const std::int64_t cell_h = nw > 32 ? 6 : 14;
  const std::int64_t margin_l = 56, margin_t = 40, gap = 24;
  const std::int64_t panel_w = margin_l + nd * cell_w + gap;
  const std::int64_t panel_h = margin_t + nw * cell_h + 36;
  const std::int64_t cols = static_cast<std::int64_t>(g.orders.size());
  const std::int64_t rows = static_cast<std::int64_t>(g.chunks.size());
  const std::int64_t header = 48, legend = 56;
  const std::int64_t width = std::max<std::int64_t>(cols * panel_w + 16, 480);
  const std::int64_t height = header + rows * panel_h + legend;
  const std::string what =
      result.formula ? "formula '" + *result.formula + "'" : "the seed's allocation W + k + 1";

  std::ostringstream s;
  s << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << width << "\" height=\"" << height
    << "\" viewBox=\"0 0 " << width << ' ' << height << "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  s << "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
  s << "<text x=\"8\" y=\"18\" font-size=\"14\" font-weight=\"bold\">kvcheck sweep: slack of "
    << xml_text(what) << " over the minimum safe ring</text>\n";
  s << "<text x=\"8\" y=\"36\">rows: window W (top to bottom), columns: drafts k; red = unsafe (below the "
       "minimum), yellow = exactly the minimum, green = rows to spare</text>\n";
  for (std::int64_t ci = 0; ci < rows; ++ci) {
    for (std::int64_t oi = 0; oi < cols; ++oi) {
      const std::int64_t x0 = 8 + oi * panel_w;
      const std::int64_t y0 = header + ci * panel_h;
      const std::int64_t chunk = g.chunks[static_cast<std::size_t>(ci)];
      const SweepOrder order = g.orders[static_cast<std::size_t>(oi)];
      s << "<g>\n<text x=\"" << x0 << "\" y=\"" << y0 + 16 << "\" font-weight=\"bold\">C = " << chunk << ", "
        << order_flag_name(order) << "</text>\n";
      for (std::int64_t di = 0; di < nd; ++di) {
        if (nd <= 24 || di % ((nd + 23) / 24) == 0) {
          s << "<text x=\"" << x0 + margin_l + di * cell_w + cell_w / 2 << "\" y=\"" << y0 + margin_t - 4
            << "\" text-anchor=\"middle\">" << g.drafts[static_cast<std::size_t>(di)] << "</text>\n";
        }
      }
      const std::int64_t label_every = std::max<std::int64_t>(1, 14 / cell_h);
      for (std::int64_t wi = 0; wi < nw; ++wi) {
        const std::int64_t w = g.windows[static_cast<std::size_t>(wi)];
        const std::int64_t y = y0 + margin_t + wi * cell_h;
        if (wi % label_every == 0) {
          s << "<text x=\"" << x0 + margin_l - 4 << "\" y=\"" << y + cell_h << "\" text-anchor=\"end\">" << w
            << "</text>\n";
        }
        for (std::int64_t di = 0; di < nd; ++di) {
          const std::int64_t k = g.drafts[static_cast<std::size_t>(di)];
          const SweepRow* r = find_row(result, w, k, chunk, order);
          if (r == nullptr) continue;
          const std::int64_t slack = allocation(*r) - r->min_safe_ring;
          s << "<rect x=\"" << x0 + margin_l + di * cell_w << "\" y=\"" << y << "\" width=\"" << cell_w
            << "\" height=\"" << cell_h << "\" fill=\"" << slack_colour(slack) << "\"><title>W=" << w
            << " k=" << k << " C=" << chunk << ' ' << order_file_name(order) << ": min " << r->min_safe_ring
            << ", allocated " << allocation(*r) << ", slack " << slack << "</title></rect>\n";
        }
      }
      s << "<text x=\"" << x0 + margin_l << "\" y=\"" << y0 + margin_t + nw * cell_h + 16
        << "\">drafts k</text>\n";
      s << "</g>\n";
    }
  }
  // Legend.
  const std::int64_t ly = header + rows * panel_h + 8;
  const std::int64_t samples[] = {-16, -8, -4, -1, 0, 1, 4, 8, 16};
  for (std::size_t i = 0; i < std::size(samples); ++i) {
    const std::int64_t lx = 8 + static_cast<std::int64_t>(i) * 44;
    s << "<rect x=\"" << lx << "\" y=\"" << ly << "\" width=\"40\" height=\"14\" fill=\""
      << slack_colour(samples[i]) << "\"/>\n<text x=\"" << lx + 20 << "\" y=\"" << ly + 28
      << "\" text-anchor=\"middle\">" << (samples[i] > 0 ? "+" : "") << samples[i]
      << (samples[i] == 16 || samples[i] == -16 ? "+" : "") << "</text>\n";
  }
  s << "</svg>\n";
  return s.str();
}

std::string sweep_table(const SweepResult& result, std::int64_t max_rows) {
  const bool formula = result.formula.has_value();
  std::ostringstream s;
  char line[512];
  const bool paged = result.block_size > 0;
  if (paged) {
    s << "paged cache, blocks of " << result.block_size
      << " rows: min = smallest pool in blocks (one live request), bound = ceil((m - 1) / B) + 1 with m = "
         "max(W + k, W + C - 1) store-then-load, max(W + k, C) load-then-store (agree: yes = bound; ring = "
         "ceil(m / B), a ring of m rows laid over blocks); check = the pool check gives\n";
  }
  std::snprintf(line, sizeof line, "%6s %3s %5s %-16s %6s %6s %-5s %9s", "W", "k", "C", "order", "min",
                paged ? "bound" : "spec", "agree", paged ? "check(+)" : "seed(+)");
  s << line;
  if (formula) s << "  formula(+)";
  s << "  at min-1: hazard -> overwritten per query\n";
  const auto total = static_cast<std::int64_t>(result.rows.size());
  const bool all = total <= max_rows;
  std::int64_t shown = 0;
  for (const SweepRow& r : result.rows) {
    const bool interesting =
        !r.spec_agrees || (r.has_formula && !r.formula_safe) || !r.replay_ok || r.unsupported;
    if (!all && !interesting) continue;
    if (!all && shown >= max_rows) break;
    ++shown;
    char seed[32];
    std::snprintf(seed, sizeof seed, "%lld(%+lld)", static_cast<long long>(r.seed_ring),
                  static_cast<long long>(r.seed_ring - r.min_safe_ring));
    std::snprintf(line, sizeof line, "%6lld %3lld %5lld %-16s %6lld %6lld %-5s %9s",
                  static_cast<long long>(r.config.window_keys), static_cast<long long>(r.config.drafts),
                  static_cast<long long>(r.config.chunk_rows), order_flag_name(r.config.order),
                  static_cast<long long>(r.min_safe_ring), static_cast<long long>(r.spec_bound),
                  !r.spec_agrees ? "NO" : (paged && r.min_safe_ring != r.spec_bound ? "ring" : "yes"), seed);
    if (r.unsupported) {
      // The cache ran no capacity of this configuration.
      std::snprintf(line, sizeof line, "%6lld %3lld %5lld %-16s %6s",
                    static_cast<long long>(r.config.window_keys), static_cast<long long>(r.config.drafts),
                    static_cast<long long>(r.config.chunk_rows), order_flag_name(r.config.order), "-");
      s << line << "  unsupported: " << r.refusal << "\n";
      continue;
    }
    s << line;
    if (formula) {
      char f[48];
      std::snprintf(f, sizeof f, "%lld(%+lld)%s", static_cast<long long>(r.formula_ring),
                    static_cast<long long>(r.formula_ring - r.min_safe_ring),
                    r.formula_safe ? "" : " UNSAFE");
      std::snprintf(line, sizeof line, "  %-10s", f);
      s << line;
    }
    if (r.has_below) {
      s << (paged ? "  pool=" : "  S=") << r.below_ring << ": " << r.below_hazard << " -> " << list_text(r.below_overwritten, 8);
      if (r.below_collisions > 0) s << ", " << r.below_collisions << " collisions";
      if (!r.replay_ok) s << "  REPLAY FAILED: " << r.replay_detail;
    }
    if (r.refused_capacities > 0)
      s << "  (" << r.refused_capacities << " capacities refused, first " << r.refusal << ")";
    s << "\n";
  }
  if (!all) {
    s << "(" << total << " configurations; " << shown
      << " shown: those that disagree with the safe-capacity bound, the formula or their replay; use --json or --csv for "
         "all)\n";
  }
  const std::int64_t measured = total - result.unsupported_rows;
  s << "configurations: " << total << ", probes: " << result.probes
    << (paged ? ", block bound agreed on " : ", safe-capacity bound agreed on ") << measured - result.spec_disagreements
    << "/" << measured << "\n";
  if (formula) {
    if (result.formula_unsafe_rows == 0) {
      s << "formula '" << *result.formula << "' is safe on every configuration of the grid\n";
    } else {
      s << "formula '" << *result.formula << "' is UNSAFE on " << result.formula_unsafe_rows << " of "
        << total << " configurations";
      std::int64_t listed = 0;
      for (const SweepRow& r : result.rows) {
        if (!r.has_formula || r.formula_safe) continue;
        s << (listed ? "; " : ": ") << "W=" << r.config.window_keys << " k=" << r.config.drafts
          << " C=" << r.config.chunk_rows << " " << order_flag_name(r.config.order) << " gives "
          << r.formula_ring << " < " << r.min_safe_ring;
        if (++listed == 5) {
          if (result.formula_unsafe_rows > 5) s << "; ...";
          break;
        }
      }
      s << "\n";
    }
  }
  if (result.replay_failures > 0) {
    s << result.replay_failures << " counterexample(s) did not replay through the reference runner\n";
  }
  if (result.unsupported_rows > 0) {
    s << result.unsupported_rows << " configuration(s) unsupported: the cache refused every capacity tried\n";
  }
  return s.str();
}

}  // namespace kvcheck::sweep
