// Flash checkpoints against real shared memory, real files and real processes killed with SIGKILL.
#include <doctest/doctest.h>

#include <atomic>
#include <condition_variable>
#include <signal.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include "agent/checkpoint/flash_checkpoint.h"
#include "test_util.h"

using namespace goodput::ckpt;
using goodput::test::TempDir;

namespace {

std::string prefix(const std::string& name) { return "/gp-test-" + std::to_string(::getpid()) + "-" + name; }

// Bytes that depend on the step and the buffer, so a mix of two saves is detectable: a fixed
// random base per buffer (made once), XORed with a byte of the step (cheap, so a child process
// spends its time saving rather than making data).
std::vector<uint8_t> pattern(int64_t step, int which, size_t n) {
  static std::map<std::pair<int, size_t>, std::vector<uint8_t>> bases;
  auto& base = bases[{which, n}];
  if (base.size() != n) {
    base.resize(n);
    uint64_t x = static_cast<uint64_t>(which) * 2654435761u + n + 1;
    for (size_t i = 0; i < n; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      base[i] = static_cast<uint8_t>(x);
    }
  }
  std::vector<uint8_t> v(base);
  const uint8_t k = static_cast<uint8_t>(step * 167 + 13);
  for (auto& b : v) b ^= k;
  return v;
}

struct State {
  std::vector<uint8_t> weights, optimizer;
  explicit State(int64_t step, size_t n = 1 << 20) : weights(pattern(step, 0, n)), optimizer(pattern(step, 1, n / 3 + 7)) {}
  std::vector<BufferView> views() const {
    return {{"model.weight", "float32", {static_cast<int64_t>(weights.size() / 4)}, weights.data(), weights.size()},
            {"optim.exp_avg", "bytes", {static_cast<int64_t>(optimizer.size())}, optimizer.data(), optimizer.size()}};
  }
};

void check_holds(const Loaded& l, int64_t step, size_t n = 1 << 20) {
  const State want(step, n);
  uint64_t nb = 0;
  const uint8_t* w = l.buffer("model.weight", &nb);
  REQUIRE(w);
  REQUIRE(nb == want.weights.size());
  CHECK(std::memcmp(w, want.weights.data(), nb) == 0);
  const uint8_t* o = l.buffer("optim.exp_avg", &nb);
  REQUIRE(o);
  REQUIRE(nb == want.optimizer.size());
  CHECK(std::memcmp(o, want.optimizer.data(), nb) == 0);
}

Options opts(const std::string& name, const TempDir& dir, int rank = 0, int world = 1) {
  Options o;
  o.job = name;
  o.rank = rank;
  o.world_size = world;
  o.storage_dir = dir.file("ckpt");
  o.shm_prefix = prefix(name);
  return o;
}

struct Cleanup {
  std::vector<FlashCheckpoint*> c;
  ~Cleanup() {
    for (auto* x : c) x->remove_memory();
  }
};

// Storage with faults the caller cannot tell from the real ones: a full disk, a file system that
// turned read-only (as after an I/O error; root ignores file modes, so it is injected here), and a
// storage path so slow that writes wait until the test lets them through.
class FaultyStorage final : public Storage {
 public:
  std::shared_ptr<Storage> real = posix_storage();
  std::atomic<bool> full = false;
  std::atomic<bool> read_only = false;
  std::mutex gate_mu;
  std::condition_variable gate_cv;
  bool gate_closed = false;
  int waiting = 0;  // writes held at the gate
  void write_atomic(const std::string& p, const std::vector<std::pair<const void*, size_t>>& parts) override {
    if (full) throw CheckpointError("write " + p + ".tmp: No space left on device");
    if (read_only) throw CheckpointError("open " + p + ".tmp: Read-only file system");
    {
      std::unique_lock lock(gate_mu);
      ++waiting;
      gate_cv.notify_all();
      gate_cv.wait(lock, [&] { return !gate_closed; });
      --waiting;
    }
    real->write_atomic(p, parts);
  }
  void open_gate() {
    std::lock_guard lock(gate_mu);
    gate_closed = false;
    gate_cv.notify_all();
  }
  std::vector<uint8_t> read(const std::string& p) override { return real->read(p); }
  std::vector<std::string> list(const std::string& d) override { return real->list(d); }
  void remove_all(const std::string& p) override { real->remove_all(p); }
  void make_dirs(const std::string& p) override { real->make_dirs(p); }
};

}  // namespace

TEST_CASE("a checkpoint round-trips through memory and through storage bit for bit") {
  TempDir dir("ckpt-roundtrip");
  FlashCheckpoint c(opts("rt", dir));
  Cleanup clean{{&c}};
  CHECK_FALSE(c.load().has_value());
  const State s(7);
  const SaveStats st = c.save(7, s.views());
  CHECK(st.bytes >= s.weights.size() + s.optimizer.size());
  auto mem = c.load();
  REQUIRE(mem);
  CHECK(mem->tier == Tier::Memory);
  CHECK(mem->manifest.step == 7);
  check_holds(*mem, 7);
  auto zc = c.load(std::nullopt, /*zero_copy=*/true);
  REQUIRE(zc);
  check_holds(*zc, 7);

  const PersistStats p = c.persist();
  CHECK(p.written);
  CHECK(c.persist().written == false);  // storage already has step 7
  c.remove_memory();                    // the node is gone; its memory with it
  auto disk = c.load();
  REQUIRE(disk);
  CHECK(disk->tier == Tier::Storage);
  check_holds(*disk, 7);
  CHECK((std::filesystem::status(c.step_dir(7)).permissions() & std::filesystem::perms::others_all) ==
        std::filesystem::perms::none);
}

TEST_CASE("a checkpoint object that reads storage only never loads what memory holds for its rank") {
  // A rank of a new layout reading an old rank's state: memory here has a newer step 9 for that
  // rank number (saved under another layout), storage has step 7.
  TempDir dir("ckpt-storage-only");
  FlashCheckpoint c(opts("so", dir));
  Cleanup clean{{&c}};
  c.save(7, State(7).views());
  c.persist();
  c.save(9, State(9).views());
  Options o = c.options();
  o.memory = false;
  FlashCheckpoint reader(o);
  auto newest = reader.load();
  REQUIRE(newest);
  CHECK(newest->tier == Tier::Storage);
  CHECK(newest->manifest.step == 7);
  check_holds(*newest, 7);
  CHECK_FALSE(reader.load(9).has_value());  // only in memory: not for this reader
  CHECK(c.load(9)->tier == Tier::Memory);
}

TEST_CASE("the agent reserves shared memory ahead: a first save then only copies, and a reserve never harms") {
  TempDir dir("ckpt-reserve");
  FlashCheckpoint c(opts("reserve", dir));
  Cleanup clean{{&c}};
  auto object = [&](int which) {
    struct stat st {};
    const int fd = ::shm_open(c.shm_name(which).c_str(), O_RDONLY, 0);
    REQUIRE(fd >= 0);
    ::fstat(fd, &st);
    ::close(fd);
    return std::pair<uint64_t, uint64_t>{static_cast<uint64_t>(st.st_size), static_cast<uint64_t>(st.st_blocks) * 512};
  };
  const State s(3);
  const uint64_t data = s.weights.size() + s.optimizer.size() + 64;
  REQUIRE(c.reserve(data) > 0);  // /dev/shm is tmpfs, which allocates ahead
  for (int which : {0, 1}) {
    const auto [size, allocated] = object(which);
    CHECK(size >= data);
    CHECK(allocated >= size);  // the pages exist now, not at the first save
  }
  const auto objects = list_shm(prefix("reserve"));
  REQUIRE(objects.size() == 2);
  CHECK(objects[0].error == "empty (reserved for the next save)");
  CHECK_FALSE(c.load().has_value());  // reserved objects are not checkpoints, and not errors either
  CHECK(c.persist().written == false);

  const auto before = object(0);
  CHECK(c.save(3, s.views()).object == c.shm_name(0));
  CHECK(object(0) == before);  // the save used the reserved object as it was: no growth, no new pages
  auto l = c.load();
  REQUIRE(l);
  check_holds(*l, 3);

  // On a restart the agent reserves again, maybe for more: the committed checkpoint is untouched,
  // a larger reserve grows the objects, a smaller one never shrinks them.
  c.reserve(4 * data);
  CHECK(object(0).first >= 4 * data);
  c.reserve(16);
  CHECK(object(0).first >= 4 * data);
  l = c.load();
  REQUIRE(l);
  CHECK(l->tier == Tier::Memory);
  check_holds(*l, 3);
  CHECK(c.save(4, State(4).views()).object == c.shm_name(1));
  check_holds(*c.load(), 4);
}

TEST_CASE("a large checkpoint is written around the page cache, to its exact size, and loads bit for bit") {
  TempDir dir("ckpt-direct");
  FlashCheckpoint c(opts("direct", dir));
  Cleanup clean{{&c}};
  const size_t n = (9 << 20) + 4093;  // neither buffer a whole number of device blocks
  c.save(3, State(3, n).views());
  const PersistStats p = c.persist();
  REQUIRE(p.written);
  CHECK(std::filesystem::file_size(p.path) == p.bytes);  // the padded last block was cut off
  struct statfs fs {};
  REQUIRE(::statfs(p.path.c_str(), &fs) == 0);
  if (fs.f_type == TMPFS_MAGIC) {
    MESSAGE("storage is on tmpfs (no O_DIRECT): the buffered path was taken");
  } else {
    // Pages of the new file in the page cache: none or almost none (the file system may keep a few).
    const int fd = ::open(p.path.c_str(), O_RDONLY | O_CLOEXEC);
    REQUIRE(fd >= 0);
    void* m = ::mmap(nullptr, p.bytes, PROT_READ, MAP_SHARED, fd, 0);
    REQUIRE(m != MAP_FAILED);
    const size_t pages = (p.bytes + 4095) / 4096;
    std::vector<unsigned char> resident(pages);
    REQUIRE(::mincore(m, p.bytes, resident.data()) == 0);
    size_t cached = 0;
    for (unsigned char r : resident) cached += r & 1;
    CHECK_MESSAGE(cached * 10 < pages, cached << " of " << pages << " pages are in the page cache");
    ::munmap(m, p.bytes);
    ::close(fd);
  }
  c.remove_memory();
  auto l = c.load();
  REQUIRE(l);
  CHECK(l->tier == Tier::Storage);
  check_holds(*l, 3, n);
}

TEST_CASE("a load into the caller's buffers reads memory checkpoints straight there, and only buffers that fit") {
  TempDir dir("ckpt-into");
  FlashCheckpoint c(opts("into", dir));
  Cleanup clean{{&c}};
  const State s(5);
  c.save(5, s.views());
  std::vector<uint8_t> weights(s.weights.size(), 0xAB), too_small(s.optimizer.size() - 1, 0xCD);
  const Destinations into = {{"model.weight", {weights.data(), weights.size()}},
                             {"optim.exp_avg", {too_small.data(), too_small.size()}}};
  auto l = c.load(std::nullopt, false, &into);
  REQUIRE(l);
  CHECK(l->placed.size() == 1);
  uint64_t nb = 0;
  CHECK(l->buffer("model.weight", &nb) == weights.data());  // the caller's memory, filled
  CHECK(weights == s.weights);
  CHECK(std::all_of(too_small.begin(), too_small.end(), [](uint8_t b) { return b == 0xCD; }));  // untouched
  check_holds(*l, 5);
  // A byte flipped in shared memory is found in the caller's copy too: the load falls back to the
  // older step (the other object).
  c.save(6, State(6).views());
  {
    const int fd = ::shm_open(c.shm_name(1).c_str(), O_RDWR, 0);
    REQUIRE(fd >= 0);
    const uint8_t bad = 0x5A;
    REQUIRE(::pwrite(fd, &bad, 1, 4096) == 1);
    ::close(fd);
  }
  auto back = c.load(std::nullopt, false, &into);
  REQUIRE(back);
  CHECK(back->manifest.step == 5);
  REQUIRE(back->skipped.size() == 1);
  CHECK(back->skipped[0].find("checksum") != std::string::npos);
  CHECK(weights == s.weights);
  check_holds(*back, 5);
}

TEST_CASE("a trainer killed with SIGKILL in the middle of a save leaves the previous checkpoint loadable") {
  TempDir dir("ckpt-kill");
  const size_t n = 48 << 20;  // 48 MiB per save: a kill usually lands inside the copy
  std::mt19937 rng(12345);
  int caught_mid_save = 0;
  for (int round = 0; round < 12; ++round) {
    FlashCheckpoint c(opts("kill" + std::to_string(round), dir));
    Cleanup clean{{&c}};
    int fds[2];
    REQUIRE(::pipe(fds) == 0);
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::close(fds[0]);
      FlashCheckpoint child(c.options());
      for (int64_t step = 1;; ++step) {
        const State s(step, n);
        const int64_t starting = -step;  // "about to save", then "saved"
        if (::write(fds[1], &starting, sizeof starting) != sizeof starting) _exit(1);
        child.save(step, s.views());
        if (::write(fds[1], &step, sizeof step) != sizeof step) _exit(1);
      }
    }
    ::close(fds[1]);
    int64_t announced = 0, v = 0;
    while (announced < 2 && ::read(fds[0], &v, sizeof v) == sizeof v)
      if (v > 0) announced = v;
    // Wait for the next save to start, then kill it at a random point of the copy.
    while (v >= 0 && ::read(fds[0], &v, sizeof v) == sizeof v)
      if (v > 0) announced = v;
    ::usleep(static_cast<useconds_t>(rng() % 4000));  // a warm 48 MiB save takes longer than this
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    while (::read(fds[0], &v, sizeof v) == sizeof v)
      if (v > 0) announced = v;
    ::close(fds[0]);
    // One of the two objects may hold a half-written save; it must never be returned.
    const auto a = c.shm_name(0), b = c.shm_name(1);
    auto l = c.load();
    REQUIRE(l);
    CAPTURE(announced);
    CHECK((l->manifest.step == announced || l->manifest.step == announced + 1));
    check_holds(*l, l->manifest.step, n);
    // Was the newer object caught mid-save? Then its header is not committed.
    for (const auto& name : {a, b}) {
      const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
      if (fd < 0) continue;
      uint32_t state = 1;
      if (::pread(fd, &state, sizeof state, 12) == sizeof state && state == 0) ++caught_mid_save;
      ::close(fd);
    }
  }
  MESSAGE("kills that landed inside a save: " << caught_mid_save << " of 12");
  CHECK(caught_mid_save > 0);
}

TEST_CASE("a flipped byte in memory fails its checksum and the load falls back to storage") {
  TempDir dir("ckpt-flip");
  FlashCheckpoint c(opts("flip", dir));
  Cleanup clean{{&c}};
  c.save(3, State(3).views());
  REQUIRE(c.persist().written);
  const std::string obj = c.shm_name(0);
  const int fd = ::shm_open(obj.c_str(), O_RDWR, 0);
  REQUIRE(fd >= 0);
  uint8_t byte;
  REQUIRE(::pread(fd, &byte, 1, 64 + 1000) == 1);
  byte ^= 0x40;
  REQUIRE(::pwrite(fd, &byte, 1, 64 + 1000) == 1);
  ::close(fd);
  auto l = c.load();
  REQUIRE(l);
  CHECK(l->tier == Tier::Storage);
  check_holds(*l, 3);
  REQUIRE(l->skipped.size() == 1);
  CHECK(l->skipped[0].find(obj + ": checksum mismatch in buffer 'model.weight'; skipped") == 0);
}

TEST_CASE("a truncated file in storage is skipped and the older step loads, with a message") {
  TempDir dir("ckpt-trunc");
  FlashCheckpoint c(opts("trunc", dir));
  Cleanup clean{{&c}};
  c.save(1, State(1).views());
  c.persist();
  c.save(2, State(2).views());
  c.persist();
  c.remove_memory();
  std::filesystem::resize_file(c.rank_file(2, 0), 5000);
  auto l = c.load();
  REQUIRE(l);
  CHECK(l->manifest.step == 1);
  check_holds(*l, 1);
  REQUIRE(l->skipped.size() == 1);
  CHECK(l->skipped[0].find(c.rank_file(2, 0) + ": truncated") == 0);
  // Asking for the broken step says why it cannot be had.
  CHECK_THROWS_WITH_AS(c.load(2), doctest::Contains("truncated"), CheckpointError);
}

TEST_CASE("a full disk during persist keeps the previous persisted checkpoint and never blocks saving") {
  TempDir dir("ckpt-full");
  auto disk = std::make_shared<FaultyStorage>();
  Options o = opts("full", dir);
  o.storage = disk;
  FlashCheckpoint c(o);
  Cleanup clean{{&c}};
  std::vector<std::string> errors;
  std::mutex mu;
  AsyncPersister persister(c, [&](const std::string& e) {
    std::lock_guard<std::mutex> lock(mu);
    errors.push_back(e);
  });
  c.save(10, State(10).views());
  persister.request();
  persister.drain();
  CHECK(persister.persisted_step() == 10);
  disk->full = true;
  for (int64_t step = 11; step <= 14; ++step) {
    const SaveStats s = c.save(step, State(step).views());  // training goes on regardless
    CHECK(s.bytes > 0);
    persister.request();
  }
  persister.drain();
  CHECK(persister.last_error().find("No space left on device") != std::string::npos);
  CHECK_FALSE(errors.empty());
  CHECK(c.complete_storage_steps() == std::vector<int64_t>{10});
  CHECK_FALSE(std::filesystem::exists(c.rank_file(14, 0) + ".tmp"));
  // No empty step directory is left behind by the failed writes.
  for (int64_t step = 11; step <= 14; ++step) CHECK_FALSE(std::filesystem::exists(c.step_dir(step)));
  c.remove_memory();
  auto l = c.load();
  REQUIRE(l);
  CHECK(l->manifest.step == 10);
  check_holds(*l, 10);
}

TEST_CASE("read-only storage during persist: reported, the persisted checkpoint kept, training goes on") {
  TempDir dir("ckpt-ro");
  auto disk = std::make_shared<FaultyStorage>();
  Options o = opts("ro", dir);
  o.storage = disk;
  FlashCheckpoint c(o);
  Cleanup clean{{&c}};
  AsyncPersister persister(c);
  c.save(10, State(10).views());
  persister.request();
  persister.drain();
  disk->read_only = true;
  for (int64_t step = 11; step <= 13; ++step) {
    CHECK(c.save(step, State(step).views()).bytes > 0);
    persister.request();
  }
  persister.drain();
  CHECK(persister.last_error().find("Read-only file system") != std::string::npos);
  CHECK(persister.persisted_step() == 10);
  CHECK(c.complete_storage_steps() == std::vector<int64_t>{10});
  // The newest step is still in memory for a process restart; storage has the older one.
  auto from_memory = c.load();
  REQUIRE(from_memory);
  CHECK(from_memory->manifest.step == 13);
  disk->read_only = false;  // remounted: the next persist catches up
  persister.request();
  persister.drain();
  CHECK(persister.persisted_step() == 13);
}

TEST_CASE("slow storage: saves never wait for a persist, requests collapse, host memory stays bounded") {
  TempDir dir("ckpt-slow");
  auto disk = std::make_shared<FaultyStorage>();
  Options o = opts("slow", dir);
  o.storage = disk;
  FlashCheckpoint c(o);
  Cleanup clean{{&c}};
  AsyncPersister persister(c);
  auto shm_objects = [] {
    int n = 0;
    for (const auto& e : std::filesystem::directory_iterator("/dev/shm"))
      n += e.path().filename().string().rfind(prefix("slow").substr(1), 0) == 0;
    return n;
  };
  {
    std::lock_guard lock(disk->gate_mu);
    disk->gate_closed = true;  // every write now waits: a persist far slower than the save interval
  }
  c.save(1, State(1).views());
  persister.request();
  {
    std::unique_lock lock(disk->gate_mu);
    disk->gate_cv.wait(lock, [&] { return disk->waiting > 0; });  // the persist of step 1 is stuck in storage
  }
  int most = 0;
  for (int64_t step = 2; step <= 40; ++step) {
    c.save(step, State(step).views());  // would never return if a save waited for the persist
    persister.request();
    most = std::max(most, shm_objects());
  }
  CHECK(most > 0);
  CHECK(most <= 2);  // two memory slots per rank, however far storage falls behind
  disk->open_gate();
  persister.drain();
  CHECK(persister.persisted_step() == 40);
  CHECK(persister.writes() <= 3);  // step 1, then the newest: the 38 requests in between collapsed
  CHECK(c.complete_storage_steps().back() == 40);
}

TEST_CASE("persist on failure: the agent writes a dead trainer's memory checkpoint for a fresh process") {
  TempDir dir("ckpt-pof");
  FlashCheckpoint agent(opts("pof", dir));
  Cleanup clean{{&agent}};
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    FlashCheckpoint trainer(agent.options());
    trainer.save(5, State(5).views());  // memory only
    ::pause();
    _exit(0);
  }
  // Wait for the save, then kill the trainer the hard way.
  for (int i = 0; i < 500 && agent.newest_in_memory() != std::optional<int64_t>(5); ++i) ::usleep(10000);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  CHECK(agent.storage_steps().empty());
  const PersistStats p = agent.persist();  // the agent's reaction to the exit
  CHECK(p.written);
  CHECK(p.step == 5);
  agent.remove_memory();  // and the node is replaced: nothing left in memory
  FlashCheckpoint fresh(agent.options());
  auto l = fresh.load();
  REQUIRE(l);
  CHECK(l->tier == Tier::Storage);
  check_holds(*l, 5);
}

TEST_CASE("a step committed by only one of two ranks is not chosen") {
  TempDir dir("ckpt-ranks");
  FlashCheckpoint r0(opts("ranks", dir, 0, 2)), r1(opts("ranks", dir, 1, 2));
  Cleanup clean{{&r0, &r1}};
  r0.save(10, State(10).views());
  r1.save(10, State(10).views());
  r0.save(20, State(20).views());  // rank 1 dies before saving step 20
  for (FlashCheckpoint* c : {&r0, &r1}) {
    auto l = c->load();
    REQUIRE(l);
    CHECK(l->manifest.step == 10);
    CHECK(l->tier == Tier::Memory);
  }
  // Storage: rank 0 persisted 20 as well, rank 1 only 10.
  r0.persist();
  r1.persist();
  CHECK(r0.complete_storage_steps() == std::vector<int64_t>{});
  r0.remove_memory();
  r1.remove_memory();
  CHECK_FALSE(r0.load().has_value());  // 20 lacks rank 1, and 10 lacks rank 0
  r0.save(10, State(10).views());
  r0.persist();
  CHECK(r1.complete_storage_steps() == std::vector<int64_t>{10});
  auto l = r1.load();
  REQUIRE(l);
  CHECK(l->manifest.step == 10);
  CHECK(l->tier == Tier::Storage);
}

TEST_CASE("storage keeps the newest complete steps only") {
  TempDir dir("ckpt-keep");
  Options o = opts("keep", dir);
  o.keep = 2;
  FlashCheckpoint c(o);
  Cleanup clean{{&c}};
  for (int64_t step = 1; step <= 5; ++step) {
    c.save(step, State(step, 4096).views());
    c.persist();
  }
  CHECK(c.complete_storage_steps() == std::vector<int64_t>{4, 5});
}

TEST_CASE("async persist requests collapse while a write runs") {
  TempDir dir("ckpt-async");
  FlashCheckpoint c(opts("async", dir));
  Cleanup clean{{&c}};
  AsyncPersister p(c);
  for (int64_t step = 1; step <= 50; ++step) {
    c.save(step, State(step, 1 << 16).views());
    p.request();
  }
  p.drain();
  CHECK(p.persisted_step() == 50);
  CHECK(p.writes() <= 50);
  CHECK(p.last_error().empty());
}

TEST_CASE("goodput ckpt lists, verifies and removes checkpoints, and names what is broken") {
  using goodput::test::goodput_cmd;
  using goodput::test::run_command;
  TempDir dir("ckpt-cli");
  FlashCheckpoint r0(opts("cli", dir, 0, 2)), r1(opts("cli", dir, 1, 2));
  Cleanup clean{{&r0, &r1}};
  for (int64_t step : {100, 200}) {
    r0.save(step, State(step, 4096).views());
    r0.persist();
  }
  r1.save(100, State(100, 4096).views());
  r1.persist();
  const std::string d = r0.options().storage_dir;
  auto ls = run_command(goodput_cmd("ckpt ls " + d));
  CHECK(ls.exit_code == 0);
  CHECK(ls.output.find("step 100: 2 of 2 ranks, complete") != std::string::npos);
  CHECK(ls.output.find("step 200: 1 of 2 ranks, INCOMPLETE") != std::string::npos);
  CHECK(run_command(goodput_cmd("ckpt verify " + d)).exit_code == 0);

  // One flipped byte in a file: verify exits 2 and names the file and the buffer.
  {
    std::FILE* f = std::fopen(r1.rank_file(100, 1).c_str(), "r+b");
    REQUIRE(f);
    std::fseek(f, 64 + 10, SEEK_SET);
    const int c = std::fgetc(f);
    std::fseek(f, 64 + 10, SEEK_SET);
    std::fputc(c ^ 1, f);
    std::fclose(f);
  }
  auto v = run_command(goodput_cmd("ckpt verify " + d));
  CHECK(v.exit_code == 2);
  CHECK(v.output.find(r1.rank_file(100, 1)) != std::string::npos);
  CHECK(v.output.find("checksum mismatch in buffer 'model.weight'") != std::string::npos);
  // A flipped bit in the header's format version is damage, not another version (the manifest,
  // checksummed apart, still says this format).
  {
    std::FILE* f = std::fopen(r0.rank_file(100, 0).c_str(), "r+b");
    REQUIRE(f);
    std::fseek(f, 8, SEEK_SET);  // the version field, after the 8-byte magic
    const int c = std::fgetc(f);
    std::fseek(f, 8, SEEK_SET);
    std::fputc(c ^ 1, f);
    std::fclose(f);
  }
  v = run_command(goodput_cmd("ckpt verify " + d));
  CHECK(v.exit_code == 2);
  CAPTURE(v.output);
  CHECK(v.output.find("damaged header: its format version field reads 0 where its manifest (checksum verified) says 1") !=
        std::string::npos);

  auto shm = run_command(goodput_cmd("ckpt ls --shm " + r0.options().shm_prefix));
  CHECK(shm.output.find(r0.shm_name(0)) != std::string::npos);
  CHECK(shm.output.find("step 200") != std::string::npos);
  CHECK(run_command(goodput_cmd("ckpt verify --shm " + r0.options().shm_prefix)).exit_code == 0);

  CHECK(run_command(goodput_cmd("ckpt rm " + d + " --step 200")).exit_code == 0);
  CHECK_FALSE(std::filesystem::exists(r0.step_dir(200)));
  CHECK(run_command(goodput_cmd("ckpt rm " + d + " --step 999")).exit_code == 2);
  CHECK(run_command(goodput_cmd("ckpt rm --shm " + r0.options().shm_prefix)).exit_code == 0);
  CHECK_FALSE(r0.newest_in_memory().has_value());
  CHECK(run_command(goodput_cmd("ckpt ls")).exit_code == 2);
}

TEST_CASE("persisting while the trainer keeps saving never fails and never writes a torn checkpoint") {
  TempDir dir("ckpt-race");
  Options o = opts("race", dir);
  o.keep = 1000;
  FlashCheckpoint trainer(o), agent(o);
  Cleanup clean{{&trainer}};
  std::atomic<bool> done{false};
  std::thread t([&] {
    for (int64_t step = 1; step <= 400; ++step) trainer.save(step, State(step, 1 << 18).views());
    done = true;
  });
  int persisted = 0;
  std::vector<std::string> errors;
  while (!done) {
    try {
      persisted += agent.persist().written;
    } catch (const CheckpointError& e) {
      errors.push_back(e.what());
    }
  }
  t.join();
  // The only acceptable failure is the documented "try again" when saves outrun eight copies in a
  // row (possible on a loaded machine); never corruption.
  for (const auto& e : errors) {
    CAPTURE(e);
    CHECK(e.find("will try again") != std::string::npos);
  }
  CHECK(persisted > 0);
  for (const auto& f : list_storage(*posix_storage(), o.storage_dir, /*verify=*/true)) {
    CAPTURE(f.name);
    CAPTURE(f.error);
    CHECK(f.valid);
  }
}

TEST_CASE("a restore drops this rank's memory checkpoints of later steps: they belong to a history given up") {
  TempDir dir("drop-after");
  FlashCheckpoint c(opts("drop-after", dir));
  Cleanup cleanup{{&c}};
  c.save(10, State(10, 4096).views());
  c.save(20, State(20, 4096).views());
  CHECK(c.memory_steps() == std::vector<int64_t>{10, 20});
  CHECK(c.drop_memory_after(20) == 0);
  CHECK(c.drop_memory_after(10) == 1);
  CHECK(c.memory_steps() == std::vector<int64_t>{10});
  const auto l = c.load();
  REQUIRE(l);
  CHECK(l->manifest.step == 10);
  check_holds(*l, 10, 4096);
  // The next save takes the dropped object; the kept one stays loadable meanwhile.
  c.save(30, State(30, 4096).views());
  CHECK(c.memory_steps() == std::vector<int64_t>{10, 30});
}
