// A trainer that is not Python and saves real flash checkpoints: it speaks the agent's progress
// protocol (JSON lines appended to GOODPUT_PROGRESS_FILE, as goodput.live does) and checkpoints
// through the C++ library, so a live run of it exercises the agent's persister in whatever build
// this is (under ASan+UBSan in that pass, where the Python trainers do not run).
//
// Its "model" is 256 KiB whose bytes are a function of the step, so a restore is checked for
// exactly: a wrong byte exits 3 with the reason. Env: the agent's GOODPUT_* and RANK/WORLD_SIZE.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "agent/checkpoint/flash_checkpoint.h"

namespace {

int64_t env_int(const char* name, int64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : fallback;
}
std::string env_text(const char* name, const char* fallback = "") {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

void fill(std::vector<uint8_t>& model, int64_t step, int32_t rank) {
  for (size_t i = 0; i < model.size(); ++i) model[i] = static_cast<uint8_t>((i * 131 + step * 7 + rank * 13) & 0xff);
}

}  // namespace

int main() {
  namespace ckpt = goodput::ckpt;
  std::ofstream progress(env_text("GOODPUT_PROGRESS_FILE", "/dev/null"), std::ios::app);
  auto report = [&](const std::string& line) { progress << line << "\n" << std::flush; };
  const int32_t rank = static_cast<int32_t>(env_int("RANK", 0));
  const int64_t total = env_int("GOODPUT_TOTAL_STEPS", 50);
  const int64_t every = env_int("GOODPUT_CHECKPOINT_EVERY", 0);
  const int64_t persist_every = env_int("GOODPUT_PERSIST_EVERY", 0);
  ckpt::Options o;
  o.job = env_text("GOODPUT_JOB", "job");
  o.rank = rank;
  o.world_size = static_cast<int32_t>(env_int("WORLD_SIZE", 1));
  o.storage_dir = env_text("GOODPUT_STORAGE_DIR");
  o.shm_prefix = env_text("GOODPUT_SHM_PREFIX");
  o.peers_share_memory = false;
  ckpt::FlashCheckpoint c(o);
  report(R"({"event":"started"})");
  report(R"({"event":"rendezvous"})");

  std::vector<uint8_t> model(256 << 10);
  int64_t step = 0;
  std::string tier = "none";
  const auto t0 = std::chrono::steady_clock::now();
  try {
    // The newest step this rank holds (a job of ranks that share no collective: the master takes
    // the lowest any rank loaded, and each rank's bytes are checked against its own step).
    std::optional<ckpt::Loaded> l;
    if (env_text("GOODPUT_RESTORE_TIER") != "storage")
      if (const auto m = c.newest_in_memory()) l = c.load(*m);
    if (!l)
      if (const auto s = c.storage_steps(); !s.empty()) l = c.load(s.back());
    if (l) {
      step = l->manifest.step;
      tier = ckpt::tier_name(l->tier);
      uint64_t n = 0;
      const uint8_t* bytes = l->buffer("model", &n);
      fill(model, step, rank);
      if (!bytes || n != model.size() || !std::equal(model.begin(), model.end(), bytes)) {
        std::cerr << "ckpt_trainer: the restored model of step " << step << " is not the one saved\n";
        return 3;
      }
    }
  } catch (const std::exception& e) {
    std::cerr << "ckpt_trainer: restore failed: " << e.what() << "\n";
    return 3;
  }
  const double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  report(R"({"event":"loaded","step":)" + std::to_string(step) + R"(,"tier":")" + tier + R"(","seconds":)" +
         std::to_string(load_s) + "}");
  int64_t saves = 0;
  for (++step; step <= total; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    fill(model, step, rank);
    report(R"({"event":"step","step":)" + std::to_string(step) + "}");
    if ((every > 0 && step % every == 0) || step == total) {
      const ckpt::SaveStats s = c.save(step, {{"model", "bytes", {static_cast<int64_t>(model.size())}, model.data(), model.size()}});
      ++saves;
      const bool persist = (persist_every > 0 && saves % persist_every == 0) || step == total;
      report(R"({"event":"saved","step":)" + std::to_string(step) + R"(,"blocking_s":)" + std::to_string(s.seconds) +
             R"(,"persist":)" + (persist ? "true" : "false") + "}");
    }
  }
  report(R"({"event":"done","step":)" + std::to_string(total) + "}");
  return 0;
}
