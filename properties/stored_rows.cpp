#include "properties/stored_rows.hpp"

#include <cstdio>

namespace kvcheck::properties {

const char* encoding_label(model::Encoding f) noexcept {
  switch (f) {
    case model::Encoding::kF64: return "f64";
    case model::Encoding::kF32: return "f32";
    case model::Encoding::kBf16: return "bf16";
    case model::Encoding::kFp8: return "fp8";
  }
  return "?";
}

std::string exact_text(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

}  // namespace kvcheck::properties
