// The agent's pre-flight node check: a compute probe (is this machine's arithmetic right, and how
// fast is it) and a link probe (can it move bytes to another node of the job, and how fast). The
// master pairs nodes and judges the numbers; the agent only measures.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace goodput::agent {

struct ComputeResult {
  int64_t mflops = 0;  // per CPU second of the probing thread
  bool ok = true;
  std::string error;  // the first wrong element, when !ok
};

// Multiplies two 256x256 float matrices of small integers (every product and sum is exact in
// float, so the result is known exactly) again and again for `duration`, checking each result.
// Fault injection: work_factor > 1 does that many products per counted one (a slow machine);
// corrupt spoils one element of each product (a bad FPU or memory).
ComputeResult compute_probe(std::chrono::milliseconds duration, double work_factor = 1, bool corrupt = false);

struct LinkResult {
  int64_t mb_per_s = 0;  // 10^6 bytes per second, send to acknowledgement
  bool ok = true;
  std::string error;
};

// Serves link probes on an ephemeral TCP port of every interface. A probe is: "GPLP", the SHA-256
// of the job's token and "link-probe" (so the token never crosses the link), the byte count (8
// bytes, big-endian), the bytes; the answer is the count received (8 bytes). A wrong digest or a
// short count closes the connection. Connections are served one at a time, each bounded by a timeout.
class LinkProbeServer {
 public:
  explicit LinkProbeServer(const std::string& token);
  ~LinkProbeServer();
  LinkProbeServer(const LinkProbeServer&) = delete;
  LinkProbeServer& operator=(const LinkProbeServer&) = delete;

  uint16_t port() const { return port_; }
  // A broken network card (fault injection): connections are closed at once, unanswered.
  void set_down(bool down) { down_ = down; }
  // The collective probe's program (argv, and KEY=VALUE entries added to this process's
  // environment). A "GPLG" probe starts it as rank 0 on a free port, answers that port (2 bytes,
  // big-endian), and waits for it to finish. Without one, such a probe is closed unanswered.
  void set_collective(std::vector<std::string> argv, std::vector<std::string> env);

 private:
  void serve();

  void serve_collective(int conn, int64_t bytes);

  std::string digest_;
  std::mutex mu_;
  std::vector<std::string> collective_argv_, collective_env_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> down_{false};
  std::atomic<bool> quit_{false};
  std::thread thread_;
};

// Sends `bytes` to a LinkProbeServer at host:port and waits for its acknowledgement.
LinkResult link_probe(const std::string& host, uint16_t port, const std::string& token, int64_t bytes,
                      std::chrono::milliseconds timeout);

// The collective probe (PyTorch jobs): asks the LinkProbeServer at host:port to start the program
// as rank 0, then runs it here as rank 1 against it (`--rank --addr --port --bytes --timeout` are
// appended); its last stdout line is {"ok": ..., "mb_per_s": ..., "error": ...}.
LinkResult collective_probe(const std::string& host, uint16_t port, const std::string& token, int64_t bytes,
                            std::chrono::milliseconds timeout, const std::vector<std::string>& argv,
                            const std::vector<std::string>& env);

}  // namespace goodput::agent
