#include "agent/program.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

extern char** environ;

namespace goodput::agent {

Program spawn_program(const std::vector<std::string>& argv, const std::vector<std::string>& env_add) {
  Program p;
  int fds[2];
  if (argv.empty() || ::pipe2(fds, O_CLOEXEC) != 0) return p;
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  for (const std::string& kv : env_add) {
    const std::string key = kv.substr(0, kv.find('=') + 1);
    std::erase_if(env, [&](const std::string& s) { return s.rfind(key, 0) == 0; });
    env.push_back(kv);
  }
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  p.pid = ::fork();
  if (p.pid == 0) {
    ::setpgid(0, 0);
    ::dup2(fds[1], 1);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  if (p.pid < 0) {
    ::close(fds[0]);
    return p;
  }
  p.out = fds[0];
  return p;
}

ProgramResult finish_program(Program& p, std::chrono::steady_clock::time_point deadline) {
  ProgramResult r;
  if (p.pid < 0) return r;
  char buf[4096];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd pf{p.out, POLLIN, 0};
    const int ready = ::poll(&pf, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000)));
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    const ssize_t n = ::read(p.out, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // end of output: it exited (or closed stdout)
    if (r.out.size() < (1 << 16)) r.out.append(buf, static_cast<size_t>(n));
  }
  ::close(p.out);
  int st = 0;
  bool reaped = false;
  while (!(reaped = ::waitpid(p.pid, &st, WNOHANG) == p.pid) && std::chrono::steady_clock::now() < deadline)
    ::usleep(10'000);  // its output ended: it is exiting
  ::kill(-p.pid, SIGKILL);  // out of time, or whatever it left running in its group
  if (!reaped) ::waitpid(p.pid, &st, 0);
  r.exited_ok = reaped && WIFEXITED(st) && WEXITSTATUS(st) == 0;
  p.pid = -1;
  return r;
}

uint16_t free_tcp_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  socklen_t len = sizeof addr;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

}  // namespace goodput::agent
