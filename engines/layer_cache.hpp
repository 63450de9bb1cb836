// The layer-bound cache of seed 000 (impl/cpu/layer_kv_cache.hpp) as a
// step-level cache under test, so `check` reaches it too.
//
// The cache appends one token per call to a fixed-capacity buffer bound to an
// AttentionLayer and attends to every row it holds. The adapter feeds it
// kvcheck's independent q, k, v rows through the layer's own projections: the
// layer is 3*H heads of width d (model width 3*H*d), the input is [q | k | v],
// Wq, Wk and Wv select their third into heads 0..H-1 (the other heads see zero
// rows and output zeros), and Wo is the identity. The physical row of
// position p is p, so written and read slots are reported truthfully.
//
// Refusal probes exercise its typed refusals along random schedules: a
// rebuilt layer (new parameter identities), a layer with another RoPE, an
// input of the wrong width, two tokens at once, a NaN input, and a parameter
// updated in place (a new revision). Each must be refused with the seed's
// error and leave length and storage byte-identical. A bumped revision never
// comes back, so after that probe the adapter does what the seed prescribes:
// it rebuilds the cache for the updated layer and replays the inputs since the
// last reset, and the next call fails ("replay-mismatch") unless the replayed
// rows equal the old cache's live rows byte for byte.
#pragma once

#include <memory>

#include "engines/cache_under_test.hpp"

namespace kvcheck::engines {

/// Provider of layer-bound caches ("layer").
std::unique_ptr<CacheProvider> make_layer_cache_provider();

}  // namespace kvcheck::engines
