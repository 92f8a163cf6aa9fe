"""Several trainer processes per node, and `goodput torchrun`, end to end with real processes: real
PyTorch DDP trainers (gloo, CPU), faults as real signals, the real torchrun 1.13 (Debian's, through
shared/tools/torchrun_py311.py, which fixes its one Python 3.11 start-up bug) as the reference for
the environment. Every assertion reads what the job left behind: the event log, the trainers'
progress files and outputs."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_live import GOODPUT, PYTHONPATH, ROOT, LiveRun, of_type, spec  # noqa: E402

TRAIN_DDP = os.path.join(ROOT, "examples/pytorch/train_ddp.py")
SHARED = os.environ.get("GOODPUT_SHARED_DATA", os.path.join(ROOT, "..", "shared", "data"))
TORCHRUN = os.path.join(os.path.dirname(os.path.abspath(SHARED)), "tools", "torchrun_py311.py")

# Prints the trainer's environment (what the launcher added to ours) into DIR/env-RANK.json.
PRINT_ENV = """
import json, os, sys
base = set(os.environ.get("BASE_KEYS", "").split(","))
with open(os.path.join(sys.argv[1], "env-%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({k: v for k, v in os.environ.items() if k not in base}, f)
"""

# An unmodified torchrun script: the process group from the environment, its own torch.save
# checkpoint every 10 steps, no goodput import. It logs what it did to DIR/log-RANK.jsonl.
PLAIN_DDP = """
import json, os, sys, time
import torch, torch.distributed as dist
out, steps = sys.argv[1], int(sys.argv[2])
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ckpt = os.path.join(out, "ckpt-%d.pt" % rank)
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
start = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt)
    model.load_state_dict(state["model"])
    start = state["step"]
log = open(os.path.join(out, "log-%d.jsonl" % rank), "a", buffering=1)
log.write(json.dumps({"restart": int(os.environ["TORCHELASTIC_RESTART_COUNT"]), "from": start}) + "\\n")
for step in range(start + 1, steps + 1):
    g = torch.Generator().manual_seed(step * 100 + rank)
    x = torch.randn(16, 8, generator=g)
    loss = model(x).pow(2).mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.data -= 0.01 * p.grad / world
        p.grad = None
    if step % 10 == 0:
        torch.save({"model": model.state_dict(), "step": step}, ckpt + ".tmp")
        os.replace(ckpt + ".tmp", ckpt)
    log.write(json.dumps({"step": step, "loss": loss.item()}) + "\\n")
    time.sleep(0.05)
dist.destroy_process_group()
"""


def progress(run_dir):
    """{(node name, restart, local rank): [progress records]} from every node's files."""
    out = {}
    nodes = os.path.join(run_dir, "nodes")
    for name in sorted(os.listdir(nodes)):
        for f in os.listdir(os.path.join(nodes, name)):
            m = re.fullmatch(r"r(\d+)(?:-l(\d+))?-progress\.jsonl", f)
            if m:
                with open(os.path.join(nodes, name, f)) as fh:
                    out[(name, int(m.group(1)), int(m.group(2) or 0))] = [json.loads(l) for l in fh if l.strip()]
    return out


def rank_of(run_dir, name, restart, local):
    """The global rank a process had, from what it printed ("rank R/W restart N: ...")."""
    tag = "" if local == 0 else "-l%d" % local
    with open(os.path.join(run_dir, "nodes", name, "r%d%s-stdout.log" % (restart, tag))) as f:
        return int(re.search(r"^rank (\d+)/", f.read(), re.M).group(1))


def step_losses(recs):
    return {r["step"]: r["loss"] for r in recs if r.get("event") == "step"}


def losses_per_rank(run_dir):
    """{global rank: {restart: {step: loss}}}"""
    out = {}
    for (name, restart, local), recs in progress(run_dir).items():
        out.setdefault(rank_of(run_dir, name, restart, local), {})[restart] = step_losses(recs)
    return out


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mp_spec(**over):
    return spec(**{"job": "mptest", "nproc_per_node": 2, "total_steps": 120, "checkpoint_bytes_per_node": 8 << 20, **over})


class SeveralProcessesPerNodeTest(unittest.TestCase):
    def diag(self, run):
        return f"\n--- stderr:\n{run.stderr[-3000:]}\n--- stdout:\n{run.stdout[-1500:]}"

    def test_one_local_rank_killed_stops_its_siblings_and_every_rank_restores_from_memory_bit_for_bit(self):
        # The reference: the same 2 x 2 job, uninterrupted.
        clean = LiveRun(self, mp_spec())
        self.assertEqual(clean.run(), 0, self.diag(clean))
        reference = losses_per_rank(clean.run_dir)
        self.assertEqual(sorted(reference), [0, 1, 2, 3], "four ranks on two nodes")

        # Local rank 1 of slot 1 (global rank 3) is SIGKILLed.
        run = LiveRun(self, mp_spec(), [{"fault": "kill-process", "slot": 1, "local_rank": 1, "at_step": 45}])
        statuses = []

        def watch():
            run.wait_for_step(20)
            with urllib.request.urlopen(run.url() + "/status", timeout=5) as r:
                statuses.append(json.loads(r.read()))

        self.assertEqual(run.run_while(watch), 0, self.diag(run))
        # /status shows each node's processes.
        nodes = {n["slot"]: n["trainer"] for n in statuses[0]["nodes"]}
        self.assertEqual({s: t["processes"] for s, t in nodes.items()}, {0: 2, 1: 2}, statuses)
        self.assertEqual([p["rank"] for p in nodes[1]["ranks"]], [2, 3], nodes)

        ev = run.events()
        failures = of_type(ev, "failure_observed")
        self.assertEqual(len(failures), 1, failures)
        self.assertEqual((failures[0]["kind"], failures[0]["signal"]), ("process_exit", signal.SIGKILL))
        self.assertIn("local rank 1 (rank 3): killed by signal 9", failures[0]["reason"])
        self.assertEqual([(d["diagnosis"], d["action"]) for d in of_type(ev, "recovery_decided")],
                         [("software_error", "restart_process")])
        killed = {j["node"]: j["name"] for j in of_type(ev, "node_joined")}[failures[0]["node"]]
        self.assertEqual(killed, "local-1")
        self.assertIn("local rank 1", run.explain("local-1"))
        with open(os.path.join(run.run_dir, "nodes", "local-1", "agent.log")) as f:
            self.assertIn("local rank 1 (rank 3) failed: stopping its 1 siblings (SIGTERM", f.read())
        self.assertEqual(of_type(ev, "restart_job")[-1]["world_size"], 2, "the world is two nodes")

        # Every process of the world loaded the agreed step from memory ...
        loaded = of_type(ev, "checkpoint_loaded")[1]
        self.assertEqual(loaded["tier"], "memory")
        prog = progress(run.run_dir)
        second = {k: v for k, v in prog.items() if k[1] == 1}
        self.assertEqual(len(second), 4, sorted(prog))
        for key, recs in second.items():
            load = [r for r in recs if r["event"] == "loaded"][0]
            self.assertEqual((load["step"], load["tier"]), (loaded["step"], "memory"), key)
        # ... and every step of every rank, before and after the kill, has the loss of the
        # uninterrupted run, bit for bit.
        got = losses_per_rank(run.run_dir)
        for rank, gens in got.items():
            for restart, steps in gens.items():
                for s, loss in steps.items():
                    self.assertEqual(loss, reference[rank][0][s], f"rank {rank} restart {restart} step {s}")
            self.assertEqual(max(gens[1]), 120, rank)
            self.assertEqual(min(gens[1]), loaded["step"] + 1, rank)

    def test_a_hung_local_rank_is_found_among_its_waiting_siblings_and_its_stacks_dumped(self):
        run = LiveRun(self, mp_spec(hang_timeout="6s"), [{"fault": "hang", "slot": 1, "local_rank": 1, "at_step": 30}])
        self.assertEqual(run.run(), 0, self.diag(run))
        ev = run.events()
        failures = of_type(ev, "failure_observed")
        self.assertEqual([f["kind"] for f in failures], ["hang"], failures)
        self.assertIn("process stopped: local rank 1 (rank 3)", failures[0]["reason"])
        self.assertEqual({j["node"]: j["name"] for j in of_type(ev, "node_joined")}[failures[0]["node"]], "local-1")
        self.assertIn("local rank 1 (rank 3)", run.explain("local-1"))
        # Each of the node's processes had its stacks taken before it was killed (goodput.live's
        # faulthandler writes them to the process's stderr).
        for tag in ("", "-l1"):
            with open(os.path.join(run.run_dir, "nodes", "local-1", "r0%s-stderr.log" % tag)) as f:
                self.assertIn("most recent call first", f.read(), tag)
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

    def test_a_killed_agent_is_relaunched_and_each_process_trains_its_own_shards_once(self):
        # 100 steps x 4 ranks, one shard per rank-step: exactly one pass over 400 shards, although
        # each node's two processes ask the master for shards on their own.
        run = LiveRun(self, mp_spec(total_steps=100, data_shards=400),
                      [{"fault": "kill-node", "slot": 0, "at_step": 50}])
        self.assertEqual(run.run(), 0, self.diag(run))
        ev = run.events()
        self.assertEqual([f["kind"] for f in of_type(ev, "failure_observed")], ["node_lost"])
        self.assertEqual([d["action"] for d in of_type(ev, "recovery_decided")], ["relaunch_node"])
        self.assertEqual(len(of_type(ev, "node_joined")), 3, "node 0 was relaunched")
        self.assertEqual(of_type(ev, "checkpoint_loaded")[1]["tier"], "storage")
        self.assertIn("400 of 400 done, 0 trained twice", run.stdout)
        self.assertEqual({a.get("local_rank", 0) for a in of_type(ev, "shards_assigned")}, {0, 1})
        finals = [r for recs in progress(run.run_dir).values() for r in recs if r.get("event") == "done"]
        self.assertEqual({r["samples"] for r in finals}, {400 * 64}, finals)


class GoodputTorchrunTest(unittest.TestCase):
    def torchrun(self, args, timeout=240, env=None, cwd=None):
        # Trainers run under this interpreter (the one with torch), as torchrun's run under its own.
        env = dict(env or os.environ, PYTHON_EXEC=sys.executable)
        return subprocess.run([GOODPUT, "torchrun"] + args, capture_output=True, text=True, timeout=timeout,
                              env=env, cwd=cwd)

    def tmp(self):
        d = tempfile.mkdtemp(prefix="goodput-torchrun-")
        self.addCleanup(subprocess.run, ["rm", "-rf", d])
        return d

    def test_standalone_four_processes_on_goodput_live_recover_a_killed_rank_from_memory(self):
        d = self.tmp()
        faults = os.path.join(d, "faults.json")
        with open(faults, "w") as f:
            json.dump([{"fault": "kill-process", "slot": 0, "local_rank": 2, "at_step": 40}], f)
        env = dict(os.environ, PYTHONPATH=PYTHONPATH)
        r = self.torchrun(["--standalone", "--nproc-per-node=4", "--run-dir", os.path.join(d, "run"),
                           "--total-steps", "100", "--step-time", "30ms", "--faults", faults,
                           "--policy", os.path.join(ROOT, "examples/pytorch/policy.json"),
                           TRAIN_DDP, "--step-seconds", "0.03", "--hidden", "64"], env=env)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        run_dir = os.path.join(d, "run")
        ev = [json.loads(l) for l in subprocess.run([GOODPUT, "report", os.path.join(run_dir, "events.db"), "--format",
                                                     "events"], capture_output=True, text=True, check=True).stdout.splitlines()]
        failures = of_type(ev, "failure_observed")
        self.assertEqual(len(failures), 1, failures)
        self.assertIn("local rank 2 (rank 2): killed by signal 9", failures[0]["reason"])
        self.assertEqual(of_type(ev, "checkpoint_loaded")[1]["tier"], "memory")
        ranks = {rank_of(run_dir, "local-0", 1, l) for l in range(4)}
        self.assertEqual(ranks, {0, 1, 2, 3})
        sums = set()
        for l in range(4):
            with open(os.path.join(run_dir, "nodes", "local-0", "r1%s-stdout.log" % ("" if l == 0 else "-l%d" % l))) as f:
                sums.update(re.findall(r"parameter sum (\S+)", f.read()))
        self.assertEqual(len(sums), 1, "every rank ends with the same model")

    def test_an_unmodified_torchrun_script_is_restarted_with_torchruns_environment(self):
        d = self.tmp()
        script = os.path.join(d, "plain_ddp.py")
        with open(script, "w") as f:
            f.write(PLAIN_DDP)
        out = os.path.join(d, "out")
        os.mkdir(out)
        faults = os.path.join(d, "faults.json")
        with open(faults, "w") as f:
            json.dump([{"fault": "kill-process", "slot": 0, "local_rank": 1, "after": "4s"}], f)
        r = self.torchrun(["--standalone", "--nproc_per_node=2", "--max_restarts=3", "--run-dir", os.path.join(d, "run"),
                           "--faults", faults, script, out, "120"])
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertIn("does not use goodput.live", r.stderr)
        for rank in (0, 1):
            with open(os.path.join(out, "log-%d.jsonl" % rank)) as f:
                recs = [json.loads(l) for l in f]
            starts = [x for x in recs if "restart" in x]
            self.assertEqual([s["restart"] for s in starts], [0, 1], "started once, restarted once (TORCHELASTIC_RESTART_COUNT)")
            self.assertGreater(starts[1]["from"], 0, "the restart resumed from the script's own checkpoint")
            self.assertEqual(max(x.get("step", 0) for x in recs), 120)
        ev = [json.loads(l) for l in subprocess.run([GOODPUT, "report", os.path.join(d, "run", "events.db"), "--format",
                                                     "events"], capture_output=True, text=True, check=True).stdout.splitlines()]
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        self.assertIn("local rank 1 (rank 1)", of_type(ev, "failure_observed")[0]["reason"])

    def test_a_failing_script_gives_up_after_max_restarts_as_torchrun_does(self):
        d = self.tmp()
        script = os.path.join(d, "fails.py")
        with open(script, "w") as f:
            f.write("import os, sys\nsys.exit(3 if os.environ['LOCAL_RANK'] == '1' else 0)\n")
        r = self.torchrun(["--standalone", "--nproc-per-node=2", "--max-restarts=1", "--run-dir",
                           os.path.join(d, "run"), script])
        self.assertEqual(r.returncode, 1, r.stderr[-3000:])
        ev = [json.loads(l) for l in subprocess.run([GOODPUT, "report", os.path.join(d, "run", "events.db"), "--format",
                                                     "events"], capture_output=True, text=True, check=True).stdout.splitlines()]
        self.assertEqual(len(of_type(ev, "failure_observed")), 2, "the first run and its one restart")
        self.assertEqual(of_type(ev, "recovery_decided")[-1]["action"], "give_up")
        self.assertEqual(of_type(ev, "failure_observed")[0]["exit_code"], 3)

    @unittest.skipUnless(os.path.exists(TORCHRUN), "shared/tools/torchrun_py311.py (the torchrun reference) is missing")
    def test_the_environment_is_torchruns(self):
        d = self.tmp()
        script = os.path.join(d, "print_env.py")
        with open(script, "w") as f:
            f.write(PRINT_ENV)
        theirs, ours = os.path.join(d, "theirs"), os.path.join(d, "ours")
        os.mkdir(theirs)
        os.mkdir(ours)
        env = dict(os.environ, BASE_KEYS=",".join(os.environ) + ",BASE_KEYS,PYTHON_EXEC")
        r = subprocess.run(["/usr/bin/python3", TORCHRUN, "--standalone", "--nproc_per_node=2", script, theirs],
                           capture_output=True, text=True, timeout=120, env=env)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        r = self.torchrun(["--standalone", "--nproc_per_node=2", "--max_restarts=0", "--run-dir", os.path.join(d, "run"),
                           script, ours], env=env)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        # Values that must differ: the store's address and port (ours: rank 0's host, a port its
        # agent offered), the run id and the error file (ours: in the run directory).
        differ = {"MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}
        for rank in (0, 1):
            with open(os.path.join(theirs, "env-%d.json" % rank)) as f:
                t = json.load(f)
            with open(os.path.join(ours, "env-%d.json" % rank)) as f:
                o = json.load(f)
            t.pop("_", None), o.pop("_", None)
            added = {k for k in o if k.startswith("GOODPUT_")}
            self.assertEqual(set(t), set(o) - added, f"rank {rank}: the same variables")
            self.assertEqual({k: t[k] for k in t if k not in differ}, {k: o[k] for k in t if k not in differ}, rank)
            for k in differ:
                self.assertTrue(o[k], k)
            self.assertTrue(o["TORCHELASTIC_ERROR_FILE"].startswith(os.path.join(d, "run")), o)

    def test_two_machines_each_run_goodput_torchrun_and_the_rendezvous_host_serves_the_master(self):
        d = self.tmp()
        script = os.path.join(d, "print_env.py")
        with open(script, "w") as f:
            f.write(PRINT_ENV)
        port = free_port()
        env = dict(os.environ, GOODPUT_TOKEN="t0ken-for-this-test", BASE_KEYS="", PYTHON_EXEC=sys.executable)
        common = ["--nnodes=2", "--nproc-per-node=2", f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=pair",
                  "--rdzv-backend=c10d"]
        procs = []
        for node_rank in (1, 0):  # the agent first: it waits for the master
            procs.append(subprocess.Popen([GOODPUT, "torchrun"] + common + [f"--node-rank={node_rank}", "--run-dir",
                                                                            os.path.join(d, f"run{node_rank}"), script, d],
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env))
            time.sleep(0.5)
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=120))
            finally:
                p.kill()
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, err[-3000:])
        self.assertIn("joins the master at http://127.0.0.1:%d" % port, outs[0][1])
        seen = {}
        for rank in range(4):
            with open(os.path.join(d, "env-%d.json" % rank)) as f:
                e = json.load(f)
            seen[rank] = (e["GROUP_RANK"], e["LOCAL_RANK"], e["WORLD_SIZE"], e["GROUP_WORLD_SIZE"], e["LOCAL_WORLD_SIZE"])
        self.assertEqual(seen, {0: ("0", "0", "4", "2", "2"), 1: ("0", "1", "4", "2", "2"),
                                2: ("1", "0", "4", "2", "2"), 3: ("1", "1", "4", "2", "2")})

    def test_a_goodput_master_already_on_the_rendezvous_port_is_joined_not_served_again(self):
        d = self.tmp()
        script = os.path.join(d, "print_env.py")
        with open(script, "w") as f:
            f.write(PRINT_ENV)
        port = free_port()
        job = os.path.join(d, "job.json")
        with open(job, "w") as f:
            json.dump(spec(job="joined", nodes=1, nproc_per_node=2, trainer_reports=False,
                           command=[sys.executable, script, d]), f)
        env = dict(os.environ, GOODPUT_TOKEN="t0ken-for-this-test", BASE_KEYS="")
        master = subprocess.Popen([GOODPUT, "master", job, "--port", str(port), "--run-dir", os.path.join(d, "run")],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            deadline = time.time() + 30
            while time.time() < deadline:
                try:
                    if urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1).read() == b"ok\n":
                        break
                except OSError:
                    time.sleep(0.1)
            r = subprocess.run([GOODPUT, "torchrun", "--nnodes=1", "--nproc-per-node=2", f"--rdzv-endpoint=127.0.0.1:{port}",
                                "--rdzv-id=joined", "--run-dir", os.path.join(d, "agent"), script, d],
                               capture_output=True, text=True, timeout=120, env=env)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            self.assertIn("already listening", r.stderr)
            self.assertEqual(master.wait(timeout=60), 0, master.stderr.read()[-3000:])
        finally:
            master.kill()
            master.communicate()
        for rank in (0, 1):
            with open(os.path.join(d, "env-%d.json" % rank)) as f:
                self.assertEqual(json.load(f)["LOCAL_WORLD_SIZE"], "2")
        self.assertFalse(os.path.exists(os.path.join(d, "agent", "events.db")), "the joining process served no master")

    def test_bad_command_lines_are_refused_naming_the_option(self):
        for args, message in [(["--nproc_per_node=2", "--bogus", "x.py"], "unknown option '--bogus'"),
                              (["--nproc-per-node=two", "x.py"], "--nproc-per-node must be an integer"),
                              (["--standalone"], "give the training script"),
                              (["--rdzv-backend=etcd", "x.py"], "--rdzv-backend etcd is not supported"),
                              (["--standalone", "-m", "--no-python", "x"], "not both"),
                              (["--standalone", "/nonexistent/train.py"], "no such training script"),
                              (["--nnodes=2", "x.py"], "needs --rdzv-endpoint")]:
            r = self.torchrun(args)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(message, r.stderr, args)
        self.assertIn("--nproc-per-node", self.torchrun(["--help"]).stdout)


if __name__ == "__main__":
    unittest.main()
