// `goodput torchrun [torchrun options] SCRIPT [ARGS]`: a working torchrun command line, run under
// Goodput's master and agents. The options are torchrun's (1.13's underscore spellings and the newer
// hyphen ones, and their PET_* environment defaults), plus a few of Goodput's own; what differs from
// torchrun is listed in the README ("Coming from torchrun").
#include "cli/torchrun.h"

#include <netdb.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "agent/agent.h"
#include "cli/live.h"
#include "engine/json_reader.h"  // ConfigError: a bad spec or policy, named
#include "net/http.h"

extern char** environ;

namespace goodput {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct TorchrunError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Every option `goodput torchrun` takes, by its hyphen spelling; true: it takes a value.
const std::map<std::string, bool>& known_options() {
  static const std::map<std::string, bool> options = {
      // torchrun's
      {"nnodes", true}, {"nproc-per-node", true}, {"rdzv-backend", true}, {"rdzv-endpoint", true}, {"rdzv-id", true},
      {"rdzv-conf", true}, {"standalone", false}, {"max-restarts", true}, {"monitor-interval", true},
      {"start-method", true}, {"role", true}, {"module", false}, {"no-python", false}, {"run-path", false},
      {"log-dir", true}, {"redirects", true}, {"tee", true}, {"node-rank", true}, {"master-addr", true},
      {"master-port", true}, {"local-addr", true},
      // Goodput's
      {"policy", true}, {"faults", true}, {"run-dir", true}, {"ckpt-dir", true}, {"port", true}, {"job", true},
      {"total-steps", true}, {"step-time", true}, {"trainer-reports", true}, {"quiet", false}, {"help", false}};
  return options;
}

const char* kUsage = R"(usage: goodput torchrun [OPTIONS] SCRIPT [ARGS...]

Runs a torchrun command line under Goodput: replace the word `torchrun` and keep the rest.

torchrun's options (hyphen or underscore spellings; PET_<NAME> environment defaults):
  --standalone              a master and one agent on this machine (with --nnodes=N: N local nodes)
  --nnodes N|MIN:MAX        nodes in the job (MIN:MAX: elastic, down to MIN)
  --nproc-per-node N|auto|cpu|gpu   trainer processes per node (default 1)
  --node-rank R             this node's rank (default: the rendezvous decides; SLURM_NODEID if set)
  --rdzv-endpoint HOST:PORT where the job's master listens (default port 29400); the process on
                            that host serves it, the others join it as agents
  --rdzv-id ID              the job's name (and, without GOODPUT_TOKEN, the seed of its token)
  --rdzv-backend c10d|static, --rdzv-conf K=V,...  accepted (the master is the rendezvous)
  --master-addr, --master-port  static rendezvous: the master's address, as --rdzv-endpoint
  --max-restarts N          failures tolerated before the job gives up (default: the policy's)
  --monitor-interval S      seconds between an agent's heartbeats (default 0.25)
  --role NAME               ROLE_NAME of the trainers (default "default")
  -m, --module              run SCRIPT as a Python module (python -m)
  --no-python               run SCRIPT as a program, not through python
  --run-path                run SCRIPT as a Python file (the default anyway)
  --log-dir DIR             where the run goes (its event log and each process's stdout/stderr)
  -r, --redirects, -t, --tee  accepted: each process's output always goes to files in the run
  --start-method, --local-addr  accepted (--local-addr: the address other nodes reach this one at)

Goodput's own:
  --total-steps N           steps the job trains (needed by scripts on goodput.live.Session)
  --step-time DURATION      expected step time, for the report's cost model (default 100ms)
  --trainer-reports auto|yes|no  whether SCRIPT reports progress through goodput.live (auto: it
                            imports it); no: an unmodified script, judged by its exit codes
  --policy FILE             recovery, checkpoint and scaling policy (JSON)
  --faults FILE             faults to inject, to rehearse recovery (see `goodput run --help`)
  --run-dir DIR             the run's directory (default runs/JOB-TIME)
  --ckpt-dir DIR            where flash checkpoints are persisted (default RUN/checkpoints)
  --port PORT               the master's port (default: the rendezvous port, else any free one)
  --job NAME                the job's name (default: --rdzv-id, else torchrun-SCRIPT)
  --quiet                   no progress lines
)";

struct Args {
  std::map<std::string, std::string> given;  // option (hyphen spelling) -> value ("" for flags)
  std::vector<std::string> program;          // SCRIPT and its arguments
  bool has(const std::string& k) const { return given.count(k) > 0; }
  std::string get(const std::string& k, const std::string& fallback = "") const {
    const auto it = given.find(k);
    return it == given.end() ? fallback : it->second;
  }
};

TorchrunLine parse_line(const std::vector<std::string>& argv) {
  TorchrunLine a;
  const auto& known = known_options();
  size_t i = 0;
  for (; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the script: the rest is its own
    std::string name, value;
    bool has_value = false;
    if (arg[1] == '-') {
      const auto eq = arg.find('=');
      name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
      if (eq != std::string::npos) value = arg.substr(eq + 1), has_value = true;
      std::replace(name.begin(), name.end(), '_', '-');
    } else {
      static const std::map<char, std::string> shorts = {{'m', "module"}, {'r', "redirects"}, {'t', "tee"}, {'h', "help"}};
      const auto s = shorts.find(arg[1]);
      if (s == shorts.end()) throw TorchrunError("unknown option '" + arg + "' (see goodput torchrun --help)");
      name = s->second;
      if (arg.size() > 2) value = arg.substr(arg[2] == '=' ? 3 : 2), has_value = true;
    }
    const auto k = known.find(name);
    if (k == known.end()) throw TorchrunError("unknown option '" + arg + "' (see goodput torchrun --help)");
    if (k->second && !has_value) {
      if (i + 1 >= argv.size()) throw TorchrunError("option '" + arg + "' needs a value");
      value = argv[++i];
    } else if (!k->second && has_value) {
      throw TorchrunError("option '--" + name + "' takes no value");
    }
    a.options[name] = value;
  }
  a.program.assign(argv.begin() + static_cast<std::ptrdiff_t>(i), argv.end());
  return a;
}

Args parse(const std::vector<std::string>& argv) {
  Args a;
  TorchrunLine line = parse_line(argv);
  a.given = std::move(line.options);
  a.program = std::move(line.program);
  // torchrun reads an option it was not given from PET_<NAME> (PET_NPROC_PER_NODE=4).
  for (const auto& [name, takes_value] : known_options()) {
    std::string env = "PET_" + name;
    std::transform(env.begin(), env.end(), env.begin(), [](char c) { return c == '-' ? '_' : static_cast<char>(std::toupper(c)); });
    if (a.has(name) || name == "help") continue;
    if (const char* v = std::getenv(env.c_str()); v && *v) a.given[name] = takes_value ? v : "";
  }
  return a;
}

int64_t integer(const Args& a, const std::string& name, int64_t fallback, int64_t lo, int64_t hi) {
  if (!a.has(name)) return fallback;
  const std::string v = a.get(name);
  size_t used = 0;
  int64_t n = 0;
  try {
    n = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != v.size() || v.empty() || n < lo || n > hi)
    throw TorchrunError("--" + name + " must be an integer from " + std::to_string(lo) + " to " + std::to_string(hi) +
                        ", not '" + v + "'");
  return n;
}

int32_t nproc_of(const std::string& v) {
  if (v == "cpu") return static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));
  if (v == "gpu" || v == "auto") {
    int32_t gpus = 0;
    if (fs::is_directory("/proc/driver/nvidia/gpus"))
      for ([[maybe_unused]] const auto& e : fs::directory_iterator("/proc/driver/nvidia/gpus")) ++gpus;
    if (gpus > 0) return gpus;
    if (v == "gpu") throw TorchrunError("--nproc-per-node=gpu, but this machine shows no NVIDIA GPU");
    return static_cast<int32_t>(std::max(1u, std::thread::hardware_concurrency()));  // torchrun's auto without CUDA
  }
  Args one;
  one.given["nproc-per-node"] = v;
  return static_cast<int32_t>(integer(one, "nproc-per-node", 1, 1, 1024));
}

std::string job_name(const std::string& raw) {
  std::string out;
  for (char c : raw) out += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '-';
  return out.substr(0, 100);
}

// Does the script report through goodput.live? (Read, not run: the first MiB of its source.)
bool uses_goodput(const std::string& script) {
  std::ifstream in(script, std::ios::binary);
  std::string text(1 << 20, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  return text.find("goodput.live") != std::string::npos || text.find("from goodput import") != std::string::npos;
}

// Whether a Goodput master answers at host:port (its /healthz says "ok").
bool master_answers(const std::string& host, uint16_t port) {
  const auto r = net::http_call(net::Url{host, std::to_string(port), false}, "GET", "/healthz", "", "", 1000);
  return r && r->status == 200 && r->body == "ok\n";
}

// A token every node of a job can compute from its rendezvous id: guessable by whoever knows the id.
std::string token_from(const std::string& rdzv_id) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a, twice with different seeds
  uint64_t g = 0x9e3779b97f4a7c15ull;
  for (char c : "goodput-torchrun:" + rdzv_id) {
    h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
    g = (g ^ static_cast<unsigned char>(c)) * 0x100000001b3ull + 0x7f4a7c15ull;
  }
  char buf[40];
  std::snprintf(buf, sizeof buf, "%016llx%016llx", static_cast<unsigned long long>(h), static_cast<unsigned long long>(g));
  return buf;
}

// Is `host` an address of this machine? (It can be bound to.)
bool is_this_machine(const std::string& host) {
  if (host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1") return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  bool local = false;
  for (addrinfo* p = res; p && !local; p = p->ai_next) {
    const int fd = ::socket(p->ai_family, SOCK_STREAM, 0);
    if (fd < 0) continue;
    local = ::bind(fd, p->ai_addr, p->ai_addrlen) == 0;  // port 0: any; only the address is tried
    ::close(fd);
  }
  ::freeaddrinfo(res);
  return local;
}

std::string this_host_name() {
  char name[256] = "node";
  ::gethostname(name, sizeof name - 1);
  return name;
}

int run_torchrun(const std::vector<std::string>& argv) {
  const Args a = parse(argv);
  if (a.has("help")) {
    std::cout << kUsage;
    return 0;
  }
  if (a.program.empty()) throw TorchrunError("give the training script: goodput torchrun [OPTIONS] SCRIPT [ARGS...]");

  // The world.
  int32_t min_nodes = 1, max_nodes = 1;
  if (a.has("nnodes")) {
    const std::string v = a.get("nnodes");
    const auto colon = v.find(':');
    Args n;
    n.given["nnodes"] = v.substr(0, colon);
    min_nodes = max_nodes = static_cast<int32_t>(integer(n, "nnodes", 1, 1, 4096));
    if (colon != std::string::npos) {
      n.given["nnodes"] = v.substr(colon + 1);
      max_nodes = static_cast<int32_t>(integer(n, "nnodes", 1, 1, 4096));
      if (min_nodes > max_nodes) throw TorchrunError("--nnodes=" + v + ": MIN is above MAX");
    }
  }
  const int32_t nproc = nproc_of(a.get("nproc-per-node", "1"));
  const std::string backend = a.get("rdzv-backend", "c10d");
  if (backend != "c10d" && backend != "static")
    throw TorchrunError("--rdzv-backend " + backend + " is not supported: Goodput's master is the rendezvous (give c10d or static)");
  if (const std::string m = a.get("start-method", "spawn"); m != "spawn" && m != "fork" && m != "forkserver")
    throw TorchrunError("--start-method must be spawn, fork or forkserver, not '" + m + "'");
  for (const char* k : {"redirects", "tee"})
    if (const std::string v = a.get(k); v.find_first_not_of("0123456789,:") != std::string::npos)
      throw TorchrunError(std::string("--") + k + " must be 0-3 or LOCAL_RANK:0-3,..., not '" + v + "'");
  if (a.has("module") && a.has("no-python")) throw TorchrunError("give --module or --no-python, not both");
  const bool standalone = a.has("standalone");
  const int64_t max_restarts = integer(a, "max-restarts", -1, 0, 100'000'000);

  // Who serves the master: standalone, this process; else the one on the rendezvous host.
  std::string endpoint = a.get("rdzv-endpoint");
  if (endpoint.empty() && (a.has("master-addr") || backend == "static"))
    endpoint = a.get("master-addr", "127.0.0.1") + ":" + a.get("master-port", "29500");
  uint16_t port = static_cast<uint16_t>(integer(a, "port", 0, 0, 65535));
  std::string host = "127.0.0.1";
  if (!standalone) {
    if (endpoint.empty()) {
      if (max_nodes > 1) throw TorchrunError("--nnodes=" + a.get("nnodes") + " needs --rdzv-endpoint HOST:PORT (or --standalone for nodes on this machine)");
      endpoint = "127.0.0.1:29400";
    }
    const auto colon = endpoint.rfind(':');
    host = endpoint.substr(0, colon);
    if (colon != std::string::npos) {
      Args p;
      p.given["rdzv-endpoint"] = endpoint.substr(colon + 1);
      if (!a.has("port")) port = static_cast<uint16_t>(integer(p, "rdzv-endpoint", 29400, 1, 65535));
    } else if (!a.has("port")) {
      port = 29400;
    }
  }
  // The trainer's command, as torchrun builds it.
  std::vector<std::string> command;
  std::string script = a.program[0];
  if (script.find('/') != std::string::npos && fs::exists(script)) script = fs::absolute(script).lexically_normal().string();
  if (a.has("no-python")) {
    command.push_back(script);
  } else {
    const char* py = std::getenv("PYTHON_EXEC");
    command = {py && *py ? py : "python3", "-u"};
    if (a.has("module")) command.push_back("-m");
    if (!a.has("module") && !fs::exists(script)) throw TorchrunError("no such training script: " + a.program[0]);
    command.push_back(script);
  }
  command.insert(command.end(), a.program.begin() + 1, a.program.end());

  const std::string reports = a.get("trainer-reports", "auto");
  if (reports != "auto" && reports != "yes" && reports != "no")
    throw TorchrunError("--trainer-reports must be auto, yes or no, not '" + reports + "'");
  const bool trainer_reports =
      reports == "yes" || (reports == "auto" && !a.has("module") && !a.has("no-python") && uses_goodput(script));
  if (trainer_reports && !a.has("total-steps"))
    throw TorchrunError(a.program[0] + " reports through goodput.live: give --total-steps (the steps it trains, "
                        "Session.total_steps)");
  if (!trainer_reports && !a.has("quiet"))
    std::cerr << "goodput torchrun: " << a.program[0] << " does not use goodput.live: its processes are supervised "
              << "as torchrun does (exit codes, restarts from its own checkpoints); no flash checkpoints, hang "
              << "detection or step accounting\n";

  // The job spec.
  const std::string job = job_name(a.get("job", a.has("rdzv-id") && a.get("rdzv-id") != "none"
                                                     ? a.get("rdzv-id")
                                                     : "torchrun-" + fs::path(script).stem().string()));
  json spec{{"job", job.empty() ? "torchrun" : job},
            {"nodes", max_nodes},
            {"nproc_per_node", nproc},
            {"command", command},
            {"total_steps", integer(a, "total-steps", 1, 1, INT64_MAX / 4)},
            {"trainer_reports", trainer_reports},
            {"role", a.get("role", "default")}};
  if (a.has("step-time")) spec["step_time"] = a.get("step-time");
  if (a.has("monitor-interval")) {
    double s = 0;
    try {
      s = std::stod(a.get("monitor-interval"));
    } catch (const std::exception&) {
    }
    if (!(s > 0 && s <= 3600)) throw TorchrunError("--monitor-interval must be seconds, above 0, not '" + a.get("monitor-interval") + "'");
    const int64_t ms = std::max<int64_t>(50, static_cast<int64_t>(s * 1000));
    spec["heartbeat_interval"] = std::to_string(ms) + "ms";
    spec["heartbeat_timeout"] = std::to_string(std::max<int64_t>(5000, 4 * ms)) + "ms";
  }
  json policy = json{{"name", "default"}};
  if (a.has("policy")) {
    std::ifstream in(a.get("policy"));
    if (!in) throw TorchrunError("--policy " + a.get("policy") + ": cannot open it");
    try {
      policy = json::parse(in);
    } catch (const json::exception& e) {
      throw TorchrunError("--policy " + a.get("policy") + ": not valid JSON: " + e.what());
    }
    if (!policy.is_object()) throw TorchrunError("--policy " + a.get("policy") + ": a policy is a JSON object");
  }
  if (max_restarts >= 0) policy["recovery"]["max_failures"] = max_restarts;  // torchrun's budget: the job's restarts
  if (min_nodes < max_nodes && !a.has("policy")) policy["scaling"] = {{"policy", "elastic"}, {"min_nodes", min_nodes}};
  spec["policy"] = policy;
  json env = json::object();
  if (max_restarts >= 0) env["TORCHELASTIC_MAX_RESTARTS"] = std::to_string(max_restarts);
  spec["env"] = env;

  // Where it goes.
  std::string run_dir = a.get("run-dir", a.get("log-dir"));
  if (run_dir.empty()) run_dir = "runs/" + spec["job"].get<std::string>() + "-" + std::to_string(std::time(nullptr));
  if (a.has("ckpt-dir")) spec["storage_dir"] = fs::absolute(a.get("ckpt-dir")).string();
  if (fs::exists(fs::path(run_dir) / "events.db"))
    throw TorchrunError(run_dir + " already holds a job's log: give another --run-dir (or resume it with goodput run --resume)");

  std::optional<int64_t> node_rank;
  if (a.has("node-rank")) node_rank = integer(a, "node-rank", 0, 0, 4095);
  else if (const char* s = std::getenv("SLURM_NODEID"); s && *s && !standalone) node_rank = std::atoll(s);
  // The rendezvous host serves the master, unless a `goodput master` already listens there: then
  // every node, that host's included, is its agent (the job is that master's spec, not this line).
  const bool master_listening = !standalone && port != 0 && master_answers(host, port);
  const bool serves = standalone || (!master_listening && (node_rank ? *node_rank == 0 : is_this_machine(host)));

  // The token: the operator's, else (several machines must agree on it) one derived from the id.
  if (!standalone && !std::getenv("GOODPUT_TOKEN")) {
    const std::string id = a.get("rdzv-id", "none");
    std::cerr << "goodput torchrun: WARNING: no GOODPUT_TOKEN; the job's token is derived from --rdzv-id '" << id
              << "': anyone who knows it can drive this job (set GOODPUT_TOKEN on every node)\n";
    ::setenv("GOODPUT_TOKEN", token_from(id).c_str(), 1);
  }

  const std::string node_name =
      standalone ? "" : job_name(this_host_name() + (node_rank ? "-" + std::to_string(*node_rank) : "-" + std::to_string(::getpid())));
  if (!serves) {  // an agent of the master on the rendezvous host (it retries until the master listens)
    agent::AgentOptions ao;
    ao.master_url = "http://" + host + ":" + std::to_string(port);
    ao.name = node_name;
    ao.token = std::getenv("GOODPUT_TOKEN");
    ao.host = a.get("local-addr");
    ao.work_dir = (fs::path(run_dir) / "nodes" / node_name).string();
    if (node_rank) ao.slot = static_cast<int32_t>(*node_rank);
    std::cerr << "goodput torchrun: node " << node_name << " joins the master at " << ao.master_url
              << (master_listening ? " (already listening: its job spec decides the job)" : "") << "\n";
    return agent::run_agent(ao);
  }

  fs::create_directories(run_dir);
  const std::string spec_path = (fs::absolute(run_dir) / "torchrun-job.json").string();
  std::ofstream(spec_path) << spec.dump(2) << "\n";
  ServeOptions o;
  o.spec_path = spec_path;
  o.run_dir = run_dir;
  o.port = port;
  o.quiet = a.has("quiet");
  o.faults_path = a.get("faults");
  pid_t own_agent = -1;
  if (!standalone) {
    o.local = false;
    o.listen = host == "localhost" || host.rfind("127.", 0) == 0 ? "127.0.0.1" : "0.0.0.0";
    o.on_listening = [&](const std::string& url, const std::string& token) {
      // The rendezvous host is a node of the job too: its agent runs beside the master.
      const std::string self = fs::canonical("/proc/self/exe").string();
      std::vector<std::string> args = {self, "agent", "--master", url, "--name", node_name, "--work-dir",
                                       (fs::absolute(run_dir) / "nodes" / node_name).string()};
      if (node_rank) args.insert(args.end(), {"--slot", std::to_string(*node_rank)});
      if (a.has("local-addr")) args.insert(args.end(), {"--host", a.get("local-addr")});
      ::setenv("GOODPUT_TOKEN", token.c_str(), 1);
      own_agent = ::fork();
      if (own_agent == 0) {
        std::vector<char*> c;
        for (auto& s : args) c.push_back(s.data());
        c.push_back(nullptr);
        ::execv(c[0], c.data());
        ::_exit(127);
      }
    };
  }
  const int rc = serve(o);
  if (own_agent > 0) {  // it leaves with the job's end; a master that stopped early takes it along
    for (int i = 0; i < 100 && ::waitpid(own_agent, nullptr, WNOHANG) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (::waitpid(own_agent, nullptr, WNOHANG) == 0) {
      ::kill(own_agent, SIGTERM);
      ::waitpid(own_agent, nullptr, 0);
    }
  }
  return rc;
}

}  // namespace

TorchrunLine parse_torchrun_line(const std::vector<std::string>& argv) { return parse_line(argv); }

void add_torchrun_command(CLI::App& app, int& rc) {
  static std::vector<std::string> rest;
  auto* t = app.add_subcommand("torchrun", "Run a torchrun command line under Goodput (goodput torchrun --help)");
  t->prefix_command();
  t->set_help_flag();  // torchrun's options, -h included, are parsed here
  t->callback([&rc, t] {
    try {
      rc = run_torchrun(t->remaining());
    } catch (const TorchrunError& e) {
      std::cerr << "goodput torchrun: " << e.what() << "\n";
      rc = 2;
    } catch (const ConfigError& e) {
      std::cerr << "goodput torchrun: " << e.what() << "\n";
      rc = 2;
    }
  });
}

}  // namespace goodput
