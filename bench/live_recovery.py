"""Live recovery: how fast a real job notices a failure and trains again, beside the real torchrun.

Two measurements, each from real processes, real signals and the job's own records:

1. torchrun vs goodput torchrun (the default): one 2 x 2 job (two launchers on this machine, as two
   nodes, two gloo trainers each: bench/recovery_job.py) and one fault, run side by side under
   - the real torchrun (Debian's 1.13 through shared/tools/torchrun_py311.py), `--max-restarts=3`,
     the script keeping its own `torch.save` checkpoint every K steps;
   - `goodput torchrun` with the same command line and the same script (its own checkpoint);
   - `goodput torchrun` with the script on goodput.live's flash checkpoints (--flash).
   The benchmark SIGKILLs global rank 1 when it reports step S and reads back: detection (kill ->
   the launcher knows: torchrun's "Worker group FAILED" log line, Goodput's failure_observed
   event), kill -> training again (the first step every rank completes after the restart), steps
   recomputed (the last step done before the kill minus the step restored), and the goodput of the
   whole run (the steps at one step time for all, the median of every run's, over the run's wall
   time, start-up included); each launcher's own median step time is shown beside it.
2. --faults: the DDP example under `goodput run`, one process per node, a process restart (from
   host memory) cold and warm (recovery.warm_start: the restart runs in an interpreter started
   beforehand with torch imported), a node relaunch onto a new node restoring from storage and
   from a peer's copy of its memory checkpoint (checkpoint.replicas: 1), and onto a warm spare
   ("spares": 1), against the same run's cold start, with the steps each recomputed.

    PYTHONPATH=build/python /usr/bin/python3 bench/live_recovery.py [--runs 3] [--faults | --faults-only]
"""

import argparse
import json
import os
import re
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOODPUT = os.path.join(ROOT, "build", "goodput")
JOB = os.path.join(ROOT, "bench", "recovery_job.py")
SHARED = os.environ.get("GOODPUT_SHARED_DATA", os.path.join(ROOT, "..", "shared", "data"))
TORCHRUN = os.path.join(os.path.dirname(os.path.abspath(SHARED)), "tools", "torchrun_py311.py")
FLASH_POLICY = {"name": "flash every step (bench)",
                "recovery": {"policy": "diagnose", "restore_from": "memory"},
                "checkpoint": {"policy": "flash", "every_steps": 1, "persist_every": 50},
                "scaling": {"policy": "wait"}}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_log(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.endswith("\n")]


class Launcher:
    """One launcher process (a "node"), its stderr lines stamped with the wall time they arrived."""

    def __init__(self, cmd, env):
        self.lines = []
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stderr:
            self.lines.append((time.time(), line.rstrip("\n")))

    def wait(self, timeout):
        try:
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        self.reader.join(5)
        return self.proc.returncode


def run_pair(kind, tmp, i, args):
    """One run of the 2 x 2 job under `kind` (torchrun, goodput, goodput-flash), rank 1 killed at
    step args.kill_step + offset; returns its measurements."""
    out = os.path.join(tmp, f"{kind}-{i}")
    os.makedirs(out)
    port = free_port()
    kill_step = args.kill_step + (7 * i) % args.save_every  # spread the kill over the checkpoint interval
    script = [JOB, out, "--steps", str(args.steps), "--save-every", str(args.save_every),
              "--step-seconds", str(args.step_seconds)] + (["--flash"] if kind == "goodput-flash" else [])
    # torchrun 1.13's spellings (it knows no hyphens); goodput torchrun takes both.
    common = ["--nnodes=2", "--nproc_per_node=2", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
              f"--rdzv_id=bench{i}", "--max_restarts=3"]
    env = dict(os.environ, LOGLEVEL="INFO", PYTHON_EXEC=sys.executable, GOODPUT_TOKEN=f"bench-token-{i}",
               PYTHONPATH=os.path.join(ROOT, "build", "python"))
    t0 = time.time()
    launchers = []
    if kind == "torchrun":
        for _ in range(2):
            launchers.append(Launcher([sys.executable, TORCHRUN] + common + script, env))
    else:
        extra = ["--trainer-reports=no"] if kind == "goodput" else ["--trainer-reports=yes", "--total-steps",
                                                                    str(args.steps), "--policy", args.flash_policy]
        for node_rank in (1, 0):  # the agent first: it waits for the master on the rendezvous host
            launchers.append(Launcher([GOODPUT, "torchrun"] + common + extra + [
                f"--node_rank={node_rank}", "--run-dir", os.path.join(out, f"run{node_rank}")] + script, env))
            time.sleep(0.3)
    # Kill rank 1 when it reports kill_step (its first life).
    victim = os.path.join(out, "log-1.jsonl")
    killed_at, deadline = None, time.time() + args.timeout
    while killed_at is None and time.time() < deadline:
        recs = read_log(victim)
        if any(r.get("step", 0) >= kill_step for r in recs):
            os.kill(recs[0]["pid"], signal.SIGKILL)
            killed_at = time.time()
        elif any(l.proc.poll() is not None for l in launchers):
            break
        time.sleep(0.005)
    codes = [l.wait(max(1, deadline - time.time())) for l in launchers]
    wall = time.time() - t0
    if killed_at is None or any(codes):
        tails = "\n".join(line for l in launchers for _, line in l.lines[-15:])
        raise RuntimeError(f"{kind} run {i}: killed={killed_at is not None} exit codes {codes}\n{tails}")

    logs = {r: read_log(os.path.join(out, f"log-{r}.jsonl")) for r in range(4)}
    before = max(x["step"] for r in logs for x in logs[r] if "step" in x and x["t"] < killed_at)
    restored = {r: [x["from"] for x in logs[r] if "from" in x][-1] for r in logs}
    if len(set(restored.values())) != 1:
        raise RuntimeError(f"{kind} run {i}: ranks restored different steps {restored}")
    resumed = max(next(x["t"] for x in logs[r] if "step" in x and x["t"] > killed_at) for r in logs)
    for r in logs:
        if max(x.get("step", 0) for x in logs[r]) != args.steps:
            raise RuntimeError(f"{kind} run {i}: rank {r} did not finish")
    steps0 = [x["t"] for x in logs[0] if "step" in x]
    gaps = sorted(b - a for a, b in zip(steps0, steps0[1:]) if b > a)
    step_time = statistics.median(gaps)
    if kind == "torchrun":
        seen = [t for l in launchers for t, line in l.lines
                if t > killed_at and re.search(r"Worker group FAILED|Worker group UNHEALTHY", line)]
        if not seen:
            raise RuntimeError(f"torchrun run {i}: no 'Worker group FAILED' line (LOGLEVEL=INFO)")
        detected = min(seen)
    else:
        db = sqlite3.connect(os.path.join(out, "run0", "events.db"))
        epoch = int(db.execute("SELECT value FROM meta WHERE key='epoch_unix_ns'").fetchone()[0])
        t_ns = db.execute("SELECT MIN(time_ns) FROM events WHERE type='failure_observed'").fetchone()[0]
        db.close()
        detected = (epoch + t_ns) / 1e9
    return {"detection": detected - killed_at, "training": resumed - killed_at,
            "recomputed": before - restored[0], "wall": wall, "step_time": step_time}


def compare_torchrun(args):
    kinds = [("torchrun", f"torchrun --max-restarts=3, torch.save every {args.save_every} steps"),
             ("goodput", f"goodput torchrun, the same script (torch.save every {args.save_every} steps)"),
             ("goodput-flash", "goodput torchrun, flash checkpoints (goodput.live)")]
    if not os.path.exists(TORCHRUN):
        print(f"note: {TORCHRUN} is missing: no torchrun baseline", file=sys.stderr)
        kinds = kinds[1:]
    with tempfile.TemporaryDirectory() as tmp:
        args.flash_policy = os.path.join(tmp, "flash-policy.json")
        with open(args.flash_policy, "w") as f:
            json.dump(FLASH_POLICY, f)
        res = {k: [] for k, _ in kinds}
        for i in range(args.runs):  # interleaved, so that a noisy minute hurts every launcher alike
            for k, _ in kinds:
                res[k].append(run_pair(k, tmp, i, args))
                print(f"run {i + 1}/{args.runs} {k}: {res[k][-1]['training']:.2f}s kill->training, "
                      f"{res[k][-1]['recomputed']} steps recomputed", file=sys.stderr)
    # Goodput = the steps at one step time for every launcher (the median over all runs: a launcher
    # whose steps run slower gets no credit for it) over the run's wall time, start-up included.
    reference = statistics.median(r["step_time"] for k in res for r in res[k])
    for k in res:
        for r in res[k]:
            r["goodput"] = args.steps * reference / r["wall"]
    cols = ("detection", "training", "recomputed", "goodput", "wall", "step_time")
    med = {k: {c: statistics.median(r[c] for r in res[k]) for c in cols} for k in res}
    print(f"2 x 2 gloo job, {args.steps} steps (at least {args.step_seconds * 1000:.0f} ms each), global rank 1 "
          f"SIGKILLed near step {args.kill_step}, {args.runs} runs (medians; goodput at {reference * 1000:.1f} ms a step)")
    print(f"{'launcher':<62} {'detection':>10} {'kill->training':>15} {'recomputed':>11} {'goodput':>8} "
          f"{'wall':>7} {'step':>7}")
    for k, what in kinds:
        m = med[k]
        print(f"{what:<62} {m['detection']:>9.2f}s {m['training']:>14.2f}s {m['recomputed']:>11.0f} "
              f"{m['goodput']:>7.1%} {m['wall']:>6.1f}s {m['step_time'] * 1000:>5.1f}ms")
    if "torchrun" in med:
        base = med["torchrun"]
        for k, what in kinds[1:]:
            m = med[k]
            ratio = lambda c: base[c] / m[c] if m[c] > 0 else float("inf")
            print(f"{k}: detection {ratio('detection'):.1f}x faster, training again {ratio('training'):.1f}x "
                  f"sooner, {base['recomputed'] - m['recomputed']:.0f} fewer steps recomputed, goodput "
                  f"{m['goodput'] / base['goodput']:.2f}x torchrun's")


def run_faults_once(fault, tmp, i, warm=False, spares=0, replicas=0):
    job = json.load(open(os.path.join(ROOT, "examples/pytorch/job.json")))
    job["policy"] = json.load(open(os.path.join(ROOT, "examples/pytorch/policy.json")))
    job["policy"]["recovery"]["warm_start"] = warm
    job["spares"] = spares
    job["policy"]["checkpoint"]["replicas"] = replicas
    job["command"][1] = os.path.join(ROOT, job["command"][1])
    job["env"]["PYTHONPATH"] = os.path.join(ROOT, "build/python")
    job["total_steps"] = 160
    tag = f"{fault}-{'warm' if warm else 'cold'}-{spares}-{replicas}-{i}"
    spec = os.path.join(tmp, f"job-{tag}.json")
    faults = os.path.join(tmp, f"faults-{tag}.json")
    json.dump(job, open(spec, "w"))
    json.dump([{"fault": fault, "slot": 1, "at_step": 70}], open(faults, "w"))
    run_dir = os.path.join(tmp, f"run-{tag}")
    subprocess.run([GOODPUT, "run", spec, "--run-dir", run_dir, "--faults", faults, "--quiet"],
                   check=True, capture_output=True)
    out = subprocess.run([GOODPUT, "report", os.path.join(run_dir, "events.db"), "--format", "events"],
                         check=True, capture_output=True, text=True).stdout
    ev = [json.loads(line) for line in out.splitlines()]
    first = lambda t, after=0: next(e for e in ev if e["type"] == t and e["seq"] > after)
    cold = first("checkpoint_loaded")["t"] - first("restart_job")["t"]
    failure = first("failure_observed")
    stalled = failure["data"]["stalled_since_ns"]
    resumed = first("checkpoint_loaded", failure["seq"])
    # Steps recomputed: the furthest any rank got before the failure, less the step restored.
    reached = 0
    for node in os.listdir(os.path.join(run_dir, "nodes")):
        for f in os.listdir(os.path.join(run_dir, "nodes", node)):
            if f.startswith("r0-") and f.endswith("-progress.jsonl"):
                for line in open(os.path.join(run_dir, "nodes", node, f)):
                    r = json.loads(line)
                    if r.get("event") == "step":
                        reached = max(reached, r["step"])
    return {"cold_start": cold / 1e9, "detection": (failure["t"] - stalled) / 1e9,
            "resumed": (resumed["t"] - stalled) / 1e9, "tier": resumed["data"]["tier"],
            "recomputed": reached - resumed["data"]["step"]}


def faults_table(args):
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        # Warm: recovery.warm_start, the restart handed to an interpreter that imported torch beforehand.
        # Spare: "spares": 1 in the job spec, a node registered and idle that takes the lost slot.
        # Peer copy: checkpoint.replicas 1, each memory checkpoint copied to the other node's memory.
        for fault, what, warm, spares, replicas in (("kill-process", "process restart", False, 0, 0),
                                                    ("kill-process", "warm restart", True, 0, 0),
                                                    ("kill-node", "node relaunch", False, 0, 0),
                                                    ("kill-node", "warm spare", False, 1, 0),
                                                    ("kill-node", "peer copy", False, 0, 1)):
            res = [run_faults_once(fault, tmp, i, warm, spares, replicas) for i in range(args.runs)]
            med = {k: statistics.median(r[k] for r in res) for k in ("cold_start", "detection", "resumed", "recomputed")}
            tiers = sorted({r["tier"] for r in res})
            rows.append((what, "/".join(tiers), med))
            print(f"{what}: done {args.runs} runs", file=sys.stderr)
    print(f"{'recovery':<16} {'restored from':<14} {'detection':>10} {'kill->training':>15} {'cold start':>11} {'ratio':>6}"
          f" {'recomputed':>11}")
    for what, tier, m in rows:
        print(f"{what:<16} {tier:<14} {m['detection']:>9.3f}s {m['resumed']:>14.3f}s {m['cold_start']:>10.3f}s "
              f"{m['resumed'] / m['cold_start']:>5.2f}x {m['recomputed']:>6.0f} steps")
    print("(medians; ratio = kill->training over the same run's cold start)")
    cold, warm = rows[0][2]["resumed"], rows[1][2]["resumed"]
    print(f"warm process restart: kill->training {warm:.3f}s vs {cold:.3f}s cold ({cold / warm:.2f}x sooner)")
    relaunch, spare = rows[2][2]["resumed"], rows[3][2]["resumed"]
    print(f"node relaunch onto a warm spare: kill->training {spare:.3f}s vs {relaunch:.3f}s launching a node "
          f"({relaunch / spare:.2f}x sooner)")
    peer = rows[4][2]
    print(f"node relaunch restoring a peer's copy: {peer['recomputed']:.0f} steps recomputed vs "
          f"{rows[2][2]['recomputed']:.0f} from storage, kill->training {peer['resumed']:.3f}s vs {relaunch:.3f}s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=300, help="steps of the 2 x 2 job")
    ap.add_argument("--step-seconds", type=float, default=0.05, help="the 2 x 2 job's time per step")
    ap.add_argument("--save-every", type=int, default=20, help="K: the script's own torch.save interval")
    ap.add_argument("--kill-step", type=int, default=150, help="rank 1 is killed near this step")
    ap.add_argument("--timeout", type=float, default=300, help="seconds one run may take")
    ap.add_argument("--faults", action="store_true", help="also the one-process-per-node goodput run table")
    ap.add_argument("--faults-only", action="store_true", help="only that table (no torchrun comparison)")
    args = ap.parse_args()
    if not args.faults_only:
        compare_torchrun(args)
    if args.faults or args.faults_only:
        print()
        faults_table(args)


if __name__ == "__main__":
    main()
