#include "properties/stored_rows.hpp"

#include <cstdio>

namespace kvcheck::properties {

std::string exact_text(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

}  // namespace kvcheck::properties
