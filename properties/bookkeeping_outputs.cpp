#include "properties/bookkeeping_outputs.hpp"

#include <algorithm>
#include <cmath>

#include "support/assert.hpp"

namespace kvcheck::properties {

void ReadRows::remember(std::uint64_t seq, const std::vector<double>& key, const std::vector<double>& value) {
  rows_[seq] = Row{key, value};
}

void ReadRows::forget(std::uint64_t seq) {
  rows_.erase(seq);
}

void ReadRows::attend(std::span<const double> query, std::span<const ReadTag> reads,
                      const model::Heads& heads, double scale, std::optional<double> sink,
                      double* out) const {
  const std::int64_t d = heads.head_dim;
  const std::int32_t group = heads.q_heads / heads.kv_heads;
  KVCHECK_ASSERT(static_cast<std::int64_t>(query.size()) == std::int64_t{heads.q_heads} * d);
  std::vector<const Row*> seen;
  seen.reserve(reads.size());
  for (const ReadTag& r : reads) {
    if (r.write_seq == 0) continue;
    const auto it = rows_.find(r.write_seq);
    KVCHECK_ASSERT(it != rows_.end());  // every row a slot holds is remembered
    seen.push_back(&it->second);
  }
  std::vector<double> score(seen.size());
  for (std::int32_t h = 0; h < heads.q_heads; ++h) {
    const std::int64_t kv = (h / group) * d;
    const double* q = query.data() + h * d;
    double m = sink.value_or(-INFINITY);
    for (std::size_t j = 0; j < seen.size(); ++j) {
      double dot = 0;
      for (std::int64_t e = 0; e < d; ++e) dot += q[e] * seen[j]->key[static_cast<std::size_t>(kv + e)];
      score[j] = scale * dot;
      m = std::max(m, score[j]);
    }
    // Plain softmax, the sink an extra logit with no value.
    double total = sink ? std::exp(*sink - m) : 0.0;
    for (double& s : score) total += s = std::exp(s - m);
    double* o = out + h * d;
    std::fill(o, o + d, 0.0);
    if (seen.empty()) continue;  // nothing read (with or without a sink): zeros
    for (std::size_t j = 0; j < seen.size(); ++j) {
      const std::vector<double>& v = seen[j]->value.empty() ? seen[j]->key : seen[j]->value;
      const double w = score[j] / total;
      for (std::int64_t e = 0; e < d; ++e) o[e] += w * v[static_cast<std::size_t>(kv + e)];
    }
  }
}

}  // namespace kvcheck::properties
