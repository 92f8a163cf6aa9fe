#!/usr/bin/python3
"""Flash-checkpoint benchmark: each figure next to its baseline, measured in the same run.

    PYTHONPATH=build/python /usr/bin/python3 bench/ckpt_bench.py [--sizes 256M,1G,4G] [--dir DIR]

- memcpy: copying the state into memory that is already mapped, on one thread and on as many
  threads as a checkpoint copies with (the limit for a save and for a restore into a live model's
  tensors), and into fresh memory (the limit for a restore into new tensors, which must fault its
  destination in, as torch.load must).
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
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

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


def best(f, repeat=3, sync=lambda: None):
    """The fastest of `repeat` runs of f; `sync` waits for work f left running (a device's)."""
    times = []
    for _ in range(repeat):
        sync()
        t0 = time.perf_counter()
        f()
        sync()
        times.append(time.perf_counter() - t0)
    return min(times)


def torch_save_synced(state, path):
    """torch.save to a file, flushed and fsynced: a save that survives the machine, as a persist."""
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


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


def copy_all(dst, src):
    for k, v in src.items():
        dst[k].copy_(v)


def fresh_memcpy(src):
    def run():
        copy_all({k: torch.empty_like(v) for k, v in src.items()}, src)
    return run


def shm_read(prefix, threads):
    """A bare read of the newest shared-memory object into memory already mapped, in 1 MiB chunks
    on `threads` threads, as a restore into tensors reads it: the kernel's limit for that restore."""
    objects = [os.path.join("/dev/shm", f) for f in os.listdir("/dev/shm") if f.startswith(prefix.lstrip("/"))]
    path = max(objects, key=os.path.getmtime)
    size = os.path.getsize(path)
    buf = torch.empty(size, dtype=torch.uint8)
    view = memoryview(buf.numpy())
    chunk = 1 << 20
    fd = os.open(path, os.O_RDONLY)

    def part(k):
        for off in range(k * chunk, size, threads * chunk):
            os.preadv(fd, [view[off:off + chunk]], off)

    def run():
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(part, range(threads)))

    try:
        run()  # maps the destination
        return best(run), size
    finally:
        os.close(fd)


def checkpoint_threads(nbytes):
    # As FlashCheckpoint copies: all cores (at most 8) from 32 MiB on.
    return min(os.cpu_count() or 1, 8) if nbytes >= (32 << 20) else 1


def enough_memory(nbytes):
    # At the peak: the state, both shared-memory copies and a live model's tensors.
    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    return avail > 4.5 * nbytes


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="256M,1G,4G", help="state sizes (a size that does not fit in memory is skipped)")
    ap.add_argument("--dir", default=None, help="storage directory (default: a temporary one under /tmp)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    root = args.dir or tempfile.mkdtemp(prefix="goodput-bench-")
    try:
        run(args, root)
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)


def run(args, root):
    print(f"flash checkpoint benchmark, storage under {root}; torch on one thread\n")
    print(f"{'size':>6} {'memcpy':>9} {'memcpyxN':>9} {'fresh':>9} | {'1st save':>9} {'reserved':>9} {'save':>9} {'%memcpyN':>8} {'restore':>9} {'%fresh':>7} "
          f"{'into':>9} {'%memcpy':>8} {'%memcpyN':>8} {'shm-read':>9} {'%':>5} | {'persist':>9} {'seq-write':>9} {'%':>5} | {'torch.save':>10} {'torch.load':>10} | {'save x':>7} {'load x':>7}")
    for size_text in args.sizes.split(","):
        size = parse_size(size_text)
        if not enough_memory(size):
            print(f"{size_text:>6} skipped: MemAvailable is under 4.5 times the state")
            continue
        state = make_state(size)
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        dst = {k: torch.empty_like(v) for k, v in state.items()}
        copy_all(dst, state)
        memcpy = best(lambda: copy_all(dst, state))
        threads = checkpoint_threads(nbytes)
        torch.set_num_threads(threads)
        memcpy_n = best(lambda: copy_all(dst, state))
        torch.set_num_threads(1)
        del dst
        fresh = best(fresh_memcpy(state))

        job = f"bench{os.getpid()}"
        prefix = f"/goodput-bench-{os.getpid()}"
        storage = os.path.join(root, f"flash-{size_text}")
        ck = FlashCheckpoint(job, storage_dir=storage, shm_prefix=prefix, keep=1)
        try:
            step = [0]

            def save():
                step[0] += 1
                ck.save(step[0], state)

            t0 = time.perf_counter()
            save()  # the first save into new shared memory: its pages are allocated as it copies
            t_first = time.perf_counter() - t0
            save()
            t_save = best(save)
            t_restore = min(restore_in_fresh_process(prefix, job) for _ in range(2))
            target = {k: torch.empty_like(v) for k, v in state.items()}  # a live model's tensors
            ck.load(into=target)
            t_into = best(lambda: ck.load(into=target))
            t_read, read_bytes = shm_read(prefix, threads)
            assert ck.last_load["placed"] == len(state)
            del target
            # The same first save into objects the agent reserved ahead (checkpoint_bytes_per_node).
            ahead = FlashCheckpoint(job + "r", storage_dir=storage, shm_prefix=prefix + "r", keep=1)
            try:
                ahead.reserve(nbytes)
                t0 = time.perf_counter()
                ahead.save(1, state)
                t_first_reserved = time.perf_counter() - t0
            finally:
                ahead.remove_memory()
            persist_times = []
            for _ in range(2):
                save()
                persist_times.append(ck.persist()["seconds"])
            t_persist = min(persist_times)
        finally:
            ck.remove_memory()

        seq_paths = []

        def seq_write():
            # A new file each time, the previous one kept: a persist writes a new checkpoint while
            # the older ones stay (rewriting one file would reuse the pages its truncation frees).
            seq_paths.append(os.path.join(root, f"seq-{size_text}-{len(seq_paths)}"))
            with open(seq_paths[-1], "wb") as f:
                for v in state.values():
                    f.write(memoryview(v.numpy()).cast("B"))
                f.flush()
                os.fsync(f.fileno())

        t_seq = best(seq_write, repeat=2)
        for p in seq_paths:
            os.unlink(p)

        tpath = os.path.join(root, f"torch-{size_text}.pt")

        t_tsave = best(lambda: torch_save_synced(state, tpath), repeat=2)
        t_tload = best(lambda: torch.load(tpath), repeat=2)
        os.unlink(tpath)

        print(f"{size_text:>6} {gbps(nbytes, memcpy):>7.2f}GB {gbps(nbytes, memcpy_n):>7.2f}GB {gbps(nbytes, fresh):>7.2f}GB | "
              f"{gbps(nbytes, t_first):>7.2f}GB {gbps(nbytes, t_first_reserved):>7.2f}GB "
              f"{gbps(nbytes, t_save):>7.2f}GB {memcpy_n / t_save * 100:>7.0f}% "
              f"{gbps(nbytes, t_restore):>7.2f}GB {fresh / t_restore * 100:>6.0f}% "
              f"{gbps(nbytes, t_into):>7.2f}GB {memcpy / t_into * 100:>7.0f}% {memcpy_n / t_into * 100:>7.0f}% "
              f"{gbps(read_bytes, t_read):>7.2f}GB {nbytes / t_into / (read_bytes / t_read) * 100:>4.0f}% | "
              f"{gbps(nbytes, t_persist):>7.2f}GB {gbps(nbytes, t_seq):>7.2f}GB {t_seq / t_persist * 100:>4.0f}% | "
              f"{gbps(nbytes, t_tsave):>8.2f}GB {gbps(nbytes, t_tload):>8.2f}GB | "
              f"{t_tsave / t_save:>6.1f}x {t_tload / t_restore:>6.1f}x")
    print("\nGB = GB/s. memcpyxN: copying into mapped memory on as many threads as a checkpoint uses "
          f"({checkpoint_threads(1 << 30)} here from 32 MiB); %memcpyN: against it; %memcpy: against one thread. "
          "shm-read: a bare pread of the shared-memory object on as many threads (the kernel's limit for into), "
          "%: into against it. 1st save: the first save into new shared memory; reserved: the same into objects "
          "reserved ahead (the agent does, from checkpoint_bytes_per_node). restore: into new memory in a fresh process, %fresh: against copying into fresh "
          "memory (4 KiB pages, "
          "as torch.empty gets); into: restore into a live model's tensors (load(into=...)); %: persist against a "
          "plain sequential write + fsync; x: torch.save / save and torch.load / restore.")


if __name__ == "__main__":
    main()
