// `goodput run | master | agent | inject`: the live side of the command line.
#include "cli/live.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <set>

#include "agent/agent.h"
#include "net/http.h"
#include "backends/live/live_master.h"
#include "backends/live/master_api.h"
#include "backends/live/master_status.h"
#include "backends/local/local_nodes.h"
#include "backends/kubernetes/kube_nodes.h"
#include "backends/ray/ray_nodes.h"
#include "engine/invariant.h"
#include "engine/json_reader.h"
#include "report/report.h"

namespace goodput {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using LiveError = ConfigError;  // bad input from the operator: exit code 2

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string s;
  std::getline(in, s);
  return s;
}

void write_private(const std::string& path, const std::string& text) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) throw LiveError("cannot write " + path);
  (void)!::write(fd, text.data(), text.size());
  ::close(fd);
}

// A scheduled fault: when the job reaches a step, or after some time of training.
struct Fault {
  std::string fault;
  int32_t slot = 0;
  int32_t local_rank = 0;
  int64_t at_step = -1;
  Duration after = -1;
  bool done = false;
};

std::vector<Fault> load_faults(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw LiveError(path + ": cannot open faults file");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw LiveError(path + ": not valid JSON: " + e.what());
  }
  if (!j.is_array()) throw LiveError(path + ": a faults file is a JSON list of {\"fault\", \"slot\", \"at_step\"|\"after\"}");
  std::vector<Fault> out;
  for (size_t i = 0; i < j.size(); ++i) {
    try {
      ConfigReader r(j[i], "[" + std::to_string(i) + "]");
      Fault f;
      f.fault = r.text("fault", "");
      if (f.fault != "kill-process" && f.fault != "kill-node" && f.fault != "hang" && f.fault != "oom" &&
          f.fault != "corrupt-replica")
        r.fail("fault", "must be kill-process, kill-node, hang, oom or corrupt-replica");
      f.slot = static_cast<int32_t>(r.integer("slot", 0, 0, 4095));
      f.local_rank = static_cast<int32_t>(r.integer("local_rank", 0, 0, 1023));  // which process of the node
      f.at_step = r.integer("at_step", -1, 1, INT64_MAX / 2);
      f.after = r.duration("after", -1);
      if ((f.at_step >= 0) == (f.after >= 0)) r.fail("at_step", "give exactly one of at_step and after");
      r.finish();
      out.push_back(f);
    } catch (const ConfigError& e) {
      throw LiveError(path + ": " + e.what());
    }
  }
  return out;
}

// Whether an event log holds any event. A file that is not a log (or is damaged) counts as holding
// one: it is never removed to make room.
bool log_holds_a_job(const std::string& path) {
  try {
    return SqliteStore(path, SqliteStore::Mode::OpenReadOnly).last_seq() > 0;
  } catch (const StoreError&) {
    return true;
  }
}


// A pod's termination message: the kubelet keeps at most 4096 bytes of it.
void write_termination_log(const std::string& path, json ended, int exit_status) {
  if (path.empty()) return;
  ended["exit"] = exit_status;
  std::string text = ended.dump();
  if (text.size() > 4096) text = json{{"exit", exit_status}, {"error", "summary too long"}}.dump();
  std::ofstream out(path, std::ios::trunc);
  out << text << "\n";
}

// `ended` gets how the run ended, for the termination log: the master's figures, or the error.
int serve_job(ServeOptions& o, json& ended);

}  // namespace

int serve(ServeOptions o) {
  json ended = json::object();
  int rc = 0;
  try {
    rc = serve_job(o, ended);
  } catch (const std::exception& e) {
    write_termination_log(o.termination_log, {{"error", e.what()}}, dynamic_cast<const ConfigError*>(&e) ? 2 : 1);
    throw;
  }
  write_termination_log(o.termination_log, std::move(ended), rc);
  return rc;
}

namespace {
int serve_job(ServeOptions& o, json& ended) {
  if (o.tls.cert_file.empty() != o.tls.key_file.empty())
    throw LiveError("give both --tls-cert and --tls-key, or neither");
  if (o.spec_path.empty()) {
    // `--resume --run-dir DIR` alone: the run directory remembers the spec it was started with.
    if (!o.resume) throw LiveError("give the job spec (JOB.json), or --resume with --run-dir to continue a run");
    if (o.run_dir.empty()) throw LiveError("--resume without a job spec needs --run-dir: the run to continue");
    o.spec_path = read_first_line((fs::path(o.run_dir) / "job.path").string());
    if (o.spec_path.empty())
      throw LiveError((fs::path(o.run_dir) / "job.path").string() +
                      ": no job spec recorded for this run (give JOB.json as well)");
  }
  live::JobSpec spec = live::load_job_spec(o.spec_path);
  if (o.run_dir.empty()) o.run_dir = "runs/" + spec.job;
  const fs::path run_dir = fs::absolute(o.run_dir);
  const std::string db = (run_dir / "events.db").string();
  // Everything the operator gave is checked before anything of the run is written, so a mistake
  // leaves nothing behind that blocks the corrected run.
  std::vector<Fault> faults = o.faults_path.empty() ? std::vector<Fault>{} : load_faults(o.faults_path);
  if (!o.resume && fs::exists(db)) {
    if (log_holds_a_job(db))
      throw LiveError(db + " already holds a job's log: use --resume to continue it, or another --run-dir");
    // A start that failed before the job's first event left an empty log: nothing to keep.
    for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(db + suffix);
  }
  if (o.resume && !fs::exists(db)) throw LiveError(db + ": no log to resume");
  if (o.resume && !log_holds_a_job(db)) throw LiveError(db + ": the log holds no job to resume (start it without --resume)");
  fs::create_directories(run_dir);
  fs::permissions(run_dir, fs::perms::owner_all, fs::perm_options::replace);
  if (spec.storage_dir.empty()) spec.storage_dir = (run_dir / "checkpoints").string();
  spec.storage_dir = fs::absolute(spec.storage_dir).string();

  // The token: the operator's (GOODPUT_TOKEN), the run's (on resume), or a fresh one.
  std::string token = std::getenv("GOODPUT_TOKEN") ? std::getenv("GOODPUT_TOKEN") : "";
  if (token.empty() && o.resume) token = read_first_line((run_dir / "token").string());
  if (token.empty()) token = net::random_token();
  write_private((run_dir / "token").string(), token + "\n");
  // Agents know the master by its URL: a resumed master listens where the old one did.
  if (o.resume && o.port == 0) {
    const std::string url = read_first_line((run_dir / "master.url").string());
    if (!url.empty()) o.port = static_cast<uint16_t>(std::stoi(net::Url::parse(url).port));
  }

  SqliteStore store(db, o.resume ? SqliteStore::Mode::Open : SqliteStore::Mode::Create);
  int64_t epoch = 0;
  if (auto e = store.meta("epoch_unix_ns")) epoch = std::stoll(*e);
  else {
    epoch = live::LiveClock::unix_now_ns();
    store.set_meta("epoch_unix_ns", std::to_string(epoch));
  }
  Time last = 0;
  if (o.resume) store.for_each([&](const Event& e) { last = e.time; });
  live::LiveClock clock(epoch, last);
  PolicySet policies = spec.policy.is_null() ? default_policy() : load_policy(spec.policy);

  boost::asio::io_context io;
  live::MasterApi* api_ptr = nullptr;
  // The log is the truth: if it cannot be written (disk full, locked past the busy timeout), the
  // master stops rather than act on what it could not record; --resume picks up from the log.
  std::string fatal;
  auto stop_on_store_error = [&](const StoreError& e) {
    if (fatal.empty()) fatal = e.what();
    io.stop();
  };
  std::optional<net::HttpServer> server_holder;
  try {
    const bool tls = !o.tls.cert_file.empty();
    server_holder.emplace(io, o.listen, o.port, [&](const net::HttpRequest& r) {
      if (!api_ptr) return net::HttpResponse{503, "application/json", R"({"error":"starting"})"};
      try {
        return api_ptr->handle(r);
      } catch (const StoreError& e) {
        stop_on_store_error(e);
        return net::HttpResponse{503, "application/json", R"({"error":"master stopping: event log unwritable"})"};
      } catch (const InvariantError& e) {
        // A bug: stop rather than act on a state the master does not understand; the log holds
        // everything decided, and --resume folds it afresh.
        if (fatal.empty()) fatal = e.what();
        io.stop();
        return net::HttpResponse{503, "application/json", R"({"error":"master stopping: internal invariant broken"})"};
      }
    }, 1 << 20, tls ? &o.tls : nullptr);
  } catch (const std::runtime_error& e) {
    std::cerr << "goodput: " << e.what() << "\n";
    ended["error"] = e.what();
    return 1;
  }
  net::HttpServer& server = *server_holder;
  const std::string url = (o.tls.cert_file.empty() ? "http://" : "https://") +
                          (o.listen == "0.0.0.0" ? std::string("127.0.0.1") : o.listen) + ":" +
                          std::to_string(server.port());
  // Local agents and their trainers trust the master's certificate (self-signed: its own CA).
  if (!o.tls.cert_file.empty() && !std::getenv("GOODPUT_CA_FILE"))
    ::setenv("GOODPUT_CA_FILE", fs::absolute(o.tls.cert_file).c_str(), 1);
  write_private((run_dir / "master.url").string(), url + "\n");
  write_private((run_dir / "job.path").string(), fs::absolute(o.spec_path).string() + "\n");  // for --resume alone

  // The URL remote nodes reach the master at: the spec's (without a port: the one it listens on),
  // else the one it listens on.
  auto reachable_at = [&](const std::string& given) {
    if (given.empty()) return url;
    return given.find(':', given.find("://") + 3) == std::string::npos ? given + ":" + std::to_string(server.port())
                                                                      : given;
  };
  // Where nodes come from: `run` asks the job's backend for them; `master` waits for agents.
  const std::string run_id = std::to_string(epoch / kSecond);
  const std::string self = fs::canonical("/proc/self/exe").string();
  std::unique_ptr<live::NodeProvider> nodes;
  if (o.local && spec.backend == "ray") {
    ray::RayNodesOptions ro;
    ro.spec = spec.ray;
    ro.replicas = spec.replicas;
    if (!ro.spec.working_dir.empty()) ro.spec.working_dir = fs::absolute(ro.spec.working_dir).string();
    ro.agent_binary = spec.ray.agent.empty() ? self : spec.ray.agent;
    ro.master_url = reachable_at(spec.ray.master_url);
    ro.token = token;
    ro.run = spec.job + "-" + run_id;
    ro.adopt = o.resume;
    nodes = std::make_unique<ray::RayNodes>(ro);
  } else if (o.local && spec.backend == "kubernetes") {
    kube::KubeNodesOptions ko;
    ko.spec = spec.kube;
    ko.replicas = spec.replicas;
    try {
      ko.config = kube::default_config(spec.kube.kubeconfig, spec.kube.context);
    } catch (const kube::KubeError& e) {
      throw LiveError(o.spec_path + ": backend: " + e.what());
    }
    ko.master_url = reachable_at(spec.kube.master_url);
    ko.token = token;
    ko.job = spec.job;
    ko.run = spec.job + "-" + run_id;
    ko.adopt = o.resume;
    try {
      nodes = std::make_unique<kube::KubeNodes>(ko);
    } catch (const kube::KubeError& e) {
      std::cerr << "goodput: kubernetes: " << e.what() << "\n";
      ended["error"] = std::string("kubernetes: ") + e.what();
      return 1;
    }
  } else if (o.local) {
    auto local = std::make_unique<local::LocalNodes>(
        local::LocalNodesOptions{self, url, token, spec.job + "-" + run_id, run_dir.string()});
    if (o.resume) local->adopt_existing();
    nodes = std::move(local);
  }
  live::LiveMaster master(spec, std::move(policies), store, clock, nodes.get(), run_id);
  live::MasterApi api(master, token);
  api.set_read_access(o.read_access == "open"    ? live::ReadAccess::Open
                      : o.read_access == "token" ? live::ReadAccess::Token
                                                 : live::ReadAccess::Auto,
                      o.listen);
  api.set_transport_refusals([&server] { return server.refusals(); });
  api_ptr = &api;
  std::cerr << "goodput: " << (master.resumed() ? "resumed" : "started") << " job " << spec.job << ": master at "
            << url << ", log " << db << "\n";
  if (!o.local && !o.on_listening)
    std::cerr << "goodput: start agents with: GOODPUT_TOKEN=$(cat " << (run_dir / "token").string()
              << ") goodput agent --master " << url << " --name NAME\n";
  if (o.on_listening) o.on_listening(url, token);

  boost::asio::signal_set signals(io, SIGINT, SIGTERM);
  bool interrupted = false, detached = false;
  signals.async_wait([&](const boost::system::error_code& ec, int sig) {
    if (ec) return;
    if (sig == SIGTERM && o.detach_on_sigterm && !master.finished()) {
      detached = true;
      std::cerr << "\ngoodput: SIGTERM: the master leaves, its agents keep training; run it again with --resume\n";
      io.stop();
      return;
    }
    interrupted = true;
    std::cerr << "\ngoodput: interrupted; stopping the job\n";
    if (!master.finished()) master.stop();
  });

  boost::asio::steady_timer timer(io);
  const auto t0 = std::chrono::steady_clock::now();
  auto last_print = t0;
  std::optional<std::chrono::steady_clock::time_point> finished_at;
  std::string last_line;
  std::set<std::string> warned_persist;
  std::function<void()> tick = [&] {
    try {
      master.tick();
    } catch (const StoreError& e) {
      stop_on_store_error(e);
      return;
    } catch (const InvariantError& e) {
      if (fatal.empty()) fatal = e.what();
      io.stop();
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    const JobState& s = master.state();
    for (Fault& f : faults) {
      if (f.done || s.phase() != Phase::Training) continue;
      const bool due = f.at_step >= 0 ? master.newest_step() >= f.at_step
                                      : std::chrono::duration_cast<std::chrono::nanoseconds>(now - t0).count() >= f.after;
      if (!due) continue;
      f.done = true;
      try {
        master.inject(f.fault, f.slot, f.local_rank);
        std::cerr << "goodput: injected " << f.fault << " into slot " << f.slot << " at step " << master.newest_step() << "\n";
      } catch (const std::exception& e) {
        std::cerr << "goodput: could not inject " << f.fault << ": " << e.what() << "\n";
      }
    }
    for (const std::string& note : master.take_console_notes()) std::cerr << note << "\n";
    if (now - last_print >= std::chrono::seconds(1)) {
      last_print = now;
      const auto st = live::status_of(master, false);
      char line[256], loss[32] = "";
      if (st.contains("loss")) std::snprintf(loss, sizeof loss, "  loss %.4g", st["loss"].get<double>());
      std::snprintf(line, sizeof line, "[%6.1fs] %-18s step %6lld/%lld%s  restart %d  goodput %5.1f%%  failures %d",
                    st["wall_s"].get<double>(), st["phase"].get<std::string>().c_str(),
                    static_cast<long long>(st["step"].get<int64_t>()), static_cast<long long>(spec.total_steps), loss,
                    st["restart"].get<int>(), 100 * st["goodput"].get<double>(), st["failures"].get<int>());
      if (!o.quiet && line != last_line) std::cerr << line << "\n";
      last_line = line;
      // Checkpoints that do not reach storage are lost with the node: say so, once per reason.
      for (const auto& [id, n] : master.world().nodes())
        if (!n.gone && !n.persist_error.empty() && warned_persist.insert(n.persist_error).second)
          std::cerr << "goodput: WARNING: node " << n.name << " cannot persist checkpoints to storage: " << n.persist_error
                    << "\n";
    }
    if (master.finished() && !finished_at) finished_at = now;
    // Agents learn the job is over from their next heartbeat; give them a moment to leave.
    if (finished_at && (now - *finished_at > std::chrono::seconds(2) || interrupted)) {
      if (nodes) {
        nodes->shut_down(interrupted ? 500 : 5000);
        if (master.finished()) nodes->job_over();
        // The job is over and storage has its checkpoints: free this run's host memory.
        if (master.finished() && spec.backend == "local")
          local::remove_shm_with_prefix("goodput-" + spec.job + "-" + run_id + "-");
      }
      io.stop();
      return;
    }
    timer.expires_after(std::chrono::milliseconds(50));
    timer.async_wait([&](const boost::system::error_code& ec) {
      if (!ec) tick();
    });
  };
  tick();
  io.run();
  if (!fatal.empty()) {
    // Agents keep their trainers running; a master started with --resume carries on.
    const bool bug = fatal.rfind("invariant", 0) == 0;
    std::cerr << "goodput: " << (bug ? "" : "the event log could not be written: ") << fatal << "\ngoodput: stopping the master; "
              << (bug ? "please report this; run again with --resume" : "fix the cause and run again with --resume")
              << " (agents keep training meanwhile)\n";
    ended["error"] = (bug ? "" : "event log unwritable: ") + fatal;
    return kExitResumable;
  }
  store.flush();
  // How it ended, for whoever runs the master (the pod's termination message).
  ended = json(live::status_of(master));
  ended.erase("nodes");
  if (detached) return kExitResumable;

  const Report r = make_report(master.state());
  std::cout << report_text(r);
  if (master.shards().total() > 0)
    std::cout << "data shards: " << master.shards().done() << " of " << master.shards().total() << " done, "
              << master.shards().duplicates() << " trained twice\n";
  std::cout << "event log: " << db << "  (goodput report " << db << "; goodput replay --from-log " << db << ")\n";
  const std::string reason = master.state().finish_reason();
  return reason == "completed" ? 0 : 1;
}
}  // namespace

// What `run` and `master` share: the job, where its files go, the port, resuming, TLS.
static void add_serve_options(CLI::App* cmd, ServeOptions& o, const char* run_dir_help) {
  cmd->add_option("job", o.spec_path, "Job spec (JSON); with --resume --run-dir DIR, the one that run was started with")
      ->check(CLI::ExistingFile);
  cmd->add_option("--run-dir", o.run_dir, run_dir_help);
  cmd->add_option("--port", o.port, "Master port (default: any free port; on --resume the old one)");
  cmd->add_option("--listen", o.listen, "Address to listen on (0.0.0.0: agents on other machines, e.g. Ray nodes)")
      ->capture_default_str();
  cmd->add_flag("--resume", o.resume, "Continue the job in --run-dir after a master crash");
  cmd->add_flag("--quiet", o.quiet, "No progress lines");
  cmd->add_option("--tls-cert", o.tls.cert_file, "Serve the API over HTTPS with this PEM certificate chain")
      ->check(CLI::ExistingFile);
  cmd->add_option("--tls-key", o.tls.key_file, "The certificate's PEM private key")->check(CLI::ExistingFile);
  cmd->add_option("--read-access", o.read_access,
                  "Who may read GET /status, / and /metrics: auto (open on a loopback --listen; elsewhere /status and / "
                  "want the bearer token, /metrics stays open), open, or token (all three want it)")
      ->check(CLI::IsMember({"auto", "open", "token"}))
      ->capture_default_str();
  cmd->add_flag("--detach-on-sigterm", o.detach_on_sigterm,
                "SIGTERM stops only the master (exit 3), not the job: its agents keep training and --resume carries on "
                "(for a master Kubernetes runs: its pod gets SIGTERM when evicted or drained); SIGINT still stops the job");
  cmd->add_option("--termination-log", o.termination_log,
                  "Write how the master ended here, as one JSON object (exit status, finish reason, step, goodput, "
                  "restarts, last failure, or the error): a pod's terminationMessagePath");
}

void add_live_commands(CLI::App& app, int& rc) {
  static ServeOptions run_o, master_o;
  auto* run = app.add_subcommand("run", "Run a job through failures: the master here, nodes from the job's backend "
                                        "(local processes, pods on a Kubernetes cluster, or Ray jobs on a Ray cluster)");
  add_serve_options(run, run_o, "Where the event log, checkpoints and node logs go (default runs/JOB)");
  run->add_option("--faults", run_o.faults_path, "Faults to inject: [{\"fault\":\"kill-process\",\"slot\":0,\"at_step\":40}]")
      ->check(CLI::ExistingFile);
  run->callback([&rc] { rc = serve(run_o); });
  const char* exit_status =
      "\nExit status: 0 the job completed; 1 it ended otherwise (gave up, stopped by Ctrl-C or SIGTERM) or an internal "
      "error; 2 a bad job spec or command line; 3 the master stopped with the job still on (its log could not be "
      "written, or SIGTERM with --detach-on-sigterm): run it again with --resume.";
  run->footer(exit_status);

  auto* master = app.add_subcommand("master", "Run only the job master; agents on other machines connect to it");
  add_serve_options(master, master_o, "Where the event log and token go (default runs/JOB)");
  master->footer(exit_status);
  master->callback([&rc] {
    master_o.local = false;
    rc = serve(master_o);
  });

  static agent::AgentOptions ao;
  auto* ag = app.add_subcommand("agent", "Run the node agent (reads the bearer token from GOODPUT_TOKEN; "
                                         "an https:// master is verified against GOODPUT_CA_FILE)");
  ag->add_option("--master", ao.master_url, "Master URL, http://host:port")->required();
  ag->add_option("--name", ao.name, "This node's name, unique in the job")->required();
  ag->add_option("--host", ao.host, "Address other ranks reach this node at (default: the one the master sees)");
  ag->add_option("--work-dir", ao.work_dir, "Trainer logs and progress files (default ./goodput-agent-NAME)");
  ag->add_option("--slot", ao.slot, "The rank slot this node was launched for (taken if still vacant)")
      ->check(CLI::Range(-1, 4095));
  ag->add_option("--memory-permille", ao.memory_permille, "Scale of the job's memory limit on this node")
      ->check(CLI::Range(1, 1'000'000));
  ag->add_option("--master-timeout", ao.master_timeout_s,
                 "Seconds without a master before the agent stops its trainer and exits")
      ->capture_default_str()
      ->check(CLI::Range(1, 86400));
  ag->callback([&rc] {
    const char* t = std::getenv("GOODPUT_TOKEN");
    if (!t || !*t) throw CLI::ValidationError("GOODPUT_TOKEN", "set GOODPUT_TOKEN to the job's bearer token");
    ao.token = t;
    rc = agent::run_agent(ao);
  });

  // Operator commands: one authenticated POST to the master, its answer printed.
  static std::string url, token_file;
  auto ask_master = [&rc](const std::string& path, const json& body) {
    std::string token = std::getenv("GOODPUT_TOKEN") ? std::getenv("GOODPUT_TOKEN") : "";
    if (!token_file.empty()) token = read_first_line(token_file);
    if (token.empty()) throw CLI::ValidationError("--token-file", "give --token-file or set GOODPUT_TOKEN");
    const auto r = net::http_call(net::Url::parse(url), "POST", path, token, body.dump(), 5000);
    if (!r) {
      std::cerr << "goodput: no answer from " << url << "\n";
      rc = 1;
    } else if (r->status != 200) {
      std::cerr << "goodput: the master refused: " << r->status << " " << r->body << "\n";
      rc = 2;
    } else {
      std::cout << r->body << "\n";
      rc = 0;
    }
  };
  auto add_master_options = [](CLI::App* cmd) {
    cmd->add_option("--master", url, "Master URL (in runs/JOB/master.url)")->required();
    cmd->add_option("--token-file", token_file, "File with the bearer token, e.g. runs/JOB/token (default: GOODPUT_TOKEN)");
  };

  static std::string fault;
  static int32_t slot = 0;
  auto* inj = app.add_subcommand("inject", "Inject a fault into a live job to rehearse recovery");
  inj->add_option("fault", fault, "kill-process | kill-node | hang | oom | corrupt-replica")
      ->required()
      ->check(CLI::IsMember({"kill-process", "kill-node", "hang", "oom", "corrupt-replica"}));
  inj->add_option("slot", slot, "The rank slot whose node gets the fault")->required();
  static int32_t inject_local_rank = 0;
  inj->add_option("--local-rank", inject_local_rank, "Which of the node's trainer processes (nproc_per_node > 1)")
      ->check(CLI::Range(0, 1023));
  add_master_options(inj);
  inj->callback([=] {
    json body{{"fault", fault}, {"slot", slot}};
    if (inject_local_rank > 0) body["local_rank"] = inject_local_rank;
    ask_master("/v1/inject", body);
  });

  static std::vector<int32_t> check_slots;
  static std::string check_fault, check_reason;
  static bool check_now = false;
  auto* chk = app.add_subcommand(
      "check", "Check nodes of a running job again (training stops, each runs the pre-flight node check, and the job "
               "restarts from its newest checkpoint; a faulty node is relaunched elsewhere)");
  chk->add_option("slots", check_slots, "Rank slots whose nodes to check (default: all)")->check(CLI::Range(0, 4095));
  chk->add_option("--fault", check_fault, "Fault drill for the checks: corrupt, link-down or slow:F")
      ->check([](const std::string& f) { return live::valid_check_fault(f) ? "" : "must be corrupt, link-down or slow:F (F from 1 to 1000)"; });
  chk->add_option("--reason", check_reason, "Why, for the event log");
  chk->add_flag("--now", check_now, "Stop training at once (default: right after the next checkpoint, losing no work)");
  add_master_options(chk);
  chk->callback([=] {
    json body = check_slots.empty() ? json{{"all", true}} : json{{"slots", check_slots}};
    if (!check_fault.empty()) body["fault"] = check_fault;
    if (!check_reason.empty()) body["reason"] = check_reason;
    if (check_now) body["now"] = true;
    ask_master("/v1/check", body);
  });

  static std::string scale_group, scale_reason;
  static int32_t scale_count = 0;
  auto* sc = app.add_subcommand(
      "scale", "Change how many parameter servers (or workers) a running job has: new nodes join the group's end or "
               "its highest slots are released, and the job restarts from its newest checkpoint in storage, "
               "each rank told the layout that checkpoint was saved under");
  sc->add_option("group", scale_group, "ps | worker")->required()->check(CLI::IsMember({"ps", "worker"}));
  sc->add_option("count", scale_count, "The group's new number of nodes")->required()->check(CLI::Range(1, live::kMaxNodes));
  sc->add_option("--reason", scale_reason, "Why, for the event log");
  add_master_options(sc);
  sc->callback([=] {
    json body{{"group", scale_group}, {"count", scale_count}};
    if (!scale_reason.empty()) body["reason"] = scale_reason;
    ask_master("/v1/scale", body);
  });
}

}  // namespace goodput
