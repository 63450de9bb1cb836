#include "properties/position_code.hpp"

#include <algorithm>
#include <cmath>

#include "support/assert.hpp"

namespace kvcheck::properties {

namespace {

// Counts and sums read back within this of an integer are taken as that
// integer; the outputs of a correct f32 kernel are far closer (see header).
constexpr double kIntegerSlack = 0.25;
// Errors searched per class: up to this many lost visible rows and this many
// rows read in their place (or extra).
constexpr std::size_t kMaxPerClass = 2;

}  // namespace

PositionCodeLayout position_code_layout(const scenarios::CacheConfig& c) {
  PositionCodeLayout layout;
  const bool rotated_values = c.shared_row && c.rope.style != scenarios::RopeStyle::kNone;
  for (std::int32_t h = 0; h < c.kv_heads; ++h) {
    for (std::int32_t d = 0; d < c.head_dim; ++d) {
      // A shared row's value is its stored key, rotated in dims < rotary_dims.
      if (rotated_values && d < c.rope.rotary_dims) continue;
      layout.elements.push_back(static_cast<std::int64_t>(h) * c.head_dim + d);
    }
  }
  layout.elements.resize(layout.elements.size() / 2 * 2);
  layout.classes = static_cast<std::int64_t>(layout.elements.size() / 2);
  const int bits = format_info(c.format).code_bits;  // the format table's id bits (header)
  layout.id_max = (std::int64_t{1} << bits) - 1;
  layout.id_scale = std::ldexp(1.0, bits);
  return layout;
}

std::int64_t position_code_id(const PositionCodeLayout& layout, std::int32_t layer, std::int64_t request,
                              std::int64_t position, std::int64_t step_index) {
  std::uint64_t s = mix_seed(0x706f73636f6465ull, static_cast<std::uint64_t>(layer));  // "poscode"
  s = mix_seed(s, static_cast<std::uint64_t>(request));
  s = mix_seed(s, static_cast<std::uint64_t>(position));
  s = mix_seed(s, static_cast<std::uint64_t>(step_index));
  return 1 + static_cast<std::int64_t>(s % static_cast<std::uint64_t>(layout.id_max));
}

void position_code_row(const scenarios::CacheConfig& c, const PositionCodeLayout& layout, std::int32_t layer,
                       std::int64_t request, std::int64_t position, std::int64_t step_index, Prng& rng,
                       std::vector<double>& k, std::vector<double>& v, std::vector<double>& q) {
  const std::int64_t kv_width = static_cast<std::int64_t>(c.kv_heads) * c.head_dim;
  const std::int64_t q_width = static_cast<std::int64_t>(c.q_heads) * c.head_dim;
  std::vector<double> code(static_cast<std::size_t>(kv_width), 0.0);
  if (layout.classes > 0) {
    const std::int64_t e = position % layout.classes;
    const std::int64_t id = position_code_id(layout, layer, request, position, step_index);
    code[static_cast<std::size_t>(layout.elements[static_cast<std::size_t>(2 * e)])] = 1.0;
    code[static_cast<std::size_t>(layout.elements[static_cast<std::size_t>(2 * e + 1)])] =
        static_cast<double>(id) / layout.id_scale;
  }
  if (c.shared_row) {
    // The key is the value: the code (dims RoPE leaves alone carry it).
    k.insert(k.end(), code.begin(), code.end());
  } else {
    // Keys do not matter to the scores (q = 0) but are still stored and judged.
    for (std::int64_t e = 0; e < kv_width; ++e) k.push_back(rng.signed_unit());
    v.insert(v.end(), code.begin(), code.end());
  }
  q.insert(q.end(), static_cast<std::size_t>(q_width), 0.0);
}

PositionDecoder::PositionDecoder(const scenarios::CacheConfig& cache, std::int32_t layer)
    : cache_(cache), layer_(layer), layout_(position_code_layout(cache)) {
  by_class_.resize(static_cast<std::size_t>(layout_.classes));
}

void PositionDecoder::record_writes(std::int64_t request, std::int64_t first, std::int64_t n,
                                    std::int64_t step_index) {
  if (!usable()) return;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t p = first + i;
    Written w{request, p, position_code_id(layout_, layer_, request, p, step_index), ++write_seq_};
    latest_[{request, p}] = w;
    by_class_[static_cast<std::size_t>(p % layout_.classes)].push_back(w);
  }
}

void PositionDecoder::share_prefix(std::int64_t request, std::int64_t source, std::int64_t n) {
  for (std::int64_t p = 0; p < n; ++p) {
    const auto it = latest_.find({source, p});
    if (it != latest_.end()) latest_[{request, p}] = it->second;
  }
}

void PositionDecoder::decode(std::int64_t request, const double* out, QueryObservation* q) const {
  if (!usable()) return;
  const auto M = static_cast<std::size_t>(layout_.classes);
  const double D = layout_.id_scale;
  const std::int32_t group = cache_.q_heads / cache_.kv_heads;
  // The output element showing kv element x: the first query head of its group.
  auto shown = [&](std::int64_t x) {
    const std::int64_t g = x / cache_.head_dim, d = x % cache_.head_dim;
    return out[g * group * cache_.head_dim + d];
  };
  std::vector<double> mean_count(M), mean_id(M);
  double count_total = 0;
  for (std::size_t e = 0; e < M; ++e) {
    mean_count[e] = shown(layout_.elements[2 * e]);
    mean_id[e] = shown(layout_.elements[2 * e + 1]);
    count_total += mean_count[e];
  }

  // What the query should read: the latest write of each visible position.
  std::vector<std::vector<Written>> expected(M);
  std::int64_t visible_rows = 0;
  for (std::int64_t j = q->visible_first; j <= q->position; ++j) {
    const auto it = latest_.find({request, j});
    if (it == latest_.end()) continue;
    expected[static_cast<std::size_t>(j) % M].push_back(it->second);
    ++visible_rows;
  }

  auto unknown_read = [&] { q->extra.push_back(ReadTag{-1, -1, -1, 0}); };
  bool finite = true;
  for (std::size_t e = 0; e < M; ++e)
    finite = finite && std::isfinite(mean_count[e]) && std::isfinite(mean_id[e]);
  if (!finite) {
    unknown_read();
    return;
  }

  // Counts and id sums per class under a normaliser Z, if they are integers.
  std::vector<std::int64_t> count(M), ids(M);
  auto integral = [&](double z) {
    for (std::size_t e = 0; e < M; ++e) {
      const double c = mean_count[e] * z, s = mean_id[e] * z * D;
      const double cr = std::nearbyint(c), sr = std::nearbyint(s);
      if (std::fabs(c - cr) > kIntegerSlack || std::fabs(s - sr) > kIntegerSlack || cr < 0 || sr < 0) {
        return false;
      }
      count[e] = static_cast<std::int64_t>(cr);
      ids[e] = static_cast<std::int64_t>(sr);
    }
    return true;
  };

  // Per class: the fewest lost visible rows U and rows read in their place
  // (or extra) X with |X| - |U| = count - expected and ids(X) - ids(U) = id
  // sum - expected. False when some class has no such explanation.
  std::vector<const Written*> unmatched, leftover;
  auto explain = [&] {
    unmatched.clear();
    leftover.clear();
    for (std::size_t e = 0; e < M; ++e) {
      const std::vector<Written>& want = expected[e];
      std::int64_t want_ids = 0;
      for (const Written& w : want) want_ids += w.id;
      const std::int64_t dc = count[e] - static_cast<std::int64_t>(want.size());
      const std::int64_t ds = ids[e] - want_ids;
      if (dc == 0 && ds == 0) continue;
      const std::vector<Written>& seen = by_class_[e];
      // A row with this id, preferring a copy of a lost position, then the latest.
      auto find_id = [&](std::int64_t id, const std::vector<const Written*>& lost) -> const Written* {
        const Written* best = nullptr;
        for (const Written& w : seen) {
          if (w.id != id) continue;
          const bool copy = std::any_of(lost.begin(), lost.end(), [&](const Written* u) {
            return u->request == w.request && u->position == w.position;
          });
          if (copy) return &w;
          if (!best || w.write_seq > best->write_seq) best = &w;
        }
        return best;
      };
      bool found = false;
      std::vector<const Written*> lost, read;
      for (std::size_t u = 0; u <= std::min(kMaxPerClass, want.size()) && !found; ++u) {
        const std::int64_t x = static_cast<std::int64_t>(u) + dc;
        if (x < 0 || x > static_cast<std::int64_t>(kMaxPerClass)) continue;
        // Subsets of `want` of size u, oldest first.
        std::vector<std::size_t> pick(u);
        for (std::size_t i = 0; i < u; ++i) pick[i] = i;
        for (;;) {
          lost.clear();
          std::int64_t need = ds;
          for (const std::size_t i : pick) {
            lost.push_back(&want[i]);
            need += want[i].id;
          }
          read.clear();
          if (x == 0) {
            found = need == 0;
          } else if (x == 1) {
            if (const Written* w = find_id(need, lost)) {
              read.push_back(w);
              found = true;
            }
          } else {
            for (const Written& first : seen) {
              if (first.id >= need) continue;
              if (const Written* second = find_id(need - first.id, lost)) {
                read.push_back(&first);
                read.push_back(second);
                found = true;
                break;
              }
            }
          }
          if (found) break;
          // Next subset in lexicographic order.
          std::size_t i = u;
          while (i > 0 && pick[i - 1] == want.size() - u + i - 1) --i;
          if (i == 0) break;
          ++pick[i - 1];
          for (std::size_t t = i; t < u; ++t) pick[t] = pick[t - 1] + 1;
        }
      }
      if (!found) return false;
      unmatched.insert(unmatched.end(), lost.begin(), lost.end());
      leftover.insert(leftover.end(), read.begin(), read.end());
    }
    return true;
  };

  bool decoded = false;
  double z_used = 0;  // the normaliser decoded with, without a sink
  if (!cache_.sink_logit &&
      count_total <= 0.5 / static_cast<double>(std::max<std::int64_t>(1, visible_rows) + 1)) {
    // Nothing coded was read (all-zero outputs): every visible row is missing.
    std::fill(count.begin(), count.end(), 0);
    std::fill(ids.begin(), ids.end(), 0);
    decoded = explain();
  } else if (cache_.sink_logit) {
    // Z = n + e^sink: the sink's weight pins n (no scale invariance).
    const double es = std::exp(*cache_.sink_logit);
    if (count_total < 1.0) {
      const double n = std::nearbyint(es * count_total / (1.0 - count_total));
      decoded = n >= 0 && n < 1e9 && integral(n + es) && explain();
    }
  } else {
    // Without a sink only the mean is seen: of the normalisers that make
    // every count and id sum an integer and every class explicable by a few
    // errors, the one with the fewest errors (uncoded reads included), the
    // nearest the visible count on a tie.
    const std::int64_t most = 4 * visible_rows + 16;
    std::int64_t best_z = -1, best_errors = 0;
    for (std::int64_t step = 0; step <= most; ++step) {
      for (const std::int64_t z : {visible_rows - step, visible_rows + step}) {
        if (z < 1 || z > most || (step == 0 && z != visible_rows)) continue;
        if (!integral(static_cast<double>(z)) || !explain()) continue;
        std::int64_t coded = 0;
        for (const std::int64_t c : count) coded += c;
        const std::int64_t errors = static_cast<std::int64_t>(unmatched.size() + leftover.size()) +
                                    std::max<std::int64_t>(0, z - coded);
        if (best_z < 0 || errors < best_errors) {
          best_z = z;
          best_errors = errors;
        }
      }
      if (best_z >= 0 && best_errors == 0) break;
    }
    if (best_z >= 0) decoded = integral(static_cast<double>(best_z)) && explain();
    z_used = static_cast<double>(best_z);
  }
  // Rows read that carry no code (empty slots of zeros): the normaliser
  // counts them, the counts do not. The shadow map shows such a read as an
  // extra read of an empty slot.
  std::int64_t coded_reads = 0;
  for (const std::int64_t c : count) coded_reads += c;
  const std::int64_t uncoded_reads =
      decoded && !cache_.sink_logit && z_used > 0 ? static_cast<std::int64_t>(z_used) - coded_reads : 0;
  if (!decoded) {
    // The outputs are no mean of coded rows kvcheck can name (rows it never
    // wrote, or more errors than the search tries): every visible row counts
    // as not read, and one unknown read stands for what was.
    for (const auto& members : expected)
      for (const Written& w : members) q->missing.push_back(w.position);
    std::sort(q->missing.begin(), q->missing.end());
    unknown_read();
    return;
  }

  // The shadow map's classification: a stale copy of the position, else any
  // read left to pair with (its slot held that row), makes it overwritten.
  std::sort(unmatched.begin(), unmatched.end(),
            [](const Written* a, const Written* b) { return a->position < b->position; });
  std::vector<bool> used(leftover.size(), false);
  std::vector<const Written*> still;
  for (const Written* u : unmatched) {
    bool claimed = false;
    for (std::size_t c = 0; c < leftover.size() && !claimed; ++c) {
      if (!used[c] && leftover[c]->request == u->request && leftover[c]->position == u->position) {
        used[c] = claimed = true;
      }
    }
    if (claimed)
      q->overwritten.push_back(u->position);
    else
      still.push_back(u);
  }
  for (const Written* u : still) {
    bool claimed = false;
    for (std::size_t c = 0; c < leftover.size() && !claimed; ++c) {
      if (!used[c]) used[c] = claimed = true;
    }
    (claimed ? q->overwritten : q->missing).push_back(u->position);
  }
  std::sort(q->overwritten.begin(), q->overwritten.end());
  for (std::int64_t i = 0; i < uncoded_reads; ++i) unknown_read();
  for (std::size_t c = 0; c < leftover.size(); ++c) {
    if (!used[c])
      q->extra.push_back(ReadTag{-1, leftover[c]->request, leftover[c]->position, leftover[c]->write_seq});
  }
}

}  // namespace kvcheck::properties
