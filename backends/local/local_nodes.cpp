#include "backends/local/local_nodes.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace goodput::local {

namespace fs = std::filesystem;

void remove_shm_with_prefix(const std::string& prefix) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/dev/shm", ec))
    if (e.path().filename().string().rfind(prefix, 0) == 0) ::shm_unlink(("/" + e.path().filename().string()).c_str());
}

LocalNodes::LocalNodes(LocalNodesOptions options) : o_(std::move(options)) {
  fs::create_directories(o_.run_dir + "/nodes");
  // Names must never repeat within a run, across master restarts too.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(o_.run_dir + "/nodes", ec))
    if (e.is_directory()) ++counter_;
}

LocalNodes::~LocalNodes() {
  for (auto& [name, pid] : agents_) {
    ::kill(-pid, SIGKILL);
    ::waitpid(pid, nullptr, WNOHANG);
  }
}

void LocalNodes::launch(int32_t slot, int32_t memory_permille) {
  const std::string name = "local-" + std::to_string(counter_++);
  const std::string dir = o_.run_dir + "/nodes/" + name;
  fs::create_directories(dir);
  std::vector<std::string> args = {o_.agent_binary, "agent",           "--master", o_.master_url, "--name", name,
                                   "--work-dir",    dir,               "--memory-permille", std::to_string(memory_permille),
                                   "--slot",        std::to_string(slot)};
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "GOODPUT_TOKEN=", 14) != 0) env.emplace_back(*e);
  env.push_back("GOODPUT_TOKEN=" + o_.token);
  std::vector<char*> argv, envp;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  const std::string log = dir + "/agent.log";
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);  // the node: agent and trainer, killed together
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  if (fd >= 0) ::close(fd);
  if (pid < 0) throw std::runtime_error(std::string("cannot start an agent: ") + std::strerror(errno));
  ::setpgid(pid, pid);
  agents_[name] = pid;
  std::ofstream(dir + "/agent.pid") << pid << "\n";
}

void LocalNodes::terminate(const std::string& name) {
  auto it = agents_.find(name);
  if (it != agents_.end()) {
    ::kill(-it->second, SIGKILL);  // the agent's group; the trainer is in a group of its own
    ::waitpid(it->second, nullptr, 0);
    agents_.erase(it);
  }
  // The trainer dies with its agent (the agent sets PR_SET_PDEATHSIG on it).
  remove_shm_with_prefix("goodput-" + o_.job + "-" + name + "-");
}

std::vector<live::LostNode> LocalNodes::lost() {
  std::vector<live::LostNode> out;
  for (auto it = agents_.begin(); it != agents_.end();) {
    int st = 0;
    const pid_t r = ::waitpid(it->second, &st, WNOHANG);
    const bool gone = r == it->second || (r < 0 && errno == ECHILD && ::kill(it->second, 0) != 0);
    if (gone) {
      std::string why = "node process exited";  // adopted after a master restart: no status to read
      if (r == it->second && WIFSIGNALED(st)) why = "node process killed by signal " + std::to_string(WTERMSIG(st));
      else if (r == it->second && WIFEXITED(st)) why = "node process exited with code " + std::to_string(WEXITSTATUS(st));
      out.push_back({it->first, why + " (" + it->first + ")"});
      it = agents_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

void LocalNodes::adopt_existing() {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(o_.run_dir + "/nodes", ec)) {
    std::ifstream in(e.path() / "agent.pid");
    pid_t pid = 0;
    if (in >> pid && pid > 0 && ::kill(pid, 0) == 0) agents_[e.path().filename().string()] = pid;
  }
}

void LocalNodes::shut_down(int timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!agents_.empty() && std::chrono::steady_clock::now() < until) {
    lost();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (auto& [name, pid] : agents_) {
    ::kill(-pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
  agents_.clear();
}

}  // namespace goodput::local
