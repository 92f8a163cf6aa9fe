#pragma once

#include <string>

namespace goodput {

struct KubeBenchOptions {
  int nodes = 2000;         // the job's pods
  int lose = 1000;          // of them, lost at once with their nodes (a zone)
  double qps = 100;         // the master's API limits (backend.api_qps, api_burst, api_concurrency)
  int burst = 100;
  int concurrency = 16;
  bool baseline = true;     // also with client-go's defaults (5 QPS, burst 10, one call at a time)
  std::string emulator;     // tests/emulators/kube/kube_emulator.py
  std::string fixtures;     // shared/data/k8s
};

// `goodput bench kube`: a zone lost under a big job, on the Kubernetes API emulator; an exit code.
int run_kube_bench(const KubeBenchOptions& options);

}  // namespace goodput
