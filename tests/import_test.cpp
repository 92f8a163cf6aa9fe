// Traces imported from what clusters record, and the failure rates fitted to them. The Kubernetes
// inputs are the fixtures in shared/data/k8s/ (real pod, node and watch-stream objects; YAML ones
// turned into the JSON kubectl -o json prints). The Slurm inputs are constructed here in the
// documented `sacct --parsable2` format (a header line, '|'-separated fields, ISO times, "EXIT:SIGNAL"
// exit codes, hostlist node lists): no real sacct output is in shared/data. The Alibaba PAI 2020
// instance rows are constructed in the layout of shared/data/alibaba/v2020's header file (the
// dataset's tables themselves are not in shared/data); the AcmeTrace job rows are the examples
// its README in shared/data/acmetrace shows, and its cluster summary is the real file.
#include <doctest/doctest.h>

#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "backends/kubernetes/kube_client.h"
#include "import/kube_history.h"
#include "policies/policy.h"
#include "sim/fit.h"
#include "sim/paper.h"
#include "sim/trace_import.h"
#include "test_util.h"

using namespace goodput;

namespace {

std::string fixture(const std::string& name) { return std::string(GOODPUT_SHARED_DATA) + "/k8s/" + name; }

// A YAML fixture as kubectl -o json would print it.
std::string as_json(const test::TempDir& dir, const std::string& yaml_fixture) {
  std::ifstream in(fixture(yaml_fixture));
  std::stringstream ss;
  ss << in.rdbuf();
  return dir.write(yaml_fixture + ".json", kube::yaml_to_json(ss.str()).dump());
}

Diagnosis diagnosis_of(const TraceEvent& e) {
  FailureObserved f;
  f.kind = e.type == TraceEventType::ProcessCrash  ? FailureKind::ProcessExit
           : e.type == TraceEventType::Maintenance ? FailureKind::Maintenance
           : e.type == TraceEventType::Hang        ? FailureKind::Hang
                                                   : FailureKind::NodeLost;
  f.exit_code = e.type == TraceEventType::ProcessCrash ? e.exit_code : 0;
  f.signal = e.signal;
  f.reason = e.reason;
  return DiagnosisTable::defaults().diagnose(f).diagnosis;
}

std::map<std::string, int> diagnoses(const Trace& t) {
  std::map<std::string, int> out;
  for (const TraceEvent& e : t.events) ++out[std::string(to_string(e.type)) + "/" + std::string(to_string(diagnosis_of(e)))];
  return out;
}

Trace built(const TraceBuilder& b, std::string* summary = nullptr) {
  if (summary) *summary = b.summary();
  return b.build(kSecond);
}

std::string shared(const std::string& name) { return std::string(GOODPUT_SHARED_DATA) + "/" + name; }

std::string first_line(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const TraceError& e) {
    return e.what();
  }
  return "no error";
}

const char* kSacct =
    "JobID|JobName|State|ExitCode|NNodes|NodeList|Start|End\n"
    "1001|pretrain|COMPLETED|0:0|4|gpu[01-04]|2026-03-01T00:00:00|2026-03-01T10:00:00\n"
    "1001.batch|batch|COMPLETED|0:0|1|gpu01|2026-03-01T00:00:00|2026-03-01T10:00:00\n"
    "1002|pretrain|NODE_FAIL|1:0|4|gpu[01-04]|2026-03-01T10:05:00|2026-03-01T12:05:00\n"
    "1003|pretrain|OUT_OF_MEMORY|0:125|2|gpu[05-06]|2026-03-01T12:00:00|2026-03-01T13:00:00\n"
    "1004|ft|FAILED|1:0|1|gpu07|2026-03-01T13:00:00|2026-03-01T13:30:00\n"
    "1005|ft|CANCELLED by 1000|0:15|1|gpu07|2026-03-01T14:00:00|2026-03-01T15:00:00\n"
    "1006|ft|PREEMPTED|0:0|2|gpu[07-08]|2026-03-01T15:00:00|2026-03-01T16:00:00\n"
    "1007|ft|PENDING|0:0|1|None assigned|Unknown|Unknown\n"
    "1008|x|RUNNING|0:0|1|gpu09|2026-03-02T00:00:00|Unknown\n"
    "1009|x|TIMEOUT|0:0|1|gpu09|2026-03-01T16:00:00|2026-03-01T18:00:00\n";

}  // namespace

TEST_CASE("timestamps: RFC 3339 with fractions and offsets, Slurm's local times, and what is not a time") {
  CHECK(parse_timestamp_ns("1970-01-01T00:00:00Z") == 0);
  CHECK(parse_timestamp_ns("2024-01-01T00:11:00Z") == int64_t{1704067860} * 1'000'000'000);
  CHECK(parse_timestamp_ns("2024-01-01T01:11:00+01:00") == int64_t{1704067860} * 1'000'000'000);
  CHECK(parse_timestamp_ns("2024-01-01T00:11:00.25Z") == int64_t{1704067860} * 1'000'000'000 + 250'000'000);
  CHECK(parse_timestamp_ns("2026-03-01T10:05:00") == int64_t{1772359500} * 1'000'000'000);
  for (const char* bad : {"@now-2h", "2024-13-01T00:00:00Z", "2024-01-01", "2024-01-01T00:00:00Q", "2024-01-01T00:00:00.",
                          "8776-01-01T00:00:00Z" /* found by fuzzing: past what 64-bit nanoseconds hold */})
    CHECK_MESSAGE(!parse_timestamp_ns(bad), bad);
}

TEST_CASE("Slurm hostlists expand with their zero padding; malformed ones are refused") {
  CHECK(expand_hostlist("gpu[01-03,07],cpu5") == std::vector<std::string>{"gpu01", "gpu02", "gpu03", "gpu07", "cpu5"});
  CHECK(expand_hostlist("rack[1-2]-n[8-9]") == std::vector<std::string>{"rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"});
  CHECK(expand_hostlist("a") == std::vector<std::string>{"a"});
  for (const char* bad : {"gpu[01-", "gpu]", "gpu[3-1]", "gpu[a-b]", "a,,b"}) CHECK_THROWS_AS(expand_hostlist(bad), TraceError);
}

TEST_CASE("slurm: sacct allocations become failures on their first node, with the exposure they ran for") {
  test::TempDir dir("import-slurm");
  std::string summary;
  const Trace t = built(import_slurm({dir.write("sacct.txt", kSacct)}), &summary);
  CHECK(t.cluster.nodes == 9);  // gpu01..gpu09, sorted
  // 4x10h + 4x2h + 2x1h + 0.5h + 1h (cancelled) + 2x1h + 2h (timeout); the running one has no end yet.
  CHECK(t.cluster.node_hours == doctest::Approx(40 + 8 + 2 + 0.5 + 1 + 2 + 2));
  CHECK(diagnoses(t) == std::map<std::string, int>{{"maintenance/preemption", 1},
                                                    {"node_failure/hardware_error", 1},
                                                    {"process_crash/out_of_memory", 1},
                                                    {"process_crash/software_error", 1}});
  CHECK(t.machine_name(t.events[0].node) == "n0");  // NODE_FAIL of 1002 on gpu01, at its end
  CHECK(t.events[0].reason == "slurm NODE_FAIL on gpu01 (job 1002, 4 nodes)");
  CHECK(t.events[0].t == (12 * 60 + 5) * kMinute);
  CHECK(summary.find("1 job steps (allocations only: sacct -X)") != std::string::npos);
  CHECK(summary.find("1 CANCELLED") != std::string::npos);
  CHECK(summary.find("1 TIMEOUT") != std::string::npos);
  CHECK(summary.find("1 still running") != std::string::npos);
  CHECK(summary.find("1 allocations that never started") != std::string::npos);
  const std::string text = write_trace(t);  // what `trace validate` reads
  CHECK(write_trace(parse_trace(text, "again")) == text);
}

TEST_CASE("slurm: a bad line names the file, the line and the field") {
  test::TempDir dir("import-slurm-bad");
  const std::string header = "JobID|State|ExitCode|NNodes|NodeList|Start|End\n";
  auto error = [&](const std::string& body) {
    try {
      built(import_slurm({dir.write("bad.txt", header + body)}));
    } catch (const TraceError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string f = dir.file("bad.txt");
  CHECK(error("1|FAILED|1:0|1|n1|2026-03-01T00:00:00\n") == f + ":2: 6 fields; the header has 7");
  CHECK(error("1|FAILED|1:0|1|n1|yesterday|2026-03-01T00:00:00\n") == f + ":2: field 'Start' is not a time: 'yesterday'");
  CHECK(error("1|FAILED|x|1|n1|2026-03-01T00:00:00|2026-03-01T01:00:00\n") == f + ":2: field 'ExitCode' is not EXIT:SIGNAL: 'x'");
  CHECK(error("1|FAILED|1:0|1|n[1-|2026-03-01T00:00:00|2026-03-01T01:00:00\n").find(f + ":2: field 'NodeList'") == 0);
  CHECK(error("1|EXPLODED|1:0|1|n1|2026-03-01T00:00:00|2026-03-01T01:00:00\n") ==
        f + ":2: field 'State' is 'EXPLODED', not a Slurm job state this reads");
  CHECK(error("1|FAILED|1:0|1|n1|2026-03-01T02:00:00|2026-03-01T01:00:00\n") == f + ":2: field 'End' is before Start");
  CHECK(error("1\xff|FAILED|1:0|1|n1|2026-03-01T00:00:00|2026-03-01T01:00:00\n") == f + ":2: not valid UTF-8 text");  // fuzzing
  try {
    built(import_slurm({dir.write("noheader.txt", "JobID|State\n")}));
    FAIL("no error");
  } catch (const TraceError& e) {
    CHECK(std::string(e.what()).find("the header has no column 'NodeList'") != std::string::npos);
  }
}

TEST_CASE("k8s: the fixtures' watch stream, node and pods read as the live backend reads them") {
  test::TempDir dir("import-k8s");
  std::string summary;
  // The watch stream: the pod OOMKilled (its Failed frame and its DELETED frame are one failure),
  // then its node goes Ready=Unknown with the unreachable taints.
  const Trace t = built(kube::import_history({fixture("watch-stream-pods.ndjson"), fixture("node-not-ready-unknown.json")}), &summary);
  CHECK(diagnoses(t) == std::map<std::string, int>{{"node_failure/hardware_error", 1}, {"process_crash/out_of_memory", 1}});
  CHECK(t.events[0].reason == "pod test/job-worker-0 on node-a: container main terminated: reason=OOMKilled exitCode=137");
  CHECK(t.events[0].exit_code == 137);
  CHECK(t.events[0].signal == 9);
  CHECK(t.events[1].reason == "node node-a: node Ready=Unknown (NodeStatusUnknown: Kubelet stopped posting node status.)");
  CHECK(t.cluster.nodes == 1);
  // An Argo pod whose container failed with Error, and a pod the kubelet evicted.
  const Trace u = built(kube::import_history({as_json(dir, "argo-pod-error.yaml"), as_json(dir, "ih-evicted.yaml")}));
  CHECK(diagnoses(u) == std::map<std::string, int>{{"maintenance/preemption", 1}, {"process_crash/software_error", 1}});
  CHECK(u.cluster.nodes == 2);
  // The same pods in one `kubectl get pods -o json` document (items before the list's kind, as
  // kubectl prints it; items taken as the stream parser finishes each), and in a PodList whose items
  // name no kind (they wait for the list's): the same trace.
  auto pod_of = [&](const char* name) {
    std::ifstream in(fixture(name));
    std::stringstream ss;
    ss << in.rdbuf();
    return kube::yaml_to_json(ss.str());
  };
  const nlohmann::json a = pod_of("argo-pod-error.yaml"), b = pod_of("ih-evicted.yaml");
  const std::string listed = dir.write("list.json", nlohmann::json{{"apiVersion", "v1"}, {"items", {a, b}}, {"kind", "List"},
                                                                   {"metadata", nlohmann::json::object()}}.dump(2));
  nlohmann::json bare_a = a, bare_b = b;
  bare_a.erase("kind");
  bare_b.erase("kind");
  const std::string pod_list = dir.write("podlist.json", nlohmann::json{{"apiVersion", "v1"}, {"items", {bare_a, bare_b}},
                                                                        {"kind", "PodList"}}.dump());
  for (const std::string& f : {listed, pod_list}) {
    Trace v = built(kube::import_history({f}));
    v.source = u.source;
    CHECK_MESSAGE(write_trace(v) == write_trace(u), f);
  }
  // A fixture with a placeholder where a time belongs: refused, naming the field and the pod.
  CHECK_THROWS_WITH_AS(built(kube::import_history({as_json(dir, "ih-oomkilled-unhealthy.yaml")})),
                       doctest::Contains("field 'status.containerStatuses[].lastState.terminated.finishedAt' of pod "
                                         "mission-control/oomkilled-pod: not a time: \"@now-2h\""),
                       TraceError);
  // A configuration error is the job's, not the cluster's: counted, not a failure.
  std::string config;
  const Trace c = built(kube::import_history({as_json(dir, "ih-pod-imagepullbackoff.yaml")}), &config);
  CHECK(c.events.empty());
  CHECK_MESSAGE(config.find("1 configuration errors (container ") != std::string::npos, config);
}

TEST_CASE("k8s: an EventList's node and eviction events; a cut watch frame names its line") {
  test::TempDir dir("import-k8s-events");
  const std::string events = R"({"kind": "EventList", "apiVersion": "v1", "items": [
    {"metadata": {"name": "e1"}, "involvedObject": {"kind": "Node", "name": "gpu-3"}, "reason": "NodeNotReady",
     "message": "Node gpu-3 status is now: NodeNotReady", "lastTimestamp": "2026-03-01T10:00:00Z", "count": 1},
    {"metadata": {"name": "e2"}, "involvedObject": {"kind": "Node", "name": "gpu-3"}, "reason": "NodeReady",
     "message": "Node gpu-3 status is now: NodeReady", "lastTimestamp": "2026-03-01T11:00:00Z"},
    {"metadata": {"name": "e3"}, "involvedObject": {"kind": "Pod", "namespace": "t", "name": "w-1"}, "reason": "Evicted",
     "message": "The node was low on resource: memory.", "source": {"host": "gpu-4"}, "lastTimestamp": "2026-03-01T12:00:00Z"},
    {"metadata": {"name": "e4"}, "involvedObject": {"kind": "Pod", "namespace": "t", "name": "w-2"}, "reason": "BackOff",
     "message": "Back-off restarting failed container", "lastTimestamp": "2026-03-01T12:30:00Z", "count": 5}]})";
  std::string summary;
  const Trace t = built(kube::import_history({dir.write("events.json", events)}), &summary);
  REQUIRE(t.events.size() == 3);
  CHECK(t.events[0].type == TraceEventType::NodeFailure);
  CHECK(t.events[1].type == TraceEventType::NodeReturn);
  CHECK(t.events[1].t == kHour);
  CHECK(t.events[2].type == TraceEventType::Maintenance);
  CHECK(diagnosis_of(t.events[2]) == Diagnosis::Preemption);
  CHECK(t.machine_name(t.events[2].node) == "n1");  // gpu-4
  CHECK(summary.find("4 repeats folded into an event's count") != std::string::npos);
  CHECK(summary.find("1 events of other reasons") != std::string::npos);
  const std::string cut = dir.write("cut.ndjson", R"({"type":"ADDED","object":{"kind":"Node","metadata":{"name":"a"}}})"
                                                  "\n{\"type\":\"MODIFIED\",\"obj\n");
  CHECK_THROWS_WITH_AS(built(kube::import_history({cut})), doctest::Contains((cut + ":2: not valid JSON (a cut frame?)").c_str()),
                       TraceError);
}

TEST_CASE("exact Poisson intervals") {
  auto [lo0, hi0] = poisson_interval(0, 1);
  CHECK(lo0 == 0);
  CHECK(hi0 == doctest::Approx(3.6889).epsilon(1e-4));
  auto [lo, hi] = poisson_interval(10, 2);
  CHECK(lo == doctest::Approx(4.7954 / 2).epsilon(1e-4));
  CHECK(hi == doctest::Approx(18.3904 / 2).epsilon(1e-4));
}

TEST_CASE("fit: counts per cause survive, the known rates fall in their intervals, and a fitted header regenerates them") {
  PaperTraceOptions po;
  po.paper_path = std::string(GOODPUT_SHARED_DATA) + "/papers/llama3-405b-interruptions.json";
  po.seed = 7;
  const Trace truth = trace_from_paper(po);
  const TraceFit fit = fit_traces({truth}, {false});
  std::map<TraceEventType, int64_t> events, fitted;
  for (const TraceEvent& e : truth.events) ++events[e.type];
  for (const CauseFit& c : fit.causes) fitted[c.type] += c.count;
  CHECK(fitted == events);
  CHECK(fit.failures == static_cast<int64_t>(truth.events.size()));
  // Every true per-type rate in the fitted per-type interval (one draw: seed 7 is fixed).
  std::map<TraceEventType, double> true_rate;
  for (const FailureRate& r : truth.rates) true_rate[r.type] += r.per_node_hour;
  const double hours = truth.cluster.nodes * static_cast<double>(truth.job.duration) / kHour;
  for (const auto& [type, rate] : true_rate) {
    const auto [lo, hi] = poisson_interval(events[type], hours);
    CHECK_MESSAGE(lo <= rate, to_string(type));
    CHECK_MESSAGE(rate <= hi, to_string(type));
  }
  // The fitted header is a trace header; traces drawn from it at 4x the size give the same rates.
  const Trace header = fitted_header(fit);
  Trace bigger = parse_trace(write_trace(header), "fitted.jsonl");
  REQUIRE(bigger.rates.size() == fit.causes.size());
  CHECK(bigger.rates[0].count == fit.causes[0].count);
  bigger.cluster.nodes *= 4;
  bigger.events = generate_failures(bigger, 11);
  const TraceFit again = fit_traces({bigger}, {false});
  REQUIRE(again.causes.size() <= fit.causes.size());
  for (const CauseFit& c : again.causes) {
    const auto it = std::find_if(fit.causes.begin(), fit.causes.end(),
                                 [&](const CauseFit& f) { return f.type == c.type && f.diagnosis == c.diagnosis; });
    REQUIRE(it != fit.causes.end());  // the same causes, diagnosed the same way
    CHECK_MESSAGE(c.lo <= it->per_node_hour, c.reason);
    CHECK_MESSAGE(it->per_node_hour <= c.hi, c.reason);
  }
}

TEST_CASE("fit: job MTBF by size against MTBF proportional to 1/nodes") {
  Trace small, large;
  for (Trace* t : {&small, &large}) {
    t->cluster.nodes = t == &small ? 8 : 64;
    t->job.duration = 1000 * kHour;
    t->rates = {FailureRate{TraceEventType::NodeFailure, "Faulty GPU", 1e-3, 1, 0}};
    t->events = generate_failures(*t, 3);
  }
  const TraceFit fit = fit_traces({small, large}, {false, false});
  REQUIRE(fit.sizes.size() == 2);
  for (const SizeFit& s : fit.sizes) {
    CHECK(s.lo_hours <= s.predicted_hours);
    CHECK(s.predicted_hours <= s.hi_hours);
    CHECK(s.predicted_hours == doctest::Approx(1 / (1e-3 * s.nodes)).epsilon(0.2));
  }
  CHECK(fit_text(fit).find("job MTBF by size") != std::string::npos);
  CHECK_THROWS_AS(fit_traces({Trace{}}, {false}), TraceError);
}

TEST_CASE("slurm split by job size: each size's exposure and failures, and MTBF by size fitted from one history") {
  test::TempDir dir("import");
  const TraceBuilder b = import_slurm({dir.write("sacct.txt", kSacct)});
  CHECK(b.sizes() == std::vector<int32_t>{1, 2, 4});
  std::vector<Trace> parts;
  double hours = 0;
  size_t events = 0;
  for (int32_t n : b.sizes()) {
    Trace t = parse_trace(write_trace(b.build(kSecond, n)), "part.jsonl");  // job_nodes survives the file
    CHECK(t.cluster.job_nodes == n);
    for (const TraceEvent& e : t.events) CHECK(e.reason.find(", " + std::to_string(n) + " nodes)") != std::string::npos);
    hours += t.cluster.node_hours;
    events += t.events.size();
    parts.push_back(std::move(t));
  }
  // 4-node jobs: 4x10h + 4x2h; 2-node: 2x1h + 2x1h; 1-node: 0.5h + 1h + 2h. Together: the whole history.
  CHECK(parts[2].cluster.node_hours == doctest::Approx(48));
  CHECK(parts[1].cluster.node_hours == doctest::Approx(4));
  CHECK(parts[0].cluster.node_hours == doctest::Approx(3.5));
  CHECK(parts[2].cluster.nodes == 4);  // gpu01..gpu04 only
  const Trace whole = b.build(kSecond);
  CHECK(hours == doctest::Approx(whole.cluster.node_hours));
  CHECK(events == whole.events.size());
  const TraceFit fit = fit_traces(parts, {false, false, false});
  REQUIRE(fit.sizes.size() == 3);
  CHECK(fit.sizes[0].nodes == 1);
  CHECK(fit.sizes[0].failures == 1);  // 1004 FAILED
  CHECK(fit.sizes[1].failures == 2);  // 1003 OUT_OF_MEMORY, 1006 PREEMPTED
  CHECK(fit.sizes[2].failures == 1);  // 1002 NODE_FAIL
  CHECK(fit.sizes[2].mtbf_hours == doctest::Approx(12));  // 12 job hours of 4-node jobs, one failure
}

TEST_CASE("pai2020: failed instances are process crashes on their machines, jobs sized by their instances") {
  test::TempDir dir("import");
  // The dataset's CSVs have no header line: its columns are the .header file's. A prepended header is fine.
  const std::string header = first_line(shared("alibaba/v2020/data_pai_instance_table.header"));
  const std::string rows =
      "jobA,worker,i0,w0,idA,Failed,100.0,3700.0,m1\n"
      "jobA,worker,i1,w1,idA,Terminated,100.0,7300.0,m2\n"
      "jobB,tensorflow,i2,w2,idB,Terminated,0.0,3600.0,m1\n"
      "jobC,worker,i3,w3,idC,Waiting,,,\n"
      "jobD,ps,i4,w4,idD,Running,500.5,,m3\n"
      "jobE,worker,i5,w5,idE,Interrupted,7200.0,10800.0,m3\n";
  std::string summary;
  const TraceBuilder b = import_pai2020({dir.write("with-header.csv", header + "\n" + rows)});
  const Trace t = built(b, &summary);
  CHECK(t.cluster.nodes == 3);  // m1 m2 m3
  CHECK(t.cluster.node_hours == doctest::Approx(1 + 2 + 1 + 1));
  REQUIRE(t.events.size() == 1);
  CHECK(t.events[0].type == TraceEventType::ProcessCrash);
  CHECK(t.machine_name(t.events[0].node) == "n0");  // m1, the first machine by name
  CHECK(t.events[0].t == 3700 * kSecond);
  CHECK(t.events[0].reason == "pai Failed instance, task worker on m1 (job jobA, 2 instances)");
  CHECK(diagnosis_of(t.events[0]) == Diagnosis::SoftwareError);
  CHECK(b.sizes() == std::vector<int32_t>{1, 2});
  CHECK(b.build(kSecond, 2).cluster.node_hours == doctest::Approx(3));
  CHECK_MESSAGE(summary.find("1 instances that never started") != std::string::npos, summary);
  CHECK_MESSAGE(summary.find("1 Interrupted") != std::string::npos, summary);
  // The same rows without the header line give the same trace.
  Trace bare = built(import_pai2020({dir.write("bare.csv", rows)}));
  bare.source = t.source;
  CHECK(write_trace(bare) == write_trace(t));
  // Strict: a field that is not what the table holds names the file, the line and the field.
  const std::string bad = dir.write("bad.csv", rows + "jobF,worker,i6,w6,idF,Exploded,1.0,2.0,m1\n");
  CHECK(error_of([&] { import_pai2020({bad}); }) == bad + ":7: field 'status' is 'Exploded', not Terminated, Failed, Running, Waiting or Interrupted");
  const std::string when = dir.write("when.csv", "jobF,worker,i6,w6,idF,Failed,soon,2.0,m1\n");
  CHECK(error_of([&] { import_pai2020({when}); }) == when + ":1: field 'start_time' is not seconds: 'soon'");
  const std::string job_table = dir.write("job.csv", "jobA,idA,u1,Failed,100.0,3700.0\n");  // pai_job_table's 6 columns
  CHECK(error_of([&] { import_pai2020({job_table}); }).find(job_table + ":1: 6 fields; pai_instance_table has 9") == 0);
}

TEST_CASE("acme: AcmeTrace job traces (failed and node-failed GPU jobs, no machine names) and its real cluster summary") {
  test::TempDir dir("import");
  // trace_kalos.csv's columns and the README's two example rows, plus a NODE_FAIL, a CPU job and one never started.
  const std::string kalos =
      "job_id,user,node_num,gpu_num,cpu_num,mem_per_pod_GB,shared_mem_per_pod,type,state,submit_time,start_time,end_time,"
      "fail_time,stop_time,duration,queue,gpu_time\n"
      "dlctk696s0jbvitv,uf794,8,64,960,1000,100.0,Other,FAILED,2023-05-17 11:00:58+00:00,2023-05-17 11:01:08+00:00,"
      "2023-05-17 11:01:16+00:00,2023-05-17 11:01:16+00:00,,18,10.0,1152.0\n"
      "dlc1t2ypl09b8qtp,uf794,8,64,960,1000,100.0,Other,CANCELLED,2023-05-17 11:28:42+00:00,2023-05-17 11:28:54+00:00,"
      "2023-05-17 11:30:04+00:00,,2023-05-17 11:30:04+00:00,82,12.0,5248.0\n"
      "dlcnodefail,u1,2,16,256,1000,100.0,Pretrain,NODE_FAIL,2023-05-17 12:00:00+00:00,2023-05-17 12:00:00+00:00,"
      "2023-05-17 14:00:00+00:00,2023-05-17 13:00:00+00:00,,7200,0.0,115200.0\n"
      "dlccpu,u2,1,0,16,10,1.0,Other,FAILED,2023-05-17 12:00:00+00:00,2023-05-17 12:00:00+00:00,2023-05-17 12:10:00+00:00,,,600,0.0,0.0\n"
      "dlcwait,u2,1,8,16,10,1.0,Other,CANCELLED,2023-05-17 12:00:00+00:00,,,,,0,100.0,0.0\n";
  // trace_seren.csv's columns and its README row: times in +08:00.
  const std::string seren =
      "job_id,user,node_num,gpu_num,cpu_num,type,state,submit_time,start_time,end_time,duration,queue,gpu_time\n"
      "5778432,u5907,1,8,128,Other,FAILED,2023-03-01 00:18:22+08:00,2023-03-01 00:18:54+08:00,2023-03-01 00:20:51+08:00,117,32,936.0\n"
      "5778469,u5907,1,8,128,Other,COMPLETED,2023-03-01 00:23:58+08:00,2023-03-01 00:24:11+08:00,2023-03-01 01:09:04+08:00,2693,13,21544.0\n";
  std::string summary;
  const TraceBuilder b = import_acme({dir.write("trace_kalos.csv", kalos), dir.write("trace_seren.csv", seren)});
  const Trace t = built(b, &summary);
  CHECK(t.cluster.nodes == 8);  // no machines named: the largest job
  CHECK(t.cluster.node_hours == doctest::Approx((8 * 8 + 8 * 70 + 2 * 7200 + 117 + 2693) / 3600.0));
  REQUIRE(t.events.size() == 3);
  CHECK(t.events[0].reason == "acme FAILED (job 5778432, 1 nodes, 8 GPUs)");  // Seren's, months earlier
  CHECK(t.events[1].type == TraceEventType::ProcessCrash);
  CHECK(t.events[2].type == TraceEventType::NodeFailure);
  CHECK(t.events[2].t - t.events[1].t == 13 * kHour - (11 * kHour + kMinute + 16 * kSecond));  // the fail_times
  for (const TraceEvent& e : t.events) CHECK(e.rank == 0);
  CHECK(diagnoses(t) == std::map<std::string, int>{{"node_failure/hardware_error", 1}, {"process_crash/software_error", 2}});
  CHECK_MESSAGE(summary.find("1 CPU jobs") != std::string::npos, summary);
  CHECK_MESSAGE(summary.find("1 jobs that never started") != std::string::npos, summary);
  CHECK(b.sizes() == std::vector<int32_t>{1, 2, 8});
  const std::string bad = dir.write("bad.csv", std::string(seren) + "1,u,1,8,1,Other,EXPLODED,x,2023-03-01 00:00:00+08:00,2023-03-01 00:00:01+08:00,1,0,8\n");
  CHECK(error_of([&] { import_acme({bad}); }) == bad + ":4: field 'state' is 'EXPLODED', not COMPLETED, CANCELLED, FAILED, TIMEOUT or NODE_FAIL");

  // The real cluster summary: one counted rate of failed GPU jobs per node-hour, and what it rests on.
  const std::string real = shared("acmetrace/cluster_summary.csv");
  REQUIRE(is_acme_summary(real));
  const Trace kal = parse_trace(write_trace(import_acme_summary(real, "Kalos", 8, &summary)), "kalos.jsonl");
  REQUIRE(kal.rates.size() == 1);
  CHECK(kal.events.empty());
  CHECK(kal.rates[0].count == std::llround(19907 * 0.397));  // gpu_job_num x fail_rate_gpu
  const double kalos_hours = (1667685146.0 + 3239202064.0 + 426292851.0) / 3600 / 8;
  CHECK(kal.cluster.node_hours == doctest::Approx(kalos_hours));
  CHECK(kal.rates[0].ci_lo < kal.rates[0].per_node_hour);
  CHECK(kal.rates[0].per_node_hour < kal.rates[0].ci_hi);
  CHECK(kal.cluster.nodes == 128);  // max_gpu 1024 / 8
  CHECK(error_of([&] { import_acme_summary(real, "Nowhere", 8, nullptr); }) ==
        real + ": no cluster 'Nowhere' (it has Seren, Kalos, Philly, Helios, PAI; pick one with --cluster)");
  CHECK(error_of([&] { import_acme_summary(real, "PAI", 8, nullptr); }) ==
        real + ":6: field 'fail_rate_gpu' is empty: the summary gives no such figure for PAI");
  CHECK(error_of([&] { import_acme({real}); }).find("import it alone, with --cluster NAME") != std::string::npos);
  // A header of counted rates pools with events in a fit: the summary's count plus the job trace's.
  const TraceFit fit = fit_traces({kal, t}, {false, false});
  CHECK(fit.failures == kal.rates[0].count + 3);
  CHECK(fit.node_hours == doctest::Approx(kalos_hours + t.cluster.node_hours));
}
