// Stragglers in training: a rank whose CPU work per step is well above the typical rank's.
//
// Synchronized ranks all take as long per step as the slowest, so step times say nothing of who
// is slow; what differs is the work each does in a step, which its agent measures (median and MAD
// over its last steps). The evidence goes in the log as a SlowdownObserved with the ratio; the
// recovery policy decides whether to replace the node. Each node's newest reported slowdown is a
// fold of the log, so a resumed master neither repeats one nor forgets one.
#pragma once

#include <map>
#include <optional>
#include <vector>

#include "backends/live/world.h"

namespace goodput::live {

class Stragglers {
 public:
  explicit Stragglers(double factor) : factor_(factor) {}
  void fold(const SlowdownObserved& s) { permille_[s.node] = s.slowdown_permille; }
  // The slowdown last reported for a node (permille; 1000: none or over; 0: never reported).
  int32_t reported(NodeId node) const;
  // A new slowdown (a rank at least `factor` times the typical one, on a steady window, and more
  // than 10% off what was last reported for it), or the end of one (back under 0.8 factor); the
  // first such among the ranks, or nothing. Off with a factor of 0 or fewer than two ranks.
  std::optional<SlowdownObserved> judge(const std::vector<Node*>& ranks) const;

 private:
  double factor_;
  std::map<NodeId, int32_t> permille_;
};

}  // namespace goodput::live
