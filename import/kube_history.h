// A cluster's Kubernetes history as a trace (`goodput trace import --from k8s`). Reads what kubectl
// and the API give: `kubectl get pods -A -o json` (a PodList), `kubectl get nodes -o json`,
// `kubectl get events -A -o json` (an EventList), any `kind: List` of those, or a watch stream saved
// as NDJSON (`curl .../api/v1/pods?watch=1`: one {"type", "object"} frame per line, read as a
// stream). A pod's failure is read exactly as the live backend reads it (pod_trouble: the
// container's `reason` first, `lastState` after a kubelet restart, Evicted, CrashLoopBackOff);
// the trace's reasons are the live backend's, so the simulator's diagnosis table decides the same:
//   container terminated (OOMKilled, Error, a signal) -> process_crash with its exit code, signal
//   pod Evicted, a DisruptionTarget condition, an Evicted/Preempted event -> maintenance
//   node Ready=False/Unknown, an unreachable taint, a NodeNotReady event -> node_failure; Ready
//   again, a NodeReady event -> node_return
// Configuration errors (ImagePullBackOff and kin) are the job's, not the cluster's: counted, left out.
#pragma once

#include <string>
#include <vector>

#include "sim/trace_import.h"

namespace goodput::kube {

// Throws TraceError naming the file, the line (NDJSON) and the field.
TraceBuilder import_history(const std::vector<std::string>& files);

}  // namespace goodput::kube
