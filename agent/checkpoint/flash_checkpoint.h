// Flash checkpoints: a training process copies its state into host shared memory (the only part
// of a save that blocks training), the node agent persists committed copies to storage in the
// background, and a restarted process loads from memory when it can and from storage when it must.
//
// One checkpoint of one rank, in memory or in a file, is laid out the same way:
//   [64-byte header][data: the buffers back to back, 64-byte aligned][manifest: JSON]
// The header carries a magic, the format version, the step, where the manifest is and its XXH3
// checksum; the manifest lists each buffer's name, dtype, shape, offset, size and XXH3 checksum.
//
// Memory: each rank owns two POSIX shared-memory objects, <prefix>-r<rank>-a and -b. A save writes
// the one that does not hold the newest committed checkpoint and commits it last (state and
// generation in its header, stored with release order), so a process killed mid-save leaves the
// previous checkpoint intact. Storage: <dir>/step-<step>/rank-<rank>.ckpt, written to a temporary
// name, fsynced, renamed, and the directory fsynced. A step is complete when every rank has it.
//
// The parts, each in a file of its own: format.h (header, manifest, checksums: what an image is),
// memory_objects.h (the shared-memory objects), posix_storage.cpp (the file system), this class
// (save, load, reserve, persist over those), persister.cpp (AsyncPersister) and inventory.cpp (what
// operators list and verify).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace goodput::ckpt {

constexpr uint32_t kFormatVersion = 1;

struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct BufferInfo {
  std::string name;
  std::string dtype;  // free text for the client ("float32", "bfloat16", "bytes")
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t nbytes = 0;
  uint64_t xxh3 = 0;
};

struct Manifest {
  uint32_t format_version = kFormatVersion;
  std::string job;
  int32_t rank = 0;
  int32_t world_size = 1;
  int64_t step = 0;
  uint64_t data_bytes = 0;
  std::vector<BufferInfo> buffers;
};

// What the trainer hands to save(): bytes it owns, described.
struct BufferView {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  uint64_t nbytes = 0;
};

enum class Tier { Memory, Storage };
const char* tier_name(Tier t);

// A loaded checkpoint. `data()` points at verified bytes that stay valid as long as this object
// lives (a private copy, or the shared-memory mapping for zero-copy loads).
class Loaded {
 public:
  Manifest manifest;
  Tier tier = Tier::Memory;
  std::string source;                // shm object or file it came from
  double seconds = 0;                // time to read and verify
  std::vector<std::string> skipped;  // newer candidates that were rejected, and why
  const uint8_t* data() const { return data_; }
  const uint8_t* buffer(const std::string& name, uint64_t* nbytes = nullptr) const;

  // Buffers read straight into memory the caller passed (load's `into`): name -> where they are.
  std::map<std::string, uint8_t*> placed;

  std::shared_ptr<void> keepalive_;
  const uint8_t* data_ = nullptr;
};

// Where the caller wants buffers of a checkpoint put (its model's tensors, already in memory), by
// buffer name: a buffer of exactly that size is read there instead of into fresh memory.
struct Destination {
  uint8_t* data = nullptr;
  uint64_t nbytes = 0;
};
using Destinations = std::map<std::string, Destination>;

// The file system, behind an interface so tests can fail writes (disk full, read-only) on purpose.
class Storage {
 public:
  virtual ~Storage() = default;
  // Writes parts to path atomically: temp file, fsync, rename, fsync of the directory.
  virtual void write_atomic(const std::string& path, const std::vector<std::pair<const void*, size_t>>& parts) = 0;
  virtual std::vector<uint8_t> read(const std::string& path) = 0;
  virtual std::vector<std::string> list(const std::string& dir) = 0;  // names, sorted; empty if absent
  virtual void remove_all(const std::string& path) = 0;
  virtual void make_dirs(const std::string& path) = 0;  // mode 0700
};
std::shared_ptr<Storage> posix_storage();

struct Options {
  std::string job = "job";
  int32_t rank = 0;
  int32_t world_size = 1;
  std::string storage_dir;   // empty: memory only
  std::string shm_prefix;    // default "/goodput-<job>"
  int keep = 3;              // complete steps kept in storage
  // True: every rank's shared memory is visible here (one host), and a memory checkpoint counts
  // only when every rank committed it. False (ranks on many hosts): the caller agrees on the step
  // with the other ranks itself (goodput.live does, with a collective) and load(step) trusts it.
  bool peers_share_memory = true;
  // False: load() reads storage only (a rank of a new layout reading what another rank saved
  // under the old one: the rank number's shared memory here, if any, is not that state).
  bool memory = true;
  std::shared_ptr<Storage> storage;  // default: posix_storage()
};

struct SaveStats {
  uint64_t bytes = 0;
  double seconds = 0;  // the blocking part
  std::string object;  // the shared-memory object written
};

struct PersistStats {
  bool written = false;  // false: storage already had this step or memory had nothing
  int64_t step = -1;
  uint64_t bytes = 0;
  double seconds = 0;
  std::string path;
};

class FlashCheckpoint {
 public:
  explicit FlashCheckpoint(Options options);
  const Options& options() const { return options_; }

  // Trainer: copy the buffers into shared memory and commit them as `step`.
  SaveStats save(int64_t step, const std::vector<BufferView>& buffers);
  // Trainer: the newest checkpoint complete across ranks, from memory if valid there, else from
  // storage; nullopt if none. With `step`, that step only. zero_copy: verified in place in shared
  // memory and returned as a view (valid until the save after next); otherwise a private copy.
  // into: buffers from shared memory go straight to these (verified there, as they arrive); a
  // buffer it does not name or whose size differs, and everything from storage, goes to fresh
  // memory. If the load fails, what `into` holds is undefined.
  std::optional<Loaded> load(std::optional<int64_t> step = std::nullopt, bool zero_copy = false,
                             const Destinations* into = nullptr);

  // Agent: make this rank's two shared-memory objects hold at least a checkpoint of `data_bytes`
  // and allocate their pages now (fallocate: never shrinks an object, never changes what it
  // holds), so the trainer's first save does not allocate them and a full /dev/shm shows up here
  // rather than in a save. Returns the bytes allocated; 0 where the file system cannot allocate
  // ahead (nothing is done then).
  uint64_t reserve(uint64_t data_bytes);

  // Agent: write the newest committed memory checkpoint to storage if storage lacks its step,
  // then keep the newest `keep` complete steps. Safe while the trainer saves; never blocks it.
  PersistStats persist();
  // Agent: a verified private copy of this rank's newest committed memory checkpoint (what persist
  // and replication send on); nullopt if memory holds none. Valid until the next call.
  std::optional<Loaded> newest_copy();

  // Operators and tests.
  std::vector<int64_t> storage_steps() const;           // steps with a file for this rank
  std::vector<int64_t> complete_storage_steps() const;  // steps every rank has
  std::optional<int64_t> newest_in_memory() const;      // newest committed step of this rank
  std::vector<int64_t> memory_steps() const;            // committed steps of this rank (up to two)
  void remove_memory();                                  // unlink this rank's shm objects
  // A restore of `step`: this rank's memory checkpoints of later steps belong to a history the job
  // gave up, and must not be loaded (nor combined with other ranks' later saves): they are
  // uncommitted. Returns how many were.
  int drop_memory_after(int64_t step);
  std::string shm_name(int which) const;                 // which: 0 -> "a", 1 -> "b"
  std::string step_dir(int64_t step) const;
  std::string rank_file(int64_t step, int32_t rank) const;

 private:
  Options options_;
  std::shared_ptr<void> write_maps_[2];  // this process's mappings of its two objects
  std::shared_ptr<void> persist_buffer_;  // reused between persists: bounded memory, no page faults
};

// For operators (`goodput ckpt`): what is in shared memory and in a storage directory.
struct ObjectInfo {
  std::string name;    // shm object ("/goodput-job-r0-a") or file path
  bool valid = false;  // committed (memory) / verified (files, when asked)
  std::string error;   // why not
  int64_t step = -1;
  int32_t rank = -1;
  int32_t world_size = 0;
  uint64_t bytes = 0;
  uint64_t generation = 0;
};
// Objects under /dev/shm whose names start with `prefix` (e.g. "/goodput-job"). Headers only.
std::vector<ObjectInfo> list_shm(const std::string& prefix);
// Every rank file of every step directory; with verify, checksums of all bytes too.
std::vector<ObjectInfo> list_storage(Storage& storage, const std::string& dir, bool verify);

// Reads and verifies one committed shared-memory object into a private copy.
Loaded read_shm_object(const std::string& name);

// Reads and verifies one checkpoint file (header, manifest checksum, every buffer's checksum).
// Throws CheckpointError saying what is wrong.
Loaded read_checkpoint_file(Storage& storage, const std::string& path);

// Persists in a background thread: request() asks for the newest memory checkpoint to be written;
// requests made while a write runs collapse into one (back-pressure: memory stays bounded, and
// training never waits). Errors are kept for the caller and reported through `on_error`.
class AsyncPersister {
 public:
  explicit AsyncPersister(FlashCheckpoint& checkpoint, std::function<void(const std::string&)> on_error = {});
  ~AsyncPersister();
  void request();
  // Blocks until no request is pending or running (the agent calls it before relaunching a trainer).
  void drain();
  std::string last_error() const;
  int64_t persisted_step() const { return persisted_step_.load(); }
  int64_t writes() const { return writes_.load(); }

 private:
  void loop();
  FlashCheckpoint& ckpt_;
  std::function<void(const std::string&)> on_error_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool pending_ = false, running_ = false, stop_ = false;
  std::string last_error_;
  std::atomic<int64_t> persisted_step_{-1};
  std::atomic<int64_t> writes_{0};
  std::thread thread_;
};

}  // namespace goodput::ckpt
