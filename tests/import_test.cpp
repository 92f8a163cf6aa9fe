// Traces imported from what clusters record, and the failure rates fitted to them. The Kubernetes
// inputs are the fixtures in shared/data/k8s/ (real pod, node and watch-stream objects; YAML ones
// turned into the JSON kubectl -o json prints). The Slurm inputs are constructed here in the
// documented `sacct --parsable2` format (a header line, '|'-separated fields, ISO times, "EXIT:SIGNAL"
// exit codes, hostlist node lists): no real sacct output is in shared/data.
#include <doctest/doctest.h>

#include <fstream>
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
  const Trace t = import_slurm({dir.write("sacct.txt", kSacct)}, kSecond, &summary);
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
      import_slurm({dir.write("bad.txt", header + body)}, kSecond);
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
    import_slurm({dir.write("noheader.txt", "JobID|State\n")}, kSecond);
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
  const Trace t = kube::import_history({fixture("watch-stream-pods.ndjson"), fixture("node-not-ready-unknown.json")}, kSecond,
                                       &summary);
  CHECK(diagnoses(t) == std::map<std::string, int>{{"node_failure/hardware_error", 1}, {"process_crash/out_of_memory", 1}});
  CHECK(t.events[0].reason == "pod test/job-worker-0 on node-a: container main terminated: reason=OOMKilled exitCode=137");
  CHECK(t.events[0].exit_code == 137);
  CHECK(t.events[0].signal == 9);
  CHECK(t.events[1].reason == "node node-a: node Ready=Unknown (NodeStatusUnknown: Kubelet stopped posting node status.)");
  CHECK(t.cluster.nodes == 1);
  // An Argo pod whose container failed with Error, and a pod the kubelet evicted.
  const Trace u = kube::import_history({as_json(dir, "argo-pod-error.yaml"), as_json(dir, "ih-evicted.yaml")}, kSecond);
  CHECK(diagnoses(u) == std::map<std::string, int>{{"maintenance/preemption", 1}, {"process_crash/software_error", 1}});
  CHECK(u.cluster.nodes == 2);
  // A fixture with a placeholder where a time belongs: refused, naming the field and the pod.
  CHECK_THROWS_WITH_AS(kube::import_history({as_json(dir, "ih-oomkilled-unhealthy.yaml")}, kSecond),
                       doctest::Contains("field 'status.containerStatuses[].lastState.terminated.finishedAt' of pod "
                                         "mission-control/oomkilled-pod: not a time: \"@now-2h\""),
                       TraceError);
  // A configuration error is the job's, not the cluster's: counted, not a failure.
  std::string config;
  const Trace c = kube::import_history({as_json(dir, "ih-pod-imagepullbackoff.yaml")}, kSecond, &config);
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
  const Trace t = kube::import_history({dir.write("events.json", events)}, kSecond, &summary);
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
  CHECK_THROWS_WITH_AS(kube::import_history({cut}, kSecond), doctest::Contains((cut + ":2: not valid JSON (a cut frame?)").c_str()),
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
