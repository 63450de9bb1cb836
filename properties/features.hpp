// The features a generated case may exercise, one row each: the step kinds
// a cache runs, the structural parts of a schedule (trims, shared prefixes,
// a window per layer, long runs over a shared pool) and the shapes of a
// configuration (GQA, sink, RoPE, narrow formats, shared rows, layers).
// Every case draws a random subset of what the cache declares (swarm
// testing: docs/check.md "Features"), so features meet in one case; coverage
// then counts, per declared feature and per pair of them, the cases that
// exercised it (properties/generator.hpp).
//
// Pool pressure (a cache that shares prefixes and reports cached rows) is
// many short requests on few states, each finishing, so the cache's free
// pool turns over and cached blocks are evicted before a later begin looks
// them up (docs/check.md "Features").
//
// A feature is one row here (its name, what a cache must declare for it, and
// what a scenario must contain to exercise it) plus, where it shapes the
// schedule, one part of the generator (generator.cpp's FeaturePart).
#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <vector>

#include "engines/cache_under_test.hpp"
#include "scenarios/scenario.hpp"

namespace kvcheck::properties {

/// Which distribution `kvcheck check` draws cases from (`--profile`). A
/// profile is a preset of sizes and emphasis: every profile draws, per case,
/// a random subset of the features the cache declares; a profile named after
/// a feature draws it in every case (where the cache declares it).
enum class Profile : std::uint8_t {
  kDefault,     ///< small caches (window 1..7, head width 2..8): milliseconds a case
  kProduction,  ///< production shapes under a per-case work budget
  kTrim,        ///< the default's sizes, trims in every case (a cache that declares trim)
  kPaged,       ///< long runs in every case: windows of one to three blocks, 4..8 requests on 2..4 states
  kLayers,      ///< the default's sizes, a window per layer in every case (per_layer_windows)
  kPrefix,      ///< the default's sizes, shared prefixes in every case (prefix_sharing)
};

// X(id, name, what a case must contain to exercise it). New rows go last
// (a coverage class keeps its index).
#define KVCHECK_FEATURES(X)                                                                          \
  X(kVerify, "verify", "a verify step (its accept follows)")                                         \
  X(kPrefillLoadThenStore, "prefill_load_then_store", "a prefill chunk that reads before it stores") \
  X(kPrefillStoreThenLoad, "prefill_store_then_load", "a prefill chunk that stores before it reads") \
  X(kFinish, "finish", "a finish step")                                                              \
  X(kReset, "reset", "a reset step")                                                                 \
  X(kTrim, "trim", "a trim step")                                                                    \
  X(kPrefix, "prefix", "a request that begins from another's shared prefix")                         \
  X(kLayerWindows, "layer_windows", "a window per layer (cache.layer_windows)")                      \
  X(kLongRuns, "long_runs", "a long run: 3 or more requests over 16 or more steps")                  \
  X(kLayers, "layers", "two or more layers")                                                         \
  X(kGqa, "gqa", "more query heads than KV heads")                                                   \
  X(kSink, "sink", "an attention-sink logit")                                                        \
  X(kRope, "rope", "a RoPE style")                                                                   \
  X(kNarrowFormat, "narrow_format", "rows stored in a format narrower than f64")                     \
  X(kSharedRow, "shared_row", "one stored row as both key and value")                                \
  X(kPoolPressure, "pool_pressure",                                                                  \
    "four or more requests, three finishing, one beginning from a finished request's prefix")        \
  X(kPreempt, "preempt", "a preempt step (the request resumes at its next step)")

enum class Feature : std::uint8_t {
#define KVCHECK_FEATURE_ENUM(id, name, what) id,
  KVCHECK_FEATURES(KVCHECK_FEATURE_ENUM)
#undef KVCHECK_FEATURE_ENUM
};

#define KVCHECK_FEATURE_COUNT(id, name, what) +1
inline constexpr int kFeatureCount = 0 KVCHECK_FEATURES(KVCHECK_FEATURE_COUNT);
#undef KVCHECK_FEATURE_COUNT

/// One bit per Feature.
using FeatureSet = std::bitset<kFeatureCount>;

/// The feature's name ("trim").
const char* feature_name(Feature feature) noexcept;
/// What a case must contain to exercise it.
const char* feature_meaning(Feature feature) noexcept;

/// The features the generator can draw for a cache with `caps` under
/// `profile`: what the cache declares, inside its limits (a cache of one
/// layer gets no window per layer, one without a second query head no GQA).
FeatureSet drawable_features(const engines::Capabilities& caps, Profile profile);

/// The features `scenario` exercises (from its configuration and schedule).
FeatureSet exercised_features(const scenarios::Scenario& scenario);

}  // namespace kvcheck::properties
