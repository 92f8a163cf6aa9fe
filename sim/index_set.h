// A set of small non-negative integers (machine and slot indices) as a bitmap: O(1) insert and
// erase, lowest member first. Iteration order is by index, so it never depends on history.
#pragma once

#include <bit>
#include <cstdint>
#include <vector>

namespace goodput {

class IndexSet {
 public:
  explicit IndexSet(int32_t capacity = 0) : words_((static_cast<size_t>(capacity) + 63) / 64, 0) {}
  void insert(int32_t i) {
    uint64_t& w = words_[static_cast<size_t>(i) >> 6];
    const uint64_t bit = uint64_t{1} << (i & 63);
    size_ += (w & bit) == 0;
    w |= bit;
  }
  void erase(int32_t i) {
    uint64_t& w = words_[static_cast<size_t>(i) >> 6];
    const uint64_t bit = uint64_t{1} << (i & 63);
    size_ -= (w & bit) != 0;
    w &= ~bit;
  }
  bool empty() const { return size_ == 0; }
  int32_t size() const { return size_; }
  // The lowest member at or above `from`, or -1.
  int32_t next(int32_t from = 0) const {
    size_t wi = static_cast<size_t>(from) >> 6;
    if (wi >= words_.size()) return -1;
    uint64_t w = words_[wi] & (~uint64_t{0} << (from & 63));
    while (true) {
      if (w) return static_cast<int32_t>(wi * 64 + static_cast<size_t>(std::countr_zero(w)));
      if (++wi >= words_.size()) return -1;
      w = words_[wi];
    }
  }

 private:
  std::vector<uint64_t> words_;
  int32_t size_ = 0;
};

}  // namespace goodput
