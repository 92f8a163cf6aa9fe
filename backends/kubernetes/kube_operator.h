// `goodput operator`: runs each GoodputJob's master on the cluster and keeps the resource's status.
// Level-triggered: GoodputJobs and the masters' pods are listed, then watched (a 410 re-lists), and
// every known job is reconciled again each resync, so an operator killed at any moment and started
// again converges from what the cluster holds; its only memory is what it wrote into each job's
// status. What to do is decided by goodput_job.h's reconcile(); this is its I/O: reading the job,
// its master's pod and the master's /status, creating what the job owns, and writing the status
// and Events.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "backends/kubernetes/goodput_job.h"
#include "backends/kubernetes/kube_client.h"

namespace goodput::kube {

struct OperatorOptions {
  KubeConfig config;
  std::string namespace_;  // empty: GoodputJobs in every namespace
  std::chrono::milliseconds resync{2000};  // every job is looked at again this often (its master's /status)
  bool quiet = false;                       // no line per decision on stderr
};

class Operator {
 public:
  explicit Operator(OperatorOptions options);
  // Until `stop` is set.
  void run(const std::atomic<bool>& stop);

 private:
  using Key = std::pair<std::string, std::string>;  // namespace, name
  void watch_loop(bool jobs, const std::atomic<bool>& stop);
  void enqueue(const Key& k);
  void reconcile(const Key& k);
  std::string token_of(const nlohmann::json& job, bool create);
  // spec.policy_from's document (null: none); a ConfigError names what is missing.
  nlohmann::json policy_from(const nlohmann::json& job, const std::string& ns);
  void ensure(const std::string& path, const nlohmann::json& object);  // create; one that exists is left
  void emit(const nlohmann::json& job, const JobEvent& e);
  void say(const Key& k, const std::string& what) const;

  OperatorOptions o_;
  KubeClient client_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::set<Key> queue_;  // jobs to look at now
  std::set<Key> known_;  // every job the watch knows of
  std::map<Key, std::pair<std::string, std::string>> tokens_;  // by job: its uid (a job made anew has another), the token
  std::string host_;  // reportingInstance of the Events
  int64_t events_ = 0;
};

}  // namespace goodput::kube
