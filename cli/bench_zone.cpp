// `goodput bench kube`: a zone lost under a big job on Kubernetes. No API server can run here, so
// the cluster is the Kubernetes API emulator (tests/emulators/kube/kube_emulator.py, the wire
// format of shared/data/k8s/) in its cheap-pods mode: a pod runs no process, and its node agent is
// one of this process's simulated agents (cli/sim_agent.h), started when the pod turns Running and
// registering for the slot its pod was made for. The master is a real `goodput run` with the
// Kubernetes backend.
//
// Once the world trains, the nodes under `lose` of its pods go NotReady at once (the node lifecycle
// controller's conditions and taints, from the fixtures) and those pods' agents fall silent. Printed:
// the time from the NotReady to every replacement pod created and to the world training again, the
// pod-create rate the API server saw, API errors, the master's CPU, and the same with client-go's
// default limits (5 QPS, burst 10, one call at a time) as the baseline. Exit status 1 unless every
// lost slot got exactly one new pod, every failure was observed once and the log holds it all.
#include "cli/bench_kube.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "backends/kubernetes/kube_client.h"
#include "backends/live/job_spec.h"
#include "cli/sim_agent.h"
#include "engine/event_store.h"
#include "net/http.h"

namespace goodput {
namespace {

using namespace goodput::bench;
namespace fs = std::filesystem;

// A child process with its stdout on a pipe (the emulator says where it listens there).
struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;
  ~Child() { stop(); }
  void stop() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, nullptr, 0);
      pid = -1;
    }
    if (out) ::fclose(out);
    out = nullptr;
  }
};

Child spawn(const std::vector<std::string>& argv, const std::string& log, bool pipe_out, const std::string& token = "") {
  std::fflush(stdout);  // the child must not write out what this process has buffered
  int fds[2] = {-1, -1};
  if (pipe_out && ::pipe(fds) != 0) throw std::runtime_error("pipe failed");
  Child c;
  c.pid = ::fork();
  if (c.pid == 0) {
    if (pipe_out) {
      ::dup2(fds[1], 1);
      ::close(fds[0]);
    } else {
      std::freopen(log.c_str(), "w", stdout);
    }
    std::freopen(log.c_str(), "a", stderr);
    if (!token.empty()) ::setenv("GOODPUT_TOKEN", token.c_str(), 1);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  if (pipe_out) {
    ::close(fds[1]);
    c.out = ::fdopen(fds[0], "r");
  }
  return c;
}

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

struct Outcome {
  bool formed = false, reformed = false, correct = true;
  double to_created = 0, to_reformed = 0, create_qps = 0, cpu = 0;
  int64_t api_errors = 0, events = 0, restarts = 0;
};

// One run: a cluster, a master with these API limits, the zone lost once the world trains.
Outcome run_once(const KubeBenchOptions& o, const live::ApiLimits& limits, const std::string& label) {
  Outcome out;
  const fs::path dir = fs::temp_directory_path() / ("goodput-bench-kube-" + std::to_string(::getpid()) + "-" + label);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const int nodes = o.nodes + o.lose + 8;  // room for every replacement, and a few more
  const std::string python = fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";  // Debian's, with PyYAML
  Child emulator = spawn({python, o.emulator, "--fixtures", o.fixtures, "--state-dir", (dir / "cluster").string(),
                          "--nodes", std::to_string(nodes), "--cheap-pods"},
                         (dir / "emulator.log").string(), true);
  char buf[256] = "";
  if (!emulator.out || !std::fgets(buf, sizeof buf, emulator.out) || std::string(buf).rfind("listening on ", 0) != 0)
    throw std::runtime_error("the Kubernetes emulator did not start (" + o.emulator + "); see " + (dir / "emulator.log").string());
  std::string api_url(buf + 13);
  api_url.erase(api_url.find_last_not_of(" \r\n") + 1);
  const std::string ns = "bench";
  {
    std::ofstream kc(dir / "kubeconfig");
    kc << "apiVersion: v1\nkind: Config\nclusters:\n- name: emu\n  cluster:\n    server: " << api_url
       << "\nusers:\n- name: bench\n  user:\n    token: bench\ncontexts:\n- name: emu\n  context:\n    cluster: emu\n"
          "    user: bench\n    namespace: " << ns << "\ncurrent-context: emu\n";
  }
  {
    std::ofstream spec(dir / "job.json");
    spec << json{{"job", "zone"},
                 {"nodes", o.nodes},
                 {"command", {"true"}},
                 {"total_steps", 1'000'000'000},
                 {"heartbeat_interval", "1s"},
                 {"heartbeat_timeout", "60s"},  // the cluster says first: NotReady
                 {"hang_timeout", "600s"},
                 {"backend",
                  {{"type", "kubernetes"},
                   {"kubeconfig", (dir / "kubeconfig").string()},
                   {"image", "registry.example/trainer:bench"},
                   {"api_qps", limits.qps},
                   {"api_burst", limits.burst},
                   {"api_concurrency", limits.concurrency}}}}
                .dump();
  }
  const std::string self = fs::canonical("/proc/self/exe").string();
  const std::string token = "bench-kube-token";
  Child master = spawn({self, "run", (dir / "job.json").string(), "--run-dir", (dir / "run").string(), "--quiet"},
                       (dir / "master.log").string(), false, token);
  std::string master_url;
  for (int i = 0; i < 400 && master_url.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    master_url = read_line((dir / "run" / "master.url").string());
  }
  if (master_url.empty()) throw std::runtime_error("the master did not start; see " + (dir / "master.log").string());
  const net::Url murl = net::Url::parse(master_url);

  // The agents: one per Running pod, as the watch shows them.
  kube::KubeConfig kc = kube::load_kubeconfig((dir / "kubeconfig").string());
  kube::KubeClient client(kc);
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  LoadResult load;
  const auto started = Clock::now();
  const auto until = started + std::chrono::hours(1);
  const tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(std::stoi(murl.port)));
  std::mutex mu;
  std::map<std::string, std::shared_ptr<SimAgent>> agents;  // by pod name
  std::map<std::string, std::string> machine;               // pod -> node, once Running
  std::map<std::string, std::pair<Clock::time_point, int>> seen;  // pod -> when it was first seen, its rank
  std::atomic<bool> quit{false};
  std::thread io_thread, watcher;
  struct Finally {  // whatever happens, the threads end and the children go
    std::function<void()> f;
    ~Finally() { f(); }
  } finally{[&] {
    quit = true;
    master.stop();
    emulator.stop();
    work.reset();
    io.stop();
    if (io_thread.joinable()) io_thread.join();
    if (watcher.joinable()) watcher.join();
  }};
  io_thread = std::thread([&] { io.run(); });
  watcher = std::thread([&] {
    const std::string path = "/api/v1/namespaces/" + ns + "/pods";
    auto on_pod = [&](const json& pod) {
      const std::string name = pod["metadata"].value("name", "");
      const json labels = pod["metadata"].value("labels", json::object());
      std::lock_guard lock(mu);
      seen.try_emplace(name, Clock::now(), std::stoi(labels.value("goodput/rank", "-1")));
      if (pod["status"].value("phase", "") != "Running") return;
      machine[name] = pod["spec"].value("nodeName", "");
      if (agents.count(name)) return;
      const int slot = std::stoi(pod["metadata"]["labels"].value("goodput/rank", "-1"));
      auto a = std::make_shared<SimAgent>(io, ep, token, name, static_cast<int>(agents.size()), std::chrono::seconds(1),
                                          started, until, load);
      a->for_slot(slot);
      agents[name] = a;
      asio::post(io, [a] { a->start(std::chrono::milliseconds(0)); });
    };
    while (!quit) {
      try {
        auto list = client.list(path);
        for (const json& p : list.items) on_pod(p);
        std::string rv = list.resource_version;
        while (!quit && !client.watch(path, "", rv, quit, [&](const kube::WatchEvent& e) {
          if (e.type == "ADDED" || e.type == "MODIFIED") on_pod(e.object);
        })) {
        }
      } catch (const std::exception& e) {
        if (!quit) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
  });
  auto status = [&] {
    auto r = net::http_call(murl, "GET", "/status?nodes=0", "", "", 5000);
    return r && r->status == 200 ? json::parse(r->body, nullptr, false) : json();
  };

  // The world forms.
  // Its pods go out at the limits' pace: time for that, and a minute for the rest.
  const auto form_by = Clock::now() + std::chrono::seconds(60 + static_cast<int64_t>(1.5 * o.nodes / limits.qps));
  int restarts0 = -1;
  while (Clock::now() < form_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const json s = status();
    if (s.is_object() && s.value("phase", "") == "training" && s.value("nodes_training", 0) == o.nodes) {
      restarts0 = s.value("restart", 0);
      out.events = s.value("events", int64_t{0});
      break;
    }
  }
  if (restarts0 < 0) {
    std::printf("%s: the world of %d pods did not form in time; see %s\n", label.c_str(), o.nodes, dir.string().c_str());
    out.correct = false;
    return out;
  }
  out.formed = true;
  std::this_thread::sleep_for(std::chrono::seconds(2));  // a moment of steady training

  // The zone: the machines under the pods of the first `lose` slots.
  std::set<std::string> before, zone;
  std::set<int> lost_slots;
  {
    std::lock_guard lock(mu);
    for (const auto& [name, when] : seen) before.insert(name);
    int taken = 0;
    for (const auto& [name, node] : machine)
      if (taken < o.lose && !node.empty()) {
        zone.insert(node);
        lost_slots.insert(seen[name].second);
        asio::post(io, [a = agents[name]] { a->silence(); });
        ++taken;
      }
  }
  const double cpu0 = cpu_rss(master.pid).first;
  const auto t0 = Clock::now();
  client.call("POST", "/_emulator/node-down", json{{"nodes", std::vector<std::string>(zone.begin(), zone.end())}});
  std::optional<Clock::time_point> created_at, reformed_at;
  const auto give_up = t0 + std::chrono::seconds(std::max<int64_t>(120, static_cast<int64_t>(4.0 * o.lose / limits.qps) + 60));
  while (Clock::now() < give_up && !reformed_at) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (!created_at) {
      size_t fresh = 0;
      {
        std::lock_guard lock(mu);
        for (const auto& [name, when] : seen) fresh += before.count(name) ? 0 : 1;
      }
      if (fresh >= static_cast<size_t>(o.lose)) created_at = Clock::now();
    }
    const json s = status();
    if (s.is_object() && s.value("restart", 0) > restarts0 && s.value("phase", "") == "training" &&
        s.value("nodes_training", 0) == o.nodes)
      reformed_at = Clock::now();
  }
  out.cpu = cpu_rss(master.pid).first - cpu0;
  const json last = status();
  if (!reformed_at) {  // where it stands, for whoever looks into it
    std::lock_guard lock(mu);
    size_t fresh = 0, running = 0;
    for (const auto& [name, when] : seen)
      if (!before.count(name)) {
        ++fresh;
        running += machine.count(name);
      }
    std::printf("%s: %zu new pods seen, %zu of them Running; master: %s\n", label.c_str(), fresh, running,
                last.dump().substr(0, 600).c_str());
  }

  // What the API server saw: the pods made after the NotReady (as the watch showed them), their
  // rate, the requests it answered with an error.
  out.api_errors = client.call("GET", "/_emulator/request-counts").value("faults", int64_t{0});
  std::vector<double> create_times;
  std::multiset<int> new_slots;
  {
    std::lock_guard lock(mu);
    for (const auto& [name, when] : seen)
      if (!before.count(name)) {
        create_times.push_back(seconds(when.first - t0));
        new_slots.insert(when.second);
      }
  }
  finally.f();
  finally.f = [] {};
  if (create_times.size() > 1) {
    const auto [lo, hi] = std::minmax_element(create_times.begin(), create_times.end());
    out.create_qps = static_cast<double>(create_times.size() - 1) / std::max(*hi - *lo, 1e-3);
  }
  if (created_at) out.to_created = seconds(*created_at - t0);
  if (reformed_at) {
    out.reformed = true;
    out.to_reformed = seconds(*reformed_at - t0);
  }
  out.events = last.value("events", int64_t{0}) - out.events;

  // Correctness: one new pod per lost slot, none created twice, every loss observed once, all logged.
  const int failures = last.value("failures", -1);
  std::set<int64_t> lost_nodes;
  int64_t relaunches = 0, restarts = 0;
  SqliteStore log((dir / "run" / "events.db").string(), SqliteStore::Mode::OpenReadOnly);
  log.for_each([&](const Event& e) {
    if (const auto* f = std::get_if<FailureObserved>(&e.payload)) lost_nodes.insert(f->node);
    if (const auto* d = std::get_if<RecoveryDecided>(&e.payload); d && d->action == RecoveryAction::RelaunchNode) ++relaunches;
    if (std::holds_alternative<RestartJob>(e.payload)) ++restarts;
  });
  auto check = [&](bool ok, const std::string& what) {
    if (!ok) std::printf("%s: WRONG: %s\n", label.c_str(), what.c_str());
    out.correct = out.correct && ok;
  };
  check(out.reformed, "the world did not train again in time");
  check(create_times.size() == static_cast<size_t>(o.lose),
        std::to_string(create_times.size()) + " pods created for " + std::to_string(o.lose) + " lost");
  check(std::set<int>(new_slots.begin(), new_slots.end()) == lost_slots && new_slots.size() == lost_slots.size(),
        "the new pods are not one for each lost slot");
  check(failures == o.lose && static_cast<int>(lost_nodes.size()) == o.lose,
        std::to_string(failures) + " failures observed, of " + std::to_string(lost_nodes.size()) + " nodes, for " +
            std::to_string(o.lose) + " lost");
  check(relaunches == o.lose, std::to_string(relaunches) + " relaunches logged for " + std::to_string(o.lose) + " lost");
  // The zone's NotReady reach the master over a few watch frames: a world may re-form between them
  // (one restart per wave), but never without one.
  check(restarts >= 2, std::to_string(restarts) + " restarts logged: want the first start and one after the zone");
  out.restarts = restarts - 1;
  if (out.correct) fs::remove_all(dir);
  return out;
}

void print(const std::string& label, const live::ApiLimits& l, const Outcome& r, int lose) {
  std::printf("%-24s %5.0f QPS burst %4d x%-3d  %d pods created %6.2f s after the NotReady (%6.1f creates/s), training "
              "again at %6.2f s (%lld restart%s); master %5.2f CPU s, %lld events, %lld API errors\n",
              label.c_str(), l.qps, l.burst, l.concurrency, lose, r.to_created, r.create_qps, r.to_reformed,
              static_cast<long long>(r.restarts), r.restarts == 1 ? "" : "s", r.cpu, static_cast<long long>(r.events),
              static_cast<long long>(r.api_errors));
}

}  // namespace

int run_kube_bench(const KubeBenchOptions& o) {
  if (o.lose < 1 || o.lose > o.nodes) {
    std::fprintf(stderr, "goodput: --lose must be from 1 to --nodes\n");
    return 2;
  }
  if (!fs::exists(o.emulator)) {
    std::fprintf(stderr, "goodput: no Kubernetes emulator at %s (--emulator)\n", o.emulator.c_str());
    return 2;
  }
  std::printf("a zone of %d of %d pods lost at once, on the Kubernetes API emulator with cheap pods (simulated agents, "
              "no trainers)\n",
              o.lose, o.nodes);
  const live::ApiLimits tuned{o.qps, o.burst, o.concurrency};
  const Outcome r = run_once(o, tuned, "goodput");
  print("goodput", tuned, r, o.lose);
  bool ok = r.correct;
  if (o.baseline) {
    const live::ApiLimits client_go{5, 10, 1};  // client-go's defaults, one call after another
    const Outcome b = run_once(o, client_go, "client-go-defaults");
    print("client-go defaults", client_go, b, o.lose);
    if (r.reformed && b.reformed)
      std::printf("ratio: replacements created %.1fx sooner, training again %.1fx sooner\n",
                  b.to_created / std::max(r.to_created, 1e-3), b.to_reformed / std::max(r.to_reformed, 1e-3));
    ok = ok && b.correct;
  }
  return ok ? 0 : 1;
}

}  // namespace goodput
