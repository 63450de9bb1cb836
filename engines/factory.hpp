// Makes a cache provider from its command-line name: "cpu" and "cuda" (the
// ring pool over that kernel table, with an optional named fault), "layer"
// (the layer-bound cache) and "exec:COMMAND" (an engine in another process).
#pragma once

#include <memory>
#include <string>

#include "engines/cache_under_test.hpp"
#include "engines/exec_cache.hpp"

namespace kvcheck::engines {

/// Throws kvcheck::Error naming --impl (kUsage for an unknown name, kDevice
/// for an unavailable backend, kAdapter for an adapter that does not start)
/// or --fault (an unknown fault name, or a fault given for a cache that has
/// no named faults). `fault` is a name of `kvcheck faults`, "none" for none.
std::unique_ptr<CacheProvider> make_provider(const std::string& impl, const std::string& fault,
                                             const ExecOptions& exec = {});

/// Whether `impl` names an exec adapter ("exec:...").
bool is_exec(const std::string& impl) noexcept;

}  // namespace kvcheck::engines
