// Checkpoint replicas in peers' host memory (checkpoint.replicas): after each save a node's agent
// sends every rank's newest committed memory checkpoint to the agents the master names (the
// holders); a holder keeps each copy in shared-memory objects of its own; after a relaunch the new
// node's agent fetches its ranks' copies back into its own memory before its trainers start, so
// the world restores from memory instead of storage.
//
// The wire (TCP over Boost.Asio, one request per connection, integers little-endian):
//   request: "GPRP" | SHA-256 of the job's token and "replica" (32 bytes: the token never crosses
//            the link) | op (1 byte: 'P' put, 'G' get) | rank (i32) | world size (i32)
//            | step (i64: the step a get wants; -1 for a put) | key length (u16) | key (the run:
//            "<job>-<run id>", at most 128 of [A-Za-z0-9._-])
//            a put then sends the image exactly as a checkpoint file holds it: the 64-byte
//            header, the data, the manifest (flash_checkpoint.h)
//   answer:  status (1 byte: 0 ok, 1 refused) | message length (u32) | message (why refused)
//            a get answered ok then sends the image
// Images travel in 4 MiB chunks, each read and write bounded by a timeout; a sender may pace its
// writes to a byte rate (a share of the link that training's collectives keep the rest of). Every
// buffer's XXH3 checksum is checked where the bytes land, before the copy is committed there: a
// copy that does not check out is never loadable, on the holder or on the fetching node.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "agent/checkpoint/flash_checkpoint.h"

namespace goodput::agent {

// One rank's copy a holder keeps, committed (each rank has two objects: up to two steps).
struct HeldReplica {
  int32_t rank = 0;
  int64_t step = 0;
};

// Serves puts and gets on an ephemeral TCP port of every interface, on a thread of its own. The
// copies of rank r of run K are /goodput-K-<holder>-held-r<r>-a and -b, written like a trainer's own
// two objects (the one not holding the newest copy, committed last). Removed with the server.
class ReplicaServer {
 public:
  ReplicaServer(const std::string& token, std::string holder);
  ~ReplicaServer();
  ReplicaServer(const ReplicaServer&) = delete;
  ReplicaServer& operator=(const ReplicaServer&) = delete;

  uint16_t port() const;
  std::vector<HeldReplica> held() const;  // every committed copy, by rank then step
  // Fault injection: spoils one byte of the data of every copy held, so fetching any fails its
  // checksum. Returns how many copies were spoiled.
  int corrupt();
  void remove_all();  // unlinks every object this server wrote

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

struct ReplicaTransfer {
  int64_t step = -1;
  uint64_t bytes = 0;  // over the wire
  double seconds = 0;
};

// Sends `image` (FlashCheckpoint::newest_copy) to the holder at host:port as rank `rank` of a world
// of `world` in run `key`; pacing: at most bytes_per_s (0: as fast as the link goes). Returns once
// the holder has verified and committed it; throws ckpt::CheckpointError saying why not.
ReplicaTransfer send_replica(const ckpt::Loaded& image, const std::string& key, const std::string& host, uint16_t port,
                             const std::string& token, double bytes_per_s, std::chrono::milliseconds timeout);

// Fetches the copy of `step` of dest's rank from the holder at host:port, into dest's own memory
// objects (committed as its newest once every checksum checked out there). Throws
// ckpt::CheckpointError saying what is wrong (no such copy, a checksum mismatch, the holder gone).
ReplicaTransfer fetch_replica(ckpt::FlashCheckpoint& dest, const std::string& key, int64_t step, const std::string& host,
                              uint16_t port, const std::string& token, std::chrono::milliseconds timeout);

}  // namespace goodput::agent
