// The Kubernetes backend's reading of the cluster, against the fixtures in shared/data/k8s/ (real
// `kubectl get -o yaml` dumps and test data from other projects, and objects reconstructed from
// the Kubernetes source): what a pod's status means, when a node is lost, watch frames,
// kubeconfig files, the pod a launch creates. (The backend end to end, with real agents and
// PyTorch trainers on the Kubernetes API emulator and the real kubectl, is tests/python/test_kube.py.)
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <yaml-cpp/yaml.h>

#include "backends/kubernetes/kube_client.h"
#include "backends/kubernetes/kube_nodes.h"
#include "policies/policy.h"
#include "backends/live/job_spec.h"
#include "engine/json_reader.h"
#include "test_util.h"

using namespace goodput;
using nlohmann::json;

namespace {

std::string k8s_text(const std::string& name) {
  std::ifstream in(std::string(GOODPUT_SHARED_DATA) + "/k8s/" + name);
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
json k8s(const std::string& name) {
  const std::string t = k8s_text(name);
  return name.size() > 5 && name.substr(name.size() - 5) == ".yaml" ? kube::yaml_to_json(t) : json::parse(t);
}

std::string trouble(const std::string& fixture) {
  const auto t = kube::pod_trouble(k8s(fixture));
  return t ? (t->fatal ? "FATAL " : "") + t->reason : "fine";
}

}  // namespace

TEST_CASE("a pod's status is read reason first, lastState when the container restarted") {
  // OOMKilled with exit code 1, in lastState of a container the kubelet restarted 9 times.
  const std::string oom = trouble("ih-oomkilled-unhealthy.yaml");
  CHECK(oom.find("restarted 9 times; last exit: reason=OOMKilled exitCode=1: system has run out of memory") !=
        std::string::npos);
  // The Kubernetes docs' snippet is a container's lastState alone: in a container that restarted.
  json snippet = {{"status", {{"phase", "Running"}, {"containerStatuses", json::array({{{"name", "memory-demo-2-ctr"}, {"restartCount", 1},
      {"state", {{"running", json::object()}}}, {"lastState", k8s("pod-oomkilled-k8s-docs-snippet.yaml")["lastState"]}}})}}}};
  CHECK(kube::pod_trouble(snippet)->reason ==
        "container memory-demo-2-ctr restarted 1 times; last exit: reason=OOMKilled exitCode=137");
  CHECK(trouble("ih-evicted.yaml").find("pod Evicted: The node was low on resource: memory") == 0);
  CHECK(trouble("ih-start-error.yaml").find("reason=StartError exitCode=128") != std::string::npos);
  CHECK(trouble("argo-pod-failed.yaml").find("reason=Error exitCode=1") != std::string::npos);
  CHECK(trouble("argo-pod-crashloop.yaml").find("CrashLoopBackOff; last exit: reason=Error") != std::string::npos);
  // A configuration error: retrying cannot pull an image that is not there.
  CHECK(trouble("ih-pod-imagepullbackoff.yaml").find("FATAL container") == 0);
  CHECK(trouble("ih-pod-imagepullbackoff.yaml").find("ImagePullBackOff: Back-off pulling image") != std::string::npos);
}

TEST_CASE("a pod's status line for the log, from the fixtures' pods") {
  CHECK(kube::pod_status(k8s("argo-pod-crashloop.yaml")).find("waiting (CrashLoopBackOff)") != std::string::npos);
  CHECK(kube::pod_status(k8s("ih-evicted.yaml")).rfind("Failed (Evicted)", 0) == 0);
  CHECK(kube::pod_status(k8s("ih-pod-imagepullbackoff.yaml")).find("waiting (ImagePullBackOff)") != std::string::npos);
  CHECK(kube::pod_status(k8s("ih-oomkilled-unhealthy.yaml")).find("; oomkilled running, 9 restarts") != std::string::npos);
  CHECK(kube::pod_status(json::object()) == "Unknown");  // nothing known: still a line, never a throw
  // The scheduler's condition on a pod no node was found for (as the Kubernetes docs show it).
  const json unschedulable = {{"status", {{"phase", "Pending"}, {"conditions", {{
      {"type", "PodScheduled"}, {"status", "False"}, {"reason", "Unschedulable"}, {"lastProbeTime", nullptr},
      {"message", "0/3 nodes are available: 3 Insufficient cpu."}}}}}}};
  CHECK(kube::pod_status(unschedulable) == "Pending (Unschedulable: 0/3 nodes are available: 3 Insufficient cpu.)");
}

TEST_CASE("the diagnosis table reads the pod reasons as the simulator's diagnosis kinds") {
  const DiagnosisTable t = DiagnosisTable::defaults();
  auto diag = [&](const std::string& fixture) {
    return t.diagnose(FailureObserved{0, FailureKind::NodeLost, 0, 0, kube::pod_trouble(k8s(fixture))->reason, 0}).diagnosis;
  };
  CHECK(diag("ih-oomkilled-unhealthy.yaml") == Diagnosis::OutOfMemory);
  CHECK(diag("ih-evicted.yaml") == Diagnosis::Preemption);  // evicted: the pod goes elsewhere
  CHECK(diag("argo-pod-failed.yaml") == Diagnosis::HardwareError);  // the pod is gone: a node-level loss
}

TEST_CASE("a node is lost when Ready is False or Unknown, or it is tainted unreachable") {
  const auto unknown = kube::node_trouble(k8s("node-not-ready-unknown.json"));
  REQUIRE(unknown);
  CHECK(*unknown == "node Ready=Unknown (NodeStatusUnknown: Kubelet stopped posting node status.)");
  // node-ready-false.json is the kubelet's Ready condition alone.
  json node = {{"metadata", {{"name", "node-b"}}}, {"status", {{"conditions", json::array({k8s("node-ready-false.json")})}}}};
  const auto not_ready = kube::node_trouble(node);
  REQUIRE(not_ready);
  CHECK(not_ready->find("node Ready=False (KubeletNotReady: container runtime network not ready") == 0);
  node["status"]["conditions"][0]["status"] = "True";
  CHECK_FALSE(kube::node_trouble(node));
  node["spec"]["taints"] = json::array({{{"key", "node.kubernetes.io/unreachable"}, {"effect", "NoExecute"}}});
  CHECK(kube::node_trouble(node) == "node tainted node.kubernetes.io/unreachable:NoExecute");
  json disrupted = node;
  disrupted.erase("spec");
  disrupted["status"]["conditions"].push_back({{"type", "DisruptionTarget"}, {"status", "True"}, {"reason", "PreemptionByScheduler"}});
  CHECK(kube::node_trouble(disrupted)->find("DisruptionTarget") != std::string::npos);
}

TEST_CASE("watch frames parse as the apiserver writes them; anything else is skipped") {
  std::istringstream lines(k8s_text("watch-stream-pods.ndjson"));
  std::vector<std::string> types;
  for (std::string line; std::getline(lines, line);)
    if (auto e = kube::parse_watch_frame(line)) types.push_back(e->type);
  CHECK(types == std::vector<std::string>{"ADDED", "MODIFIED", "BOOKMARK", "MODIFIED", "DELETED", "ERROR"});
  const auto bookmark = kube::parse_watch_frame(k8s_text("watch-initial-events-end-bookmark.json"));
  REQUIRE(bookmark);
  CHECK(bookmark->object["metadata"]["resourceVersion"] == "12746");
  CHECK_FALSE(kube::parse_watch_frame(R"({"type":"MODIFIED","object":{"kind":"Pod","metadata":{"na)"));  // cut mid-frame
  CHECK_FALSE(kube::parse_watch_frame(k8s_text("status-410-expired-watch.json")));  // a Status, not a frame
}

TEST_CASE("kubeconfig: current context, CA and client certificate data, token file, clear errors") {
  const auto dir = std::filesystem::temp_directory_path() / "goodput-kubeconfig-test";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "config").string();
  std::ofstream(dir / "token") << "rotating-token\n";
  // The fixture's shape, with real base64 where it has placeholders.
  std::string text = k8s_text("kubeconfig-example.yaml");
  text.replace(text.find("<base64 PEM>"), 12, "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCg==");
  text.replace(text.find("token: <bearer token>"), 21, "tokenFile: token");
  std::ofstream(path) << text;
  const kube::KubeConfig c = kube::load_kubeconfig(path);
  CHECK(c.server == "https://127.0.0.1:6443");
  CHECK(c.namespace_ == "test");
  CHECK(c.tls.ca_pem == "-----BEGIN CERTIFICATE-----\n");
  CHECK(c.token_file == (dir / "token").string());
  CHECK_THROWS_WITH_AS(kube::load_kubeconfig(path, "nope"), (path + ": no context named 'nope'").c_str(), kube::KubeError);
  std::ofstream(path) << "apiVersion: v1\nkind: Config\ncurrent-context: a\ncontexts:\n- name: a\n  context: {cluster: c, user: u}\n"
                         "clusters:\n- name: c\n  cluster: {server: 'https://h:6443', certificate-authority-data: '%%%'}\n"
                         "users:\n- name: u\n  user: {token: t}\n";
  CHECK_THROWS_WITH_AS(kube::load_kubeconfig(path), (path + ": field 'certificate-authority-data' is not valid base64").c_str(),
                       kube::KubeError);
  std::ofstream(path) << "apiVersion: v1\ncurrent-context: a\ncontexts:\n- name: a\n  context: {cluster: c, user: u}\n"
                         "clusters:\n- name: c\n  cluster: {server: 'https://h:6443'}\nusers:\n- name: u\n  user: {exec: {command: aws}}\n";
  CHECK_THROWS_AS(kube::load_kubeconfig(path), kube::KubeError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the pod a launch creates: labels, memory scaled after an OOM, bad nodes avoided, token from a Secret") {
  live::KubeBackendSpec s;
  s.image = "registry.example/trainer:1";
  s.memory_mb = 1024;
  s.gpus = 8;
  s.node_selector["pool"] = "h100";
  kube::KubeNodesOptions o;
  o.spec = s;
  o.master_url = "http://master:8000";
  o.token = "secret-token";
  o.job = "Llama_3";
  o.run = "Llama_3-1700000000";
  const json pod = kube::KubeNodes::manifest_for(o, "llama-3-1700000000-worker-3", 2, 1500, {"node-b"});
  CHECK(pod["metadata"]["labels"]["goodput/job"] == "llama-3");
  CHECK(pod["metadata"]["labels"]["goodput/replica-type"] == "worker");
  CHECK(pod["metadata"]["labels"]["goodput/launch"] == "3");
  CHECK(pod["metadata"]["labels"]["goodput/rank"] == "2");
  const json& c = pod["spec"]["containers"][0];
  CHECK(c["resources"]["limits"]["memory"] == "1536Mi");
  CHECK(c["resources"]["limits"]["nvidia.com/gpu"] == "8");
  CHECK(c["command"] == json::array({"goodput", "agent", "--master", "http://master:8000", "--name",
                                     "llama-3-1700000000-worker-3", "--memory-permille", "1500", "--slot", "2", "--host",
                                     "$(POD_IP)"}));
  CHECK(c["env"][1]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP");
  CHECK(c["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "llama-3-1700000000-token");
  CHECK(pod.dump().find("secret-token") == std::string::npos);
  CHECK(pod["spec"]["nodeSelector"]["pool"] == "h100");
  CHECK(pod["spec"]["restartPolicy"] == "Never");
  CHECK(pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
           ["matchExpressions"][0]["values"] == json::array({"node-b"}));
  // Flash checkpoints need more than a runtime's 64 MiB /dev/shm: a memory-backed one, unless the
  // spec brings its own.
  CHECK(c["volumeMounts"] == json::parse(R"([{"name":"goodput-shm","mountPath":"/dev/shm"}])"));
  CHECK(pod["spec"]["volumes"] == json::parse(R"([{"name":"goodput-shm","emptyDir":{"medium":"Memory"}}])"));
  o.spec.volumes = json::parse(R"([{"name":"shm","emptyDir":{"medium":"Memory","sizeLimit":"64Gi"}}])");
  o.spec.volume_mounts = json::parse(R"([{"name":"shm","mountPath":"/dev/shm"}])");
  const json own = kube::KubeNodes::manifest_for(o, "llama-3-1700000000-worker-4", 2, 1000, {});
  CHECK(own["spec"]["volumes"] == o.spec.volumes);
  CHECK(own["spec"]["containers"][0]["volumeMounts"] == o.spec.volume_mounts);
}

TEST_CASE("a job spec's Kubernetes backend is checked field by field") {
  auto error_of = [](const std::string& backend) {
    try {
      live::job_spec_from_json(json::parse(R"({"job":"j","command":["x"],"total_steps":10,"backend":)" + backend + "}"), "", ".");
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error_of(R"({"type":"kubernetes"})") == "field 'backend.image' is required: the container image with goodput and the trainer");
  // A pod's replica type comes from the job's replica groups, not from the backend.
  CHECK(error_of(R"({"type":"kubernetes","image":"i","replica_type":"ps"})").find("replica_type") != std::string::npos);
  CHECK(error_of(R"({"type":"kubernetes","image":"i","tolerations":{}})").find("tolerations") != std::string::npos);
  CHECK(error_of(R"({"type":"kubernetes","image":"i","image_pull_policy":"Sometimes"})").find("image_pull_policy") !=
        std::string::npos);
  CHECK(error_of(R"({"type":"kubernetes","image":"i","pending_timeout":"0s"})") ==
        "field 'backend.pending_timeout' must be positive");
  CHECK(error_of(R"({"type":"kubernetes","image":"i","memory_mb":512,"gpus":1,"pending_timeout":"5m"})") == "no error");
  // How hard it may press the API server.
  CHECK(error_of(R"({"type":"kubernetes","image":"i","api_qps":0})").find("backend.api_qps") != std::string::npos);
  CHECK(error_of(R"({"type":"kubernetes","image":"i","api_concurrency":1000})").find("backend.api_concurrency") !=
        std::string::npos);
  const live::JobSpec limited = live::job_spec_from_json(
      json::parse(R"({"job":"j","command":["x"],"total_steps":10,"backend":{"type":"kubernetes","image":"i",)"
                  R"("api_qps":100,"api_burst":200,"api_concurrency":16}})"),
      "", ".");
  CHECK(limited.kube.api.qps == 100);
  CHECK(limited.kube.api.burst == 200);
  CHECK(limited.kube.api.concurrency == 16);
  CHECK(live::job_spec_from_json(json::parse(R"({"job":"j","command":["x"],"total_steps":10,"backend":{"type":"kubernetes","image":"i"}})"),
                                 "", ".")
            .kube.api.qps == 20);  // kube-controller-manager's default
}

TEST_CASE("the shipped Kubernetes job spec and the deployment's ConfigMap are valid job specs") {
  const live::JobSpec ex = live::load_job_spec(std::string(GOODPUT_SOURCE_DIR) + "/examples/unified/kubernetes-job.json");
  CHECK(ex.backend == "kubernetes");
  CHECK(ex.kube.gpus == 8);
  CHECK(ex.kube.volume_mounts[0]["mountPath"] == "/checkpoints");
  // The parameter-server example: its servers are CPU machines of their own pool.
  const live::JobSpec ps = live::load_job_spec(std::string(GOODPUT_SOURCE_DIR) + "/examples/unified/kubernetes-ps-job.json");
  CHECK(ps.nodes == 37);
  CHECK(ps.fixed_slots() == 5);
  const live::ReplicaGroup& servers = live::replica_group(ps.replicas, 1);
  CHECK(servers.type == "ps");
  CHECK(servers.kube.gpus == 0);
  CHECK(servers.kube.node_selector.at("pool") == "cpu-highmem");
  CHECK(servers.kube.tolerations.empty());
  CHECK(servers.kube.volume_mounts == ex.kube.volume_mounts);
  CHECK(live::replica_group(ps.replicas, 36).kube.gpus == 8);
  std::ifstream in(std::string(GOODPUT_SOURCE_DIR) + "/backends/kubernetes/deploy/goodput.yaml");
  std::stringstream ss;
  ss << in.rdbuf();
  std::vector<json> docs;
  for (const YAML::Node& d : YAML::LoadAll(ss.str())) docs.push_back(kube::yaml_to_json(YAML::Dump(d)));
  std::map<std::string, int> kinds;
  for (const json& d : docs) ++kinds[d["kind"].get<std::string>()];
  CHECK(kinds == std::map<std::string, int>{{"ClusterRole", 1}, {"ClusterRoleBinding", 1}, {"ConfigMap", 1}, {"Job", 1},
                                             {"PersistentVolumeClaim", 1}, {"Role", 1}, {"RoleBinding", 1}, {"Service", 1},
                                             {"ServiceAccount", 1}});
  for (const json& d : docs) {
    if (d["kind"] == "Role") {
      // The least rights: its own pods (patch: their rank label follows a scale) and the token
      // Secret (deleted when the job is over); no update or deletecollection.
      CHECK(d["rules"][0]["verbs"] == json::array({"create", "delete", "get", "list", "patch", "watch"}));
      CHECK(d["rules"][1]["verbs"] == json::array({"create", "delete"}));
    }
    if (d["kind"] == "Job") {
      // The master runs to the job's end: a job that ended (exit 1) or a bad spec (2) fails the
      // Job, anything else (3: resume me, a crash) gets a fresh pod that resumes from the log; an
      // eviction costs no retry and only stops the master (--detach-on-sigterm).
      const json& rules = d["spec"]["podFailurePolicy"]["rules"];
      REQUIRE(rules.size() == 2);
      CHECK(rules[0]["action"] == "FailJob");
      CHECK(rules[0]["onExitCodes"]["values"] == json::array({1, 2}));
      CHECK(rules[0]["onExitCodes"]["containerName"] == "master");
      CHECK(rules[1]["action"] == "Ignore");
      CHECK(rules[1]["onPodConditions"][0]["type"] == "DisruptionTarget");
      const json& pod = d["spec"]["template"]["spec"];
      CHECK(pod["restartPolicy"] == "Never");  // what podFailurePolicy needs
      CHECK(pod["containers"][0]["name"] == "master");
      const std::string args = pod["containers"][0]["args"][0].get<std::string>();
      CHECK(args.find("--detach-on-sigterm") != std::string::npos);
      CHECK(args.find("--resume") != std::string::npos);
    }
    if (d["kind"] == "ConfigMap") {
      const json spec = json::parse(d["data"]["job.json"].get<std::string>());
      json inline_policy = spec;
      inline_policy["policy"] = json::parse(d["data"]["policy.json"].get<std::string>());
      const live::JobSpec s = live::job_spec_from_json(inline_policy, "ConfigMap goodput-job", ".");
      CHECK(s.kube.master_url == "http://goodput-master:8000");
      CHECK(load_policy(s.policy).recovery != nullptr);
    }
  }
}

TEST_CASE("in-cluster configuration: the service account's files, the token read again before each call") {
  const auto dir = std::filesystem::temp_directory_path() / "goodput-sa-test";
  std::filesystem::create_directories(dir);
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  CHECK_THROWS_WITH_AS(kube::in_cluster_config(dir.string()),
                       "not inside a Kubernetes pod (KUBERNETES_SERVICE_HOST/PORT unset): give backend.kubeconfig",
                       kube::KubeError);
  ::setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
  ::setenv("KUBERNETES_SERVICE_PORT", "443", 1);
  std::ofstream(dir / "token") << "token-1\n";
  std::ofstream(dir / "namespace") << "training";
  std::ofstream(dir / "ca.crt") << "";
  const kube::KubeConfig c = kube::in_cluster_config(dir.string());
  CHECK(c.server == "https://10.96.0.1:443");
  CHECK(c.namespace_ == "training");
  CHECK(c.token_file == (dir / "token").string());
  CHECK(c.tls.ca_file == (dir / "ca.crt").string());
  ::unsetenv("KUBERNETES_SERVICE_HOST");
  ::unsetenv("KUBERNETES_SERVICE_PORT");
  std::filesystem::remove_all(dir);
}

TEST_CASE("the client sends the token file's current token, and honours 429 Retry-After") {
  const auto dir = std::filesystem::temp_directory_path() / "goodput-token-test";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "token") << "token-1\n";
  std::vector<std::string> seen;
  int throttle = 1;
  boost::asio::io_context io;
  net::HttpServer server(io, "127.0.0.1", 0, [&](const net::HttpRequest& r) -> net::HttpResponse {
    seen.push_back(r.authorization);
    if (throttle-- > 0) return {429, "application/json", k8s_text("status-429-eviction-pdb.json")};
    return {200, "application/json", R"({"kind":"PodList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":[]})"};
  });
  std::thread t([&] { io.run(); });
  kube::KubeConfig c;
  c.server = "http://127.0.0.1:" + std::to_string(server.port());
  c.token_file = (dir / "token").string();
  kube::KubeClient client(c);
  CHECK(client.list("/api/v1/namespaces/x/pods", "goodput/run=r").resource_version == "7");
  CHECK(client.retries() == 1);
  std::ofstream(dir / "token") << "token-2\n";  // rotated by the kubelet
  client.list("/api/v1/namespaces/x/pods");
  io.stop();
  t.join();
  CHECK(seen == std::vector<std::string>{"Bearer token-1", "Bearer token-1", "Bearer token-2"});
  std::filesystem::remove_all(dir);
}

TEST_CASE("the manifests' namespace is one setting: kustomize puts it everywhere, the cluster-wide binding too") {
  // The real kubectl's kustomize (no cluster needed), on a copy of deploy/ whose one setting is changed.
  if (goodput::test::run_command("kubectl version --client").exit_code != 0) {
    WARN_MESSAGE(false, "kubectl is not installed: the kustomization is not rendered here");
    return;
  }
  goodput::test::TempDir dir("kustomize");
  const std::string deploy = std::string(GOODPUT_SOURCE_DIR) + "/backends/kubernetes/deploy";
  std::filesystem::copy_file(deploy + "/goodput.yaml", dir.file("goodput.yaml"));
  std::ifstream k(deploy + "/kustomization.yaml");
  std::stringstream ks;
  ks << k.rdbuf();
  std::string kust = ks.str();
  const auto at = kust.find("namespace: training");
  REQUIRE(at != std::string::npos);
  kust.replace(at, std::string("namespace: training").size(), "namespace: ml-team");
  dir.write("kustomization.yaml", kust);
  const auto r = goodput::test::run_command("kubectl kustomize " + dir.path.string());
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  int namespaced = 0;
  for (const YAML::Node& d : YAML::LoadAll(r.output)) {
    const json doc = kube::yaml_to_json(YAML::Dump(d));
    const std::string kind = doc["kind"];
    CAPTURE(kind);
    if (kind == "ClusterRole") continue;
    if (kind == "ClusterRoleBinding") {
      CHECK(doc["metadata"]["name"] == "goodput-node-reader-ml-team");
      CHECK(doc["subjects"][0]["namespace"] == "ml-team");
      continue;
    }
    CHECK(doc["metadata"]["namespace"] == "ml-team");
    if (kind == "RoleBinding") CHECK(doc["subjects"][0].value("namespace", "ml-team") == "ml-team");
    ++namespaced;
  }
  CHECK(namespaced == 7);
  CHECK(r.output.find("training") == std::string::npos);
  CHECK(r.output.find("NAMESPACE") == std::string::npos);
}

namespace {
// A provider whose API calls take 30 ms each and are recorded: what ClusterNodes does with many
// commands at once, without a cluster.
struct RecordingNodes final : live::ClusterNodes<live::ClusterMember> {
  using Command = ClusterNodes::Command;
  struct Call {
    Command::Kind kind;
    std::string name;
    std::chrono::steady_clock::time_point start, end;
  };
  explicit RecordingNodes(live::ApiLimits limits) : ClusterNodes({"test", "machine", "node"}, {}, false, limits) {
    start_worker();
  }
  ~RecordingNodes() override { stop_worker(); }
  void launch(int32_t slot, int32_t) override {
    std::lock_guard lock(mu_);
    const std::string name = "n" + std::to_string(slot);
    members_[name].slot = slot;
    queue({Command::Create, name, 1000, slot});
  }
  bool carry_out(const Command& c) override {
    const auto start = std::chrono::steady_clock::now();
    const int now_in_flight = ++in_flight;
    for (int seen = most_in_flight.load(); seen < now_in_flight && !most_in_flight.compare_exchange_weak(seen, now_in_flight);) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    --in_flight;
    std::lock_guard lock(calls_mu);
    const bool refuse = c.name == refuse_once && c.kind == Command::Create && !refused;  // a 429 after its retries
    refused = refused || refuse;
    calls.push_back({c.kind, c.name, start, std::chrono::steady_clock::now()});
    return !refuse;
  }
  std::atomic<int> in_flight{0}, most_in_flight{0};
  std::mutex calls_mu;
  std::vector<Call> calls;
  std::string refuse_once;
  bool refused = false;
};
}  // namespace

TEST_CASE("API commands go out concurrently within the rate limit; a node's delete never overtakes its create") {
  live::ApiLimits limits{.qps = 200, .burst = 10, .concurrency = 6};
  RecordingNodes nodes(limits);
  {
    std::lock_guard lock(nodes.calls_mu);
    nodes.refuse_once = "n3";
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int32_t s = 0; s < 60; ++s) nodes.launch(s, 1000);
  for (int32_t s = 0; s < 60; s += 5) nodes.terminate("n" + std::to_string(s));  // queued behind their creates
  for (int i = 0; i < 500; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::lock_guard lock(nodes.calls_mu);
    if (nodes.calls.size() == 60 + 1 + 12) break;  // + the refused try, + the deletes
  }
  std::lock_guard lock(nodes.calls_mu);
  REQUIRE(nodes.calls.size() == 73);
  // Concurrency: more than one at a time (30 ms calls, 60 of them), never more than allowed.
  CHECK(nodes.most_in_flight.load() > 1);
  CHECK(nodes.most_in_flight.load() <= limits.concurrency);
  // Rate: by any moment, at most burst + qps x elapsed calls started.
  std::vector<double> starts;
  for (const auto& c : nodes.calls) starts.push_back(std::chrono::duration<double>(c.start - t0).count());
  std::sort(starts.begin(), starts.end());
  for (size_t i = 0; i < starts.size(); ++i) CHECK(static_cast<double>(i + 1) <= limits.burst + limits.qps * starts[i] + 1);
  // Order per node: a delete starts after its create ended; the refused create was tried again
  // (a second later) without holding up the others, and its node's delete waited for it.
  std::map<std::string, std::vector<const RecordingNodes::Call*>> by_name;
  for (const auto& c : nodes.calls) by_name[c.name].push_back(&c);
  for (int32_t s = 0; s < 60; s += 5) {
    const auto& cs = by_name["n" + std::to_string(s)];
    REQUIRE(cs.size() == 2);
    CHECK(cs[0]->kind == RecordingNodes::Command::Create);
    CHECK(cs[1]->kind == RecordingNodes::Command::Delete);
    CHECK(cs[1]->start >= cs[0]->end);
  }
  const auto& n3 = by_name["n3"];
  REQUIRE(n3.size() == 2);
  CHECK(n3[1]->start - n3[0]->end >= std::chrono::milliseconds(900));
  size_t meanwhile = 0;  // calls made between the refusal and the retry
  for (const auto& c : nodes.calls)
    if (c.name != "n3" && c.start >= n3[0]->end && c.end <= n3[1]->start) ++meanwhile;
  CHECK(meanwhile > 0);
}
