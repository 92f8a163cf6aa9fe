"""A small real DDP job for Goodput's live mode: gloo on CPU, one process per node.

A regression MLP trained on synthetic data that is a pure function of the data shard (or, without
the shard service, of the step and rank), so a run that is killed and restored reproduces the
loss curve of an uninterrupted run bit for bit. Flash checkpoints hold the model, the optimizer,
the step and the number of samples trained on.

    goodput run examples/pytorch/job.json --faults examples/pytorch/faults.json

Flags (after the script name in the job's command):
    --hidden N          width of the hidden layers (default 256)
    --batch N           samples per shard / per step (default 64)
    --step-seconds S    extra time per step, to look like a bigger model (default 0)
    --oom-mb N          allocate N MiB every step (a real allocation: memory limits bite)
    --slow-node NAME    on the node named NAME (GOODPUT_NODE_NAME), do --slow-factor times the CPU
    --slow-factor F     work of a step (a straggler; default 3)
"""

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from goodput.live import Session


def batch(seed, size, dim):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, dim, generator=g)
    y = torch.sin(x[:, :4] * 3).sum(dim=1, keepdim=True)  # a target worth learning
    return x, y


def rank_ordered_mean(state, bucket):
    """DDP's gradient averaging, with each element summed over the ranks in rank order: an
    all-reduce of more than two ranks adds them in an order that follows the bucket's layout, and
    DDP lays its buckets out anew after a restart, so the sums (and, a few steps on, the model)
    would differ from an uninterrupted run's in their last bits. Gathering costs world_size times
    the traffic of an all-reduce: right for a model this small, and the point of the example."""
    grads = bucket.buffer()
    parts = [torch.empty_like(grads) for _ in range(dist.get_world_size())]
    work = dist.all_gather(parts, grads, async_op=True)

    def mean(fut):
        fut.value()  # raises if the gather failed (a peer died): never train on unfilled buffers
        total = parts[0].clone()
        for p in parts[1:]:
            total += p
        return total.div_(len(parts))

    return work.get_future().then(mean)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--step-seconds", type=float, default=0.0)
    ap.add_argument("--oom-mb", type=int, default=0)
    ap.add_argument("--slow-node", default="")
    ap.add_argument("--slow-factor", type=float, default=3.0)
    args = ap.parse_args()
    torch.set_num_threads(1)

    s = Session()
    dist.init_process_group("gloo")
    s.rendezvous_done()

    torch.manual_seed(0)
    dim = 32
    model = torch.nn.Sequential(torch.nn.Linear(dim, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    ddp = DDP(model)  # before the restore: its set-up is part of getting back to training
    if dist.get_world_size() > 2:  # two ranks add up the same in either order
        ddp.register_comm_hook(None, rank_ordered_mean)
    step, state = s.restore()
    if state is None and step > 0:  # a worker added by `goodput scale worker N`: every rank's state is the same
        state = s.load_replica("worker", 0)
    samples = 0
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        samples = state["samples"]
    print(f"rank {s.rank}/{s.world_size} restart {s.restart}: starting after step {step} "
          f"(from {s.loaded_from[0]})", flush=True)

    slow = args.slow_node and os.environ.get("GOODPUT_NODE_NAME") == args.slow_node
    burn = torch.randn(64, 64)
    for step in range(step + 1, s.total_steps + 1):
        t0 = time.perf_counter()
        c0 = time.process_time()
        if args.oom_mb:
            scratch = torch.empty(args.oom_mb << 20, dtype=torch.uint8)  # noqa: F841 (allocated on purpose)
        shard = s.next_shard()
        seed = 1_000_000 + shard if shard is not None else step * 1000 + s.rank
        x, y = batch(seed, args.batch, dim)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        if slow:  # a straggler: the same step costs this node slow_factor times the CPU work
            target = (time.process_time() - c0) * (args.slow_factor - 1)
            c1 = time.process_time()
            while time.process_time() - c1 < target:
                burn = torch.tanh(burn @ burn)
        if shard is not None:
            samples += args.batch
        s.step_done(step, loss.item())
        if s.should_save(step):
            s.save(step, {"model": model.state_dict(), "optim": opt.state_dict(), "step": step, "samples": samples})
        left = args.step_seconds - (time.perf_counter() - t0)
        if left > 0:
            time.sleep(left)

    total = torch.tensor([samples])
    dist.all_reduce(total)
    s.done(s.total_steps, samples=int(total.item()))
    digest = sum(float(p.double().sum()) for p in model.parameters())  # the same on every rank
    print(f"rank {s.rank}: done at step {s.total_steps}, {int(total.item())} samples trained across ranks, "
          f"parameter sum {digest:.10f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
