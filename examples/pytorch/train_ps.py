"""A small real parameter-server job for Goodput's live mode: gloo on CPU, one process per node.

The job spec's replica groups say who is who (examples/pytorch/ps-job.json): parameter servers
("ps") own the model's tensors (tensor i lives on server i mod #servers) and their Adam state;
workers (and a chief, if there is one) hold no state of their own beyond the step. Each step is
synchronous: every server broadcasts its tensors, each trainer computes gradients on its own batch,
the gradients are summed onto the owning server, which averages them and takes the optimizer step.

Every rank saves its own flash checkpoint (a server: its tensors and optimizer state, by tensor
number; a trainer: its step), so a server killed with SIGKILL is restarted, the world restores the
newest step every rank holds, and the loss curve continues bit for bit (the data is a pure function
of step and trainer index). When an operator changes the number of servers (`goodput scale ps N`),
each server of the new layout reads the tensors it now owns from the servers that owned them in
the checkpoint's layout.

    goodput run examples/pytorch/ps-job.json --faults examples/pytorch/ps-faults.json

Flags:
    --hidden N          width of the hidden layer (default 128)
    --batch N           samples per trainer per step (default 64)
    --step-seconds S    extra time per step, to look like a bigger model (default 0)
"""

import argparse
import sys
import time

import torch
import torch.distributed as dist

from goodput.live import Session


def batch(seed, size, dim):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, dim, generator=g)
    y = torch.sin(x[:, :4] * 3).sum(dim=1, keepdim=True)
    return x, y


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--step-seconds", type=float, default=0.0)
    args = ap.parse_args()
    torch.set_num_threads(1)

    s = Session()
    dist.init_process_group("gloo")
    s.rendezvous_done()

    # The world's layout: chief (rank 0), then the servers, then the workers.
    chiefs, servers, workers = (s.replicas.get(t, 0) for t in ("chief", "ps", "worker"))
    server_ranks = list(range(chiefs, chiefs + servers))
    trainer_ranks = list(range(chiefs)) + list(range(chiefs + servers, chiefs + servers + workers))
    if not server_ranks or s.world_size != chiefs + servers + workers:
        sys.exit(f"rank {s.rank}: this job needs a ps group and a world of chief+ps+worker ranks, "
                 f"got {s.replicas} in a world of {s.world_size}")
    serving = s.rank in server_ranks
    trainer_index = trainer_ranks.index(s.rank) if not serving else None

    torch.manual_seed(0)
    dim = 32
    model = torch.nn.Sequential(torch.nn.Linear(dim, args.hidden), torch.nn.ReLU(), torch.nn.Linear(args.hidden, 1))
    params = list(model.parameters())
    owner = [server_ranks[i % len(server_ranks)] for i in range(len(params))]
    owned = [i for i in range(len(params)) if owner[i] == s.rank]
    opt = torch.optim.Adam([params[i] for i in owned], lr=1e-3) if serving else None

    step, state = s.restore()
    if step > 0 and serving:
        # Tensor i was on server i mod #servers of the layout the checkpoint was saved under.
        saved_servers = s.restored_replicas.get("ps", 0)
        states = {}
        with torch.no_grad():
            for i in owned:
                j = i % saved_servers
                if j not in states:  # this server's own state, or, after a scale, server j's then
                    states[j] = state if s.restored_replicas == s.replicas else s.load_replica("ps", j)
                params[i].copy_(states[j]["params"][i])
                opt.state[params[i]] = {k: v.clone() for k, v in states[j]["optim"][i].items()}
    print(f"rank {s.rank} ({s.replica_type} {s.replica_index}) restart {s.restart}: starting after step {step} "
          f"(from {s.loaded_from[0]})", flush=True)

    for step in range(step + 1, s.total_steps + 1):
        t0 = time.perf_counter()
        with torch.no_grad():
            for i, p in enumerate(params):  # the servers' current tensors to everyone
                dist.broadcast(p, src=owner[i])
        loss = None
        if serving:
            grads = [torch.zeros_like(p) for p in params]
        else:
            x, y = batch(step * 1000 + trainer_index, args.batch, dim)
            model.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            grads = [p.grad for p in params]
        for i, g in enumerate(grads):  # summed onto each tensor's server
            dist.reduce(g, dst=owner[i], op=dist.ReduceOp.SUM)
            if owner[i] == s.rank:
                params[i].grad = g / len(trainer_ranks)
        if serving:
            opt.step()
        s.step_done(step, loss.item() if loss is not None else None)
        if s.should_save(step):
            if serving:
                s.save(step, {"params": {i: params[i].detach() for i in owned},
                              "optim": {i: opt.state[params[i]] for i in owned}, "step": step})
            else:
                s.save(step, {"step": step})
        left = args.step_seconds - (time.perf_counter() - t0)
        if left > 0:
            time.sleep(left)

    s.done(s.total_steps)
    if serving:
        digest = sum(float(params[i].double().sum()) for i in owned)
        print(f"rank {s.rank}: server done at step {s.total_steps}, tensor sum {digest:.10f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
