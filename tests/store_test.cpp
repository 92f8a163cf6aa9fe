// The SQLite event log: a real file, reopened, read back, and refused when it is not ours.
#include <doctest/doctest.h>
#include <sqlite3.h>
#include <sys/stat.h>

#include <filesystem>

#include "policies/policy.h"
#include "engine/event_json.h"
#include "engine/event_store.h"
#include "report/report.h"
#include "sim/simulator.h"
#include "test_util.h"

using namespace goodput;
using namespace goodput::test;

TEST_CASE("a replay's SQLite log reproduces the replay's report exactly") {
  TempDir dir("store-report");
  const Trace t = load_trace(source_path("traces/small-2048gpu-7d.jsonl"));
  Report live;
  DigestSink live_digest;
  {
    SqliteStore store(dir.file("events.db"), SqliteStore::Mode::Create, 512);
    Simulator sim(t, default_policy(), SimOptions{3, true}, {&store, &live_digest});
    live = make_report(sim.run());
  }
  SqliteStore back(dir.file("events.db"), SqliteStore::Mode::OpenReadOnly);
  JobState folded;
  DigestSink back_digest;
  back.for_each([&](const Event& e) {
    folded.apply(e);
    back_digest.append(e);
  });
  CHECK(report_json(make_report(folded)).dump() == report_json(live).dump());
  CHECK(back_digest.hex() == live_digest.hex());
  CHECK(back.last_seq() == live.events);
  CHECK(live.failures > 0);
}

TEST_CASE("the event log file is private to its owner and never overwritten") {
  TempDir dir("store-perm");
  const std::string path = dir.file("events.db");
  { SqliteStore s(path, SqliteStore::Mode::Create); }
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 077) == 0);
  CHECK_THROWS_WITH_AS(SqliteStore(path, SqliteStore::Mode::Create), doctest::Contains("already exists"), StoreError);
}

TEST_CASE("appends survive reopening, and sequence numbers must follow") {
  TempDir dir("store-reopen");
  const std::string path = dir.file("events.db");
  {
    SqliteStore s(path, SqliteStore::Mode::Create);
    s.append(Event{1, 0, JobStarted{"j", 1, 1, kSecond, 0, 0, 1, 1, "p"}});
    s.append(Event{2, 5, NodeJoined{0, 0, "n0", ""}});
    s.flush();
    CHECK_THROWS_AS(s.append(Event{4, 6, NoSpareNode{0}}), StoreError);
  }
  SqliteStore s(path, SqliteStore::Mode::Open);
  CHECK(s.last_seq() == 2);
  s.append(Event{3, 7, NoSpareNode{0}});
  s.flush();
  std::vector<std::string> types;
  s.for_each([&](const Event& e) { types.emplace_back(event_type_name(e.payload)); });
  CHECK(types == std::vector<std::string>{"job_started", "node_joined", "no_spare_node"});
}

TEST_CASE("a log that is not ours, or from another schema version, is refused with a reason") {
  TempDir dir("store-bad");
  CHECK_THROWS_WITH_AS(SqliteStore(dir.file("missing.db"), SqliteStore::Mode::OpenReadOnly),
                       doctest::Contains("cannot open"), StoreError);
  const std::string junk = dir.write("junk.db", "this is not a database at all, just some text to fill the page");
  CHECK_THROWS_AS(SqliteStore(junk, SqliteStore::Mode::OpenReadOnly), StoreError);
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(dir.file("v9.db").c_str(), &db) == SQLITE_OK);
  sqlite3_exec(db, "PRAGMA user_version=9; CREATE TABLE events(seq INTEGER)", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  CHECK_THROWS_WITH_AS(SqliteStore(dir.file("v9.db"), SqliteStore::Mode::OpenReadOnly),
                       doctest::Contains("schema version 9"), StoreError);
  // An empty file, or a SQLite database that is not ours: said so, without SQLite's "not an error".
  const std::string empty = dir.write("empty.db", "");
  CHECK_THROWS_WITH_AS(SqliteStore(empty, SqliteStore::Mode::OpenReadOnly),
                       (empty + ": is not a Goodput event log (an empty file or another SQLite database)").c_str(), StoreError);
}

TEST_CASE("a damaged row is reported with its sequence number, not loaded silently") {
  TempDir dir("store-damaged");
  const std::string path = dir.file("events.db");
  {
    SqliteStore s(path, SqliteStore::Mode::Create);
    s.append(Event{1, 0, JobStarted{"j", 1, 1, kSecond, 0, 0, 1, 1, "p"}});
    s.append(Event{2, 5, NodeJoined{0, 0, "n0", ""}});
  }
  sqlite3* db = nullptr;
  REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
  sqlite3_exec(db, "UPDATE events SET payload='{\"node\":0}' WHERE seq=2", nullptr, nullptr, nullptr);
  sqlite3_close(db);
  SqliteStore s(path, SqliteStore::Mode::OpenReadOnly);
  CHECK_THROWS_WITH_AS(s.for_each([](const Event&) {}), doctest::Contains("event 2: node_joined: field 'slot' is missing"),
                       StoreError);
}

TEST_CASE("a log with an event missing, a time that goes back, or cut short says it is damaged") {
  TempDir dir("store-cut");
  const std::string path = dir.file("events.db");
  {
    SqliteStore s(path, SqliteStore::Mode::Create);
    s.append(Event{1, 0, JobStarted{"j", 1, 1, kSecond, 0, 0, 1, 1, "p"}});
    for (uint64_t seq = 2; seq <= 3000; ++seq)
      s.append(Event{seq, static_cast<Time>(seq) * kSecond, StatusObserved{"pod", "p-" + std::to_string(seq), std::string(200, 'x')}});
  }
  auto edit = [&](const char* sql) {
    sqlite3* db = nullptr;
    REQUIRE(sqlite3_open(path.c_str(), &db) == SQLITE_OK);
    REQUIRE(sqlite3_exec(db, sql, nullptr, nullptr, nullptr) == SQLITE_OK);
    sqlite3_close(db);
  };
  auto error_of = [&] {
    try {
      SqliteStore s(path, SqliteStore::Mode::OpenReadOnly);
      s.for_each([](const Event&) {});
    } catch (const StoreError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  edit("UPDATE events SET time_ns = 1000 WHERE seq = 50");
  CHECK(error_of().find("event 50: its time (1000 ns) is before the previous event's (49000000000 ns): the log is damaged") !=
        std::string::npos);
  edit("UPDATE events SET time_ns = 50000000000 WHERE seq = 50");
  edit("DELETE FROM events WHERE seq = 70");
  CHECK(error_of().find("event 71: expected seq 70: the log is damaged") != std::string::npos);
  // Cut mid-page (a copy that stopped short): SQLite finds the file malformed.
  edit("PRAGMA wal_checkpoint(TRUNCATE)");
  std::filesystem::resize_file(path, std::filesystem::file_size(path) / 2 + 100);
  const std::string cut = error_of();
  CAPTURE(cut);
  CHECK(cut.find("the log is damaged") != std::string::npos);
}
