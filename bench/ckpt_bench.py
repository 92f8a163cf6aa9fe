#!/usr/bin/python3
"""Flash-checkpoint benchmark: each figure next to its baseline, measured in the same run.

    PYTHONPATH=build/python /usr/bin/python3 bench/ckpt_bench.py [--sizes 256M,1G,4G] [--dir DIR]

- memcpy: copying the state into memory that is already mapped (the limit for a save), and into
  fresh memory (the limit for a restore, which must fault its destination in, as torch.load must).
- save: the blocking part of FlashCheckpoint.save (into shared memory), after the first save.
- restore: FlashCheckpoint.load from shared memory, in a process that has not mapped it; and
  load(into=...) into tensors that exist already (a restarted trainer's model), against memcpy.
- persist: FlashCheckpoint.persist (copy out of shared memory, write around the page cache, fsync,
  rename) against a plain sequential write + fsync of the same bytes to a new file (dd-style), the
  previous file kept as a persist keeps the previous checkpoint.
- torch.save / torch.load of the same state dict to the same directory, with fsync.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from goodput.checkpoint import FlashCheckpoint


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1].upper()]) if s[-1].upper() in units else int(s)


def make_state(nbytes):
    n = 16
    per = nbytes // 4 // n
    return {f"layer{i}.weight": torch.randn(per) for i in range(n)}


def gbps(nbytes, seconds):
    return nbytes / seconds / 1e9


def best(f, repeat=3):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return min(times)


def restore_in_fresh_process(prefix, job):
    code = f"""
import time, sys
from goodput.checkpoint import FlashCheckpoint
c = FlashCheckpoint({job!r}, shm_prefix={prefix!r})
t0 = time.perf_counter(); step, state = c.load(); t = time.perf_counter() - t0
assert c.last_load["tier"] == "memory"
print(t)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    return float(out.stdout.strip())


def fresh_memcpy(src):
    def run():
        dst = torch.empty_like(src)
        dst.copy_(src)
    return run


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="256M,1G")
    ap.add_argument("--dir", default=None, help="storage directory (default: a temporary one under /tmp)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = args.dir or tempfile.mkdtemp(prefix="goodput-bench-")
    print(f"flash checkpoint benchmark, storage under {root}, one thread\n")
    print(f"{'size':>6} {'memcpy':>9} {'fresh':>9} | {'save':>9} {'%memcpy':>8} {'restore':>9} {'%fresh':>7} "
          f"{'%memcpy':>8} {'into':>9} {'%memcpy':>8} | {'persist':>9} {'seq-write':>9} {'%':>5} | {'torch.save':>10} {'torch.load':>10} | {'save x':>7} {'load x':>7}")
    for size_text in args.sizes.split(","):
        size = parse_size(size_text)
        state = make_state(size)
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        flat = torch.cat(list(state.values()))
        dst = torch.empty_like(flat)
        dst.copy_(flat)
        memcpy = best(lambda: dst.copy_(flat))
        fresh = best(fresh_memcpy(flat))
        del dst

        job = f"bench{os.getpid()}"
        prefix = f"/goodput-bench-{os.getpid()}"
        storage = os.path.join(root, f"flash-{size_text}")
        ck = FlashCheckpoint(job, storage_dir=storage, shm_prefix=prefix, keep=1)
        try:
            step = [0]

            def save():
                step[0] += 1
                ck.save(step[0], state)

            save()  # first save maps the objects
            save()
            t_save = best(save)
            t_restore = min(restore_in_fresh_process(prefix, job) for _ in range(2))
            target = {k: torch.empty_like(v) for k, v in state.items()}  # a live model's tensors
            ck.load(into=target)
            t_into = best(lambda: ck.load(into=target))
            assert ck.last_load["placed"] == len(state)
            persist_times = []
            for _ in range(2):
                save()
                persist_times.append(ck.persist()["seconds"])
            t_persist = min(persist_times)
        finally:
            ck.remove_memory()

        raw = flat.numpy().tobytes() if size <= (1 << 30) else None
        seq_paths = []

        def seq_write():
            # A new file each time, the previous one kept: a persist writes a new checkpoint while
            # the older ones stay (rewriting one file would reuse the pages its truncation frees).
            seq_paths.append(os.path.join(root, f"seq-{size_text}-{len(seq_paths)}"))
            with open(seq_paths[-1], "wb") as f:
                if raw is not None:
                    f.write(raw)
                else:
                    f.write(memoryview(flat.numpy()))
                f.flush()
                os.fsync(f.fileno())

        t_seq = best(seq_write, repeat=2)
        for p in seq_paths:
            os.unlink(p)
        del raw

        tpath = os.path.join(root, f"torch-{size_text}.pt")

        def tsave():
            with open(tpath, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())

        t_tsave = best(tsave, repeat=2)
        t_tload = best(lambda: torch.load(tpath), repeat=2)
        os.unlink(tpath)

        print(f"{size_text:>6} {gbps(nbytes, memcpy):>7.2f}GB {gbps(nbytes, fresh):>7.2f}GB | "
              f"{gbps(nbytes, t_save):>7.2f}GB {t_save and memcpy / t_save * 100:>7.0f}% "
              f"{gbps(nbytes, t_restore):>7.2f}GB {fresh / t_restore * 100:>6.0f}% {memcpy / t_restore * 100:>7.0f}% "
              f"{gbps(nbytes, t_into):>7.2f}GB {memcpy / t_into * 100:>7.0f}% | "
              f"{gbps(nbytes, t_persist):>7.2f}GB {gbps(nbytes, t_seq):>7.2f}GB {t_seq / t_persist * 100:>4.0f}% | "
              f"{gbps(nbytes, t_tsave):>8.2f}GB {gbps(nbytes, t_tload):>8.2f}GB | "
              f"{t_tsave / t_save:>6.1f}x {t_tload / t_restore:>6.1f}x")
    print("\nGB = GB/s. %memcpy: save against copying into mapped memory; %fresh: restore against copying into "
          "fresh memory (4 KiB pages, as torch.empty gets) and into mapped memory; into: restore into a live model's tensors "
          "(load(into=...)) against copying into mapped memory; %: persist against a plain sequential write + fsync; x: torch.save / save and "
          "torch.load / restore.")


if __name__ == "__main__":
    main()
