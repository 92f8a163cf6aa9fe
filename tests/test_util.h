// Helpers shared by the tests: small traces built in code, and running the real `goodput` binary.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "sim/trace.h"

namespace goodput::test {

// 4 nodes of 8 accelerators, 1 s steps, 2 GB checkpoints: saving takes 0.2 s to memory (10 GB/s)
// and 2 s to storage (1 GB/s). Start-up: 60 s scheduling, 30 s restart, 10 s rendezvous.
inline Trace small_trace(Duration horizon, int32_t spares = 0) {
  Trace t;
  t.name = "small";
  t.path = "small.jsonl";
  t.cluster.nodes = 4;
  t.cluster.accelerators_per_node = 8;
  t.cluster.spare_nodes = spares;
  t.cluster.repair_time = kHour;
  t.job.step_time = kSecond;
  t.job.duration = horizon;
  t.job.checkpoint_bytes_per_node = 2'000'000'000;
  t.job.memory_bandwidth_bytes_per_s = 10'000'000'000;
  t.job.storage_bandwidth_bytes_per_s = 1'000'000'000;
  t.job.node_scheduling = 60 * kSecond;
  t.job.process_restart = 30 * kSecond;
  t.job.rendezvous = 10 * kSecond;
  t.job.exit_detection = kSecond;
  t.job.heartbeat_timeout = 30 * kSecond;
  t.job.hang_timeout = 5 * kMinute;
  return t;
}

inline TraceEvent failure(Duration at, TraceEventType type, const char* node, const Trace& t, const char* reason = "") {
  TraceEvent e;
  e.t = at;
  e.type = type;
  e.node = *t.machine_index(node);
  e.reason = reason;
  return e;
}

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.output.append(buf.data(), n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

inline std::string goodput_cmd(const std::string& args) { return std::string(GOODPUT_BINARY) + " " + args; }

// A fresh directory under the build tree, removed at the end of the test.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name) {
    path = std::filesystem::temp_directory_path() / ("goodput-test-" + name + "-" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(file(name), std::ios::binary) << text;
    return file(name);
  }
};

inline std::string source_path(const std::string& rel) { return std::string(GOODPUT_SOURCE_DIR) + "/" + rel; }

}  // namespace goodput::test
