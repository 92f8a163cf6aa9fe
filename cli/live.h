#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include <CLI/CLI.hpp>

#include "net/http.h"

namespace goodput {

// A job master for a spec file: its log and files in run_dir, nodes from the spec's backend (local)
// or agents that connect (not local); returns the process exit code (0: the job completed).
struct ServeOptions {
  std::string spec_path;
  std::string run_dir;
  std::string listen = "127.0.0.1";
  uint16_t port = 0;
  bool resume = false;
  bool local = true;  // run: start agents here; master: wait for agents from elsewhere
  std::string faults_path;
  bool quiet = false;
  net::TlsFiles tls;  // both set: the API is HTTPS only
  std::string read_access = "auto";
  // SIGTERM stops only the master (kExitResumable): its agents keep training, `--resume` carries on.
  // For a master that Kubernetes runs, whose pod gets SIGTERM when it is evicted or its node drained.
  bool detach_on_sigterm = false;
  // Where the master writes how it ended, as one JSON object (the exit status, the finish reason,
  // step, goodput, restarts, the last failure, or the error): a pod's terminationMessagePath, which
  // the kubelet puts into the container's terminated state for `goodput operator` to read.
  std::string termination_log;
  // Called once the master listens (its URL, the job's token): `goodput torchrun` starts the
  // rendezvous host's own agent there.
  std::function<void(const std::string& url, const std::string& token)> on_listening;
};
// serve()'s exit status: 0 the job completed; 1 it ended otherwise (gave up, failed, stopped);
// kExitResumable the master stopped with the job still on (its log unwritable, or detached by
// SIGTERM): run it again with --resume. (2 is a bad command line or job spec.)
constexpr int kExitResumable = 3;
int serve(ServeOptions o);

// `goodput run | master | agent | inject`: supervise a real job.
void add_live_commands(CLI::App& app, int& rc);
}  // namespace goodput
