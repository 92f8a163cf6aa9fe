#pragma once

#include <string>

namespace goodput {

struct ZoneBenchOptions {
  std::string backend = "kubernetes";  // or "ray"
  int nodes = 2000;         // the job's nodes (pods, Ray jobs)
  int lose = 1000;          // of them, lost at once with their machines (a zone)
  double qps = 100;         // the master's API limits (backend.api_qps, api_burst, api_concurrency)
  int burst = 100;
  int concurrency = 16;
  bool baseline = true;     // also with client-go's defaults (5 QPS, burst 10, one call at a time)
  std::string emulator;     // tests/emulators/kube/kube_emulator.py or tests/emulators/ray/ray_emulator.py
  std::string fixtures;     // shared/data/k8s or shared/data/ray
};

// `goodput bench kube` / `goodput bench ray`: a zone lost under a big job, on the cluster's
// emulator; an exit code.
int run_zone_bench(const ZoneBenchOptions& options);

}  // namespace goodput
