#include "engine/event_store.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <cstdio>

#include "engine/event_json.h"

namespace goodput {

// ---- MemoryStore ----

void MemoryStore::append(const Event& e) {
  if (e.seq != last_seq() + 1) throw StoreError("event seq " + std::to_string(e.seq) + " out of order");
  events_.push_back(e);
}

void MemoryStore::for_each(const std::function<void(const Event&)>& f) const {
  for (const Event& e : events_) f(e);
}

std::optional<std::string> MemoryStore::meta(const std::string& key) const {
  auto it = meta_.find(key);
  if (it == meta_.end()) return std::nullopt;
  return it->second;
}

// ---- DigestSink ----

DigestSink::DigestSink() : state_(XXH3_createState()) { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)); }
DigestSink::~DigestSink() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void DigestSink::append(const Event& e) {
  std::string line = event_to_line(e);
  line.push_back('\n');
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), line.data(), line.size());
  ++count_;
}

std::string DigestSink::hex() const {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits_digest(static_cast<XXH3_state_t*>(state_))));
  return buf;
}

// ---- SqliteStore ----

SqliteStore::SqliteStore(const std::string& path, Mode mode, int batch_events) : path_(path), batch_events_(batch_events) {
  try {
    open(mode);
  } catch (...) {
    sqlite3_finalize(insert_);
    sqlite3_close(db_);  // the destructor does not run for a constructor that throws
    throw;
  }
}

void SqliteStore::open(Mode mode) {
  const std::string& path = path_;
  if (mode == Mode::Create) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) throw StoreError(path + ": already exists (refusing to overwrite an event log)");
  }
  int flags = mode == Mode::OpenReadOnly ? SQLITE_OPEN_READONLY
              : mode == Mode::Create     ? SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE
                                         : SQLITE_OPEN_READWRITE;
  if (mode == Mode::Create) {
    // The log holds the job's history and policy: readable by its owner only.
    mode_t old = ::umask(077);
    int rc = sqlite3_open_v2(path.c_str(), &db_, flags, nullptr);
    ::umask(old);
    if (rc != SQLITE_OK) fail("cannot create");
  } else if (sqlite3_open_v2(path.c_str(), &db_, flags, nullptr) != SQLITE_OK) {
    fail("cannot open");
  }
  sqlite3_busy_timeout(db_, 5000);
  if (mode == Mode::Create) {
    exec("PRAGMA journal_mode=WAL");
    exec("PRAGMA synchronous=FULL");
    exec("CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT NOT NULL)");
    exec("CREATE TABLE events(seq INTEGER PRIMARY KEY, time_ns INTEGER NOT NULL, type TEXT NOT NULL,"
         " payload TEXT NOT NULL)");
    exec(("PRAGMA user_version=" + std::to_string(kSchemaVersion)).c_str());
  } else {
    sqlite3_stmt* st = nullptr;
    int version = -1;
    if (sqlite3_prepare_v2(db_, "PRAGMA user_version", -1, &st, nullptr) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
      version = sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    if (version == -1) fail("is not a readable SQLite database");
    // Not SQLite's errors: its message would be "not an error".
    if (version == 0) throw StoreError(path + ": is not a Goodput event log (an empty file or another SQLite database)");
    if (version != kSchemaVersion)
      throw StoreError(path + ": has event-log schema version " + std::to_string(version) + ", this build reads version " +
                       std::to_string(kSchemaVersion));
    if (sqlite3_prepare_v2(db_, "SELECT COALESCE(MAX(seq),0) FROM events", -1, &st, nullptr) != SQLITE_OK)
      fail("is not a Goodput event log");
    if (sqlite3_step(st) == SQLITE_ROW) last_seq_ = static_cast<uint64_t>(sqlite3_column_int64(st, 0));
    sqlite3_finalize(st);
    if (mode == Mode::Open) exec("PRAGMA synchronous=FULL");
  }
  if (mode != Mode::OpenReadOnly &&
      sqlite3_prepare_v2(db_, "INSERT INTO events(seq,time_ns,type,payload) VALUES(?,?,?,?)", -1, &insert_, nullptr) !=
          SQLITE_OK)
    fail("cannot prepare insert");
}

SqliteStore::~SqliteStore() {
  try {
    flush();
  } catch (const StoreError& e) {
    std::fprintf(stderr, "goodput: %s\n", e.what());
  }
  sqlite3_finalize(insert_);
  sqlite3_close(db_);
}

void SqliteStore::fail(const std::string& what) const {
  std::string msg = path_ + ": " + what;
  if (db_) {
    const int code = sqlite3_errcode(db_);
    if (code == SQLITE_CORRUPT || code == SQLITE_NOTADB) msg += ": the log is damaged";  // cut short or overwritten
    msg += std::string(" (") + sqlite3_errmsg(db_) + ")";
  }
  throw StoreError(msg);
}

void SqliteStore::exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    throw StoreError(path_ + ": " + msg + " in: " + sql);
  }
}

void SqliteStore::begin_if_needed() {
  if (!in_txn_) {
    exec("BEGIN IMMEDIATE");
    in_txn_ = true;
  }
}

void SqliteStore::append(const Event& e) {
  if (!insert_) fail("is open read-only");
  if (e.seq != last_seq_ + 1)
    throw StoreError(path_ + ": event seq " + std::to_string(e.seq) + " does not follow " + std::to_string(last_seq_));
  begin_if_needed();
  const std::string type(event_type_name(e.payload));
  const std::string payload = payload_to_json(e.payload).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  sqlite3_reset(insert_);
  sqlite3_bind_int64(insert_, 1, static_cast<sqlite3_int64>(e.seq));
  sqlite3_bind_int64(insert_, 2, e.time);
  sqlite3_bind_text(insert_, 3, type.data(), static_cast<int>(type.size()), SQLITE_TRANSIENT);
  sqlite3_bind_text(insert_, 4, payload.data(), static_cast<int>(payload.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(insert_) != SQLITE_DONE) fail("cannot append event " + std::to_string(e.seq));
  last_seq_ = e.seq;
  if (batch_events_ > 0 && ++pending_ >= batch_events_) flush();
}

void SqliteStore::flush() {
  if (!in_txn_) return;
  exec("COMMIT");
  in_txn_ = false;
  pending_ = 0;
}

void SqliteStore::for_each(const std::function<void(const Event&)>& f) const {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT seq,time_ns,type,payload FROM events ORDER BY seq", -1, &st, nullptr) != SQLITE_OK)
    fail("cannot read events");
  uint64_t expected = 1;
  Time last_time = INT64_MIN;
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    Event e;
    e.seq = static_cast<uint64_t>(sqlite3_column_int64(st, 0));
    e.time = sqlite3_column_int64(st, 1);
    const char* type = reinterpret_cast<const char*>(sqlite3_column_text(st, 2));
    const char* payload = reinterpret_cast<const char*>(sqlite3_column_text(st, 3));
    std::string where = path_ + ": event " + std::to_string(e.seq);
    if (e.seq != expected) {
      sqlite3_finalize(st);
      throw StoreError(where + ": expected seq " + std::to_string(expected) +
                       ": the log is damaged (events are missing: cut short, or edited)");
    }
    if (e.time < last_time) {
      sqlite3_finalize(st);
      throw StoreError(where + ": its time (" + std::to_string(e.time) + " ns) is before the previous event's (" +
                       std::to_string(last_time) + " ns): the log is damaged (a log's time never goes back)");
    }
    last_time = e.time;
    try {
      e.payload = payload_from_json(type ? type : "", nlohmann::json::parse(payload ? payload : ""));
    } catch (const std::exception& ex) {
      sqlite3_finalize(st);
      throw StoreError(where + ": " + ex.what());
    }
    f(e);
    ++expected;
  }
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) fail("cannot read events");
}

void SqliteStore::set_meta(const std::string& key, const std::string& value) {
  begin_if_needed();
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_, "INSERT OR REPLACE INTO meta(key,value) VALUES(?,?)", -1, &st, nullptr) != SQLITE_OK)
    fail("cannot write meta");
  sqlite3_bind_text(st, 1, key.c_str(), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(st, 2, value.c_str(), -1, SQLITE_TRANSIENT);
  const int rc = sqlite3_step(st);
  sqlite3_finalize(st);
  if (rc != SQLITE_DONE) fail("cannot write meta '" + key + "'");
}

std::optional<std::string> SqliteStore::meta(const std::string& key) const {
  sqlite3_stmt* st = nullptr;
  if (sqlite3_prepare_v2(db_, "SELECT value FROM meta WHERE key=?", -1, &st, nullptr) != SQLITE_OK)
    fail("cannot read meta");
  sqlite3_bind_text(st, 1, key.c_str(), -1, SQLITE_TRANSIENT);
  std::optional<std::string> out;
  if (sqlite3_step(st) == SQLITE_ROW) out = reinterpret_cast<const char*>(sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  return out;
}

}  // namespace goodput
