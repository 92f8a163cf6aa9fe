"""Live recovery latencies: how fast a real job notices a failure and trains again.

Runs the PyTorch DDP example (examples/pytorch/) under `goodput run` once per fault, with real
signals, and reads the event log: detection latency (progress stopped -> failure observed), and
kill -> training resumed (progress stopped -> checkpoint loaded), for a process restart (restore
from host memory) and a node relaunch (restore from storage). The baseline, measured in the same
runs, is the job's cold start (trainers launched -> checkpoint loaded), which a recovery repeats
at the least.

    PYTHONPATH=build/python /usr/bin/python3 bench/live_recovery.py [--runs 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOODPUT = os.path.join(ROOT, "build", "goodput")


def run_once(fault, tmp, i):
    job = json.load(open(os.path.join(ROOT, "examples/pytorch/job.json")))
    job["policy"] = os.path.join(ROOT, "examples/pytorch/policy.json")
    job["command"][1] = os.path.join(ROOT, job["command"][1])
    job["env"]["PYTHONPATH"] = os.path.join(ROOT, "build/python")
    job["total_steps"] = 160
    spec = os.path.join(tmp, f"job-{fault}-{i}.json")
    faults = os.path.join(tmp, f"faults-{fault}-{i}.json")
    json.dump(job, open(spec, "w"))
    json.dump([{"fault": fault, "slot": 1, "at_step": 70}], open(faults, "w"))
    run_dir = os.path.join(tmp, f"run-{fault}-{i}")
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
    return {"cold_start": cold / 1e9, "detection": (failure["t"] - stalled) / 1e9,
            "resumed": (resumed["t"] - stalled) / 1e9, "tier": resumed["data"]["tier"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for fault, what in (("kill-process", "process restart"), ("kill-node", "node relaunch")):
            res = [run_once(fault, tmp, i) for i in range(args.runs)]
            med = {k: statistics.median(r[k] for r in res) for k in ("cold_start", "detection", "resumed")}
            tiers = sorted({r["tier"] for r in res})
            rows.append((what, "/".join(tiers), med))
            print(f"{what}: done {args.runs} runs", file=sys.stderr)
    print(f"{'recovery':<16} {'restored from':<14} {'detection':>10} {'kill->training':>15} {'cold start':>11} {'ratio':>6}")
    for what, tier, m in rows:
        print(f"{what:<16} {tier:<14} {m['detection']:>9.3f}s {m['resumed']:>14.3f}s {m['cold_start']:>10.3f}s "
              f"{m['resumed'] / m['cold_start']:>5.2f}x")
    print("(medians; ratio = kill->training over the same run's cold start)")


if __name__ == "__main__":
    main()
