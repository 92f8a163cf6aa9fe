// What the node providers that place nodes through a cluster's API share (Kubernetes pods, Ray
// jobs): the table of nodes they placed, a queue of API commands carried out by worker threads of
// their own (so a slow or failing API server never stalls the master), the losses and status
// changes the master collects, the machines excluded after a hardware error, and the end of the job
// (wait for the nodes to leave, then stop the rest). Each provider keeps only its API's specifics:
// how a command is carried out, what it watches or polls, and what it reads as a loss.
//
// The API server is shared with everyone else on the cluster, and a zone failure asks for a
// thousand pods at once: commands go out at most `api.concurrency` at a time and at most `api.qps`
// a second (a token bucket of `api.burst`), never one slow call after another. Commands for one
// node keep their order (a delete never overtakes its create); a command the API did not take is
// tried again a second later without holding up the others.
//
// Member is the provider's record of one node; it has at least the fields of ClusterMember.
// A derived class starts the worker (start_worker) at the end of its constructor and stops it
// (stop_worker) first thing in its destructor: the worker calls its virtual functions.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "backends/live/job_spec.h"
#include "backends/live/node_provider.h"
#include "net/token_bucket.h"

namespace goodput::live {

struct ClusterMember {
  int32_t slot = -1;
  int32_t memory_permille = 1000;
  std::string machine;    // the cluster machine it runs on, once placed (a node name, a Ray node id)
  std::string status;     // as last logged
  bool stopping = false;  // terminated by the master: its end is not a loss
  bool reported = false;  // its loss was reported (once)
  bool ended = false;     // gone from the cluster, or finished
};

template <class Member>
class ClusterNodes : public NodeProvider {
 public:
  void terminate(const std::string& name) final {
    {
      std::lock_guard lock(mu_);
      const auto it = members_.find(name);
      if (it == members_.end()) return;
      it->second.stopping = true;
      queue_.push_back({{Command::Delete, name, 0, -1}});
    }
    work_cv_.notify_one();
  }
  std::vector<LostNode> lost() final {
    std::lock_guard lock(mu_);
    return std::exchange(lost_, {});
  }
  std::vector<StatusObserved> status_changes() final {
    std::lock_guard lock(mu_);
    return std::exchange(changes_, {});
  }
  void set_layout(const std::vector<ReplicaGroup>& groups) final {
    std::lock_guard lock(mu_);
    groups_ = groups;
  }
  void exclude(const std::string& name) final {
    std::lock_guard lock(mu_);
    const auto it = members_.find(name);
    if (it == members_.end() || it->second.machine.empty()) {
      std::cerr << "goodput: " << names_.api << ": cannot keep later nodes off " << names_.member << " " << name
                << "'s machine: the cluster never said where it ran\n";
      return;
    }
    if (excluded_.insert(it->second.machine).second)
      std::cerr << "goodput: " << names_.api << ": " << names_.machine << " " << it->second.machine << " excluded ("
                << names_.member << " " << name << " diagnosed with a hardware error or a failed node check): later "
                << names_.member << "s keep off it\n";
  }
  // Agents leave on their own once the master says the job is over; what is still there after
  // timeout_ms is stopped (bounded: an API that is gone cannot be helped).
  void shut_down(int timeout_ms) final {
    std::unique_lock lock(mu_);
    cv_.wait_until(lock, std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms), [&] {
      for (const auto& [name, m] : members_)
        if (!m.ended && !m.stopping) return false;
      return true;
    });
    for (auto& [name, m] : members_)
      if (!m.stopping && (delete_ended_at_end_ || !m.ended)) {
        m.stopping = true;
        queue_.push_back({{Command::Delete, name, 0, -1}});
      }
    work_cv_.notify_all();
    cv_.wait_until(lock, std::chrono::steady_clock::now() + std::chrono::seconds(10), [&] { return queue_.empty(); });
  }

 protected:
  struct Command {
    enum Kind { Create, Delete, Relabel } kind;
    std::string name;  // Create: may be empty until prepare() names it
    int32_t memory_permille = 1000;
    int32_t slot = -1;  // Create: the slot it is for; Relabel: its rank now
  };

  // What messages call things: the API ("kubernetes"), a machine ("node"), a member ("pod").
  struct Names {
    std::string api, machine, member;
  };
  // delete_ended_at_end: shut_down() deletes nodes that already ended too (a pod that completed
  // still holds its object).
  ClusterNodes(Names names, std::vector<ReplicaGroup> groups, bool delete_ended_at_end, ApiLimits limits)
      : groups_(std::move(groups)),
        names_(std::move(names)),
        delete_ended_at_end_(delete_ended_at_end),
        limits_(limits),
        bucket_(limits.qps, limits.burst) {}
  ~ClusterNodes() override { stop_worker(); }

  void start_worker() {
    for (int32_t i = 0; i < std::max(limits_.concurrency, 1); ++i) workers_.emplace_back([this, i] { work(i); });
  }
  void stop_worker() {
    quit_ = true;
    cv_.notify_all();
    work_cv_.notify_all();
    for (std::thread& t : workers_)
      if (t.joinable()) t.join();
    workers_.clear();
  }

  // ---- the provider's API, on the worker threads
  virtual void on_start() {}  // first, before any command (an adoption of a resumed master's nodes)
  // Under mu_, before a command is carried out: name it, record it (it stays in the queue until it
  // is done, so a retry keeps the name).
  virtual void prepare(Command& c) { (void)c; }
  // Carry it out (without mu_; several at once, each for another node); false: the API did not
  // take it now, try again later.
  virtual bool carry_out(const Command& c) = 0;
  // Every idle_every() on the first worker (between its commands once due), without mu_: a poll,
  // a sweep for nodes pending too long.
  virtual std::chrono::steady_clock::duration idle_every() const { return std::chrono::seconds(1); }
  virtual void on_idle() {}

  // ---- for the provider, under mu_
  void queue(Command c) {
    queue_.push_back({std::move(c)});
    work_cv_.notify_one();
  }
  // The node is lost, and why: told the master once, unless the master stopped it itself.
  void report(const std::string& name, Member& m, std::string reason, bool fatal) {
    if (m.reported || m.stopping) return;
    m.reported = true;
    lost_.push_back({name, std::move(reason), fatal});
  }
  void status_changed(const std::string& kind, const std::string& name, const std::string& status) {
    changes_.push_back({kind, name, status});
  }

  std::mutex mu_;
  std::condition_variable cv_;       // the providers' own waits (quit, nodes ended, the queue empty)
  std::condition_variable work_cv_;  // the workers': a command to carry out, one woken at a time
  std::map<std::string, Member> members_;
  std::vector<ReplicaGroup> groups_;  // as set_layout() last said
  std::set<std::string> excluded_;    // machines the master found bad (hardware error, failed check): for good
  std::atomic<bool> quit_{false};     // the provider is going away (its own threads watch it too)

 private:
  using SteadyClock = std::chrono::steady_clock;
  struct Queued {
    Command command;
    bool in_flight = false;
    SteadyClock::time_point not_before{};  // a retry waits until then
  };

  void work(int32_t worker) {
    // Nothing may escape this thread (std::terminate would take the master down with it).
    while (!quit_) {
      try {
        if (worker == 0 && !started_) {
          on_start();
          std::lock_guard lock(mu_);
          started_ = true;
          work_cv_.notify_all();
        }
        run(worker);
      } catch (const std::exception& e) {
        std::cerr << "goodput: " << names_.api << ": unexpected error, carrying on: " << e.what() << "\n";
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, std::chrono::seconds(1), [&] { return quit_.load(); });
      }
    }
  }

  // The command that goes next: one not in flight, not waiting for a retry, with no earlier
  // command for the same node still queued; creates first (a replacement is what recovery waits
  // for; deleting a lost node's remains and relabelling can wait), else in the order queued.
  // `wake`: when one may be ready (a retry's time).
  typename std::list<Queued>::iterator next_command(SteadyClock::time_point now, SteadyClock::time_point& wake) {
    std::unordered_set<std::string_view> earlier;  // views of the queue's own names: nothing copied
    auto pick = queue_.end();
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      const std::string& name = it->command.name;
      const bool blocked = !name.empty() && !earlier.insert(name).second;
      if (blocked || it->in_flight) continue;
      if (it->not_before > now) {
        wake = std::min(wake, it->not_before);
        continue;
      }
      if (it->command.kind == Command::Create) return it;
      if (pick == queue_.end()) pick = it;
    }
    return pick;
  }

  void run(int32_t worker) {
    auto next_idle = SteadyClock::now();
    while (!quit_) {
      std::optional<Command> c;
      typename std::list<Queued>::iterator picked;
      {
        std::unique_lock lock(mu_);
        for (;;) {
          if (quit_) return;
          const auto now = SteadyClock::now();
          if (worker == 0 && now >= next_idle) break;  // the idle work is due
          auto wake = worker == 0 ? next_idle : now + std::chrono::seconds(1);
          if (started_) {
            if (auto it = next_command(now, wake); it != queue_.end()) {
              if (const auto wait = bucket_.take(now); wait == SteadyClock::duration::zero()) {
                prepare(it->command);
                it->in_flight = true;
                picked = it;
                c = it->command;
                work_cv_.notify_one();  // another worker for what may remain
                break;
              } else {
                wake = std::min(wake, now + wait);  // the rate limit: the next token
              }
            }
          }
          work_cv_.wait_until(lock, wake);
        }
      }
      if (!c) {
        on_idle();
        next_idle = SteadyClock::now() + idle_every();
        continue;
      }
      const bool done = carry_out(*c);
      std::lock_guard lock(mu_);
      if (done) {
        queue_.erase(picked);
      } else {  // the API refused it for now: a second before trying again, the others go on
        picked->in_flight = false;
        picked->not_before = SteadyClock::now() + std::chrono::seconds(1);
      }
      work_cv_.notify_one();  // a command of the same node may go now
      cv_.notify_all();       // shut_down() waits for the queue to empty
    }
  }

  Names names_;
  bool delete_ended_at_end_;
  ApiLimits limits_;
  net::TokenBucket bucket_;  // under mu_
  bool started_ = false;     // on_start() is done: commands may go
  std::list<Queued> queue_;
  std::vector<LostNode> lost_;
  std::vector<StatusObserved> changes_;
  std::vector<std::thread> workers_;
};

}  // namespace goodput::live
