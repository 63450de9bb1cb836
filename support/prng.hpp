// The project's one PRNG: splitmix64 seeding a xoshiro256**, with integer and
// real distributions written here. std:: distributions differ between standard
// libraries, and reports must be byte-identical for the same seed everywhere.
#pragma once

#include <cstdint>

#include "support/assert.hpp"

namespace kvcheck {

__extension__ typedef unsigned __int128 Uint128;  ///< GCC/Clang extension, for Lemire's method

/// splitmix64 step; also used to derive independent sub-seeds.
constexpr std::uint64_t splitmix64(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

/// Mixes several integers into one seed (order matters).
constexpr std::uint64_t mix_seed(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t s = a ^ (b * 0xd1342543de82ef95ULL + 0x632be59bd9b4e019ULL);
  return splitmix64(s);
}

/// xoshiro256** generator.
class Prng {
 public:
  explicit constexpr Prng(std::uint64_t seed) noexcept {
    std::uint64_t s = seed;
    for (auto& w : s_) w = splitmix64(s);
  }

  /// Next raw 64-bit output.
  constexpr std::uint64_t next() noexcept {
    const std::uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const std::uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  /// Uniform integer in [0, bound) without modulo bias (Lemire's method).
  std::uint64_t below(std::uint64_t bound) noexcept {
    KVCHECK_ASSERT(bound > 0);
    Uint128 m = static_cast<Uint128>(next()) * bound;
    auto low = static_cast<std::uint64_t>(m);
    if (low < bound) {
      const std::uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        m = static_cast<Uint128>(next()) * bound;
        low = static_cast<std::uint64_t>(m);
      }
    }
    return static_cast<std::uint64_t>(m >> 64);
  }

  /// Uniform integer in [lo, hi] (inclusive).
  std::int64_t range(std::int64_t lo, std::int64_t hi) noexcept {
    KVCHECK_ASSERT(lo <= hi);
    return lo + static_cast<std::int64_t>(below(static_cast<std::uint64_t>(hi - lo) + 1));
  }

  /// True with probability num/den.
  bool chance(std::uint64_t num, std::uint64_t den) noexcept { return below(den) < num; }

  /// Uniform double in [0, 1) with 53 random bits.
  double unit() noexcept { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

  /// Uniform double in [-1, 1) rounded to a multiple of 2^-20, so rows are
  /// exact in every element format we compare at high precision.
  double signed_unit() noexcept {
    return static_cast<double>(static_cast<std::int64_t>(next() >> 43) - (1LL << 20)) * 0x1.0p-20;
  }

 private:
  static constexpr std::uint64_t rotl(std::uint64_t x, int k) noexcept { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4]{};
};

}  // namespace kvcheck
