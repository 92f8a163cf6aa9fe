"""The 2 x 2 job of bench/live_recovery.py: the same DDP script under torchrun and goodput torchrun.

A torchrun script as users write it: the process group from the environment, an MLP on synthetic
data that is a pure function of (step, rank). By default it keeps its own checkpoint, `torch.save`
every --save-every steps, and resumes from it after a restart; with --flash it keeps its state in
goodput.live's flash checkpoints instead (the step interval is then the policy's).

Each rank appends what the benchmark measures to OUT/log-RANK.jsonl, with wall-clock times taken
before `import torch` where it matters:
    {"start": T, "pid": P, "restart": N}      the process began (TORCHELASTIC_RESTART_COUNT = N)
    {"from": STEP, "t": T}                    restored; the next step trained is STEP + 1
    {"step": S, "t": T}                       step S done
    {"sigterm": T}                            its launcher stopped it

    python3 bench/recovery_job.py OUT --steps N [--save-every K] [--step-seconds S] [--flash]
"""

import time

STARTED = time.time()

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--save-every", type=int, default=20)
    ap.add_argument("--step-seconds", type=float, default=0.05)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--flash", action="store_true", help="flash checkpoints through goodput.live.Session")
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    log = open(os.path.join(args.out, f"log-{rank}.jsonl"), "a", buffering=1)

    def record(**fields):
        log.write(json.dumps(fields) + "\n")

    record(start=STARTED, pid=os.getpid(), restart=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")))

    def stopped(signum, frame):
        record(sigterm=time.time())
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, stopped)

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    session = None
    if args.flash:
        from goodput.live import Session
        session = Session()
    dist.init_process_group("gloo")
    if session:
        session.rendezvous_done()
    world = dist.get_world_size()
    torch.manual_seed(0)
    dim = 32
    model = torch.nn.Sequential(torch.nn.Linear(dim, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, args.hidden), torch.nn.ReLU(),
                                torch.nn.Linear(args.hidden, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    ckpt = os.path.join(args.out, f"ckpt-{rank}.pt")
    start, state = 0, None
    if session:
        start, state = session.restore()
    elif os.path.exists(ckpt):
        state = torch.load(ckpt)
        start = state["step"]
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
    record(**{"from": start, "t": time.time()})

    for step in range(start + 1, args.steps + 1):
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(64, dim, generator=g)
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        snapshot = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
        if session:
            session.step_done(step, loss.item())
            if session.should_save(step):
                session.save(step, snapshot)
        elif step % args.save_every == 0:
            torch.save(snapshot, ckpt + ".tmp")
            os.replace(ckpt + ".tmp", ckpt)
        record(step=step, t=time.time())
        left = args.step_seconds - (time.perf_counter() - t0)
        if left > 0:
            time.sleep(left)
    if session:
        session.done(args.steps)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
