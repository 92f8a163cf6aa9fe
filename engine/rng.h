// Our own seeded PRNG (xoshiro256**, seeded through splitmix64): the same seed gives the same
// numbers with every compiler and standard library, which the standard library's
// distributions do not promise.
#pragma once

#include <cmath>
#include <cstdint>

namespace goodput {

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    for (auto& s : s_) s = splitmix(seed);
  }
  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; bias below 2^-32 for n < 2^32).
  uint64_t below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64); }
  // Exponential with the given mean.
  double exponential(double mean) { return -std::log1p(-uniform()) * mean; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  static uint64_t splitmix(uint64_t& x) {
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  uint64_t s_[4];
};

}  // namespace goodput
