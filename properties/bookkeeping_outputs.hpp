// Outputs for bookkeeping-only engines (hello "outputs": false, README
// "Bookkeeping-only engines"): a block manager reports where it wrote each
// row and which slots each query read, and no outputs. kvcheck computes each
// query's output itself, over the rows its shadow map resolves the reads to
// (the rows the cache says are there, in read order), in binary64 with a
// plain softmax, and judges that against the reference like any output. A
// read of the wrong slot thus fails twice: as an overwritten, missing or
// extra row, and as an output the reference does not give.
//
// This is a deliberate second attention next to the reference (which never
// sees slots): it attends over whatever the engine read, right or wrong.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/attention.hpp"
#include "properties/observation.hpp"

namespace kvcheck::properties {

/// The rows of one layer a read can still resolve to, by write number
/// (ShadowRow::write_seq): each reference-encoded key (after RoPE) and value.
class ReadRows {
 public:
  /// Remembers the row written as write number `seq`; `value` empty for shared rows.
  void remember(std::uint64_t seq, const std::vector<double>& key, const std::vector<double>& value);
  /// Forgets a row no slot holds any more.
  void forget(std::uint64_t seq);
  /// Rows remembered (for memory checks in tests).
  std::size_t size() const noexcept { return rows_.size(); }

  /// The attention output of `query` ([q_heads * head_dim], rotated) over
  /// the rows `reads` resolve to, in read order; a read of a slot that holds
  /// no row (write_seq 0) contributes nothing. `out`: [q_heads * head_dim].
  void attend(std::span<const double> query, std::span<const ReadTag> reads, const model::Heads& heads,
              double scale, std::optional<double> sink, double* out) const;

 private:
  struct Row {
    std::vector<double> key, value;  ///< [kv_heads * head_dim]; value empty for shared rows
  };
  std::unordered_map<std::uint64_t, Row> rows_;
};

}  // namespace kvcheck::properties
