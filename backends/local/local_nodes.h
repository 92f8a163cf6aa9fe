// The local backend: every "node" is a `goodput agent` process on this machine, in its own process
// group. Relaunching a node kills that whole group and removes the node's shared memory (a lost
// machine takes its host memory with it), then starts a fresh agent under a new name.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <vector>

#include "backends/live/live_master.h"

namespace goodput::local {

struct LocalNodesOptions {
  std::string agent_binary;  // the goodput executable
  std::string master_url;
  std::string token;         // handed to agents through the environment, not argv
  std::string job;           // job name and run id: "<job>-<run id>", as in shared-memory names
  std::string run_dir;       // <run_dir>/nodes/<name>/ holds each agent's log and trainer files
};

class LocalNodes final : public live::NodeProvider {
 public:
  explicit LocalNodes(LocalNodesOptions options);
  ~LocalNodes() override;  // kills what is left

  void launch(int32_t slot, int32_t memory_permille) override;
  void terminate(const std::string& name) override;
  std::vector<live::LostNode> lost() override;
  void shut_down(int timeout_ms) override;
  // Agents that were started by an earlier master of this run (after a master crash) are
  // adopted from their pid files so they can still be terminated.
  void adopt_existing();
  size_t running() const { return agents_.size(); }

 private:
  LocalNodesOptions o_;
  std::map<std::string, pid_t> agents_;  // name -> pid (also its process group)
  int counter_ = 0;
};

// Removes /dev/shm objects whose names start with prefix (without the leading '/').
void remove_shm_with_prefix(const std::string& prefix);

}  // namespace goodput::local
