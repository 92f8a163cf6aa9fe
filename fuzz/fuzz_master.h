// What the live-master fuzz targets share: a fresh event log per input, on a virtual clock.
#pragma once

#include <unistd.h>

#include <memory>
#include <string>

#include "backends/live/live_master.h"

namespace goodput::fuzz {

struct FuzzMaster {
  std::unique_ptr<SqliteStore> store;
  VirtualClock clock;
  std::unique_ptr<live::LiveMaster> master;

  // `name` keeps the targets' logs apart; the log of the previous input is removed first.
  FuzzMaster(const std::string& name, live::JobSpec spec) {
    const std::string db = "/tmp/goodput-fuzz-" + name + "-" + std::to_string(::getpid()) + ".db";
    for (const char* suffix : {"", "-wal", "-shm"}) ::unlink((db + suffix).c_str());
    store = std::make_unique<SqliteStore>(db, SqliteStore::Mode::Create);
    master = std::make_unique<live::LiveMaster>(std::move(spec), default_policy(), *store, clock, nullptr, "t", "1");
  }
};

}  // namespace goodput::fuzz
