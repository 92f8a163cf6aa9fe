// `goodput k8s convert`: a Kubeflow PyTorchJob (kubeflow.org/v1) as a GoodputJob, naming what it
// cannot carry over. The PyTorchJob's fields are those of the training operator's v1 API
// (pytorchReplicaSpecs Master/Worker with replicas, restartPolicy and a pod template;
// nprocPerNode; elasticPolicy; runPolicy); a launcher in the container's command (torchrun,
// python -m torch.distributed.run / .launch) is read by goodput torchrun's own option parser and
// left out, since Goodput's agents start each node's processes.
#include "cli/k8s_convert.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <iostream>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "backends/kubernetes/kube_client.h"
#include "backends/live/job_spec.h"
#include "cli/torchrun.h"

namespace goodput {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

struct ConvertError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

const json& at(const json& j, const char* key) {
  static const json none;
  return j.is_object() && j.contains(key) ? j[key] : none;
}

// "64Gi", "500M", "1e3", "1073741824" -> MiB (rounded up); nullopt: not a quantity.
std::optional<int64_t> mebibytes(const std::string& q) {
  static const std::vector<std::pair<std::string, double>> suffixes = {
      {"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"Ti", 1099511627776.0},
      {"k", 1e3},     {"M", 1e6},        {"G", 1e9},           {"T", 1e12}};
  double scale = 1;
  std::string number = q;
  for (const auto& [s, f] : suffixes)
    if (q.size() > s.size() && q.compare(q.size() - s.size(), s.size(), s) == 0) {
      scale = f;
      number = q.substr(0, q.size() - s.size());
      break;
    }
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(number, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used != number.size() || !(v >= 0)) return std::nullopt;
  return static_cast<int64_t>((v * scale + 1048575.0) / 1048576.0);
}

std::string text_of(const json& v) { return v.is_string() ? v.get<std::string>() : v.is_number() ? v.dump() : ""; }

bool is_python(const std::string& exe) {
  const std::string base = exe.substr(exe.rfind('/') == std::string::npos ? 0 : exe.rfind('/') + 1);
  return base.rfind("python", 0) == 0;
}

// A string YAML would read as something else (a number, a boolean, null) is written quoted.
bool needs_quotes(const std::string& v) {
  static const std::regex plain_scalar(
      R"(^$|^[-+]?(\.[0-9]+|[0-9][0-9_]*(\.[0-9_]*)?)([eE][-+]?[0-9]+)?$|^0[xo][0-9a-fA-F]+$|^[-+]?\.(inf|Inf|INF)$|^\.(nan|NaN|NAN)$|^(true|True|TRUE|false|False|FALSE|yes|Yes|YES|no|No|NO|on|On|ON|off|Off|OFF|y|Y|n|N|null|Null|NULL|~)$)");
  return std::regex_search(v, plain_scalar);
}

void emit(YAML::Emitter& e, const ordered_json& j) {
  if (j.is_object()) {
    e << YAML::BeginMap;
    for (const auto& [k, v] : j.items()) {
      e << YAML::Key << k << YAML::Value;
      emit(e, v);
    }
    e << YAML::EndMap;
  } else if (j.is_array()) {
    e << YAML::BeginSeq;
    for (const auto& v : j) emit(e, v);
    e << YAML::EndSeq;
  } else if (j.is_string()) {
    const std::string v = j.get<std::string>();
    if (needs_quotes(v)) e << YAML::DoubleQuoted;
    e << v;
  } else if (j.is_boolean()) {
    e << j.get<bool>();
  } else if (j.is_number_integer()) {
    e << j.get<int64_t>();
  } else if (j.is_number()) {
    e << j.get<double>();
  } else {
    e << YAML::Null;
  }
}

}  // namespace

ConvertedJob convert_pytorchjob(const nlohmann::json& m) {
  ConvertedJob out;
  auto& lost = out.not_carried;
  auto fail = [](const std::string& field, const std::string& what) { return ConvertError("field '" + field + "' " + what); };
  if (!m.is_object()) throw ConvertError("not a Kubernetes object");
  const std::string api = text_of(at(m, "apiVersion")), kind = text_of(at(m, "kind"));
  if (kind != "PyTorchJob" || api.rfind("kubeflow.org/", 0) != 0)
    throw fail("kind", "is '" + api + " " + kind + "', not a kubeflow.org PyTorchJob");
  const std::string name = text_of(at(at(m, "metadata"), "name"));
  if (name.empty()) throw fail("metadata.name", "is missing");
  const json& spec = at(m, "spec");
  const json& replicas = at(spec, "pytorchReplicaSpecs");
  if (!replicas.is_object() || replicas.empty()) throw fail("spec.pytorchReplicaSpecs", "is missing (Master and/or Worker)");
  int64_t nodes = 0;
  for (const auto& [type, r] : replicas.items()) {
    if (type != "Master" && type != "Worker") {
      lost.push_back("spec.pytorchReplicaSpecs." + type + ": a replica type PyTorchJob itself does not define");
      continue;
    }
    const json& count = at(r, "replicas");
    if (!count.is_null() && (!count.is_number_integer() || count.get<int64_t>() < 0))
      throw fail("spec.pytorchReplicaSpecs." + type + ".replicas", "must be a count");
    nodes += count.is_null() ? 1 : count.get<int64_t>();
    if (r.contains("restartPolicy"))
      lost.push_back("spec.pytorchReplicaSpecs." + type + ".restartPolicy (" + text_of(r["restartPolicy"]) +
                     "): Goodput's recovery policy decides every restart");
  }
  if (nodes < 1 || nodes > live::kMaxNodes)
    throw fail("spec.pytorchReplicaSpecs", "must hold 1 to " + std::to_string(live::kMaxNodes) + " replicas in all");
  const std::string from = replicas.contains("Worker") ? "Worker" : "Master";
  if (replicas.contains("Worker") && replicas.contains("Master") &&
      at(replicas["Master"], "template") != at(replicas["Worker"], "template"))
    lost.push_back("spec.pytorchReplicaSpecs.Master.template: it differs from the Worker's; every node gets the Worker's");
  const std::string tpl = "spec.pytorchReplicaSpecs." + from + ".template.spec";
  const json& pod = at(at(replicas[from], "template"), "spec");
  const json& containers = at(pod, "containers");
  if (!containers.is_array() || containers.empty()) throw fail(tpl + ".containers", "is missing");
  size_t which = 0;
  for (size_t i = 0; i < containers.size(); ++i)
    if (text_of(at(containers[i], "name")) == "pytorch") which = i;  // the training operator's container
  for (size_t i = 0; i < containers.size(); ++i)
    if (i != which) lost.push_back(tpl + ".containers[" + text_of(at(containers[i], "name")) + "]: a second container (a sidecar)");
  const json& c = containers[which];
  const std::string ctr = tpl + ".containers[" + text_of(at(c, "name")) + "]";

  ordered_json backend = ordered_json::object();
  const std::string image = text_of(at(c, "image"));
  if (image.empty()) throw fail(ctr + ".image", "is missing");
  backend["image"] = image;
  if (c.contains("imagePullPolicy")) backend["image_pull_policy"] = text_of(c["imagePullPolicy"]);

  // The trainer's argv, less a launcher: Goodput's agent starts each node's processes.
  std::vector<std::string> argv;
  for (const char* key : {"command", "args"})
    for (const auto& a : at(c, key)) {
      if (!a.is_string()) throw fail(ctr + "." + key, "must be a list of strings");
      argv.push_back(a.get<std::string>());
    }
  if (argv.empty()) throw fail(ctr + ".command", "is missing: Goodput runs the trainer's command, not the image's entrypoint");
  std::string launcher_nproc;
  const std::string exe = argv[0].substr(argv[0].rfind('/') == std::string::npos ? 0 : argv[0].rfind('/') + 1);
  size_t skip = 0;
  if (exe == "torchrun") skip = 1;
  else if (is_python(argv[0]) && argv.size() > 2 && argv[1] == "-m" &&
           (argv[2] == "torch.distributed.run" || argv[2] == "torch.distributed.launch"))
    skip = 3;
  std::vector<std::string> command = argv;
  if (skip > 0) {
    TorchrunLine line;
    try {
      line = parse_torchrun_line({argv.begin() + static_cast<std::ptrdiff_t>(skip), argv.end()});
    } catch (const std::runtime_error& e) {
      throw fail(ctr + ".command", std::string("has a launcher line Goodput cannot read: ") + e.what());
    }
    if (line.program.empty()) throw fail(ctr + ".command", "has a launcher but no training script");
    const std::string python = is_python(argv[0]) ? argv[0] : "python3";
    command.clear();
    if (line.options.count("no-python")) {
      command = line.program;
    } else {
      command.push_back(python);
      if (line.options.count("module")) command.push_back("-m");
      command.insert(command.end(), line.program.begin(), line.program.end());
    }
    std::string dropped;
    for (const auto& [opt, v] : line.options) {
      if (opt == "nproc-per-node") launcher_nproc = v;
      else if (opt != "module" && opt != "no-python" && opt != "run-path") dropped += (dropped.empty() ? "--" : ", --") + opt;
    }
    if (!dropped.empty())
      lost.push_back(ctr + ".command: the launcher's " + dropped + " (Goodput's master is the rendezvous and decides restarts)");
  }

  ordered_json env = ordered_json::object();
  for (const auto& e : at(c, "env")) {
    const std::string n = text_of(at(e, "name"));
    if (e.contains("value")) env[n] = text_of(e["value"]);
    else lost.push_back(ctr + ".env " + n + ": valueFrom (only plain values carry over)");
  }
  if (c.contains("envFrom")) lost.push_back(ctr + ".envFrom");

  const json& res = at(c, "resources");
  for (const char* part : {"limits", "requests"}) {
    const json& r = at(res, part);
    if (!backend.contains("gpus") && r.contains("nvidia.com/gpu")) {
      const std::string g = text_of(r["nvidia.com/gpu"]);
      try {
        backend["gpus"] = std::stoi(g);
      } catch (const std::exception&) {
        throw fail(ctr + ".resources." + part + ".nvidia.com/gpu", "is not a count: '" + g + "'");
      }
    }
    if (!backend.contains("cpu") && r.contains("cpu")) backend["cpu"] = text_of(r["cpu"]);
    if (!backend.contains("memory_mb") && r.contains("memory")) {
      const auto mb = mebibytes(text_of(r["memory"]));
      if (!mb) throw fail(ctr + ".resources." + part + ".memory", "is not a quantity: '" + text_of(r["memory"]) + "'");
      backend["memory_mb"] = *mb;
    }
  }
  if (at(res, "limits").contains("memory") && at(res, "requests").contains("memory") &&
      at(res, "limits")["memory"] != at(res, "requests")["memory"])
    lost.push_back(ctr + ".resources: a memory request below the limit (Goodput's pods ask for the limit)");
  if (pod.contains("nodeSelector")) backend["node_selector"] = pod["nodeSelector"];
  if (pod.contains("tolerations")) backend["tolerations"] = pod["tolerations"];
  if (pod.contains("volumes")) backend["volumes"] = pod["volumes"];
  if (c.contains("volumeMounts")) backend["volume_mounts"] = c["volumeMounts"];
  if (pod.contains("serviceAccountName")) backend["service_account"] = text_of(pod["serviceAccountName"]);
  if (c.contains("workingDir")) backend["working_dir"] = text_of(c["workingDir"]);
  static const std::set<std::string> pod_done = {"containers", "nodeSelector", "tolerations", "volumes",
                                                 "serviceAccountName", "restartPolicy"};
  for (const auto& [k, v] : pod.items())
    if (!pod_done.count(k)) lost.push_back(tpl + "." + k);
  static const std::set<std::string> container_done = {"name", "image", "imagePullPolicy", "command", "args", "env",
                                                       "envFrom", "resources", "volumeMounts", "workingDir"};
  for (const auto& [k, v] : c.items())
    if (!container_done.count(k)) lost.push_back(ctr + "." + k);

  // Processes per node: the job's nprocPerNode, else the elastic policy's, else the launcher's.
  std::string nproc = text_of(at(spec, "nprocPerNode"));
  if (nproc.empty()) nproc = text_of(at(at(spec, "elasticPolicy"), "nProcPerNode"));
  if (nproc.empty()) nproc = launcher_nproc;
  int64_t per_node = 1;
  if (nproc == "gpu" || nproc == "auto") {
    per_node = backend.contains("gpus") && backend["gpus"].get<int64_t>() > 0 ? backend["gpus"].get<int64_t>() : 1;
  } else if (nproc == "cpu") {
    lost.push_back("spec.nprocPerNode: cpu (one process per CPU); give a number");
  } else if (!nproc.empty()) {
    try {
      per_node = std::stoll(nproc);
    } catch (const std::exception&) {
      throw fail("spec.nprocPerNode", "is not a count: '" + nproc + "'");
    }
    if (per_node < 1 || per_node > 1024) throw fail("spec.nprocPerNode", "must be from 1 to 1024");
  }
  if (spec.contains("elasticPolicy"))
    lost.push_back("spec.elasticPolicy: an elastic world is a scaling policy in Goodput (examples/policies/), and its "
                   "restarts the recovery policy's");
  if (spec.contains("runPolicy")) {
    std::string keys;
    for (const auto& [k, v] : spec["runPolicy"].items()) keys += (keys.empty() ? "" : ", ") + k;
    lost.push_back("spec.runPolicy (" + keys + "): the job ends when training does, and gives up as its policy says");
  }

  ordered_json meta = {{"name", name}};
  const json& in_meta = at(m, "metadata");
  if (in_meta.contains("namespace")) meta["namespace"] = in_meta["namespace"];
  if (in_meta.contains("labels")) meta["labels"] = in_meta["labels"];
  ordered_json job_spec = {{"nodes", nodes}};
  if (per_node > 1) job_spec["nproc_per_node"] = per_node;
  job_spec["command"] = command;
  if (!env.empty()) job_spec["env"] = env;
  job_spec["backend"] = backend;
  out.job = {{"apiVersion", "goodput.dev/v1alpha1"}, {"kind", "GoodputJob"}, {"metadata", meta}, {"spec", job_spec}};
  return out;
}

std::string to_yaml_text(const nlohmann::ordered_json& j) {
  YAML::Emitter e;
  emit(e, j);
  return std::string(e.c_str()) + "\n";
}

void add_k8s_commands(CLI::App& app, int& rc) {
  auto* k8s = app.add_subcommand("k8s", "Kubernetes tools: turn other operators' jobs into GoodputJobs");
  k8s->require_subcommand(1);
  static std::string in_path, out_path, format = "yaml";
  auto* convert = k8s->add_subcommand("convert", "A Kubeflow PyTorchJob (kubeflow.org/v1) as a GoodputJob, naming what "
                                                 "it cannot carry over");
  convert->add_option("file", in_path, "The PyTorchJob manifest (YAML or JSON)")->required()->check(CLI::ExistingFile);
  convert->add_option("-o,--output", out_path, "Where the GoodputJob goes (default: stdout)");
  convert->add_option("--format", format, "yaml or json")->check(CLI::IsMember({"yaml", "json"}))->capture_default_str();
  convert->callback([&rc] {
    std::ifstream in(in_path);
    std::stringstream ss;
    ss << in.rdbuf();
    ConvertedJob c;
    try {
      c = convert_pytorchjob(kube::yaml_to_json(ss.str()));
    } catch (const kube::KubeError& e) {
      std::cerr << "goodput k8s convert: " << in_path << ": " << e.what() << "\n";
      rc = 2;
      return;
    } catch (const ConvertError& e) {
      std::cerr << "goodput k8s convert: " << in_path << ": " << e.what() << "\n";
      rc = 2;
      return;
    }
    std::string text;
    if (format == "json") {
      text = c.job.dump(2) + "\n";
    } else {
      text = "# goodput k8s convert " + in_path + "\n";
      for (const std::string& l : c.not_carried) text += "# not carried over: " + l + "\n";
      text += to_yaml_text(c.job);
    }
    if (out_path.empty() || out_path == "-") {
      std::cout << text;
    } else {
      std::ofstream out(out_path, std::ios::binary);
      out << text;
      if (!out) {
        std::cerr << "goodput k8s convert: " << out_path << ": cannot write\n";
        rc = 2;
        return;
      }
    }
    for (const std::string& l : c.not_carried) std::cerr << "not carried over: " << l << "\n";
    std::cerr << c.job["metadata"]["name"].get<std::string>() << ": " << c.job["spec"]["nodes"].get<int64_t>()
              << " nodes; " << c.not_carried.size() << " thing(s) not carried over\n";
    rc = 0;
  });
}

}  // namespace goodput
