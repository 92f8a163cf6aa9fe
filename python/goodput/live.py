"""The trainer's side of a live Goodput job.

The node agent starts the trainer with the torchrun environment (RANK, WORLD_SIZE, MASTER_ADDR, ...)
plus GOODPUT_* variables; Session reads them and tells the agent what the trainer is doing by
appending JSON lines to GOODPUT_PROGRESS_FILE (the agent forwards them in its heartbeats):

    from goodput.live import Session
    s = Session()
    dist.init_process_group("gloo"); s.rendezvous_done()
    step, state = s.restore()                 # the step every rank can load, agreed by a collective
    for step in range(step + 1, s.total_steps + 1):
        shard = s.next_shard()                # dynamic data sharding (None: no shard service)
        ... train ...
        s.step_done(step, loss)
        if s.should_save(step):
            s.save(step, state)               # flash checkpoint; finished shards are acknowledged
    s.done(step)

Outside a Goodput job (no GOODPUT_PROGRESS_FILE) every call still works: nothing is reported,
checkpoints go to the directory given by GOODPUT_STORAGE_DIR if any.
"""

import faulthandler
import json
import os
import shutil
import signal
import ssl
import time
import urllib.error
import urllib.request

from goodput.checkpoint import CheckpointError, FlashCheckpoint


def _int(name, default=0):
    v = os.environ.get(name, "")
    return int(v) if v else default


class Session:
    def __init__(self):
        e = os.environ
        self.rank = _int("RANK")
        self.local_rank = _int("LOCAL_RANK")
        self.world_size = _int("WORLD_SIZE", 1)
        self.restart = _int("GOODPUT_RESTART")
        self.node = _int("GOODPUT_NODE", -1)
        self.job = e.get("GOODPUT_JOB") or e.get("TORCHELASTIC_RUN_ID") or "job"
        self.total_steps = _int("GOODPUT_TOTAL_STEPS")
        self.checkpoint_every = _int("GOODPUT_CHECKPOINT_EVERY")
        self.persist_every = _int("GOODPUT_PERSIST_EVERY")
        self.restore_step = _int("GOODPUT_RESTORE_STEP")
        self.restore_tier = e.get("GOODPUT_RESTORE_TIER", "none")
        # This rank's part in a job with replica groups ("chief", "ps", "worker"), its index among
        # its type, and how many of each the world has now; a plain job is all workers.
        self.replica_type = e.get("GOODPUT_REPLICA_TYPE", "worker")
        self.replica_index = _int("GOODPUT_REPLICA_INDEX", self.rank)
        self.replicas = json.loads(e["GOODPUT_REPLICAS"]) if e.get("GOODPUT_REPLICAS") else {"worker": self.world_size}
        # The layout the checkpoint to restore was saved under, when the master names it (a group
        # was scaled during the run, so ranks may have moved): a rank's state is found by its part
        # (type and index), not by its rank number.
        self._relaid = bool(e.get("GOODPUT_RESTORE_REPLICAS"))
        self.restored_replicas = json.loads(e["GOODPUT_RESTORE_REPLICAS"]) if self._relaid else self.replicas
        self._storage_dir = e.get("GOODPUT_STORAGE_DIR", "")
        self._master = e.get("GOODPUT_MASTER", "")
        self._token = e.get("GOODPUT_TOKEN", "")
        # An https:// master is verified against GOODPUT_CA_FILE (or the system's trust store).
        self._tls = ssl.create_default_context(cafile=e.get("GOODPUT_CA_FILE") or None) \
            if self._master.startswith("https://") else None
        path = e.get("GOODPUT_PROGRESS_FILE", "")
        self._progress = open(path, "a", buffering=1) if path else None
        self.ckpt = FlashCheckpoint(self.job, self.rank, self.world_size,
                                    storage_dir=e.get("GOODPUT_STORAGE_DIR", ""),
                                    shm_prefix=e.get("GOODPUT_SHM_PREFIX", ""),
                                    peers_share_memory=False)
        self._saves = 0
        self._finished_shards = []  # done since the last save: acknowledged with it
        self._shard_requests = 0    # numbered, so a retried request gets the same shard
        self._work_mark = None
        self.loaded_from = None
        stacks = {}
        if self._progress:  # the agent sends SIGUSR1 before it kills a hung trainer: say where we are
            faulthandler.register(signal.SIGUSR1, all_threads=True)
            stacks = {"stacks_on": "SIGUSR1"}
        self.report("started", **stacks)

    # ---- reporting ----
    def report(self, event, **fields):
        if self._progress:
            fields["event"] = event
            self._progress.write(json.dumps(fields) + "\n")

    def rendezvous_done(self):
        self.report("rendezvous")

    def step_done(self, step, loss=None):
        """Reports the step, its loss, and the CPU time this rank worked on it (time blocked in a
        collective is not work: that is how a straggler among synchronized ranks shows)."""
        now = time.process_time()
        work = now - self._work_mark if self._work_mark is not None else None
        self._work_mark = now
        fields = {"loss": float(loss)} if loss is not None else {}
        if work is not None:
            fields["work_s"] = work
        self.report("step", step=step, **fields)

    def done(self, step, **fields):
        self.report("done", step=step, **fields)

    # ---- checkpoints ----
    def restore(self):
        """Agrees with every rank on the newest step all of them can load (memory, else storage),
        loads it, and returns (step, state); (0, None) for a fresh start.

        After a replica group was scaled the master names the step (in storage) and the layout it
        was saved under: the state returned is that of the same part (say, worker 1) then, None for
        a part that did not exist; load_replica() reads any other part's, to re-partition."""
        import torch.distributed as dist

        t0 = time.perf_counter()
        if self._relaid and self.restore_tier == "storage" and self.restore_step > 0:
            state = self.load_replica(self.replica_type, self.replica_index)
            if self.rank == 0:
                self._drop_storage_after(self.restore_step)
            self.loaded_from = ("storage", self.restore_step)
            self.report("loaded", step=self.restore_step, tier="storage", seconds=time.perf_counter() - t0)
            return self.restore_step, state
        have = {}
        if self.restore_tier != "storage":  # the policy may forbid memory restores
            for s in self.ckpt.memory_steps():
                have[s] = "memory"
        for s in self.ckpt.complete_storage_steps():
            have.setdefault(s, "storage")
        everyone = [None] * self.world_size
        if dist.is_initialized() and self.world_size > 1:
            dist.all_gather_object(everyone, sorted(have))
        else:
            everyone = [sorted(have)]
        common = set(everyone[0]).intersection(*map(set, everyone[1:]))
        # Storage steps above the one restored belong to a history the job has given up: some
        # ranks' files from it, others' written later by this one, would make a "complete" step
        # of two histories. Rank 0 drops them before anyone saves again.
        if self.rank == 0:
            self._drop_storage_after(max(common) if common else 0)
        # The same in memory, where each rank keeps its own: a later step there would let the next
        # restore combine this rank's old history with the others' new one.
        self.ckpt.drop_memory_after(max(common) if common else 0)
        if not common:
            self.report("loaded", step=0, tier="none", seconds=time.perf_counter() - t0)
            self.loaded_from = ("none", 0)
            return 0, None
        step = max(common)
        loaded_step, state = self.ckpt.load(step)
        tier = self.ckpt.last_load.get("tier", have[step])
        # This node's agent fetched that step from a peer's memory before we started (a relaunch).
        if tier == "memory" and loaded_step == _int("GOODPUT_PEER_STEP", -1):
            tier = "peer"
        # Every rank reports the slowest tier any rank used, so the master sees one answer.
        tiers = [None] * self.world_size
        if dist.is_initialized() and self.world_size > 1:
            dist.all_gather_object(tiers, tier)
        else:
            tiers = [tier]
        tier = next(t for t in ("storage", "peer", "memory") if t in tiers)
        self.loaded_from = (tier, loaded_step)
        self.report("loaded", step=loaded_step, tier=tier, seconds=time.perf_counter() - t0)
        return loaded_step, state

    def load_replica(self, replica_type, index):
        """The state replica `index` of `replica_type` ("ps", "worker", "chief") saved in the
        checkpoint this restart restores, read from storage by the layout it was saved under; None
        if that layout had no such replica or there is nothing to restore."""
        layout = self.restored_replicas
        first = 0
        for t in ("chief", "ps", "worker"):
            if t == replica_type:
                break
            first += layout.get(t, 0)
        if self.restore_step <= 0 or not 0 <= index < layout.get(replica_type, 0):
            return None
        # That rank as the old world had it, read from storage only: this node's shared memory holds
        # its own old rank at best, and the rank number may have meant another part when saved.
        old = FlashCheckpoint(self.job, first + index, sum(layout.values()), storage_dir=self._storage_dir,
                              peers_share_memory=False, memory=False)
        step, state = old.load(self.restore_step)
        if step is None:
            raise CheckpointError(f"the master restores step {self.restore_step}, but storage has no checkpoint of "
                                  f"{replica_type} {index} (rank {first + index}) at it")
        return state

    def _drop_storage_after(self, step):
        """Steps in storage above the restored one were saved by a world that was given up (under
        another layout, perhaps): the job saves them again as it goes, and nobody may load them
        meanwhile, nor count one complete when its ranks' files come from two histories. The
        other ranks wait in the first step's collectives. (An agent still persisting its old
        trainer's memory at this moment can write one such file afterwards: the next restore
        drops it again, but a failure in between could count its step complete.)"""
        if not self._storage_dir or not os.path.isdir(self._storage_dir):
            return
        for name in os.listdir(self._storage_dir):
            if name.startswith("step-") and name[5:].isdigit() and int(name[5:]) > step:
                shutil.rmtree(os.path.join(self._storage_dir, name), ignore_errors=True)

    def should_save(self, step):
        return self.checkpoint_every > 0 and step % self.checkpoint_every == 0 or step == self.total_steps

    def save(self, step, state):
        """Flash checkpoint of this rank; then the shards finished since the last save are
        acknowledged as part of it."""
        stats = self.ckpt.save(step, state)
        self._saves += 1
        persist = self.persist_every > 0 and self._saves % self.persist_every == 0 or step == self.total_steps
        self.report("saved", step=step, blocking_s=stats["seconds"], persist=persist)
        if self._finished_shards:
            self._call("/v1/shards/complete", {"node": self.node, "restart": self.restart, "step": step,
                                               "shards": self._finished_shards})
            self._finished_shards = []
        return stats

    # ---- data shards ----
    def next_shard(self):
        """The next data shard id for this rank, or None when the service has none (or the job
        has no shard service). The shard counts as done at the next save()."""
        if not self._master:
            return None
        body = {"node": self.node, "restart": self.restart, "request": self._shard_requests}
        if self.local_rank:  # one of several trainers on the node: each numbers its own requests
            body["local_rank"] = self.local_rank
        r = self._call("/v1/shards/next", body, allow=(404,))
        if r is None or r.get("shard") is None:
            return None
        self._shard_requests += 1
        self._finished_shards.append(r["shard"])
        return r["shard"]

    def _call(self, path, body, allow=()):
        req = urllib.request.Request(self._master + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": "Bearer " + self._token,
                                              "Content-Type": "application/json"})
        failures = 0
        while failures < 50:  # the master may be restarting: keep trying for ~10 s
            try:
                with urllib.request.urlopen(req, timeout=5, context=self._tls) as resp:
                    return json.loads(resp.read())
            except urllib.error.HTTPError as err:
                if err.code in allow:
                    return None
                text = err.read()
                if err.code == 409 and b"still loading" in text:
                    time.sleep(0.2)  # other ranks are loading the checkpoint: for as long as they take
                    continue
                if err.code == 409 or err.code >= 500:
                    failures += 1
                    time.sleep(0.2)
                    continue
                raise RuntimeError(f"goodput master refused {path}: {err.code} {text[:200]!r}") from err
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                failures += 1
                time.sleep(0.2)
        raise RuntimeError(f"goodput master at {self._master} did not answer {path}")
