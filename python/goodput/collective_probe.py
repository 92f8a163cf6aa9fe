"""The node check's collective probe for PyTorch jobs: two processes, one on each node of a pair,
all-reduce a buffer through torch.distributed the way the job's own traffic goes (gloo between
host buffers; NCCL between GPUs with --backend nccl, or auto where CUDA is present), check the sum,
and time it. Started by the node agents (`"node_check": {"collective": [...]}` in the job
spec), not by people:

    python3 -m goodput.collective_probe --rank 0|1 --addr HOST --port PORT --bytes N [--timeout S]
                                        [--backend gloo|nccl|auto]

Rank 0 hosts the rendezvous store on PORT. Prints one JSON line: {"ok": true, "mb_per_s": ...} or
{"ok": false, "error": "..."}; the bandwidth is bytes reduced per second (the algorithm's, not the
wire's).
"""

import argparse
import datetime
import json
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, required=True, choices=[0, 1])
    ap.add_argument("--addr", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--bytes", type=int, default=8 << 20)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=30)
    ap.add_argument("--backend", choices=["gloo", "nccl", "auto"], default="gloo",
                    help="auto: nccl where CUDA is available, else gloo")
    a = ap.parse_args()
    try:
        import torch
        import torch.distributed as dist
        backend = a.backend
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        device = "cpu"
        if backend == "nccl":
            if not torch.cuda.is_available():
                raise RuntimeError("--backend nccl needs a CUDA device, and this node has none")
            device = f"cuda:{torch.cuda.current_device()}"
        dist.init_process_group(backend, init_method=f"tcp://{a.addr}:{a.port}", rank=a.rank, world_size=2,
                                timeout=datetime.timedelta(seconds=a.timeout))
        x = torch.empty(max(a.bytes // 4, 1), dtype=torch.float32, device=device)
        x.fill_(a.rank + 1)
        dist.all_reduce(x)  # warm-up: connections are made here
        if not bool((x == 3).all()):
            raise RuntimeError("all_reduce returned a wrong sum")
        start = time.perf_counter()
        for _ in range(a.iters):
            x.fill_(a.rank + 1)
            dist.all_reduce(x)
            if not bool((x == 3).all()):  # waits for the device: the time is the transfer's
                raise RuntimeError("all_reduce returned a wrong sum")
        seconds = time.perf_counter() - start
        dist.destroy_process_group()
        print(json.dumps({"ok": True, "backend": backend, "mb_per_s": int(x.numel() * 4 * a.iters / max(seconds, 1e-9) / 1e6)}), flush=True)
    except Exception as e:  # noqa: BLE001 - any failure is the probe's result, reported to the agent
        print(json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"[:500]}), flush=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
