#include "properties/shadow.hpp"

#include <algorithm>
#include <optional>
#include <unordered_map>

#include "support/assert.hpp"

namespace kvcheck::properties {

namespace {

ReadTag to_read_tag(std::int64_t slot, const ShadowRow& row) {
  return ReadTag{slot, row.request, row.position, row.write_seq,
                 row.origin_request != row.request ? row.origin_request : -1};
}

}  // namespace

std::vector<std::uint64_t> ShadowMap::begin_prefix(std::int64_t request, std::int64_t source, std::int64_t n,
                                                   std::span<const std::int64_t> written,
                                                   std::int64_t visible_from, PrefixTally* tally,
                                                   std::int64_t block_size,
                                                   std::span<const std::int64_t> recompute) {
  PrefixTally counts;
  std::vector<std::uint64_t> seqs(static_cast<std::size_t>(n), 0);
  // Positions left to the next writing step, sorted for lookup.
  std::vector<std::int64_t> left(recompute.begin(), recompute.end());
  std::sort(left.begin(), left.end());
  // Where each write was stored (its lowest slot holding it, not a copy),
  // built once when a second slot may hold a content (a move, a row stored
  // again): one pass over the pool per begin, not one per position. A slot
  // this begin stores into is checked before it is used.
  std::unordered_map<std::uint64_t, std::int64_t> stored_at;
  if (any_copies_ || any_restored_) {
    for (const auto& [slot, row] : slots_) {
      if (row.copied || row.padding || row.write_seq == 0) continue;
      const auto [it, fresh] = stored_at.try_emplace(row.write_seq, slot);
      if (!fresh && slot < it->second) it->second = slot;
    }
  }
  for (std::int64_t p = 0; p < n; ++p) {
    const auto i = static_cast<std::size_t>(p);
    const auto src = latest_.find({source, p});
    // The source's content (docs/semantics.md "Row lineage"): what position
    // p of the begun request is, wherever it lies.
    const Latest lineage = src == latest_.end() ? Latest{} : src->second;
    // A slot holding that content: the source's home if held (its table's
    // block: a copy-on-write moved it there); else the slot the source's row
    // was stored in (not a copy), held or cached: the block a prefix cache
    // indexed under the source's hash, which a resume takes back (a move
    // made a copier's copy the home, and another request may hold the
    // content stored again, each under its own request's hash); else a held
    // one before a cached one (a cache sharing a held row takes no cached
    // block back).
    std::optional<std::int64_t> holder;
    if (lineage.origin != 0) {
      const ShadowRow home = at(lineage.slot);
      const bool home_holds = lineage.slot >= 0 && home.origin == lineage.origin && !home.padding;
      // The home holds the source's row itself (or its copy), not the same
      // content another request stored again there since.
      const bool home_own = home_holds && !home.cached && home.write_seq == lineage.write_seq;
      std::optional<std::int64_t> stored;
      if (!home_own && (any_copies_ || any_restored_)) {  // else only the home holds it
        const auto it = stored_at.find(lineage.write_seq);
        if (it != stored_at.end()) {
          const ShadowRow row = at(it->second);
          if (row.write_seq == lineage.write_seq && !row.copied && !row.padding) {
            stored = it->second;
          } else {
            // This begin stored another row there: look again.
            for (const auto& [slot, r] : slots_) {
              if (r.write_seq == lineage.write_seq && !r.copied && !r.padding && (!stored || slot < *stored))
                stored = slot;
            }
          }
        }
      }
      if (home_own) {
        holder = lineage.slot;
      } else if (stored) {
        holder = stored;
      } else if (const auto held = slot_with_content(lineage.origin, std::nullopt, false)) {
        holder = held;
      } else {
        holder = home_holds ? std::optional<std::int64_t>(lineage.slot) : slot_with_content(lineage.origin);
      }
    }
    // The source's row no slot holds any more after the cache had cached it:
    // evicted (a later write took the slot) or freed since.
    if (p >= visible_from && lineage.origin != 0 && was_cached_.contains(lineage.write_seq) && !holder) {
      ++counts.evicted_positions;
    }
    if (i < written.size() && written[i] >= 0) {
      // Stored again: a new write of the begun request's, of the source's content.
      seqs[i] =
          store_again(request, p, written[i], lineage.origin, lineage.origin_request, &counts.evicted_rows);
      continue;
    }
    if (std::binary_search(left.begin(), left.end(), p)) {
      // Left to the next writing step: absent until it stores it.
      latest_[{request, p}] = Latest{0, -1, lineage.origin, lineage.origin_request};
    } else if (holder) {
      ++counts.held_positions;
      latest_[{request, p}] = Latest{at(*holder).write_seq, *holder, lineage.origin, lineage.origin_request};
      // A cached row the begun request can see is held again (a prefix hit
      // takes its block back from the free pool), and so are the block's
      // other cached rows (a block leaves the pool whole).
      if (p >= visible_from && slots_.at(*holder).cached) {
        slots_.at(*holder).cached = false;
        for (std::int64_t b = block_size > 0 ? *holder / block_size * block_size : *holder;
             block_size > 0 && b < (*holder / block_size + 1) * block_size; ++b) {
          const auto it = slots_.find(b);
          if (it != slots_.end() && !it->second.padding) it->second.cached = false;
        }
      }
    } else if (lineage.origin != 0) {
      // No slot holds it: a query that needs it finds it missing.
      latest_[{request, p}] = Latest{0, -1, lineage.origin, lineage.origin_request};
    } else {
      latest_.erase({request, p});
    }
  }
  if (tally != nullptr) *tally = counts;
  return seqs;
}

std::vector<std::uint64_t> ShadowMap::recompute(std::int64_t request,
                                                std::span<const std::pair<std::int64_t, std::int64_t>> rows,
                                                std::int64_t* evicted) {
  std::vector<std::uint64_t> seqs;
  seqs.reserve(rows.size());
  std::int64_t taken = 0;
  for (const auto& [p, slot] : rows) {
    // The content its begin carried (the source's row), else its own.
    const auto it = latest_.find({request, p});
    const Latest lineage = it == latest_.end() ? Latest{} : it->second;
    seqs.push_back(store_again(request, p, slot, lineage.origin, lineage.origin_request, &taken));
  }
  if (evicted != nullptr) *evicted += taken;
  return seqs;
}

std::uint64_t ShadowMap::store_again(std::int64_t request, std::int64_t p, std::int64_t slot,
                                     std::uint64_t origin, std::int64_t origin_request,
                                     std::int64_t* evicted) {
  const ShadowRow old = at(slot);
  if (old.cached && old.request >= 0) ++*evicted;
  const std::uint64_t seq = ++write_seq_;
  if (origin == 0) {
    origin = seq;
    origin_request = request;
  }
  slots_[slot] = ShadowRow{request, p, seq, false, false, false, origin, origin_request};
  latest_[{request, p}] = Latest{seq, slot, origin, origin_request};
  any_restored_ = true;
  return seq;
}

ShadowRow ShadowMap::take(std::int64_t slot) {
  const auto it = slots_.find(slot);
  if (it == slots_.end()) return ShadowRow{};
  const ShadowRow row = it->second;
  slots_.erase(it);
  return row;
}

ShadowRow ShadowMap::at(std::int64_t slot) const {
  const auto it = slots_.find(slot);
  return it == slots_.end() ? ShadowRow{} : it->second;
}

std::vector<std::pair<std::int64_t, std::int64_t>> ShadowMap::resident() const {
  std::vector<std::pair<std::int64_t, std::int64_t>> held;
  held.reserve(slots_.size());
  for (const auto& [slot, row] : slots_) {
    if (row.request >= 0 && !row.padding && !row.cached) held.emplace_back(row.origin_request, row.position);
  }
  std::sort(held.begin(), held.end());
  held.erase(std::unique(held.begin(), held.end()), held.end());
  return held;
}

void ShadowMap::move(std::span<const std::pair<std::int64_t, std::int64_t>> moved) {
  for (const auto& [from, to] : moved) {
    const auto it = slots_.find(from);
    if (it == slots_.end()) {
      slots_.erase(to);
      continue;
    }
    ShadowRow row = it->second;
    if (!row.padding && is_latest(row)) latest_[{row.request, row.position}].slot = to;
    row.copied = true;
    row.cached = false;  // the cache put the copy there: it holds it
    slots_[to] = row;
    any_copies_ = true;
  }
}

void ShadowMap::pad(std::span<const std::int64_t> slots, std::int64_t request) {
  for (const std::int64_t slot : slots) slots_[slot] = ShadowRow{request, -1, 0, true};
}

bool ShadowMap::is_latest(const ShadowRow& row) const {
  const auto it = latest_.find({row.request, row.position});
  return it != latest_.end() && it->second.write_seq == row.write_seq;
}

std::optional<std::int64_t> ShadowMap::slot_holding(std::uint64_t write_seq,
                                                    std::optional<std::int64_t> except) const {
  // Only a move puts a write in a second slot, and no row holds write 0.
  if (!any_copies_ || write_seq == 0) return std::nullopt;
  std::optional<std::int64_t> held;
  for (const auto& [slot, row] : slots_) {
    if (slot != except && row.write_seq == write_seq && !row.padding && (!held || slot < *held)) held = slot;
  }
  return held;
}

std::optional<std::int64_t> ShadowMap::slot_with_content(std::uint64_t origin,
                                                         std::optional<std::int64_t> except,
                                                         bool cached_too) const {
  // Only a move or a row stored again puts a content in a second slot:
  // without either, no slot but its own write's (which callers look at first) holds it.
  if (origin == 0 || (!any_copies_ && !any_restored_)) return std::nullopt;
  std::optional<std::int64_t> held;
  for (const auto& [slot, row] : slots_) {
    if (slot != except && row.origin == origin && !row.padding && (cached_too || !row.cached) &&
        (!held || slot < *held))
      held = slot;
  }
  return held;
}

bool ShadowMap::held_elsewhere(std::int64_t slot, std::uint64_t write_seq) const {
  return slot_holding(write_seq, slot).has_value();
}

ShadowMap::Resident ShadowMap::resident_totals(std::int64_t block_size) const {
  Resident r;
  std::vector<std::int64_t> blocks, cached_blocks;
  for (const auto& [slot, row] : slots_) {
    if (row.padding || row.request < 0) continue;
    ++(row.cached ? r.cached_rows : r.rows);
    if (block_size > 0) (row.cached ? cached_blocks : blocks).push_back(slot / block_size);
  }
  std::sort(blocks.begin(), blocks.end());
  blocks.erase(std::unique(blocks.begin(), blocks.end()), blocks.end());
  r.blocks = static_cast<std::int64_t>(blocks.size());
  std::sort(cached_blocks.begin(), cached_blocks.end());
  cached_blocks.erase(std::unique(cached_blocks.begin(), cached_blocks.end()), cached_blocks.end());
  // A block with a row held is held (its cached rows ride along).
  r.cached_blocks = std::count_if(cached_blocks.begin(), cached_blocks.end(), [&](std::int64_t b) {
    return !std::binary_search(blocks.begin(), blocks.end(), b);
  });
  return r;
}

ShadowMap::Resident ShadowMap::resident_counts(std::int64_t block_size,
                                               const std::function<bool(const ShadowRow&)>& visible,
                                               const std::function<bool(std::int64_t)>& live,
                                               std::map<std::int64_t, RequestHeld>* by_request) const {
  Resident r = resident_totals(block_size);
  const auto add = [](std::vector<std::int64_t>& v, std::int64_t request) {
    if (std::find(v.begin(), v.end(), request) == v.end()) v.push_back(request);
  };
  // A row copied into a slot (a copy-on-write's copy of a shared prefix
  // row) is held by the request whose block it is in: the requests that
  // wrote rows of their own in that block; without a block size, or in a
  // block of copies only, by its own request unless the original is still
  // where it was written (then only the pool counts the copy).
  std::unordered_map<std::uint64_t, bool> original;                     // write -> still where it was written
  std::map<std::int64_t, std::vector<std::int64_t>> owners;             // block -> requests that wrote in it
  for (const auto& [slot, row] : slots_) {
    if (row.padding || row.request < 0 || row.copied || row.cached) continue;
    original[row.write_seq] = true;
    if (block_size > 0) add(owners[slot / block_size], row.request);
  }
  // An original row is held by the requests whose row of its position it
  // is (the writer and its prefix sharers) and that still see it, less
  // those reading their own copy of it; where none is left, by those of
  // them that finished (a prefix cache's), else by its writer.
  std::unordered_map<std::uint64_t, std::vector<std::int64_t>> readers;       // write -> requests it is the row of
  for (const auto& [key, l] : latest_) {
    if (original.contains(l.write_seq)) readers[l.write_seq].push_back(key.first);
  }
  std::unordered_map<std::uint64_t, std::vector<std::int64_t>> copy_holders;  // write -> owners of a copy
  for (const auto& [slot, row] : slots_) {
    if (row.padding || row.request < 0 || !row.copied || row.cached || block_size <= 0) continue;
    const auto o = owners.find(slot / block_size);
    if (o != owners.end()) {
      for (const std::int64_t request : o->second) add(copy_holders[row.write_seq], request);
    }
  }
  std::map<std::int64_t, std::int64_t> rows_of;                    // request -> rows
  std::map<std::int64_t, std::vector<std::int64_t>> seen_in;       // block -> requests holding a row they see
  std::map<std::int64_t, std::vector<std::int64_t>> kept_in;       // block -> writers of rows none sees
  std::vector<std::int64_t> holders;
  for (const auto& [slot, row] : slots_) {
    if (row.padding || row.request < 0 || row.cached) continue;  // a cached row is no request's
    holders.clear();
    bool seen = true;
    const auto o = block_size > 0 ? owners.find(slot / block_size) : owners.end();
    if (row.copied) {
      if (o != owners.end()) {
        holders = o->second;
      } else if (!original.contains(row.write_seq)) {
        holders.push_back(row.request);
      }
    } else {
      const auto rd = readers.find(row.write_seq);
      const auto ch = copy_holders.find(row.write_seq);
      std::vector<std::int64_t> finished;
      if (rd != readers.end()) {
        for (const std::int64_t request : rd->second) {
          if (ch != copy_holders.end() && std::find(ch->second.begin(), ch->second.end(), request) != ch->second.end())
            continue;
          if (!visible || visible(ShadowRow{request, row.position, row.write_seq})) {
            add(holders, request);
          } else if (live && !live(request)) {
            add(finished, request);
          }
        }
      }
      if (holders.empty()) {
        holders = finished.empty() ? std::vector<std::int64_t>{row.request} : finished;
        seen = false;
      }
    }
    for (const std::int64_t request : holders) {
      ++rows_of[request];
      if (block_size > 0) add((seen ? seen_in : kept_in)[slot / block_size], request);
    }
  }
  // A block is the seers' where one sees a row of it, else its keepers'.
  std::map<std::int64_t, std::int64_t> blocks_of;  // request -> blocks it holds
  for (const auto& [block, by] : seen_in) {
    for (const std::int64_t request : by) ++blocks_of[request];
  }
  for (const auto& [block, by] : kept_in) {
    if (seen_in.contains(block)) continue;
    for (const std::int64_t request : by) ++blocks_of[request];
  }
  for (const auto& [request, n] : rows_of) r.request_rows = std::max(r.request_rows, n);
  for (const auto& [request, n] : blocks_of) r.request_blocks = std::max(r.request_blocks, n);
  if (by_request != nullptr) {
    for (const auto& [request, n] : rows_of) (*by_request)[request].rows += n;
    for (const auto& [request, n] : blocks_of) (*by_request)[request].blocks += n;
  }
  return r;
}

void ShadowMap::observe(const StepFacts& f, StepObservation* obs) {
  KVCHECK_ASSERT(f.rows >= 0 && f.window_keys >= 1);
  const auto n = static_cast<std::size_t>(f.rows);
  const std::int64_t first = f.first_position;
  const bool slots_known = f.has_written && f.has_reads;
  if (f.has_written) KVCHECK_ASSERT(f.written.size() == n);
  if (f.has_reads) KVCHECK_ASSERT(f.read_offsets.size() == n + 1);
  move(f.moved);

  // Pre-step occupants of the slots this step writes (a causal read of such a
  // slot by a query before the writing row sees the occupant, and the
  // replaced-needed collision is judged against it).
  std::vector<ShadowRow> replaced(n);
  std::vector<ShadowRow> written_rows(n);
  if (f.has_written) {
    for (std::size_t i = 0; i < n; ++i) replaced[i] = at(f.written[i]);
    std::map<std::int64_t, int> times;
    for (std::size_t i = 0; i < n; ++i) {
      const std::int64_t slot = f.written[i];
      const std::int64_t p = first + static_cast<std::int64_t>(i);
      obs->written_slots.push_back(slot);
      if (++times[slot] == 2) ++obs->collisions.same_step;
      if (f.ring && (slot < f.state * f.ring_rows || slot >= (f.state + 1) * f.ring_rows)) {
        ++obs->collisions.outside_block;
      }
      const ShadowRow& old = replaced[i];
      // A cached row the write takes is evicted, not lost: had it been
      // visible, caching it failed the step that did (docs/semantics.md "Cached rows").
      if (f.view == engines::ReadView::kAfterWrites && !old.cached && old.request == f.request &&
          old.position < first && old.position >= first - f.window_keys + 1) {
        // Live: the replaced row is the latest write of its position, this
        // slot its home (not a copy left behind by a move), and a query of
        // this step (the first one reaches furthest back) must read it.
        const auto live = latest_.find({old.request, old.position});
        if (live != latest_.end() && live->second.write_seq == old.write_seq && live->second.slot == slot) {
          ++obs->collisions.replaced_needed;
        }
      }
      // A write over a cached row evicts it (docs/semantics.md "Cached rows").
      if (old.cached && old.request >= 0) ++obs->evicted_rows;
      // A step's row is new content (docs/semantics.md "Row lineage"): a
      // position written again after a reset or trim is another row.
      ++write_seq_;
      written_rows[i] = ShadowRow{f.request, p, write_seq_, false, false, false, write_seq_, f.request};
    }
    // Apply the writes in row order (a later row of the step wins a slot).
    for (std::size_t i = 0; i < n; ++i) {
      slots_[f.written[i]] = written_rows[i];
      latest_[{f.request, written_rows[i].position}] =
          Latest{written_rows[i].write_seq, f.written[i], written_rows[i].write_seq, f.request};
    }
  }
  obs->collisions.same_step = std::max(obs->collisions.same_step, f.duplicate_slots);
  // Padding lands after the step's rows; the causal view's queries read the
  // pool as it was before the step (and their own rows), so it lands after them.
  const bool causal = f.view == engines::ReadView::kCausal;
  if (!causal) pad(f.padded, f.request);

  // Causal view: which rows of this step went to each slot (row order), so a
  // read resolves in O(rows there) instead of a scan of the step's writes.
  std::unordered_map<std::int64_t, std::vector<std::size_t>> rows_at;
  if (f.view == engines::ReadView::kCausal && f.has_written) {
    for (std::size_t j = 0; j < n; ++j) rows_at[f.written[j]].push_back(j);
  }

  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t p = first + static_cast<std::int64_t>(i);
    QueryObservation q;
    q.position = p;
    q.visible_first = std::max<std::int64_t>(0, p - f.window_keys + 1);
    if (!slots_known) {
      obs->queries.push_back(std::move(q));
      continue;
    }
    // Each read resolves to the rows the slot may have held when the query
    // read it: after the step's writes, the slot's last row; in the causal
    // view, the pre-step occupant or any row of this step up to query i
    // written there (the load_then_store scratch holds them side by side).
    struct Read {
      std::int64_t slot;
      std::vector<ShadowRow> candidates;  // [0] is what the report shows
    };
    std::vector<Read> reads;
    const auto lo = static_cast<std::size_t>(f.read_offsets[i]);
    const auto hi = static_cast<std::size_t>(f.read_offsets[i + 1]);
    for (std::size_t c = lo; c < hi; ++c) {
      const std::int64_t slot = f.read_slots[c];
      if (slot < 0) continue;
      Read r{slot, {}};
      const auto rows_here = f.view == engines::ReadView::kCausal ? rows_at.find(slot) : rows_at.end();
      if (rows_here != rows_at.end()) {
        // Rows of this step written here, latest first, up to query i; then
        // what the slot held before the step.
        const std::vector<std::size_t>& js = rows_here->second;
        for (auto j = js.rbegin(); j != js.rend(); ++j) {
          if (*j <= i) r.candidates.push_back(written_rows[*j]);
        }
        r.candidates.push_back(replaced[js.front()]);
      } else {
        r.candidates.push_back(at(slot));
      }
      reads.push_back(std::move(r));
    }
    std::vector<bool> used(reads.size(), false);
    std::vector<ReadTag> shown(reads.size());
    for (std::size_t c = 0; c < reads.size(); ++c)
      shown[c] = to_read_tag(reads[c].slot, reads[c].candidates[0]);
    auto claim = [&](auto&& match) {
      for (std::size_t c = 0; c < reads.size(); ++c) {
        if (used[c]) continue;
        for (const ShadowRow& row : reads[c].candidates) {
          if (match(reads[c].slot, row)) {
            used[c] = true;
            shown[c] = to_read_tag(reads[c].slot, row);
            return true;
          }
        }
      }
      return false;
    };
    std::vector<std::int64_t> unmatched;
    for (std::int64_t j = q.visible_first; j <= p; ++j) {
      const auto it = latest_.find({f.request, j});
      const bool ok = it != latest_.end() && claim([&](std::int64_t, const ShadowRow& row) {
                        // By content (docs/semantics.md "Row lineage"): a shared prefix
                        // row is another request's write, a row stored again or copied
                        // holds its source's content, and any slot holding it serves.
                        return row.position == j && row.origin == it->second.origin;
                      });
      if (!ok) unmatched.push_back(j);
    }
    // A visible row not read correctly was overwritten when its slot (or a
    // stale row of its position: of this request, or of its content's
    // request) was read; otherwise it was never read at all.
    for (const std::int64_t j : unmatched) {
      const auto it = latest_.find({f.request, j});
      const std::int64_t home = it == latest_.end() ? -1 : it->second.slot;
      const std::int64_t lineage = it == latest_.end() ? f.request : it->second.origin_request;
      const bool stale = claim([&](std::int64_t, const ShadowRow& row) {
        return row.position == j && (row.request == f.request || row.origin_request == lineage);
      });
      if (stale || (home >= 0 && claim([&](std::int64_t slot, const ShadowRow&) { return slot == home; }))) {
        q.overwritten.push_back(j);
      } else {
        q.missing.push_back(j);
      }
    }
    for (std::size_t c = 0; c < reads.size(); ++c) {
      if (!used[c]) q.extra.push_back(shown[c]);
    }
    if (f.record_reads) q.reads = std::move(shown);
    obs->queries.push_back(std::move(q));
  }

  if (causal) pad(f.padded, f.request);

  if (f.ring && f.record_ring && f.ring_rows <= 512 && f.has_written) {
    for (std::int64_t s = 0; s < f.ring_rows; ++s) {
      const ShadowRow row = at(f.state * f.ring_rows + s);
      obs->ring_positions.push_back(row.request < 0 ? -1 : (row.request == f.request ? row.position : -2));
    }
  }
}

}  // namespace kvcheck::properties
