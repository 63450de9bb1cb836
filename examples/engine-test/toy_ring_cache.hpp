// A toy engine cache: a ring-addressed sliding-window KV cache, written here
// from scratch the way an engine would, behind kvcheck's step-level interface
// (engines/cache_under_test.hpp of the installed package).
//
// Per layer and state, the cache owns `ring_rows` rows: position p of the
// request on state b lives in slot b * ring_rows + p % ring_rows. A slot
// holds the key (RoPE'd at its position, rounded to the element format) and
// the value. A query at position p attends to positions
// max(0, p - window_keys + 1) .. p, plus the sink logit when there is one.
//
// With `Bug::kRingSizedWindow` the ring is addressed modulo the window's
// keys, as if it had been allocated with exactly `window_keys` rows: no slack
// for a verify's drafts or a prefill chunk, so rows a query still needs are
// overwritten. kvcheck finds that and shrinks it to a short schedule.
#pragma once

#include <memory>

#include "engines/cache_under_test.hpp"

namespace toy {

enum class Bug { kNone, kRingSizedWindow };

/// Makes toy ring caches (one per run). Formats f64 and f32; every step
/// kind, RoPE style, GQA/MQA, shared rows, sink and scale.
class ToyRingProvider final : public kvcheck::engines::CacheProvider {
 public:
  explicit ToyRingProvider(Bug bug = Bug::kNone);
  const kvcheck::engines::Capabilities& capabilities() override { return caps_; }
  std::unique_ptr<kvcheck::engines::CacheUnderTest> open(const kvcheck::engines::CacheSpec& spec,
                                                         kvcheck::engines::Refusal* refused) override;
  std::string name() const override { return caps_.name; }

 private:
  Bug bug_;
  kvcheck::engines::Capabilities caps_;
};

}  // namespace toy
