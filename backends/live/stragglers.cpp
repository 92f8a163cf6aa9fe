#include "backends/live/stragglers.h"

#include <algorithm>
#include <cmath>

namespace goodput::live {

int32_t Stragglers::reported(NodeId node) const {
  const auto it = permille_.find(node);
  return it == permille_.end() ? 0 : it->second;
}

std::optional<SlowdownObserved> Stragglers::judge(const std::vector<Node*>& ranks) const {
  // Each rank's median work against the typical rank's (the lower median, so two ranks compare
  // with the faster one).
  if (factor_ <= 0 || ranks.size() < 2) return std::nullopt;
  std::vector<double> med;
  for (const Node* n : ranks) {
    if (n->trainer.work_median_s <= 0) return std::nullopt;
    med.push_back(n->trainer.work_median_s);
  }
  std::sort(med.begin(), med.end());
  const double typical = med[(med.size() - 1) / 2];
  for (const Node* n : ranks) {
    const Trainer& t = n->trainer;
    const double ratio = t.work_median_s / typical;
    const bool steady = t.work_mad_s <= 0.25 * t.work_median_s;  // not a noisy window
    const int32_t permille = static_cast<int32_t>(std::lround(ratio * 1000));
    const int32_t flagged = reported(n->id);
    if (ratio >= factor_ && steady && std::abs(permille - flagged) > 100) return SlowdownObserved{n->id, permille};
    if (flagged > 1000 && ratio < factor_ * 0.8) return SlowdownObserved{n->id, 1000};
  }
  return std::nullopt;
}

}  // namespace goodput::live
