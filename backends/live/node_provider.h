// Where a live job's machines come from. The local backend starts agent processes, Ray runs them as
// Ray jobs, Kubernetes as pods; LiveMaster asks through this interface and never knows which.
// Providers that place nodes through a cluster's API share the worker thread, retries and
// bookkeeping of cluster_nodes.h.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backends/live/job_spec.h"
#include "engine/event.h"

namespace goodput::live {

// A node the provider saw die, and what it knows of why (an exit status, a Ray job's message and
// log tail, a dead machine). The reason goes to the diagnosis table: "OutOfMemoryError" in it
// reads as an OOM even though the whole node is gone.
struct LostNode {
  std::string name;
  std::string reason;
  bool fatal = false;  // a configuration error (Ray refused the job): trying again cannot help
};

// Where machines come from: the local backend starts agent processes, Ray runs them as Ray jobs.
class NodeProvider {
 public:
  virtual ~NodeProvider() = default;
  // Start a fresh node that will register itself for `slot` (the rank it is meant to take; it
  // takes another vacant one if that is taken by then); memory_permille scales its memory limit.
  virtual void launch(int32_t slot, int32_t memory_permille) = 0;
  // The node is out of the job: stop it for good (its host memory goes with it).
  virtual void terminate(const std::string& name) = 0;
  // Nodes the provider saw die since the last call (process gone, Ray job failed, machine dead).
  virtual std::vector<LostNode> lost() = 0;
  // The job is over: wait up to timeout_ms for nodes to leave on their own, then stop the rest.
  virtual void shut_down(int timeout_ms) = 0;
  // The job has ended for good (not a master leaving to be resumed), after shut_down: remove what
  // only its nodes needed (the agents' token Secret on Kubernetes).
  virtual void job_over() {}
  // The machine under this node is bad (a hardware diagnosis, a failed node check): place no more
  // nodes on it. Providers that do not choose machines (the local one) have nothing to do.
  virtual void exclude(const std::string& name) { (void)name; }
  // Status changes of the cluster objects the job runs on, since the last call, for the log.
  virtual std::vector<StatusObserved> status_changes() { return {}; }
  // An operator scaled a replica group: slots are laid out anew (launch() takes the new slots).
  // Providers that pick a machine shape by slot follow; the others have nothing to do.
  virtual void set_layout(const std::vector<ReplicaGroup>& groups) { (void)groups; }
  // The node runs as this rank from this restart on (it may not be the slot it was launched for:
  // a group was scaled, or a spare took a vacant slot). Providers that label machines by rank
  // follow; the others have nothing to do.
  virtual void ranked(const std::string& name, int32_t rank) { (void)name, (void)rank; }
};

}  // namespace goodput::live
