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
  // Called once the master listens (its URL, the job's token): `goodput torchrun` starts the
  // rendezvous host's own agent there.
  std::function<void(const std::string& url, const std::string& token)> on_listening;
};
int serve(ServeOptions o);

// `goodput run | master | agent | inject`: supervise a real job.
void add_live_commands(CLI::App& app, int& rc);
}  // namespace goodput
