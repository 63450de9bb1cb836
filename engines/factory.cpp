#include "engines/factory.hpp"

#include "engines/layer_cache.hpp"
#include "engines/ring_pool_cache.hpp"
#include "support/error.hpp"

namespace kvcheck::engines {

bool is_exec(const std::string& impl) noexcept {
  return impl.rfind("exec:", 0) == 0;
}

std::unique_ptr<CacheProvider> make_provider(const std::string& impl, impl::Fault fault,
                                             const ExecOptions& exec) {
  if (impl == "cpu" || impl == "cuda") return make_ring_pool_provider(impl, fault);
  if (fault != impl::Fault::kNone) {
    throw Error(ErrorId::kUsage, "--fault",
                "named faults belong to the ring pool (--impl cpu or cuda), not to " + impl);
  }
  if (impl == "layer") return make_layer_cache_provider();
  if (is_exec(impl)) return make_exec_provider(impl.substr(5), exec);
  throw Error(ErrorId::kUsage, "--impl",
              "unknown cache '" + impl + "' (cpu, cuda, layer, or exec:'COMMAND ARGS')");
}

}  // namespace kvcheck::engines
