// libFuzzer target for the exec answer parser (engines/exec_cache.cpp,
// engines/exec_hello.cpp): the input is the adapter's side of the fixed
// exchange of exec_answer_schedule.hpp, one answer line per request. Any
// input either runs or throws kvcheck::Error; any other exception, a crash,
// a sanitizer report or an accepted answer of the wrong shape is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "engines/fuzz/exec_answer_schedule.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  try {
    kvcheck::engines::fuzz::run_answer_schedule(
        std::make_unique<kvcheck::engines::fuzz::MemoryTransport>(input));
  } catch (const kvcheck::Error&) {
    // a refused answer: the expected outcome for most inputs
  }
  return 0;
}
