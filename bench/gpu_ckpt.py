#!/usr/bin/python3
"""Flash checkpoints of accelerator tensors, and the NCCL collective probe: the checks that need a GPU.

    PYTHONPATH=build/python /usr/bin/python3 bench/gpu_ckpt.py [--sizes 1G,4G] [--device cuda] [--dir DIR]

For each size, a state dict of tensors on the device (a model's weights and Adam's two moments, in
float32 and bfloat16) goes through FlashCheckpoint and back, and every figure is printed next to its
baseline from the same run:
- save: the blocking part of FlashCheckpoint.save (device -> host, then into shared memory), against
  copying the same tensors device -> host into pinned memory that is already allocated (the limit)
  and against torch.save of the state dict to --dir.
- restore: FlashCheckpoint.load(into=...) into the device tensors of a live model, against copying
  pinned host memory -> device (the limit) and against torch.load(map_location=device).
- round trip: every tensor must come back bit-identical (exit 1 if not).
Then, with --nccl (and CUDA), the node check's collective probe with two processes and NCCL
(`python3 -m goodput.collective_probe --backend nccl`), whose answer is printed as it is. NCCL does
not put two ranks of one communicator on one GPU, so on a one-GPU machine its expected answer is an
error naming that; with two GPUs each rank takes its own (CUDA_VISIBLE_DEVICES).

--device cpu runs the same on host tensors (to try the script without a GPU; the figures then say
nothing about devices).
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import torch

from ckpt_bench import gbps, parse_size, torch_save_synced  # bench/ is this script's directory
from ckpt_bench import best as best_on_host
from goodput.checkpoint import FlashCheckpoint


def best(f, device, repeat=3):
    # A device runs copies asynchronously: wait for it before and after each run.
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    return best_on_host(f, repeat, sync)


def make_state(nbytes, device):
    # Weights and optimizer moments: half the bytes float32, half bfloat16, in 4 layers.
    g = torch.Generator().manual_seed(0)
    state, per = {}, nbytes // 16
    for i in range(4):
        state[f"layer{i}.weight"] = torch.randn(per // 4, generator=g).to(device)
        state[f"layer{i}.exp_avg"] = torch.randn(per // 4, generator=g).to(device)
        state[f"layer{i}.bf16"] = torch.randn(per // 2, generator=g).to(torch.bfloat16).to(device)
        state[f"layer{i}.bf16_sq"] = torch.randn(per // 2, generator=g).to(torch.bfloat16).to(device)
    return state


def nbytes_of(state):
    return sum(t.numel() * t.element_size() for t in state.values())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def nccl_probe():
    port = free_port()
    gpus = torch.cuda.device_count()
    procs = []
    for rank in (0, 1):
        env = dict(os.environ)
        if gpus >= 2:
            env["CUDA_VISIBLE_DEVICES"] = str(rank)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "goodput.collective_probe", "--rank", str(rank), "--addr", "127.0.0.1",
             "--port", str(port), "--bytes", str(256 << 20), "--backend", "nccl", "--timeout", "60"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
    for rank, p in enumerate(procs):
        out, err = p.communicate(timeout=120)
        print(f"nccl probe rank {rank} ({gpus} GPU(s) here): exit {p.returncode}: {out.strip() or err.strip()[-400:]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1G,4G")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dir", default=None, help="where torch.save writes (default: a temporary directory)")
    ap.add_argument("--nccl", action="store_true", help="also run the NCCL collective probe")
    a = ap.parse_args()
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"no CUDA device here (torch {torch.__version__}, built with CUDA {torch.version.cuda}): "
              "nothing to measure; --device cpu tries the script on host tensors")
        return 2
    if a.device.startswith("cuda"):
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    root = a.dir or tempfile.mkdtemp(prefix="goodput-gpu-bench-")
    bad = 0
    try:
        print(f"{'size':>6} | {'d2h pinned':>10} {'save':>9} {'%':>5} {'torch.save':>10} {'x':>6} | "
              f"{'h2d pinned':>10} {'restore':>9} {'%':>5} {'torch.load':>10} {'x':>6} | round trip")
        for size_text in a.sizes.split(","):
            state = make_state(parse_size(size_text), a.device)
            n = nbytes_of(state)
            pinned = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=a.device.startswith("cuda"))
                      for k, v in state.items()}
            t_d2h = best(lambda: [pinned[k].copy_(v) for k, v in state.items()], a.device)
            t_h2d = best(lambda: [v.copy_(pinned[k]) for k, v in state.items()], a.device)
            del pinned

            job, prefix = f"gpubench{os.getpid()}", f"/goodput-gpubench-{os.getpid()}"
            ck = FlashCheckpoint(job, storage_dir=os.path.join(root, "flash"), shm_prefix=prefix, keep=1)
            try:
                step = [0]

                def save():
                    step[0] += 1
                    ck.save(step[0], state)

                save()
                t_save = best(save, a.device)
                live = {k: torch.zeros_like(v) for k, v in state.items()}  # a restarted model's tensors
                t_load = best(lambda: ck.load(into=live), a.device)
                same = all(torch.equal(live[k], v) for k, v in state.items())
                bad += not same
                del live
            finally:
                ck.remove_memory()

            path = os.path.join(root, f"torch-{size_text}.pt")

            t_tsave = best(lambda: torch_save_synced(state, path), a.device, repeat=2)
            t_tload = best(lambda: torch.load(path, map_location=a.device), a.device, repeat=2)
            os.unlink(path)
            print(f"{size_text:>6} | {gbps(n, t_d2h):>8.2f}GB {gbps(n, t_save):>7.2f}GB {t_d2h / t_save * 100:>4.0f}% "
                  f"{gbps(n, t_tsave):>8.2f}GB {t_tsave / t_save:>5.1f}x | {gbps(n, t_h2d):>8.2f}GB {gbps(n, t_load):>7.2f}GB "
                  f"{t_h2d / t_load * 100:>4.0f}% {gbps(n, t_tload):>8.2f}GB {t_tload / t_load:>5.1f}x | "
                  f"{'bit-identical' if same else 'DIFFERENT'}")
            del state
        print("\nGB = GB/s. %: against the pinned copy in the same direction; x: torch.save / save, torch.load / restore.")
        if a.nccl and a.device.startswith("cuda"):
            nccl_probe()
    finally:
        if not a.dir:
            shutil.rmtree(root, ignore_errors=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
