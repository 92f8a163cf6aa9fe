// The event loop's queue: items ordered by (time, insertion number), so simultaneous items run
// first-in first-out and a run never depends on pointer values, hash order or thread timing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/time.h"

namespace goodput {

template <class T>
class EventQueue {
 public:
  struct Entry {
    Time time;
    uint64_t order;
    T item;
  };

  void push(Time time, T item) {
    heap_.push_back(Entry{time, next_order_++, std::move(item)});
    std::push_heap(heap_.begin(), heap_.end(), later);
  }
  bool empty() const { return heap_.empty(); }
  size_t size() const { return heap_.size(); }
  const Entry& top() const { return heap_.front(); }
  Entry pop() {
    std::pop_heap(heap_.begin(), heap_.end(), later);
    Entry e = std::move(heap_.back());
    heap_.pop_back();
    return e;
  }
  void clear() { heap_.clear(); }

 private:
  static bool later(const Entry& a, const Entry& b) {
    return a.time != b.time ? a.time > b.time : a.order > b.order;
  }
  std::vector<Entry> heap_;
  uint64_t next_order_ = 0;
};

}  // namespace goodput
