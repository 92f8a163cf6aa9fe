// Traces: the strict loader (every bad input names file, line and field), the writer, the
// generator from published statistics, and the CLI's exit codes for bad input.
#include <doctest/doctest.h>

#include "sim/paper.h"
#include "sim/trace.h"
#include "test_util.h"

using namespace goodput;
using namespace goodput::test;

namespace {
const std::string kHeader =
    R"({"format":"goodput-trace","version":1,"name":"t","cluster":{"nodes":4,"spare_nodes":1},"job":{"step_time":"1s","duration":"1h"}})";

std::string error_of(const std::string& body) {
  try {
    parse_trace(kHeader + "\n" + body, "bad.jsonl");
  } catch (const TraceError& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("bad trace lines are rejected with file, line and field") {
  CHECK(error_of(R"({"t": 10, "type": "node_failure", "node": "n1")") .find("bad.jsonl:2: not valid JSON (truncated line?)") == 0);
  CHECK(error_of(R"({"t": 10, "type": "meteor_strike", "node": "n1"})").find("bad.jsonl:2: field 'type' is unknown: 'meteor_strike'") == 0);
  CHECK(error_of(R"({"t": -5, "type": "node_failure", "node": "n1"})").find("bad.jsonl:2: field 't' is negative") == 0);
  CHECK(error_of("{\"t\": 10, \"type\": \"node_failure\", \"node\": \"n1\"}\n{\"t\": 5, \"type\": \"hang\", \"node\": \"n1\"}")
            .find("bad.jsonl:3: field 't' goes back in time") == 0);
  CHECK(error_of(R"({"type": "node_failure", "node": "n1"})").find("bad.jsonl:2: field 't' is missing") == 0);
  CHECK(error_of(R"({"t": 1, "node": "n1"})").find("bad.jsonl:2: field 'type' is missing") == 0);
  CHECK(error_of(R"({"t": 1, "type": "hang"})").find("bad.jsonl:2: field 'node' is missing") == 0);
  CHECK(error_of(R"({"t": 10, "type": "node_failure", "node": "n9"})").find("bad.jsonl:2: field 'node' names an unknown node 'n9'") == 0);
  CHECK(error_of(R"({"t": 10, "type": "node_failure", "node": "s1"})").find("unknown node 's1'") != std::string::npos);
  CHECK(error_of(R"({"t": 10, "type": "node_failure", "rank": 4})").find("field 'rank' must be between 0 and 3") != std::string::npos);
  CHECK(error_of(R"({"t": 10, "type": "slowdown", "node": "n1"})").find("field 'factor' is missing") != std::string::npos);
  CHECK(error_of(R"({"t": 10, "type": "hang", "node": "n1", "colour": "red"})").find("field 'colour' is not a known setting") != std::string::npos);
  CHECK(error_of(R"({"t": 7200, "type": "hang", "node": "n1"})").find("past the job's duration") != std::string::npos);
  CHECK(error_of(R"({"t": 10, "type": "scale", "group": "ps", "from": 1})").find("bad.jsonl:2: field 'to' is missing") == 0);
  CHECK(error_of(R"({"t": 10, "type": "scale", "from": 1, "to": 2})").find("bad.jsonl:2: field 'group' is missing") == 0);
  CHECK(error_of(R"({"t": 10, "type": "scale", "group": "ps", "from": 1, "to": 0})").find("field 'to' must be between 1") != std::string::npos);
  CHECK(error_of(R"({"t": 10, "type": "scale", "group": "ps", "from": 1, "to": 2, "node": "n1"})").find("field 'node' is not a known setting") != std::string::npos);
  // Header problems name the header field.
  try {
    parse_trace(R"({"format":"goodput-trace","version":1,"cluster":{"nodes":0},"job":{"duration":"1h"}})", "h.jsonl");
    FAIL("accepted zero nodes");
  } catch (const TraceError& e) {
    CHECK(std::string(e.what()).find("h.jsonl:1: header: field 'cluster.nodes'") == 0);
  }
  CHECK_THROWS_WITH_AS(parse_trace("", "empty.jsonl"), doctest::Contains("empty trace"), TraceError);
  // An operator's scale is an event, not something that happens at a rate.
  CHECK_THROWS_WITH_AS(parse_trace(R"({"format":"goodput-trace","version":1,"cluster":{"nodes":4},"job":{"duration":"1h"},)"
                                   R"("failure_rates":[{"type":"scale","per_node_hour":1}]})", "r.jsonl"),
                       doctest::Contains("r.jsonl:1: header: field 'failure_rates[0].type' must be node_failure"), TraceError);
  // Found by fuzzing: a number too large for a double is bad input, not an internal error.
  CHECK(error_of(R"({"t": 1e999, "type": "hang", "node": "n1"})").find("bad.jsonl:2: not valid JSON") == 0);
  CHECK_THROWS_WITH_AS(parse_trace(R"({"format":"goodput-trace","version":2})", "v2.jsonl"), doctest::Contains("version"), TraceError);
}

TEST_CASE("a written trace reads back the same") {
  Trace t = parse_trace(kHeader + "\n" +
                            R"({"t": 1.25, "type": "process_crash", "node": "n1", "exit_code": 137, "signal": 9, "reason": "OOMKilled"})" "\n" +
                            R"({"t": 2, "type": "slowdown", "rank": 2, "factor": 1.5, "duration": "10m"})" "\n" +
                            R"({"t": 3, "type": "node_failure", "node": "s0", "repair": "2h"})" "\n",
                        "a.jsonl");
  REQUIRE(t.events.size() == 3);
  CHECK(t.events[0].t == 1'250'000'000);
  CHECK(t.events[1].rank == 2);
  CHECK(t.events[1].slowdown_permille == 1500);
  CHECK(t.events[2].node == 4);
  CHECK(t.events[2].duration == 2 * kHour);
  const std::string once = write_trace(t);
  const Trace back = parse_trace(once, "b.jsonl");
  CHECK(write_trace(back) == once);
}

TEST_CASE("the generator turns the Llama 3 table into per-node rates that reproduce its counts") {
  PaperTraceOptions o;
  o.paper_path = std::string(GOODPUT_SHARED_DATA) + "/papers/llama3-405b-interruptions.json";
  o.job.duration = 0;
  const Trace t = trace_from_paper(o);
  CHECK(t.cluster.nodes == 2048);
  CHECK(t.job.duration == 54 * kDay);
  double expected = 0;
  for (const auto& r : t.rates) expected += r.per_node_hour * 2048 * 54 * 24;
  CHECK(expected == doctest::Approx(466.0));  // 419 unexpected + 47 planned
  // The draw for many seeds averages to the table's count.
  double total = 0;
  for (uint64_t seed = 1; seed <= 50; ++seed) total += static_cast<double>(generate_failures(t, seed).size());
  CHECK(total / 50 == doctest::Approx(466.0).epsilon(0.03));
  const auto a = generate_failures(t, 5), b = generate_failures(t, 5), c = generate_failures(t, 6);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    CHECK(a[i].t == b[i].t);
    CHECK(a[i].rank == b[i].rank);
    CHECK(a[i].reason == b[i].reason);
  }
  CHECK((c.size() != a.size() || c.front().t != a.front().t));  // another seed, other failures
}

TEST_CASE("the shipped traces validate") {
  auto r = run_command(goodput_cmd("trace validate " + source_path("traces/llama3-405b-54d.jsonl") + " " +
                                   source_path("traces/small-2048gpu-7d.jsonl")));
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("2048 nodes x 8 accelerators") != std::string::npos);
}

TEST_CASE("the CLI exits 2 with the line and field for each kind of bad trace") {
  TempDir dir("cli-bad");
  struct Case {
    const char* name;
    std::string body;
    const char* expect;
  } cases[] = {
      {"truncated", R"({"t": 10, "type": "node_fai)", ":2: not valid JSON"},
      {"unknown-type", R"({"t": 10, "type": "alien_abduction", "node": "n1"})", ":2: field 'type' is unknown"},
      {"negative-time", R"({"t": -1, "type": "hang", "node": "n1"})", ":2: field 't' is negative"},
      {"non-monotonic", "{\"t\": 10, \"type\": \"hang\", \"node\": \"n1\"}\n{\"t\": 9, \"type\": \"hang\", \"node\": \"n1\"}",
       ":3: field 't' goes back in time"},
      {"missing-field", R"({"t": 10, "node": "n1"})", ":2: field 'type' is missing"},
      {"unknown-node", R"({"t": 10, "type": "hang", "node": "n77"})", ":2: field 'node' names an unknown node"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    const std::string path = dir.write(std::string(c.name) + ".jsonl", kHeader + "\n" + c.body + "\n");
    for (const char* cmd : {"replay ", "trace validate "}) {
      auto r = run_command(goodput_cmd(cmd + path));
      CHECK(r.exit_code == 2);
      CHECK(r.output.find(path + c.expect) != std::string::npos);
    }
  }
  auto r = run_command(goodput_cmd("replay " + dir.file("does-not-exist.jsonl")));
  CHECK(r.exit_code == 2);
  CHECK(r.output.find("cannot open trace") != std::string::npos);
  r = run_command(goodput_cmd("replay --bogus-flag x"));
  CHECK(r.exit_code == 2);
}

TEST_CASE("an out-of-memory crash carries what the rank needs, and round-trips") {
  const Trace t = parse_trace(kHeader + "\n" +
                                  R"({"t": 5, "type": "process_crash", "node": "n1", "exit_code": 137, "signal": 9, "reason": "OOMKilled", "memory_needed": 1.4, "recur_after": "5m"})" "\n",
                              "oom.jsonl");
  REQUIRE(t.events.size() == 1);
  CHECK(t.events[0].memory_needed_permille == 1400);
  CHECK(t.events[0].duration == 5 * kMinute);
  CHECK(write_trace(parse_trace(write_trace(t), "b.jsonl")) == write_trace(t));
  CHECK(error_of(R"({"t": 1, "type": "hang", "node": "n1", "memory_needed": 2})").find("field 'memory_needed' applies to process_crash only") != std::string::npos);
}
