// `goodput bench kube` and `goodput bench ray`: a zone lost under a big job. No API server or Ray
// cluster can run here, so the cluster is an emulator that speaks the wire format of
// shared/data/k8s/ (tests/emulators/kube/kube_emulator.py) or shared/data/ray/
// (tests/emulators/ray/ray_emulator.py), in its cheap mode: a pod or a Ray job runs no process,
// and its node agent is one of this process's simulated agents (cli/sim_agent.h), started when the
// pod turns Running (the job RUNNING) and registering for the slot it was made for. The master is
// a real `goodput run` with the Kubernetes or the Ray backend.
//
// Once the world trains, the machines under `lose` of its nodes fail at once (Kubernetes: NotReady
// with the node lifecycle controller's conditions and taints, from the fixtures; Ray: DEAD, its jobs
// FAILED as Ray says it) and those nodes' agents fall silent. Printed: the time from the failure to
// every replacement created and to the world training again, the create rate the cluster saw, API
// errors, the master's CPU, and the same with client-go's default limits (5 QPS, burst 10, one call
// at a time) as the baseline. Exit status 1 unless every lost slot got exactly one new node, every
// loss was observed once and the log holds it all.
#include "cli/bench_zone.h"

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
#include <optional>
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

// A child process with its stdout on a pipe (an emulator says where it listens there).
struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;
  Child() = default;
  Child(Child&& o) noexcept : pid(std::exchange(o.pid, -1)), out(std::exchange(o.out, nullptr)) {}
  Child& operator=(Child&& o) noexcept {
    stop();
    pid = std::exchange(o.pid, -1);
    out = std::exchange(o.out, nullptr);
    return *this;
  }
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

// An emulator started with these arguments, and the URL it says it listens on.
std::pair<Child, std::string> start_emulator(const std::string& script, std::vector<std::string> args, const fs::path& dir) {
  const std::string python = fs::exists("/usr/bin/python3") ? "/usr/bin/python3" : "python3";  // Debian's, with PyYAML
  args.insert(args.begin(), {python, script});
  Child c = spawn(args, (dir / "emulator.log").string(), true);
  char buf[256] = "";
  if (!c.out || !std::fgets(buf, sizeof buf, c.out) || std::string(buf).rfind("listening on ", 0) != 0)
    throw std::runtime_error("the emulator did not start (" + script + "); see " + (dir / "emulator.log").string());
  std::string url(buf + 13);
  url.erase(url.find_last_not_of(" \r\n") + 1);
  return {std::move(c), url};
}

std::string read_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// A node of the job as the cluster shows it: its name (the agent's), its slot, where it runs.
struct Seen {
  std::string name;
  int slot = -1;
  std::string machine;  // empty until it runs
};

// What differs between Kubernetes and Ray.
class ZoneCluster {
 public:
  virtual ~ZoneCluster() = default;
  virtual json backend(const live::ApiLimits& limits) const = 0;  // the job spec's
  // Until `quit`, on a thread of its own: each node of the job as it appears and as it starts.
  virtual void follow(const std::atomic<bool>& quit, const std::function<void(const Seen&)>& seen) = 0;
  virtual void fail(const std::set<std::string>& machines) = 0;  // a zone of machines fails at once
  virtual int64_t api_errors() = 0;                               // requests answered with an error
  virtual void stop() = 0;
};

class KubeZone final : public ZoneCluster {
 public:
  KubeZone(const ZoneBenchOptions& o, int machines, const fs::path& dir) {
    auto [child, url] = start_emulator(o.emulator, {"--fixtures", o.fixtures, "--state-dir", (dir / "cluster").string(),
                                                    "--nodes", std::to_string(machines), "--cheap-pods"},
                                       dir);
    emulator_ = std::move(child);
    kubeconfig_ = (dir / "kubeconfig").string();
    std::ofstream(kubeconfig_) << "apiVersion: v1\nkind: Config\nclusters:\n- name: emu\n  cluster:\n    server: " << url
                               << "\nusers:\n- name: bench\n  user:\n    token: bench\ncontexts:\n- name: emu\n  context:\n"
                                  "    cluster: emu\n    user: bench\n    namespace: bench\ncurrent-context: emu\n";
    client_.emplace(kube::load_kubeconfig(kubeconfig_));
  }
  json backend(const live::ApiLimits& l) const override {
    return {{"type", "kubernetes"}, {"kubeconfig", kubeconfig_}, {"image", "registry.example/trainer:bench"},
            {"api_qps", l.qps},     {"api_burst", l.burst},      {"api_concurrency", l.concurrency}};
  }
  void follow(const std::atomic<bool>& quit, const std::function<void(const Seen&)>& seen) override {
    const std::string path = "/api/v1/namespaces/bench/pods";
    auto on_pod = [&](const json& pod) {
      const json labels = pod["metadata"].value("labels", json::object());
      const bool running = pod["status"].value("phase", "") == "Running";
      seen({pod["metadata"].value("name", ""), std::stoi(labels.value("goodput/rank", "-1")),
            running ? pod["spec"].value("nodeName", "") : ""});
    };
    while (!quit) {
      try {
        auto list = client_->list(path);
        for (const json& p : list.items) on_pod(p);
        std::string rv = list.resource_version;
        while (!quit && !client_->watch(path, "", rv, quit, [&](const kube::WatchEvent& e) {
          if (e.type == "ADDED" || e.type == "MODIFIED") on_pod(e.object);
        })) {
        }
      } catch (const std::exception&) {
        if (!quit) std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    }
  }
  void fail(const std::set<std::string>& machines) override {
    client_->call("POST", "/_emulator/node-down", json{{"nodes", std::vector<std::string>(machines.begin(), machines.end())}});
  }
  int64_t api_errors() override { return client_->call("GET", "/_emulator/request-counts").value("faults", int64_t{0}); }
  void stop() override { emulator_.stop(); }

 private:
  Child emulator_;
  std::string kubeconfig_;
  std::optional<kube::KubeClient> client_;
};

class RayZone final : public ZoneCluster {
 public:
  RayZone(const ZoneBenchOptions& o, int machines, const fs::path& dir) {
    auto [child, url] = start_emulator(o.emulator, {"--fixtures", o.fixtures, "--state-dir", (dir / "cluster").string(),
                                                    "--nodes", std::to_string(machines), "--node-resources",
                                                    R"({"goodput_node": 1})", "--cheap-jobs"},
                                       dir);
    emulator_ = std::move(child);
    url_ = url;
  }
  json backend(const live::ApiLimits& l) const override {
    return {{"type", "ray"},       {"address", url_},        {"num_cpus", 1},
            {"resources", {{"goodput_node", 1}}},            {"pending_timeout", "600s"},
            {"poll_interval", "1s"}, {"api_qps", l.qps},     {"api_burst", l.burst},
            {"api_concurrency", l.concurrency}};
  }
  void follow(const std::atomic<bool>& quit, const std::function<void(const Seen&)>& seen) override {
    const net::Url u = net::Url::parse(url_);
    while (!quit) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      const auto r = net::http_call(u, "GET", "/api/jobs/", "", "", 10000);
      if (!r || r->status != 200) continue;
      const json jobs = json::parse(r->body, nullptr, false);
      if (!jobs.is_array()) continue;
      for (const json& j : jobs) {
        const json meta = j.value("metadata", json::object());
        if (!meta.contains("goodput_node")) continue;
        const bool running = j.value("status", "") == "RUNNING" && j["driver_info"].is_object();
        seen({meta.value("goodput_node", ""), std::stoi(meta.value("goodput_rank", "-1")),
              running ? j["driver_info"].value("node_ip_address", "") : ""});
      }
    }
  }
  void fail(const std::set<std::string>& machines) override {
    net::http_call(net::Url::parse(url_), "POST", "/_emulator/kill-node",
                   "", json{{"node_ips", std::vector<std::string>(machines.begin(), machines.end())}}.dump(), 30000);
  }
  int64_t api_errors() override {
    const auto r = net::http_call(net::Url::parse(url_), "GET", "/_emulator/request-counts", "", "", 10000);
    return r && r->status == 200 ? json::parse(r->body).value("faults", int64_t{0}) : 0;
  }
  void stop() override { emulator_.stop(); }

 private:
  Child emulator_;
  std::string url_;
};

struct Outcome {
  bool formed = false, reformed = false, correct = true;
  double to_created = 0, to_reformed = 0, create_qps = 0, cpu = 0;
  int64_t api_errors = 0, events = 0, restarts = 0;
};

// One run: a cluster, a master with these API limits, the zone lost once the world trains.
Outcome run_once(const ZoneBenchOptions& o, const live::ApiLimits& limits, const std::string& label) {
  Outcome out;
  const fs::path dir =
      fs::temp_directory_path() / ("goodput-bench-" + o.backend + "-" + std::to_string(::getpid()) + "-" + label);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const int machines = o.nodes + o.lose + 8;  // room for every replacement, and a few more
  std::unique_ptr<ZoneCluster> cluster;
  if (o.backend == "ray") cluster = std::make_unique<RayZone>(o, machines, dir);
  else cluster = std::make_unique<KubeZone>(o, machines, dir);
  std::ofstream(dir / "job.json") << json{{"job", "zone"},
                                          {"nodes", o.nodes},
                                          {"command", {"true"}},
                                          {"total_steps", 1'000'000'000},
                                          {"heartbeat_interval", "1s"},
                                          {"heartbeat_timeout", "60s"},  // the cluster says first
                                          {"hang_timeout", "600s"},
                                          {"backend", cluster->backend(limits)}}
                                         .dump();
  const std::string self = fs::canonical("/proc/self/exe").string();
  const std::string token = "bench-zone-token";
  Child master = spawn({self, "run", (dir / "job.json").string(), "--run-dir", (dir / "run").string(), "--quiet"},
                       (dir / "master.log").string(), false, token);
  std::string master_url;
  for (int i = 0; i < 400 && master_url.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    master_url = read_line((dir / "run" / "master.url").string());
  }
  if (master_url.empty()) throw std::runtime_error("the master did not start; see " + (dir / "master.log").string());
  const net::Url murl = net::Url::parse(master_url);

  // The agents: one per node of the job, once it runs.
  asio::io_context io;
  auto work = asio::make_work_guard(io);
  LoadResult load;
  const auto started = Clock::now();
  const auto until = started + std::chrono::hours(1);
  const tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), static_cast<uint16_t>(std::stoi(murl.port)));
  std::mutex mu;
  std::map<std::string, std::shared_ptr<SimAgent>> agents;        // by node name
  std::map<std::string, std::string> machine;                     // node -> machine, once running
  std::map<std::string, std::pair<Clock::time_point, int>> seen;  // node -> when it was first seen, its slot
  std::atomic<bool> quit{false};
  std::thread io_thread, follower;
  struct Finally {  // whatever happens, the threads end and the children go
    std::function<void()> f;
    ~Finally() { f(); }
  } finally{[&] {
    quit = true;
    master.stop();
    cluster->stop();
    work.reset();
    io.stop();
    if (io_thread.joinable()) io_thread.join();
    if (follower.joinable()) follower.join();
  }};
  io_thread = std::thread([&] { io.run(); });
  follower = std::thread([&] {
    cluster->follow(quit, [&](const Seen& s) {
      std::lock_guard lock(mu);
      seen.try_emplace(s.name, Clock::now(), s.slot);
      if (s.machine.empty()) return;
      machine[s.name] = s.machine;
      if (agents.count(s.name)) return;
      auto a = std::make_shared<SimAgent>(io, ep, token, s.name, static_cast<int>(agents.size()), std::chrono::seconds(1),
                                          started, until, load);
      a->for_slot(s.slot);
      agents[s.name] = a;
      asio::post(io, [a] { a->start(std::chrono::milliseconds(0)); });
    });
  });
  auto status = [&] {
    auto r = net::http_call(murl, "GET", "/status?nodes=0", "", "", 5000);
    return r && r->status == 200 ? json::parse(r->body, nullptr, false) : json();
  };

  // The world forms; its nodes go out at the limits' pace: time for that, and a minute for the rest.
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
    std::printf("%s: the world of %d nodes did not form in time; see %s\n", label.c_str(), o.nodes, dir.string().c_str());
    out.correct = false;
    return out;
  }
  out.formed = true;
  std::this_thread::sleep_for(std::chrono::seconds(2));  // a moment of steady training

  // The zone: the machines under the nodes of the first `lose` names.
  std::set<std::string> before, zone;
  std::set<int> lost_slots;
  {
    std::lock_guard lock(mu);
    for (const auto& [name, when] : seen) before.insert(name);
    int taken = 0;
    for (const auto& [name, where] : machine)
      if (taken < o.lose) {
        zone.insert(where);
        lost_slots.insert(seen[name].second);
        asio::post(io, [a = agents[name]] { a->silence(); });
        ++taken;
      }
  }
  const double cpu0 = cpu_rss(master.pid).first;
  const auto t0 = Clock::now();
  cluster->fail(zone);
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
    std::printf("%s: %zu new nodes seen, %zu of them running; master: %s\n", label.c_str(), fresh, running,
                last.dump().substr(0, 600).c_str());
  }

  // What the cluster saw: the nodes made after the failure (as the bench saw them appear), their
  // rate, the requests it answered with an error.
  out.api_errors = cluster->api_errors();
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

  // Correctness: one new node per lost slot, every loss observed once, all of it in the log.
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
        std::to_string(create_times.size()) + " nodes created for " + std::to_string(o.lose) + " lost");
  check(std::set<int>(new_slots.begin(), new_slots.end()) == lost_slots && new_slots.size() == lost_slots.size(),
        "the new nodes are not one for each lost slot");
  check(failures == o.lose && static_cast<int>(lost_nodes.size()) == o.lose,
        std::to_string(failures) + " failures observed, of " + std::to_string(lost_nodes.size()) + " nodes, for " +
            std::to_string(o.lose) + " lost");
  check(relaunches == o.lose, std::to_string(relaunches) + " relaunches logged for " + std::to_string(o.lose) + " lost");
  // The failures reach the master over a few watch frames or polls: a world may re-form between
  // them (one restart per wave), but never without one.
  check(restarts >= 2, std::to_string(restarts) + " restarts logged: want the first start and one after the zone");
  out.restarts = restarts - 1;
  if (out.correct) fs::remove_all(dir);
  return out;
}

void print(const std::string& label, const live::ApiLimits& l, const Outcome& r, int lose, const std::string& what) {
  std::printf("%-24s %5.0f QPS burst %4d x%-3d  %d %s created %6.2f s after the failure (%6.1f/s), training "
              "again at %6.2f s (%lld restart%s); master %5.2f CPU s, %lld events, %lld API errors\n",
              label.c_str(), l.qps, l.burst, l.concurrency, lose, what.c_str(), r.to_created, r.create_qps, r.to_reformed,
              static_cast<long long>(r.restarts), r.restarts == 1 ? "" : "s", r.cpu, static_cast<long long>(r.events),
              static_cast<long long>(r.api_errors));
}

}  // namespace

int run_zone_bench(const ZoneBenchOptions& o) {
  if (o.lose < 1 || o.lose > o.nodes) {
    std::fprintf(stderr, "goodput: --lose must be from 1 to --nodes\n");
    return 2;
  }
  if (!fs::exists(o.emulator)) {
    std::fprintf(stderr, "goodput: no %s emulator at %s (--emulator)\n", o.backend.c_str(), o.emulator.c_str());
    return 2;
  }
  const bool ray = o.backend == "ray";
  const std::string what = ray ? "Ray jobs" : "pods";
  std::printf("a zone of %d of %d nodes lost at once, on the %s emulator with cheap %s (simulated agents, no trainers)\n",
              o.lose, o.nodes, ray ? "Ray dashboard" : "Kubernetes API", what.c_str());
  const live::ApiLimits tuned{o.qps, o.burst, o.concurrency};
  const Outcome r = run_once(o, tuned, "goodput");
  print("goodput", tuned, r, o.lose, what);
  bool ok = r.correct;
  if (o.baseline) {
    const live::ApiLimits client_go{5, 10, 1};  // client-go's defaults, one call after another
    const Outcome b = run_once(o, client_go, "client-go-defaults");
    print("client-go defaults", client_go, b, o.lose, what);
    if (r.reformed && b.reformed)
      std::printf("ratio: replacements created %.1fx sooner, training again %.1fx sooner\n",
                  b.to_created / std::max(r.to_created, 1e-3), b.to_reformed / std::max(r.to_reformed, 1e-3));
    ok = ok && b.correct;
  }
  return ok ? 0 : 1;
}

}  // namespace goodput
