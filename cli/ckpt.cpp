#include "cli/ckpt.h"

#include <sys/mman.h>

#include <cstdio>
#include <iostream>
#include <map>

#include "agent/checkpoint/flash_checkpoint.h"

namespace goodput {
namespace {

std::string human_bytes(uint64_t b) {
  char buf[32];
  if (b >= (1ULL << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", b / double(1ULL << 30));
  else if (b >= (1ULL << 20)) std::snprintf(buf, sizeof buf, "%.1f MiB", b / double(1ULL << 20));
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

void print_objects(const std::vector<ckpt::ObjectInfo>& objs) {
  for (const auto& o : objs) {
    std::printf("%-60s %s", o.name.c_str(), o.valid ? "ok " : "BAD");
    if (o.step >= 0) std::printf("  step %lld", static_cast<long long>(o.step));
    if (o.rank >= 0) std::printf("  rank %d/%d", o.rank, o.world_size);
    std::printf("  %s", human_bytes(o.bytes).c_str());
    if (!o.error.empty()) std::printf("  (%s)", o.error.c_str());
    std::printf("\n");
  }
}

// Per step: how many ranks have a valid file, out of the world size the files claim.
void print_steps(const std::vector<ckpt::ObjectInfo>& objs) {
  std::map<int64_t, std::pair<int, int>> steps;  // step -> (valid ranks, world)
  for (const auto& o : objs) {
    auto& s = steps[o.step];
    if (o.valid) ++s.first;
    s.second = std::max(s.second, o.world_size);
  }
  for (const auto& [step, s] : steps)
    std::printf("step %lld: %d of %d ranks%s\n", static_cast<long long>(step), s.first, s.second,
                s.second > 0 && s.first >= s.second ? ", complete" : ", INCOMPLETE");
}

}  // namespace

void add_ckpt_commands(CLI::App& app, int& rc) {
  auto* ck = app.add_subcommand("ckpt", "Inspect, verify and remove flash checkpoints");
  ck->require_subcommand(1);
  static std::string dir, shm;
  static int64_t step = -1;
  static bool all = false;

  auto* ls = ck->add_subcommand("ls", "List checkpoints in a storage directory or in shared memory");
  ls->add_option("dir", dir, "Storage directory");
  ls->add_option("--shm", shm, "Shared-memory prefix, e.g. /goodput-myjob");
  ls->callback([&rc] {
    if (dir.empty() == shm.empty()) throw CLI::ValidationError("give a storage directory or --shm PREFIX");
    if (!shm.empty()) {
      const auto objs = ckpt::list_shm(shm);
      if (objs.empty()) std::printf("no shared-memory objects start with %s\n", shm.c_str());
      print_objects(objs);
    } else {
      const auto objs = ckpt::list_storage(*ckpt::posix_storage(), dir, false);
      if (objs.empty()) std::printf("%s: no checkpoints\n", dir.c_str());
      print_objects(objs);
      print_steps(objs);
    }
    rc = 0;
  });

  auto* verify = ck->add_subcommand("verify", "Check every byte of the checkpoints against their checksums");
  verify->add_option("dir", dir, "Storage directory");
  verify->add_option("--shm", shm, "Shared-memory prefix");
  verify->callback([&rc] {
    if (dir.empty() == shm.empty()) throw CLI::ValidationError("give a storage directory or --shm PREFIX");
    std::vector<ckpt::ObjectInfo> objs;
    if (!shm.empty()) {
      // Memory objects are verified by loading them, as a restarted trainer would.
      for (auto o : ckpt::list_shm(shm)) {
        if (o.valid) {
          try {
            ckpt::read_shm_object(o.name);
          } catch (const ckpt::CheckpointError& e) {
            o.valid = false;
            o.error = e.what();
          }
        }
        objs.push_back(o);
      }
    } else {
      objs = ckpt::list_storage(*ckpt::posix_storage(), dir, true);
    }
    print_objects(objs);
    if (shm.empty()) print_steps(objs);
    size_t bad = 0;
    for (const auto& o : objs) bad += !o.valid;
    std::printf("%zu checked, %zu bad\n", objs.size(), bad);
    rc = bad ? 2 : 0;
  });

  auto* rm = ck->add_subcommand("rm", "Remove checkpoints: a step (or all) from storage, or a job's shared memory");
  rm->add_option("dir", dir, "Storage directory");
  rm->add_option("--step", step, "Step to remove from storage");
  rm->add_flag("--all", all, "Remove every step in the storage directory");
  rm->add_option("--shm", shm, "Remove the shared-memory objects with this prefix");
  rm->callback([&rc] {
    if (!shm.empty()) {
      for (const auto& o : ckpt::list_shm(shm)) {
        ::shm_unlink(o.name.c_str());
        std::printf("removed %s\n", o.name.c_str());
      }
      rc = 0;
      return;
    }
    if (dir.empty() || (step < 0 && !all)) throw CLI::ValidationError("give DIR with --step N or --all, or --shm PREFIX");
    auto storage = ckpt::posix_storage();
    int removed = 0;
    for (const std::string& d : storage->list(dir)) {
      if (d.rfind("step-", 0) != 0) continue;
      if (!all && std::stoll(d.substr(5)) != step) continue;
      storage->remove_all(dir + "/" + d);
      std::printf("removed %s/%s\n", dir.c_str(), d.c_str());
      ++removed;
    }
    if (!removed) {
      std::fprintf(stderr, "goodput: %s: no such step\n", dir.c_str());
      rc = 2;
      return;
    }
    rc = 0;
  });
}

}  // namespace goodput
