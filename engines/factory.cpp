#include "engines/factory.hpp"

#include "engines/layer_cache.hpp"
#include "engines/ring_pool_cache.hpp"
#include "impl/kv_cache.hpp"
#include "support/error.hpp"

namespace kvcheck::engines {

bool is_exec(const std::string& impl) noexcept {
  return impl.rfind("exec:", 0) == 0;
}

std::unique_ptr<CacheProvider> make_provider(const std::string& impl, const std::string& fault_name,
                                             const ExecOptions& exec) {
  impl::Fault fault = impl::Fault::kNone;
  if (!impl::parse_fault(fault_name, &fault)) {
    throw Error(ErrorId::kUsage, "--fault", "unknown fault '" + fault_name + "' (see `kvcheck faults`)");
  }
  if (impl == "cpu" || impl == "cuda") return make_ring_pool_provider(impl, fault);
  if (impl == "paged") return make_paged_pool_provider("cpu", fault);  // the CPU ring pool over a block table
  if (fault != impl::Fault::kNone) {
    throw Error(ErrorId::kUsage, "--fault",
                "named faults belong to the ring pool (--impl cpu, cuda or paged), not to " + impl);
  }
  if (impl == "layer") return make_layer_cache_provider();
  if (is_exec(impl)) return make_exec_provider(impl.substr(5), exec);
  throw Error(ErrorId::kUsage, "--impl",
              "unknown cache '" + impl + "' (cpu, cuda, paged, layer, or exec:'COMMAND ARGS')");
}

}  // namespace kvcheck::engines
