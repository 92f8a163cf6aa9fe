// A set of small non-negative integers (machine and slot indices) as a bitmap: O(1) insert and
// erase, lowest member first. Iteration order is by index, so it never depends on history.
#pragma once

#include <algorithm>
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
    first_word_ = std::min(first_word_, static_cast<size_t>(i) >> 6);
  }
  // Room for indices below `capacity` (never shrinks).
  void reserve(int32_t capacity) {
    words_.resize(std::max(words_.size(), (static_cast<size_t>(capacity) + 63) / 64), 0);
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
    uint64_t mask = ~uint64_t{0} << (from & 63);
    // Scanning from a word boundary at or below first_word_ sees every member: only then may the
    // scan move the bound.
    const bool from_start = wi < first_word_ || (wi == first_word_ && (from & 63) == 0);
    if (wi < first_word_) {
      wi = first_word_;  // every word below it is empty
      mask = ~uint64_t{0};
    }
    if (wi >= words_.size()) return -1;
    uint64_t w = words_[wi] & mask;
    while (true) {
      if (w) {
        if (from_start) first_word_ = wi;
        return static_cast<int32_t>(wi * 64 + static_cast<size_t>(std::countr_zero(w)));
      }
      if (++wi >= words_.size()) {
        if (from_start) first_word_ = words_.size();
        return -1;
      }
      w = words_[wi];
    }
  }

 private:
  std::vector<uint64_t> words_;
  int32_t size_ = 0;
  mutable size_t first_word_ = 0;  // no member lies below this word
};

}  // namespace goodput
