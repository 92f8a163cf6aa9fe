// Where events go. The engine appends through EventSink; an EventStore can also read them back.
// Stores report operating errors (disk full, locked database, bad file) as StoreError.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/event.h"

struct sqlite3;
struct sqlite3_stmt;

namespace goodput {

struct StoreError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class EventSink {
 public:
  virtual ~EventSink() = default;
  // REQUIRES: e.seq is one more than the previous event's.
  virtual void append(const Event& e) = 0;
  // Everything appended so far is durable when this returns (no-op for memory sinks).
  virtual void flush() {}
};

class EventStore : public EventSink {
 public:
  virtual uint64_t last_seq() const = 0;
  // Calls f for every event in sequence order.
  virtual void for_each(const std::function<void(const Event&)>& f) const = 0;
  virtual void set_meta(const std::string& key, const std::string& value) = 0;
  virtual std::optional<std::string> meta(const std::string& key) const = 0;
};

class MemoryStore final : public EventStore {
 public:
  void append(const Event& e) override;
  uint64_t last_seq() const override { return events_.empty() ? 0 : events_.back().seq; }
  void for_each(const std::function<void(const Event&)>& f) const override;
  void set_meta(const std::string& key, const std::string& value) override { meta_[key] = value; }
  std::optional<std::string> meta(const std::string& key) const override;
  const std::vector<Event>& events() const { return events_; }

 private:
  std::vector<Event> events_;
  std::map<std::string, std::string> meta_;
};

// Streams the canonical encoding of every event into XXH3-64: two runs agree on the digest exactly
// when their logs are byte-identical.
class DigestSink final : public EventSink {
 public:
  DigestSink();
  ~DigestSink() override;
  void append(const Event& e) override;
  std::string hex() const;
  uint64_t count() const { return count_; }

 private:
  void* state_;  // XXH3_state_t
  uint64_t count_ = 0;
};

// One row per event (seq, time, type, JSON payload) in a SQLite file in WAL mode. Appends go into
// an open transaction that flush() commits; with `batch_events` > 0 the store also commits on its
// own every that many events. Schema version lives in PRAGMA user_version.
class SqliteStore final : public EventStore {
 public:
  static constexpr int kSchemaVersion = 1;
  enum class Mode { Create, Open, OpenReadOnly };
  // Create: makes a new file (an existing one is an error). Open/OpenReadOnly: existing log only.
  SqliteStore(const std::string& path, Mode mode, int batch_events = 0);
  ~SqliteStore() override;
  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

  void append(const Event& e) override;
  void flush() override;
  uint64_t last_seq() const override { return last_seq_; }
  void for_each(const std::function<void(const Event&)>& f) const override;
  void set_meta(const std::string& key, const std::string& value) override;
  std::optional<std::string> meta(const std::string& key) const override;

 private:
  void open(Mode mode);
  void exec(const char* sql);
  void begin_if_needed();
  [[noreturn]] void fail(const std::string& what) const;

  std::string path_;
  sqlite3* db_ = nullptr;
  sqlite3_stmt* insert_ = nullptr;
  bool in_txn_ = false;
  int batch_events_ = 0;
  int pending_ = 0;
  uint64_t last_seq_ = 0;
};

}  // namespace goodput
