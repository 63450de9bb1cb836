// The reference model's number type. The model is templated on its real type;
// the default is an MPFR-backed Boost.Multiprecision float with 34 decimal
// digits (`--precision 113`; Boost gives it 114 significand bits),
// stack-allocated so each operation costs no heap traffic. Real50 (50
// digits, `--precision 169`, 168 bits) is there for precision selection; `double` instantiates the same templates for quick comparisons.
#pragma once

#include <boost/multiprecision/mpfr.hpp>
#include <string>

namespace kvcheck::model {

namespace bmp = boost::multiprecision;

/// Default reference real: 34 decimal digits, 114 significand bits (>= 100).
using Real = bmp::number<bmp::mpfr_float_backend<34, bmp::allocate_stack>, bmp::et_off>;
/// Higher-precision alternative: 50 decimal digits, 168 significand bits.
using Real50 = bmp::number<bmp::mpfr_float_backend<50, bmp::allocate_stack>, bmp::et_off>;

/// Significand bits of a real type (53 for double).
template <class R>
constexpr int real_bits() {
  if constexpr (std::is_same_v<R, double>) {
    return 53;
  } else {
    return std::numeric_limits<R>::digits;
  }
}

/// Converts any model real to double (nearest).
template <class R>
double to_double(const R& x) {
  if constexpr (std::is_same_v<R, double>) {
    return x;
  } else {
    return x.template convert_to<double>();
  }
}

}  // namespace kvcheck::model

namespace kvcheck::model {

/// Frees MPFR's per-thread caches (constants, exp/cos tables). Call at the
/// end of every worker thread that used the model, or LeakSanitizer reports
/// them when the thread exits.
void release_thread_caches() noexcept;

}  // namespace kvcheck::model
