// What the live-master fuzz targets share: a fresh event log per input, on a virtual clock.
#pragma once

#include <unistd.h>

#include <memory>
#include <string>

#include "backends/live/live_master.h"
#include "backends/live/master_api.h"

namespace goodput::fuzz {

struct FuzzMaster {
  std::unique_ptr<SqliteStore> store;
  VirtualClock clock;
  std::unique_ptr<live::LiveMaster> master;
  std::unique_ptr<live::MasterApi> api;  // its HTTP API, with the token "t"

  // `name` keeps the targets' logs apart; the log of the previous input is removed first.
  FuzzMaster(const std::string& name, live::JobSpec spec) {
    const std::string db = "/tmp/goodput-fuzz-" + name + "-" + std::to_string(::getpid()) + ".db";
    for (const char* suffix : {"", "-wal", "-shm"}) ::unlink((db + suffix).c_str());
    store = std::make_unique<SqliteStore>(db, SqliteStore::Mode::Create);
    master = std::make_unique<live::LiveMaster>(std::move(spec), default_policy(), *store, clock, nullptr, "1");
    api = std::make_unique<live::MasterApi>(*master, "t");
  }
};

}  // namespace goodput::fuzz
