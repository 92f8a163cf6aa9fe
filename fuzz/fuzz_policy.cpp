// Fuzzes policy configuration: JSON in, a PolicySet or a PolicyError out.
#include <cstdint>
#include <string>

#include "policies/policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  try {
    const goodput::PolicySet p = goodput::load_policy(j);
    // Exercise the diagnosis table the config built.
    goodput::JobState s;
    goodput::FailureObserved f{0, goodput::FailureKind::ProcessExit, 137, 9, "OOMKilled", 0};
    (void)p.recovery->on_failure(s, f);
  } catch (const goodput::PolicyError&) {
  }
  return 0;
}
