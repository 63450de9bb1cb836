#include "model/encoding.hpp"

namespace kvcheck::model {

namespace {

/// e4m3 code -> value (0x7F and 0xFF are NaN, which the reference never writes).
double e4m3_value(std::uint8_t code) {
  const int e = (code >> 3) & 0xF;
  const int m = code & 7;
  double a = 0;
  if (e == 0xF && m == 7) {
    a = std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    a = std::ldexp(static_cast<double>(m), -9);
  } else {
    a = std::ldexp(static_cast<double>(8 + m), e - 7 - 3);
  }
  return (code & 0x80u) != 0 ? -a : a;
}

}  // namespace

std::vector<double> decode_row(Encoding f, const std::uint8_t* bytes, std::int64_t n) {
  std::vector<double> out(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) {
    double& v = out[static_cast<std::size_t>(i)];
    switch (f) {
      case Encoding::kF64: std::memcpy(&v, bytes + 8 * i, 8); break;
      case Encoding::kF32: {
        float s = 0;
        std::memcpy(&s, bytes + 4 * i, 4);
        v = s;
        break;
      }
      case Encoding::kBf16: {
        std::uint16_t h = 0;
        std::memcpy(&h, bytes + 2 * i, 2);
        const std::uint32_t u = static_cast<std::uint32_t>(h) << 16;
        float s = 0;
        std::memcpy(&s, &u, 4);
        v = s;
        break;
      }
      case Encoding::kFp8: {
        const std::uint8_t scale = bytes[n + i / kFp8ScaleBlock];
        v = std::ldexp(e4m3_value(bytes[i]), static_cast<int>(scale) - 127);
        break;
      }
    }
  }
  return out;
}

}  // namespace kvcheck::model
