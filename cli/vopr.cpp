// `goodput vopr --seed N [--seeds COUNT] [--steps M] [--nodes K]`: the live master's own code under
// seeded simulation of its agents, network, machines and disk (vopr/vopr.h).
#include "cli/vopr.h"

#include <chrono>
#include <iostream>
#include <map>

#include "vopr/vopr.h"

namespace goodput {

void add_vopr_command(CLI::App& app, int& rc) {
  static vopr::Options o;
  static int64_t seeds = 1;
  static bool history = false, quiet = false;
  auto* cmd = app.add_subcommand(
      "vopr",
      "Run the live master unchanged under a seeded simulation of its agents, network, machines and event-log disk, "
      "all failing on purpose (dropped, delayed and duplicated messages; agents that die, go silent or restart; "
      "trainers that crash or hang; machines that never come; failed commits; the master killed and resumed), "
      "checking its invariants after every step and that the job completes once the faults stop. One seed is one "
      "run: the same seed reproduces it, and its event log, byte for byte.");
  cmd->add_option("--seed", o.seed, "The (first) seed")->capture_default_str();
  cmd->add_option("--seeds", seeds, "How many seeds from --seed on")->check(CLI::Range(int64_t{1}, int64_t{100'000'000}))->capture_default_str();
  cmd->add_option("--steps", o.steps, "Steps of 100 ms of virtual time with faults; then none")
      ->check(CLI::Range(int64_t{0}, int64_t{10'000'000}))
      ->capture_default_str();
  cmd->add_option("--calm-steps", o.calm_steps, "The bound on completing after the faults stop, in steps")
      ->check(CLI::Range(int64_t{1}, int64_t{10'000'000}))
      ->capture_default_str();
  cmd->add_option("--nodes", o.nodes, "Nodes of the simulated job")->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--total-steps", o.total_steps, "Training steps of the simulated job (50 ms each)")
      ->check(CLI::Range(int64_t{10}, int64_t{10'000'000}))
      ->capture_default_str();
  cmd->add_flag("--history", history, "On a failure, print the whole history (default: its last 60 lines)");
  cmd->add_flag("--quiet", quiet, "Print failures and the summary only");
  cmd->callback([&rc] {
    const auto t0 = std::chrono::steady_clock::now();
    int64_t failed = 0, events = 0, restarts = 0;
    std::map<std::string, int64_t> faults, logged;
    const uint64_t first = o.seed;
    for (int64_t i = 0; i < seeds; ++i) {
      vopr::Options one = o;
      one.seed = first + static_cast<uint64_t>(i);
      const vopr::Result r = vopr::run(one);
      if (!r.ok) ++failed;
      events += static_cast<int64_t>(r.events);
      restarts += r.master_restarts;
      for (const auto& [k, v] : r.faults) faults[k] += v;
      for (const auto& [k, v] : r.logged) logged[k] += v;
      if (!r.ok || !quiet) std::cout << vopr::describe(one, r, history) << (r.ok ? "\n" : "") << std::flush;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::cout << seeds << " seeds (" << first << ".." << first + static_cast<uint64_t>(seeds) - 1 << "), " << failed
              << " failed, " << events << " events, " << restarts << " master restarts, in " << s << " s\nfaults:";
    for (const auto& [k, v] : faults) std::cout << " " << k << " " << v;
    std::cout << "\nthe master logged:";
    for (const char* k : {"failure_observed", "slowdown_observed", "stall_observed", "recovery_decided", "restart_job",
                          "no_spare_node", "shards_completed", "job_finished"})
      std::cout << " " << k << " " << logged[k];
    std::cout << "\n";
    rc = failed > 0 ? 1 : 0;
  });
}

}  // namespace goodput
