"""Live mode end to end, with real processes: `goodput run` starts the master, the local backend
starts one agent process per node, the agents start real PyTorch DDP trainers (gloo, CPU), and
faults are real signals (SIGKILL, SIGSTOP) and a real memory limit (prlimit). Every assertion reads
what the job left behind: the SQLite event log, the trainers' progress files, the checkpoints."""

import glob
import http.client
import json
import os
import ssl
import random
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import tempfile
import time
import unittest
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GOODPUT = os.environ.get("GOODPUT_BINARY", os.path.join(ROOT, "build", "goodput"))
PYTHONPATH = os.environ.get("PYTHONPATH", os.path.join(ROOT, "build", "python"))


def spec(**over):
    s = {
        "job": "livetest",
        "nodes": 2,
        "command": ["/usr/bin/python3", os.path.join(ROOT, "examples/pytorch/train_ddp.py"),
                    "--step-seconds", "0.03", "--hidden", "64"],
        "env": {"PYTHONPATH": PYTHONPATH, "OMP_NUM_THREADS": "1"},
        "total_steps": 160,
        "step_time": "30ms",
        "policy": os.path.join(ROOT, "examples/pytorch/policy.json"),
        "heartbeat_interval": "200ms",
        "heartbeat_timeout": "6s",
        "hang_timeout": "6s",
    }
    s.update(over)
    return s


def run_a_command_that_cannot_run(test, job):
    """Runs `job` (a spec whose command is /nonexistent/python9) and checks the job failed at once
    as a configuration error with the reason, one decision and no other; returns the run."""
    run = LiveRun(test, job)
    t0 = time.time()
    test.assertEqual(run.run(timeout=120), 1, run.diag())
    test.assertLess(time.time() - t0, 60, run.diag())
    test.assertIn("cannot run /nonexistent/python9: No such file or directory", run.stderr, run.diag())
    decided = of_type(run.events(), "recovery_decided")
    test.assertEqual([(d["diagnosis"], d["action"]) for d in decided], [("configuration_error", "give_up")], decided)
    test.assertNotIn("excluded", run.stderr)
    return run


class LiveRun:
    def __init__(self, test, job, faults=None):
        self.dir = tempfile.mkdtemp(prefix="goodput-live-")
        test.addCleanup(subprocess.run, ["rm", "-rf", self.dir])
        test.addCleanup(self.kill_agents)  # a failed test must not leave nodes behind
        self.job_path = os.path.join(self.dir, "job.json")
        with open(self.job_path, "w") as f:
            json.dump(job, f)
        self.run_dir = os.path.join(self.dir, "run")
        self.db = os.path.join(self.run_dir, "events.db")
        self.args = [GOODPUT, "run", self.job_path, "--run-dir", self.run_dir]
        self.env = None  # the environment of `goodput run` (and so of its agents); None: this one
        if faults:
            self.faults_path = os.path.join(self.dir, "faults.json")
            with open(self.faults_path, "w") as f:
                json.dump(faults, f)
            self.args += ["--faults", self.faults_path]

    def kill_agents(self):
        nodes = os.path.join(self.run_dir, "nodes")
        for name in os.listdir(nodes) if os.path.isdir(nodes) else []:
            try:
                with open(os.path.join(nodes, name, "agent.pid")) as f:
                    os.killpg(int(f.read()), signal.SIGKILL)
            except (OSError, ValueError):
                pass

    def run(self, timeout=240, resume=False):
        out = subprocess.run(self.args + (["--resume"] if resume else []), capture_output=True, text=True,
                             timeout=timeout, env=self.env)
        self.stdout, self.stderr = out.stdout, out.stderr
        return out.returncode

    def start(self):
        return subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=self.env)

    def run_while(self, during=None, timeout=240):
        """Runs the job, calling during() while it runs (to inject a fault); returns its exit code."""
        proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        try:
            if during:
                during()
            self.stdout, self.stderr = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                self.stdout, self.stderr = proc.communicate()
        return proc.returncode

    def wait_for_step(self, step, timeout=120):
        self.wait_for_master()
        deadline = time.time() + timeout
        while time.time() < deadline:
            try:
                with urllib.request.urlopen(self.url() + "/status", timeout=2) as r:
                    if json.loads(r.read())["step"] >= step:
                        return
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        raise AssertionError(f"the job never reached step {step}")

    def diag(self):
        return f"\n--- stderr:\n{self.stderr[-3000:]}\n--- stdout:\n{self.stdout[-1500:]}"

    def events(self):
        out = subprocess.run([GOODPUT, "report", self.db, "--format", "events"], capture_output=True, text=True,
                             check=True)
        return [json.loads(line) for line in out.stdout.splitlines()]

    def explain(self, node_name):
        return subprocess.run([GOODPUT, "explain", self.db, "--node", node_name], capture_output=True, text=True,
                              check=True).stdout

    def report(self):
        out = subprocess.run([GOODPUT, "report", self.db, "--format", "json"], capture_output=True, text=True,
                             check=True)
        return json.loads(out.stdout)

    def progress(self):
        """{(node name, restart): [progress records]}"""
        out = {}
        nodes = os.path.join(self.run_dir, "nodes")
        for name in sorted(os.listdir(nodes)):
            for f in os.listdir(os.path.join(nodes, name)):
                if f.endswith("-progress.jsonl"):
                    restart = int(f[1:].split("-")[0])
                    with open(os.path.join(nodes, name, f)) as fh:
                        out[(name, restart)] = [json.loads(l) for l in fh if l.strip()]
        return out

    def wait_for_master(self):
        for _ in range(100):
            if os.path.exists(os.path.join(self.run_dir, "master.url")):
                break
            time.sleep(0.1)
        time.sleep(0.2)
        return self.url()

    def url(self):
        with open(os.path.join(self.run_dir, "master.url")) as f:
            return f.read().strip()

    def token(self):
        with open(os.path.join(self.run_dir, "token")) as f:
            return f.read().strip()


def ps_spec(**over):
    """A parameter-server job (examples/pytorch/train_ps.py): one server, two workers."""
    job = spec(command=["/usr/bin/python3", os.path.join(ROOT, "examples/pytorch/train_ps.py"),
                        "--step-seconds", "0.03", "--hidden", "64"],
               replicas=[{"type": "ps", "count": 1}, {"type": "worker", "count": 2}], **over)
    del job["nodes"]  # it follows from the groups
    return job


def ask_scale(run, group, count, reason=None):
    """`goodput scale GROUP COUNT` against the run's master, asked again while it answers that the
    world is not complete (a node joining); returns the finished process."""
    args = [GOODPUT, "scale", group, str(count), "--master", run.url(),
            "--token-file", os.path.join(run.run_dir, "token")] + (["--reason", reason] if reason else [])
    for _ in range(150):
        r = subprocess.run(args, capture_output=True, text=True, timeout=30)
        if r.returncode != 2 or "not complete" not in r.stderr:
            return r
        time.sleep(0.2)
    return r


def assert_replays_close(test, live, sim, every_steps=20):
    """The simulator's replay of a live log finds the live goodput within 2 points, plus the share of
    the run one save interval takes: the replay re-simulates the run on the costs it measured, so a
    failure can fall at another point of its save interval there than it did live (just before a
    save instead of just after), and the recomputation differ by up to one interval."""
    interval = every_steps * live["productive_ns"] / max(live["steps"], 1) / live["wall_ns"]
    test.assertAlmostEqual(live["goodput"], sim["goodput"], delta=0.02 + interval, msg=(live, sim))


def of_type(events, t):
    return [e["data"] for e in events if e["type"] == t]


def losses(records):
    return {r["step"]: r["loss"] for r in records if r.get("event") == "step"}


class LiveTest(unittest.TestCase):
    def diag(self, run):
        return f"\n--- stderr:\n{run.stderr[-3000:]}\n--- stdout:\n{run.stdout[-2000:]}"

    def test_kill_process_restores_from_memory_and_the_loss_curve_continues(self):
        kill_at = random.Random(os.getpid()).randint(45, 95)
        # With the job's checkpoint size given, each agent allocates its rank's shared memory while
        # the trainer starts, and the trainer saves into (and restores from) those objects.
        run = LiveRun(self, spec(checkpoint_bytes_per_node=4 << 20), [{"fault": "kill-process", "slot": 1, "at_step": kill_at}])
        self.assertEqual(run.run(), 0, self.diag(run))
        for name in os.listdir(os.path.join(run.run_dir, "nodes")):
            with open(os.path.join(run.run_dir, "nodes", name, "agent.log")) as f:
                self.assertIn("agent: reserved 10 MiB of shared memory for /goodput-livetest-", f.read(), name)
        ev = run.events()
        failures = of_type(ev, "failure_observed")
        self.assertEqual(len(failures), 1, failures)
        self.assertEqual(failures[0]["kind"], "process_exit")
        self.assertEqual(failures[0]["signal"], signal.SIGKILL)
        decided = of_type(ev, "recovery_decided")
        self.assertEqual([(d["diagnosis"], d["action"]) for d in decided], [("software_error", "restart_process")])
        self.assertEqual(len(of_type(ev, "node_joined")), 2, "no node was relaunched")
        loaded = of_type(ev, "checkpoint_loaded")
        self.assertEqual(loaded[1]["tier"], "memory")
        restored = loaded[1]["step"]
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

        prog = run.progress()
        # The fault reaches the trainer with its agent's next heartbeat, some steps after kill_at: the
        # restore is the newest checkpoint (every 20 steps) before the killed rank's last step.
        killed = {j["node"]: j["name"] for j in of_type(ev, "node_joined")}[failures[0]["node"]]
        last = max(losses(prog[(killed, 0)]))
        self.assertGreaterEqual(last, kill_at)
        self.assertIn(restored, (last // 20 * 20, last // 20 * 20 - 20), (restored, last, kill_at))
        by_node = {}
        for (name, restart), recs in prog.items():
            by_node.setdefault(name, {})[restart] = recs
        self.assertEqual(len(by_node), 2)
        for name, gens in by_node.items():
            # Every rank loaded the same step, from memory, and went on from there.
            load = [r for r in gens[1] if r["event"] == "loaded"][0]
            self.assertEqual((load["step"], load["tier"]), (restored, "memory"), name)
            before, after = losses(gens[0]), losses(gens[1])
            self.assertEqual(min(after), restored + 1)
            overlap = [s for s in after if s in before]
            # Steps done after the checkpoint are done again (none if the kill came right after it),
            # bit-identical: same model, optimizer and data at every step.
            self.assertTrue(overlap or max(before) == restored, (name, max(before), restored))
            for s in overlap:
                self.assertEqual(before[s], after[s], f"{name} step {s}")
            self.assertEqual(max(after), 160)

        # The live report and the simulator's replay of the same log agree (assert_replays_close:
        # 2 points and a save interval's share). The replay trains at the speed the log measured
        # over its checkpoint intervals, their total time over their steps, the trainers' slower
        # first interval included (a median of intervals put it 2-3 points off, always low).
        live = run.report()
        sim = json.loads(subprocess.run([GOODPUT, "replay", "--from-log", run.db, "--format", "json",
                                         "--policy", os.path.join(ROOT, "examples/pytorch/policy.json")],
                                        capture_output=True, text=True, check=True).stdout)
        assert_replays_close(self, live, sim)

    def test_a_warm_restart_runs_the_script_in_an_interpreter_started_beforehand_with_the_same_losses(self):
        # recovery.warm_start: once a trainer trains, its agent starts `python3 -m goodput.warm torch`
        # for the next restart; the kill's restart is handed to it (the same pid), and the steps it
        # does again after the memory restore have bit-identical losses to the cold run's (the same
        # model, optimizer and data: the interpreter imported torch and did nothing else).
        with open(os.path.join(ROOT, "examples/pytorch/policy.json")) as f:
            policy = json.load(f)
        policy["recovery"]["warm_start"] = True
        run = LiveRun(self, spec(policy=policy, checkpoint_bytes_per_node=4 << 20),
                      [{"fault": "kill-process", "slot": 1, "at_step": 70}])
        self.assertEqual(run.run(), 0, self.diag(run))
        ev = run.events()
        self.assertEqual([(d["diagnosis"], d["action"]) for d in of_type(ev, "recovery_decided")],
                         [("software_error", "restart_process")])
        restarts = of_type(ev, "restart_job")
        self.assertEqual([r.get("warm", False) for r in restarts], [False, True], "the first start is cold")
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        killed = {j["node"]: j["name"] for j in of_type(ev, "node_joined")}[of_type(ev, "failure_observed")[0]["node"]]
        with open(os.path.join(run.run_dir, "nodes", killed, "agent.log")) as f:
            log = f.read()
        warm = re.findall(r"warm interpreter pid (\d+) started for the next restart \(preload: torch\)", log)
        self.assertTrue(warm, log[-3000:])
        started = re.search(r"started trainer pid (\d+) \(restart 1, rank 1/2, in a warm interpreter\)", log)
        self.assertIsNotNone(started, log[-3000:])
        self.assertEqual(started.group(1), warm[0])
        self.assertNotIn("not used, starting cold", log)
        # The simulator replays the run with its measured restart times (the warm one included)
        # and finds the live goodput, within the tolerance of the cold test above.
        live = run.report()
        sim = json.loads(subprocess.run([GOODPUT, "replay", "--from-log", run.db, "--format", "json", "--policy",
                                         os.path.join(ROOT, "examples/pytorch/policy.json")],
                                        capture_output=True, text=True, check=True).stdout)
        assert_replays_close(self, live, sim)
        prog = run.progress()
        loaded = [r for r in prog[(killed, 1)] if r["event"] == "loaded"][0]
        self.assertEqual(loaded["tier"], "memory")
        for name in {n for n, _ in prog}:
            before, after = losses(prog[(name, 0)]), losses(prog[(name, 1)])
            self.assertEqual(min(after), loaded["step"] + 1)
            for s in (s for s in after if s in before):
                self.assertEqual(before[s], after[s], f"{name} step {s}")
            self.assertEqual(max(after), 160)

    def test_a_warm_interpreter_that_cannot_take_the_restart_gives_way_to_a_cold_start(self):
        # A preload that cannot be imported: the warm interpreter exits; the restart starts cold,
        # says why, and the job completes as it would have.
        with open(os.path.join(ROOT, "examples/pytorch/policy.json")) as f:
            policy = json.load(f)
        policy["recovery"]["warm_start"] = True
        run = LiveRun(self, spec(policy=policy, preload=["goodput_no_such_module"]),
                      [{"fault": "kill-process", "slot": 0, "at_step": 60}])
        self.assertEqual(run.run(), 0, self.diag(run))
        ev = run.events()
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        killed = {j["node"]: j["name"] for j in of_type(ev, "node_joined")}[of_type(ev, "failure_observed")[0]["node"]]
        node = os.path.join(run.run_dir, "nodes", killed)
        with open(os.path.join(node, "agent.log")) as f:
            log = f.read()
        self.assertRegex(log, r"warm interpreter pid \d+ not used, starting cold: it exited, code 1 \(see .*warm\.log\)")
        self.assertIn("started trainer pid", log)
        self.assertIn("no more warm interpreters on this node for this job", log)
        self.assertEqual(log.count("started for the next restart"), 1, log)
        with open(os.path.join(node, "warm.log")) as f:
            self.assertIn("No module named 'goodput_no_such_module'", f.read())
        # A bad preload list is refused when the spec is read.
        bad = LiveRun(self, spec(policy=policy, preload=["torch; rm -rf /"]))
        self.assertEqual(bad.run(timeout=60), 2, bad.stderr)
        self.assertIn("preload", bad.stderr)

    def test_a_killed_parameter_server_is_restarted_and_the_workers_loss_curves_continue(self):
        # Replica groups: one parameter server (slot 0) owns the model and its Adam state, two
        # workers compute gradients; a real SIGKILL of the server's process mid-run.
        job = spec(job="pstest", total_steps=120,
                   command=["/usr/bin/python3", os.path.join(ROOT, "examples/pytorch/train_ps.py"),
                            "--step-seconds", "0.03", "--hidden", "64"],
                   replicas=[{"type": "worker", "count": 2}, {"type": "ps", "count": 1}])
        del job["nodes"]  # it follows from the groups
        # Killed a few steps after the checkpoint of step 40, so steps are done again after it.
        run = LiveRun(self, job, [{"fault": "kill-process", "slot": 0, "at_step": 42}])
        self.assertEqual(run.run(), 0, self.diag(run))
        ev = run.events()
        joined = {j["name"]: (j["slot"], j["replica_type"]) for j in of_type(ev, "node_joined")}
        self.assertEqual(sorted(joined.values()), [(0, "ps"), (1, "worker"), (2, "worker")])
        server = [name for name, (slot, _) in joined.items() if slot == 0][0]
        self.assertIn("joined as slot 0 (ps)", run.explain(server))
        failures = of_type(ev, "failure_observed")
        self.assertEqual([(f["kind"], f["signal"]) for f in failures], [("process_exit", signal.SIGKILL)])
        self.assertEqual({j["name"]: j["node"] for j in of_type(ev, "node_joined")}[server], failures[0]["node"])
        self.assertEqual([(d["diagnosis"], d["action"]) for d in of_type(ev, "recovery_decided")],
                         [("software_error", "restart_process")])
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        restored = of_type(ev, "checkpoint_loaded")[1]
        self.assertEqual(restored["tier"], "memory")
        self.assertGreater(restored["step"], 0)

        prog = run.progress()
        for name, (slot, kind) in joined.items():
            # Each rank knew its part, and all three loaded the same step from memory.
            with open(os.path.join(run.run_dir, "nodes", name, "r1-stdout.log")) as f:
                self.assertIn(f"rank {slot} ({kind} {slot - 1 if kind == 'worker' else 0}) restart 1: "
                              f"starting after step {restored['step']} (from memory)", f.read())
            before, after = prog[(name, 0)], prog[(name, 1)]
            if kind == "ps":  # a server trains nothing itself: steps without a loss
                self.assertFalse([r for r in before + after if "loss" in r])
                self.assertEqual(max(r["step"] for r in after if r["event"] == "step"), 120)
                continue
            # The server's tensors and optimizer state came back exactly: the steps done again after
            # the restore have bit-identical losses on every worker (none were if the kill, late on
            # a loaded machine, came right after a checkpoint).
            b, a = losses(before), losses(after)
            self.assertEqual(min(a), restored["step"] + 1)
            overlap = [st for st in a if st in b]
            self.assertTrue(overlap or max(b) == restored["step"], (name, max(b), restored["step"]))
            for st in overlap:
                self.assertEqual(b[st], a[st], f"{name} step {st}")
            self.assertEqual(max(a), 120)

    def test_an_operator_adds_and_removes_a_parameter_server_and_the_losses_carry_on(self):
        # `goodput scale ps 2` mid-run: a second server joins (slot 1; the workers move up a rank),
        # the world restarts from the newest checkpoint in storage, which was saved by one server;
        # the new servers read the tensors they now own (every other one) from its file. Then
        # `goodput scale ps 1`: the second server is released and the first reads back the tensors
        # the second owned. Each time the steps done again after the restore have bit-identical
        # losses on both workers (two gradients summed with zeros: the same in any order).
        run = LiveRun(self, ps_spec(job="psscale", total_steps=200))
        answers = []

        def scale(count, at_step):
            run.wait_for_step(at_step, timeout=180)
            answers.append(ask_scale(run, "ps", count, f"operator: {count} servers"))
            with urllib.request.urlopen(run.url() + "/status", timeout=5) as resp:
                statuses.append(json.loads(resp.read()))

        statuses = []

        def during():
            wrong = subprocess.run([GOODPUT, "scale", "worker", "0", "--master", run.wait_for_master(),
                                    "--token-file", os.path.join(run.run_dir, "token")],
                                   capture_output=True, text=True, timeout=30)
            answers.append(wrong)
            scale(2, 60)
            scale(1, 130)

        self.assertEqual(run.run_while(during, timeout=300), 0, run.diag())
        self.assertNotEqual(answers[0].returncode, 0)  # a count below 1 is refused before asking
        self.assertIn("count", answers[0].stderr)
        for a in answers[1:]:
            self.assertEqual(a.returncode, 0, a.stderr)
        grown, shrunk = (json.loads(a.stdout) for a in answers[1:])
        # /status shows the layout as asked at once, and the storage step a restart goes back to.
        self.assertEqual([st["replicas"] for st in statuses], [{"ps": 2, "worker": 2}, {"ps": 1, "worker": 2}])
        self.assertTrue(all(st["storage_step"] >= 40 for st in statuses), statuses)
        self.assertEqual((grown["from"], grown["count"], grown["released"]), (1, 2, []))
        self.assertEqual((shrunk["from"], shrunk["count"], [r["slot"] for r in shrunk["released"]]), (2, 1, [1]))

        ev = run.events()
        joined = of_type(ev, "node_joined")
        self.assertEqual(len(joined), 4, joined)
        self.assertEqual(sorted((j["slot"], j["replica_type"]) for j in joined[:3]),
                         [(0, "ps"), (1, "worker"), (2, "worker")])
        second = joined[3]  # the new server takes the slot after the first; the workers moved to 2 and 3
        self.assertEqual((second["slot"], second["replica_type"]), (1, "ps"))
        self.assertEqual([(r["group"], r["from"], r["to"], r["release"]) for r in of_type(ev, "scale_requested")],
                         [("ps", 1, 2, []), ("ps", 2, 1, [second["node"]])])
        self.assertEqual([(d["group"], d["from"], d["to"], d.get("released", [])) for d in of_type(ev, "scale_decided")],
                         [("ps", 3, 4, []), ("ps", 4, 3, [second["node"]])])
        restarts = of_type(ev, "restart_job")
        self.assertEqual([(r["world_size"], r["restore_tier"]) for r in restarts],
                         [(3, "none"), (4, "storage"), (3, "storage")], restarts)
        # Each answer said which step the world would go back to.
        self.assertEqual([grown["restore_step"], shrunk["restore_step"]], [r["restore_step"] for r in restarts[1:]])
        loaded = of_type(ev, "checkpoint_loaded")
        self.assertEqual([(l["step"], l["tier"]) for l in loaded],
                         [(0, "none")] + [(r["restore_step"], "storage") for r in restarts[1:]])
        self.assertGreater(restarts[1]["restore_step"], 0)
        self.assertGreater(restarts[2]["restore_step"], restarts[1]["restore_step"])
        self.assertEqual(of_type(ev, "failure_observed"), [])
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        self.assertIn("released: the ps group shrank (world 4 -> 3 nodes): operator: 1 servers",
                      run.explain(second["name"]))
        # The log replays in the simulator with the operator's requests in it: the same scale
        # decisions and the same restarts (worlds of 3, 4, 3 restored from storage).
        replay_db = os.path.join(run.dir, "replay.db")
        subprocess.run([GOODPUT, "replay", "--from-log", run.db, "--events", replay_db,
                        "--policy", os.path.join(ROOT, "examples/pytorch/policy.json")],
                       capture_output=True, text=True, check=True, timeout=60)
        out = subprocess.run([GOODPUT, "report", replay_db, "--format", "events"], capture_output=True, text=True,
                             check=True)
        replayed = [json.loads(line) for line in out.stdout.splitlines()]
        self.assertEqual([(d["group"], d["from"], d["to"]) for d in of_type(replayed, "scale_decided")],
                         [("ps", 3, 4), ("ps", 4, 3)])
        self.assertEqual([(r["world_size"], r["restore_tier"]) for r in of_type(replayed, "restart_job")],
                         [(r["world_size"], r["restore_tier"]) for r in restarts])

        names = {j["node"]: j["name"] for j in joined}
        workers = [names[j["node"]] for j in joined if j["replica_type"] == "worker"]
        prog = run.progress()
        recomputed = 0
        for name in workers:
            seen = {}
            for restart in range(3):
                for st, loss in losses(prog[(name, restart)]).items():
                    if st in seen:
                        recomputed += 1
                        self.assertEqual(seen[st], loss, f"{name} step {st} after restart {restart}")
                    seen[st] = loss
            self.assertEqual(max(seen), 200)
        self.assertGreater(recomputed, 0)  # steps after each restored checkpoint were done twice
        # Each rank knew its part after the moves: the workers sat at ranks 2 and 3 with two servers.
        first_worker = [j for j in joined if j["replica_type"] == "worker" and j["slot"] == 1][0]
        with open(os.path.join(run.run_dir, "nodes", first_worker["name"], "r1-stdout.log")) as f:
            self.assertIn(f"rank 2 (worker 0) restart 1: starting after step {restarts[1]['restore_step']} "
                          f"(from storage)", f.read())
        with open(os.path.join(run.run_dir, "nodes", second["name"], "r1-stdout.log")) as f:
            self.assertIn(f"rank 1 (ps 1) restart 1: starting after step {restarts[1]['restore_step']}", f.read())

    def test_an_operator_adds_a_ddp_worker_which_starts_from_the_others_state(self):
        # `goodput scale worker 3` on a two-node DDP job: the third node joins at slot 2, the world
        # restarts from storage, and the new rank (a part the checkpoint does not have) loads worker
        # 0's state, as train_ddp.py does: every DDP rank holds the same model.
        run = LiveRun(self, spec(total_steps=160))
        answers = []

        def during():
            run.wait_for_step(60)
            answers.append(ask_scale(run, "worker", 3))

        self.assertEqual(run.run_while(during), 0, run.diag())
        self.assertEqual(answers[0].returncode, 0, answers[0].stderr)
        ev = run.events()
        self.assertEqual([(d["group"], d["from"], d["to"]) for d in of_type(ev, "scale_decided")], [("worker", 2, 3)])
        restarts = of_type(ev, "restart_job")
        self.assertEqual([(r["world_size"], r["restore_tier"]) for r in restarts], [(2, "none"), (3, "storage")])
        restored = restarts[1]["restore_step"]
        self.assertGreater(restored, 0)
        joined = of_type(ev, "node_joined")
        self.assertEqual(sorted(j["slot"] for j in joined), [0, 1, 2])
        third = [j for j in joined if j["slot"] == 2][0]["name"]
        with open(os.path.join(run.run_dir, "nodes", third, "r1-stdout.log")) as f:
            self.assertIn(f"rank 2/3 restart 1: starting after step {restored} (from storage)", f.read())
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        # The first step after the restore starts from the stored model: ranks 0 and 1 see the
        # same loss on it as when they first trained it.
        prog = run.progress()
        for j in joined:
            if j["slot"] < 2:
                before, after = losses(prog[(j["name"], 0)]), losses(prog[(j["name"], 1)])
                self.assertEqual(after[restored + 1], before[restored + 1], j["name"])
        # And the new rank trained the same model as the others to the end (a rank that started
        # from a fresh model would have drifted apart from them).
        sums = set()
        for j in joined:
            with open(os.path.join(run.run_dir, "nodes", j["name"], "r1-stdout.log")) as f:
                sums.update(re.findall(r"parameter sum (\S+)", f.read()))
        self.assertEqual(len(sums), 1, sums)

    def test_kill_node_relaunches_it_and_every_shard_is_trained_once(self):
        # 160 steps x 2 ranks, one shard per rank-step: the dataset is exactly one pass.
        run = LiveRun(self, spec(data_shards=320), [{"fault": "kill-node", "slot": 0, "at_step": 70}])
        self.assertEqual(run.run(), 0, self.diag(run))
        ev = run.events()
        failures = of_type(ev, "failure_observed")
        self.assertEqual([f["kind"] for f in failures], ["node_lost"], failures)
        self.assertEqual([(d["diagnosis"], d["action"]) for d in of_type(ev, "recovery_decided")],
                         [("hardware_error", "relaunch_node")])
        joined = of_type(ev, "node_joined")
        # Each node takes the slot it was launched for, whichever registers first; the replacement
        # is a fresh node identity.
        self.assertEqual({j["name"]: j["slot"] for j in joined}, {"local-0": 0, "local-1": 1, "local-2": 0})
        loaded = of_type(ev, "checkpoint_loaded")[1]
        self.assertEqual(loaded["tier"], "storage", "the new node has no host memory of the old one")
        self.assertEqual(of_type(ev, "processes_started")[-1]["world_size"], 2, "world size restored")

        # Exactly once: the ledger's view, and the samples the final model was trained on.
        assigned = 0
        for e in ev:
            if e["type"] == "shards_assigned":
                assigned += len(e["data"]["shards"])
        self.assertIn("320 of 320 done, 0 trained twice", run.stdout)
        finals = [r for recs in run.progress().values() for r in recs if r.get("event") == "done"]
        self.assertEqual({r["samples"] for r in finals}, {320 * 64}, finals)
        # Shards handed out after the restored checkpoint go round again (none when the node died
        # right after a checkpoint it had persisted: the trainers then restore that one).
        loaded = of_type(ev, "checkpoint_loaded")[1]["step"]
        self.assertGreaterEqual(assigned, 320)
        if loaded <= 40:  # the fault lands at step 70 or later
            self.assertGreater(assigned, 320, "the failure made some shards go round twice")

    def replica_spec(self, **over):
        """A memory checkpoint every 30 steps, every second one persisted, and one copy of each in
        the other node's memory (checkpoint.replicas: 1, ring)."""
        policy = {"name": "flash+replica (live test)",
                  "recovery": {"policy": "diagnose", "max_restarts_per_node": 3, "restore_from": "memory"},
                  "checkpoint": {"policy": "flash", "every_steps": 30, "persist_every": 2, "replicas": 1},
                  "scaling": {"policy": "wait"}}
        path = os.path.join(tempfile.mkdtemp(prefix="goodput-policy-"), "policy.json")
        self.addCleanup(shutil.rmtree, os.path.dirname(path), True)
        with open(path, "w") as f:
            json.dump(policy, f)
        return spec(policy=path, data_shards=320, **over), path

    def test_a_relaunched_node_restores_from_its_peer_s_copy_with_nothing_recomputed_past_the_last_save(self):
        # Saves at steps 30, 60, 90 (60 persisted); slot 0's machine dies at about step 100 (the
        # fault is handed over with a heartbeat, a few steps later). Its memory is gone, storage
        # has step 60, and slot 1's agent holds a copy of step 90: the new node fetches it and the
        # world restores step 90 (tier peer), not 60 from storage.
        job, policy = self.replica_spec()
        run = LiveRun(self, job, [{"fault": "kill-node", "slot": 0, "at_step": 95}])
        self.assertEqual(run.run(), 0, self.diag(run))
        ev = run.events()
        self.assertEqual([(d["diagnosis"], d["action"]) for d in of_type(ev, "recovery_decided")],
                         [("hardware_error", "relaunch_node")])
        failure = [e for e in ev if e["type"] == "failure_observed"][0]
        before = [e for e in ev if e["seq"] < failure["seq"]]
        saved = [e["data"]["step"] for e in before if e["type"] == "checkpoint_saved"]
        stored = [e["data"]["step"] for e in before if e["type"] == "replica_stored"]
        self.assertTrue(saved and stored, before)
        self.assertEqual(stored[-1], saved[-1], "the newest save's copies were logged before the failure")
        restart = [e["data"] for e in ev if e["type"] == "restart_job" and e["seq"] > failure["seq"]][0]
        self.assertEqual((restart["restore_tier"], restart["restore_step"]), ("peer", saved[-1]))
        loaded = of_type(ev, "checkpoint_loaded")[1]
        self.assertEqual((loaded["tier"], loaded["step"]), ("peer", saved[-1]),
                         "restored from the peer's copy: nothing recomputed beyond the last memory save")
        self.assertEqual([s for s in of_type(ev, "status_observed") if s["object"] == "replica"], [])
        new_node = [j["name"] for j in of_type(ev, "node_joined")][-1]
        with open(os.path.join(run.run_dir, "nodes", new_node, "agent.log")) as f:
            self.assertIn(f"fetched rank 0's step {saved[-1]} from local-1", f.read())
        # The relaunched rank trained on from the peer's state: its first step is the one after it.
        first = [r for r in run.progress()[(new_node, 1)] if r.get("event") == "step"][0]
        self.assertEqual(first["step"], saved[-1] + 1)
        self.assertIn("320 of 320 done, 0 trained twice", run.stdout)
        report = run.report()
        self.assertEqual(report["restores"]["peer"], 1, report["restores"])
        # The live run replays in the simulator close to its measured goodput (assert_replays_close).
        replay = subprocess.run([GOODPUT, "replay", "--from-log", run.db, "--format", "json", "--policy", policy],
                                capture_output=True, text=True)
        self.assertEqual(replay.returncode, 0, replay.stderr)
        assert_replays_close(self, report, json.loads(replay.stdout), every_steps=30)

    def test_a_spoiled_copy_is_refused_with_the_reason_and_the_world_restores_from_storage(self):
        # As above, but the copies slot 1 holds are spoiled first (a bad DIMM on the holder): the
        # new node's fetch fails its checksum, the reason is logged, and the world loads step 60.
        job, _ = self.replica_spec()
        run = LiveRun(self, job, [{"fault": "corrupt-replica", "slot": 1, "at_step": 92},
                                  {"fault": "kill-node", "slot": 0, "at_step": 100}])
        self.assertEqual(run.run(), 0, self.diag(run))
        ev = run.events()
        failure = [e for e in ev if e["type"] == "failure_observed"][0]
        restart = [e["data"] for e in ev if e["type"] == "restart_job" and e["seq"] > failure["seq"]][0]
        self.assertEqual(restart["restore_tier"], "peer", "the master planned on the copies")
        refused = [s for s in of_type(ev, "status_observed") if s["object"] == "replica"]
        self.assertEqual(len(refused), 1, refused)
        self.assertIn(f"could not fetch step {restart['restore_step']} from peers (rank 0: local-1:", refused[0]["status"])
        self.assertIn("failed its check: checksum mismatch", refused[0]["status"])
        self.assertIn("restoring from storage", refused[0]["status"])
        loaded = of_type(ev, "checkpoint_loaded")[1]
        persisted = [e["data"]["step"] for e in ev if e["type"] == "checkpoint_persisted" and e["seq"] < failure["seq"]]
        self.assertEqual((loaded["tier"], loaded["step"]), ("storage", persisted[-1]))
        self.assertIn("320 of 320 done, 0 trained twice", run.stdout)

    def test_a_lost_node_s_slot_goes_to_a_warm_spare_at_once_and_the_pool_refills(self):
        # "spares": 1 — a third agent registers beside the world and is told to stop; when slot 0's
        # node is killed its slot goes to the spare in the same decision, the job restarts without
        # waiting for a machine, and the node launched in its stead joins as the next spare.
        # With node checks on, the spares are checked beside the training world: the slot takes a
        # node known good, with no check round between the failure and the restart. (Four probes
        # share two cores and one loopback here: the link figures are noise, not stragglers.)
        # The kill lands mid-way between two saves (90 of 80 and 100), so the live restore and the
        # replay's agree on the step: near a save, whether its persist beat the kill is a race the
        # replay cannot see, and a save interval is 6 points of this 10 s run.
        run = LiveRun(self, spec(spares=1, data_shards=320, node_check={"compute": "200ms", "straggler_factor": 100}),
                      [{"fault": "kill-node", "slot": 0, "at_step": 88}])
        self.assertEqual(run.run(), 0, self.diag(run))
        ev = run.events()
        self.assertEqual([(d["diagnosis"], d["action"]) for d in of_type(ev, "recovery_decided")],
                         [("hardware_error", "relaunch_node")])
        joins = [e for e in ev if e["type"] == "node_joined"]
        self.assertEqual(sorted(j["data"]["slot"] for j in joins[:3]), [-1, 0, 1], "two ranks and a spare")
        spare = [j["data"] for j in joins[:3] if j["data"]["slot"] == -1][0]
        self.assertEqual(len(joins), 4, joins)
        self.assertEqual(joins[3]["data"]["slot"], -1, "the replacement refills the pool")
        decided = [e for e in ev if e["type"] == "recovery_decided"][0]
        restart = [e for e in ev if e["type"] == "restart_job" and e["seq"] > decided["seq"]][0]
        self.assertLess(restart["seq"], joins[3]["seq"], "the restart did not wait for the new machine")
        self.assertEqual(of_type(ev, "no_spare_node"), [])
        checked = [e for e in ev if e["type"] == "node_checked"]
        spare_checked = [c for c in checked if c["data"]["node"] == spare["node"]]
        self.assertEqual([c["data"]["verdict"] for c in spare_checked], ["passed"], checked)
        self.assertLess(spare_checked[0]["seq"], decided["seq"], "checked before it was needed")
        self.assertEqual([c for c in checked if decided["seq"] < c["seq"] < restart["seq"]], [],
                         "no check between the failure and the restart")
        refill = [c for c in checked if c["data"]["node"] == joins[3]["data"]["node"]]
        self.assertEqual([c["data"]["verdict"] for c in refill], ["passed"], "the new spare is checked too")
        # The spare trained as the lost node's rank, from the storage checkpoint, and the dataset
        # was trained exactly once.
        prog = run.progress()
        self.assertIn((spare["name"], 1), prog, sorted(prog))
        self.assertNotIn((spare["name"], 0), prog, "the spare ran no trainer before it took the slot")
        self.assertEqual(of_type(ev, "checkpoint_loaded")[1]["tier"], "storage")
        self.assertIn("320 of 320 done, 0 trained twice", run.stdout)
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        replay = subprocess.run([GOODPUT, "replay", "--from-log", run.db, "--format", "json", "--policy",
                                 os.path.join(ROOT, "examples/pytorch/policy.json")], capture_output=True, text=True)
        self.assertEqual(replay.returncode, 0, replay.stderr)  # the log of a run with spares replays
        assert_replays_close(self, run.report(), json.loads(replay.stdout))

    def test_oom_relaunches_with_more_memory_and_a_hang_is_detected(self):
        run = LiveRun(self, spec(total_steps=200, command=spec()["command"] + ["--oom-mb", "64"]),
                      [{"fault": "oom", "slot": 0, "at_step": 50}, {"fault": "hang", "slot": 1, "at_step": 130}])
        self.assertEqual(run.run(), 0, self.diag(run))
        ev = run.events()
        failures = of_type(ev, "failure_observed")
        decided = of_type(ev, "recovery_decided")
        self.assertEqual([(d["diagnosis"], d["action"], d["memory_permille"]) for d in decided],
                         [("out_of_memory", "relaunch_with_more_memory", 1500), ("unknown", "restart_process", 1000)])
        self.assertIn("can't allocate memory", failures[0]["reason"])
        hang = failures[1]
        self.assertEqual(hang["kind"], "hang")
        self.assertIn("process stopped", hang["reason"])
        hang_event = [e for e in ev if e["type"] == "failure_observed"][1]
        # Detected after hang_timeout (6 s) of silence; the blamed rank may have reported a step
        # later than the first rank to fall silent.
        self.assertGreaterEqual(hang_event["t"] - hang["stalled_since_ns"], 5_000_000_000)
        # Before the hung world was restarted, each trainer dumped its threads' stacks.
        stderr_logs = []
        for name in os.listdir(os.path.join(run.run_dir, "nodes")):
            for f in os.listdir(os.path.join(run.run_dir, "nodes", name)):
                if f.endswith("-stderr.log"):
                    with open(os.path.join(run.run_dir, "nodes", name, f)) as fh:
                        stderr_logs.append(fh.read())
        self.assertTrue(any("most recent call first" in s and "train_ddp.py" in s for s in stderr_logs))
        # The replacement node runs with 1.5x the memory limit.
        nodes = os.path.join(run.run_dir, "nodes")
        third = sorted(os.listdir(nodes))[-1]
        with open(os.path.join(nodes, third, "agent.log")) as f:
            self.assertIn("memory x1.5", f.read())

    def test_the_node_check_can_probe_links_with_a_gloo_all_reduce(self):
        # For a PyTorch job the link probe is the job's own kind of traffic: each pair of agents
        # runs goodput.collective_probe (torch.distributed, gloo) as ranks 0 and 1. Slot 1's link
        # is down: its partner's all_reduce with it fails, and so does its own with a second partner.
        check = {"compute": "200ms", "link_mib": 4, "straggler_factor": 50,  # not about stragglers
                 "collective": ["/usr/bin/python3", "-m", "goodput.collective_probe"],
                 "faults": [{"slot": 1, "fault": "link-down"}]}
        run = LiveRun(self, spec(nodes=3, node_check=check, total_steps=40))
        self.assertEqual(run.run(), 0, self.diag(run))
        ev = run.events()
        joined = {j["node"]: j for j in of_type(ev, "node_joined")}
        checked = of_type(ev, "node_checked")
        passed = [c for c in checked if c["verdict"] == "passed"]
        self.assertTrue(all(c["link_mb_per_s"] > 0 for c in passed), checked)
        faulty = [c for c in checked if c["verdict"] == "faulty"]
        self.assertEqual([joined[c["node"]]["slot"] for c in faulty], [1], checked)
        # Slot 0 failed its all_reduce with slot 1 in round 1 (the error is the collective's) and
        # cleared itself with another partner in round 2.
        zero = [c for c in checked if joined[c["node"]]["slot"] == 0]
        self.assertEqual([c["verdict"] for c in zero][:2], ["suspect", "passed"], checked)
        self.assertIn("collective with 127.0.0.1:", zero[0]["detail"])
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

    def test_a_hung_trainer_that_is_not_python_gets_native_stacks(self):
        # A bash trainer (no faulthandler to ask) stopped with SIGSTOP: after hang_timeout the agent
        # takes its stacks with gdb (py-spy where installed) before it restarts it.
        if not shutil.which("gdb") and not shutil.which("py-spy"):
            self.fail("gdb is not installed (scripts/install-deps.sh installs it)")
        trainer = os.path.join(ROOT, "tests", "python", "native_trainer.sh")
        run = LiveRun(self, spec(nodes=1, command=["/bin/bash", trainer], total_steps=120),
                      [{"fault": "hang", "slot": 0, "at_step": 30}])
        self.assertEqual(run.run(), 0, self.diag(run))
        ev = run.events()
        self.assertEqual([f["kind"] for f in of_type(ev, "failure_observed")], ["hang"])
        node_dir = os.path.join(run.run_dir, "nodes", "local-0")
        stacks = [f for f in os.listdir(node_dir) if f.startswith("stacks-r0-")]
        self.assertEqual(len(stacks), 1, os.listdir(node_dir))
        with open(os.path.join(node_dir, stacks[0])) as f:
            text = f.read()
        self.assertRegex(text, r"#0 |Thread \d+", text[-2000:])  # a backtrace of the hung process
        with open(os.path.join(node_dir, "agent.log")) as f:
            self.assertIn("stacks of the hung trainer", f.read())
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

    def test_a_straggler_is_measured_and_replaced_and_not_taken_for_a_hang(self):
        policy = {"name": "replace stragglers",
                  "recovery": {"policy": "diagnose", "replace_stragglers_above": 1.5},
                  "checkpoint": {"policy": "flash", "every_steps": 20, "persist_every": 2}}
        cmd = spec()["command"] + ["--slow-node", "local-1", "--slow-factor", "3"]
        run = LiveRun(self, spec(policy=policy, command=cmd, total_steps=200))
        self.assertEqual(run.run(), 0, self.diag(run))
        ev = run.events()
        slow = of_type(ev, "slowdown_observed")
        self.assertTrue(slow, "the slow node was never flagged")
        joined = {j["node"]: j["name"] for j in of_type(ev, "node_joined")}
        self.assertEqual(joined[slow[0]["node"]], "local-1")
        self.assertGreaterEqual(slow[0]["slowdown_permille"], 1500, slow)  # the measured ratio is the evidence
        decided = of_type(ev, "recovery_decided")
        self.assertEqual([(d["diagnosis"], d["action"]) for d in decided][:1], [("straggler", "relaunch_node")])
        self.assertIn("slower", decided[0]["rule"])
        self.assertEqual([f for f in of_type(ev, "failure_observed") if f["kind"] == "hang"], [])
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

    def test_the_node_check_finds_a_bad_link_and_a_slow_node_before_training(self):
        # Three nodes checked before any trainer starts: slot 1's link is down (its agent refuses
        # probes and its own fail), slot 2 computes at a quarter of the speed (real extra work).
        policy = {"name": "replace stragglers",
                  "recovery": {"policy": "diagnose", "replace_stragglers_above": 1.5},
                  "checkpoint": {"policy": "flash", "every_steps": 20, "persist_every": 2}}
        check = {"compute": "400ms", "link_mib": 8,
                 "faults": [{"slot": 1, "fault": "link-down"}, {"slot": 2, "fault": "slow:4"}]}
        run = LiveRun(self, spec(nodes=3, policy=policy, node_check=check, total_steps=60))
        self.assertEqual(run.run(), 0, self.diag(run))
        ev = run.events()
        joined = {j["node"]: j for j in of_type(ev, "node_joined")}
        checked = of_type(ev, "node_checked")
        by_slot = lambda slot, verdict: [c for c in checked if joined[c["node"]]["slot"] == slot and c["verdict"] == verdict]
        # Slot 1 failed with two partners (round 1 and round 2), and was relaunched as a hardware error.
        faulty = by_slot(1, "faulty")
        self.assertEqual(len(faulty), 1, checked)
        self.assertEqual(faulty[0]["round"], 2)
        self.assertFalse(faulty[0]["link_ok"])
        bad = faulty[0]["node"]
        self.assertEqual(len(by_slot(1, "suspect")), 1, checked)
        # Its round-1 partner (slot 0) was a suspect too, and cleared itself in round 2.
        self.assertTrue(any(c["round"] == 2 and c["verdict"] in ("passed", "straggler") and c["link_ok"]
                            for c in checked if joined[c["node"]]["slot"] == 0), checked)
        decided = {d["node"]: d for d in of_type(ev, "recovery_decided")}
        self.assertEqual((decided[bad]["diagnosis"], decided[bad]["action"]), ("hardware_error", "relaunch_node"))
        # Slot 2: a straggler, with its measured ratio as the evidence; replaced by the policy. (Its
        # replacement's link, measured between agents sharing 2 busy cores, may read slow too and be
        # replaced in turn: only the drilled node's compute verdict is counted.)
        slow = [c for c in by_slot(2, "straggler") if c["detail"].startswith("compute ")]
        self.assertEqual(len(slow), 1, checked)
        self.assertTrue(slow[0]["compute_ok"])
        ratio = [s for s in of_type(ev, "slowdown_observed") if s["node"] == slow[0]["node"]]
        self.assertGreaterEqual(ratio[0]["slowdown_permille"], 2000, ratio)
        self.assertEqual(decided[slow[0]["node"]]["diagnosis"], "straggler")
        # The replacements were checked (a link between agents sharing 2 busy cores may read slow,
        # so not necessarily "passed", but never faulty); only then did trainers start.
        for n in (bad, slow[0]["node"]):
            again = [c for c in checked if joined[c["node"]]["slot"] == joined[n]["slot"] and c["node"] != n]
            self.assertTrue(again and again[-1]["verdict"] in ("passed", "straggler"), checked)
        # Trainers started only once the first world and the first replacements had verdicts (a
        # replacement whose noisy link reads slow is replaced and checked in turn, later).
        first_five = set(sorted(joined)[:5])  # node ids follow the joins: the world's three, then two
        first_checks = [e["seq"] for e in ev if e["type"] == "node_checked" and e["data"]["node"] in first_five]
        started = [e["seq"] for e in ev if e["type"] == "processes_started"]
        self.assertLess(max(first_checks), min(started))
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        # goodput explain tells the faulty node's story with the numbers.
        out = run.explain(joined[bad]["name"])
        self.assertIn("checked (round 2): faulty", out)
        self.assertIn("node check failed", out)

    def test_an_operator_checks_a_running_node_and_a_bad_one_is_relaunched(self):
        # No node_check in the spec: the job trains at once. Mid-run an operator runs
        # `goodput check 1 --fault corrupt`: training stops right after the next flash checkpoint
        # (so nothing is recomputed), slot 1's node runs the real compute probe (with wrong
        # products, the drill) and a link probe to slot 0's agent, is found faulty and relaunched
        # as a hardware error, and the job resumes from that checkpoint.
        run = LiveRun(self, spec(total_steps=240))
        answers = []

        def during():
            run.wait_for_step(60)
            token = os.path.join(run.run_dir, "token")
            bad = subprocess.run([GOODPUT, "check", "7", "--master", run.url(), "--token-file", token],
                                 capture_output=True, text=True, timeout=30)
            answers.append(bad)
            answers.append(subprocess.run([GOODPUT, "check", "1", "--fault", "corrupt", "--reason", "rehearsal",
                                           "--master", run.url(), "--token-file", token],
                                          capture_output=True, text=True, timeout=30))

        self.assertEqual(run.run_while(during), 0, run.diag())
        self.assertEqual(answers[0].returncode, 2, answers[0].stderr)
        self.assertIn("no node holds slot 7", answers[0].stderr)
        self.assertEqual(answers[1].returncode, 0, answers[1].stderr)
        self.assertIn("after the next checkpoint", answers[1].stdout)
        ev = run.events()
        joined = {j["node"]: j for j in of_type(ev, "node_joined")}
        # Logged when asked (waiting for the checkpoint), then again when it starts.
        asked = of_type(ev, "check_requested")
        self.assertEqual([a.get("waiting", False) for a in asked], [True, False], asked)
        asked = asked[1:]
        self.assertEqual((asked[0]["fault"], asked[0]["reason"]), ("corrupt", "rehearsal"))
        bad = asked[0]["nodes"][0]
        self.assertEqual(joined[bad]["slot"], 1)
        checked = of_type(ev, "node_checked")
        self.assertEqual([(c["node"], c["verdict"], c["compute_ok"]) for c in checked], [(bad, "faulty", False)], checked)
        self.assertIn("differs from the exact result", checked[0]["detail"])
        self.assertEqual(joined[checked[0]["peer"]]["slot"], 0)  # its link was measured to slot 0's agent
        decided = of_type(ev, "recovery_decided")
        self.assertEqual([(d["node"], d["diagnosis"], d["action"]) for d in decided],
                         [(bad, "hardware_error", "relaunch_node")])
        # Training stopped in the same moment as the checkpoint it waited for, and restarted from it.
        seq_asked = [e["seq"] for e in ev if e["type"] == "check_requested"][1]
        saved = [e["data"] for e in ev if e["type"] == "checkpoint_saved" and e["seq"] < seq_asked]
        loaded = [e["data"] for e in ev if e["type"] == "checkpoint_loaded" and e["seq"] > seq_asked]
        self.assertGreater(loaded[0]["step"], 0, loaded)
        self.assertEqual(loaded[0]["step"], saved[-1]["step"])
        self.assertLess(run.report()["losses_ns"]["recompute"], 50_000_000)
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        out = run.explain(joined[bad]["name"])
        self.assertIn("check requested, to start after the next checkpoint: rehearsal (fault drill: corrupt)", out)
        self.assertIn("checking: rehearsal (fault drill: corrupt)", out)
        self.assertIn("checked (round 1): faulty", out)
        # A replay of the log has the failures, not the check: it says so.
        replay = subprocess.run([GOODPUT, "replay", "--from-log", run.db], capture_output=True, text=True, timeout=60)
        self.assertEqual(replay.returncode, 0, replay.stderr)
        self.assertIn("1 node check(s) an operator asked for (goodput check) are not replayed", replay.stderr)

    def test_a_hang_left_alone_is_reported_with_stacks_and_its_stall_accounted_until_it_moves(self):
        # hang_action "report": the master takes no action on a hang. Slot 1's trainer is stopped
        # (SIGSTOP) at step 60; after hang_timeout (6 s) the master logs stall_observed and every agent
        # dumps its trainer's stacks without touching it. Once the stacks are written, the test
        # continues the process (SIGCONT): progress resumes, the stall ends in the log, and the job completes with no
        # failure and no restart; the stalled time is the report's "stall" loss.
        run = LiveRun(self, spec(total_steps=200, hang_action="report"),
                      [{"fault": "hang", "slot": 1, "at_step": 60}])
        seen = {}

        def during():
            run.wait_for_master()
            deadline = time.time() + 120
            while time.time() < deadline and "stall" not in seen:
                try:
                    with urllib.request.urlopen(run.url() + "/status", timeout=2) as r:
                        st = json.loads(r.read())
                    # (A start slowed past hang_timeout by a loaded machine is a stall too; this
                    # test is about the stopped process.)
                    stopped = [x for x in of_type(run.events(), "stall_observed") if "process stopped" in x["reason"]]
                    if stopped:
                        seen["stall"] = stopped[0]
                        seen["pid"] = [n["trainer"]["pid"] for n in st["nodes"] if n["slot"] == 1][0]
                except (OSError, ValueError, subprocess.CalledProcessError):
                    pass
                time.sleep(0.3)
            # Its stacks are taken where it stands (gdb attaches to the stopped process; on a busy
            # machine that takes a while), and it is left alone: still stopped afterwards.
            nodes = os.path.join(run.run_dir, "nodes")
            while time.time() < deadline and not any(
                    os.path.getsize(os.path.join(nodes, n, f)) > 0 for n in os.listdir(nodes)
                    for f in os.listdir(os.path.join(nodes, n)) if f == f"stacks-r0-{seen.get('pid')}.txt"):
                time.sleep(0.2)
            time.sleep(1)
            with open(f"/proc/{seen['pid']}/stat") as f:
                # T: stopped; t: stopped with a tracer still attached (gdb finishing on a loaded machine)
                seen["still_stopped"] = f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
            os.kill(seen["pid"], signal.SIGCONT)

        self.assertEqual(run.run_while(during), 0, run.diag())
        self.assertIn("stall", seen, run.diag())
        ev = run.events()
        stalls = of_type(ev, "stall_observed")
        self.assertTrue(seen["still_stopped"], stalls)
        # The stopped process's stall, then its end; any before them came in pairs too.
        self.assertEqual([s["resumed"] for s in stalls][-2:], [False, True], stalls)
        self.assertEqual(len(stalls) % 2, 0, stalls)
        self.assertIn("process stopped", stalls[-2]["reason"])
        self.assertEqual(stalls[-2]["node"], stalls[-1]["node"])
        self.assertEqual(of_type(ev, "failure_observed"), [])
        self.assertEqual(of_type(ev, "recovery_decided"), [])
        self.assertEqual(len(of_type(ev, "restart_job")), 1)
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        # From the last progress to the resumption: at least the timeout and the second left alone.
        self.assertGreater(run.report()["losses_ns"]["stall"], 6.5e9)
        # The stopped trainer's stacks were taken where it stood (native: it could not answer a signal).
        nodes = os.path.join(run.run_dir, "nodes")
        stacks = [os.path.join(nodes, n, f) for n in os.listdir(nodes) for f in os.listdir(os.path.join(nodes, n))
                  if f == f"stacks-r0-{seen['pid']}.txt"]
        self.assertEqual(len(stacks), 1)
        self.assertGreater(os.path.getsize(stacks[0]), 0)

    def test_a_pause_that_passes_before_the_hang_timeout_is_logged_as_a_stall_and_replays(self):
        # Slot 1's trainer is stopped for 3 s (SIGSTOP, then SIGCONT) by the test: longer than
        # stall_after (1.5 s), shorter than hang_timeout (6 s). Nothing is decided; the log says the
        # job stood still and for how long, the report counts it as "stall", and the log replays
        # in the simulator with the pause in it.
        run = LiveRun(self, spec(total_steps=200, stall_after="1500ms"))
        seen = {}

        def during():
            run.wait_for_step(60)
            with urllib.request.urlopen(run.url() + "/status", timeout=2) as r:
                seen["pid"] = [n["trainer"]["pid"] for n in json.loads(r.read())["nodes"] if n["slot"] == 1][0]
            os.kill(seen["pid"], signal.SIGSTOP)
            time.sleep(3)
            os.kill(seen["pid"], signal.SIGCONT)

        self.assertEqual(run.run_while(during), 0, run.diag())
        ev = run.events()
        # (A start slowed by two busy cores may be one too: the stop came after step 60.)
        stalls = [e for e in ev if e["type"] == "stall_observed"]
        self.assertTrue(all(e["data"]["resumed"] for e in stalls), stalls)
        stopped = [e for e in stalls if int(re.search(r"at step (\d+)", e["data"]["reason"]).group(1)) >= 60]
        self.assertEqual(len(stopped), 1, stalls)
        lasted = stopped[0]["t"] - stopped[0]["data"]["stalled_since_ns"]
        self.assertGreater(lasted, 2.5e9)
        self.assertLess(lasted, 6.5e9)  # well under hang_timeout plus a heartbeat
        self.assertIn("then moving again", stopped[0]["data"]["reason"])
        self.assertEqual(of_type(ev, "failure_observed"), [])
        self.assertEqual(len(of_type(ev, "restart_job")), 1)
        self.assertGreater(run.report()["losses_ns"]["stall"], 2.5e9)
        replay = subprocess.run([GOODPUT, "replay", "--from-log", run.db, "--format", "json"], capture_output=True,
                                text=True, check=True)
        self.assertGreater(json.loads(replay.stdout)["losses_ns"]["stall"], 2.5e9)

    def test_storage_that_cannot_be_written_costs_persistence_not_the_job(self):
        # The checkpoint storage path cannot be created (its parent is a device file: root can
        # write anywhere else). Training goes on on memory checkpoints, a killed trainer still
        # restores from memory, and the failure is named: in the agents' logs, in /status and as a
        # warning of `goodput run`; the report shows nothing was persisted.
        run = LiveRun(self, spec(total_steps=120, storage_dir="/dev/null/ckpt"),
                      [{"fault": "kill-process", "slot": 1, "at_step": 70}])
        self.assertEqual(run.run(), 0, self.diag(run))
        ev = run.events()
        self.assertEqual(of_type(ev, "checkpoint_persisted"), [])
        loaded = [l for l in of_type(ev, "checkpoint_loaded") if l["step"] > 0]
        self.assertEqual([l["tier"] for l in loaded], ["memory"], loaded)
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        self.assertIn("cannot persist checkpoints to storage: /dev/null/ckpt/step-", run.stderr)
        logs = ""
        for name in os.listdir(os.path.join(run.run_dir, "nodes")):
            with open(os.path.join(run.run_dir, "nodes", name, "agent.log")) as f:
                logs += f.read()
        self.assertIn("persist failed: /dev/null/ckpt/step-", logs)
        self.assertIn("Not a directory", logs)

    def test_storage_slower_than_the_checkpoint_interval_never_holds_training_back(self):
        # The disk under the checkpoint directory is made slow at the OS boundary: a preloaded
        # write() (tests/python/slow_write.c) sleeps as a 25 kB/s disk would, so one persist takes
        # longer than the 10 steps between saves. The agents' persisters must collapse requests
        # (persisting the newest, skipping the rest) rather than queue them or hold saves back, keep
        # at most two memory copies per rank, and still get the last step to storage.
        so = os.path.join(tempfile.mkdtemp(prefix="goodput-slowwrite-"), "slow_write.so")
        self.addCleanup(shutil.rmtree, os.path.dirname(so), True)
        subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", so, os.path.join(ROOT, "tests/python/slow_write.c"),
                        "-ldl"], check=True)
        policy = {"name": "flash every 10 steps, each persisted",
                  "recovery": {"policy": "diagnose"},
                  "checkpoint": {"policy": "flash", "every_steps": 10, "persist_every": 1}}
        run = LiveRun(self, spec(total_steps=200, policy=policy))
        storage = os.path.join(run.run_dir, "checkpoints")
        run.env = dict(os.environ, LD_PRELOAD=so, GOODPUT_SLOW_DIR=storage, GOODPUT_SLOW_BYTES_PER_S="25000")
        most = {}

        def during():
            run.wait_for_master()
            deadline = time.time() + 120
            while time.time() < deadline:
                for f in glob.glob("/dev/shm/goodput-livetest-*"):
                    node = f.rsplit("-", 2)[0]
                    most[node] = max(most.get(node, 0), len(glob.glob(node + "-*")))
                try:
                    with urllib.request.urlopen(run.url() + "/status", timeout=2) as r:
                        if json.loads(r.read())["phase"] == "finished":
                            break
                except (OSError, ValueError):
                    pass
                time.sleep(0.05)

        self.assertEqual(run.run_while(during), 0, run.diag())
        ev = run.events()
        saves = sum(s["count"] for s in of_type(ev, "checkpoint_saved"))
        persisted = sum(p["count"] for p in of_type(ev, "checkpoint_persisted"))
        self.assertGreaterEqual(saves, 19, of_type(ev, "checkpoint_saved"))
        self.assertLess(persisted, saves - 3, (saves, of_type(ev, "checkpoint_persisted")))
        self.assertTrue(most, "no shared memory seen")
        self.assertLessEqual(max(most.values()), 2, most)
        listed = subprocess.run([GOODPUT, "ckpt", "ls", storage], capture_output=True, text=True, check=True).stdout
        self.assertIn("step 200", listed)
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

    def test_master_killed_mid_run_resumes_from_its_log(self):
        run = LiveRun(self, spec(total_steps=200, data_shards=400))
        proc = run.start()
        try:
            deadline = time.time() + 120
            step = 0
            while time.time() < deadline and step < 60:
                time.sleep(0.3)
                try:
                    with urllib.request.urlopen(run.url() + "/status", timeout=2) as r:
                        step = json.loads(r.read())["step"]
                except (OSError, ValueError):
                    pass
            self.assertGreaterEqual(step, 60, "the job never got going")
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
        with sqlite3.connect(run.db) as db:  # what the dead master had acknowledged
            before = db.execute("SELECT seq, time_ns, type, payload FROM events ORDER BY seq").fetchall()
        time.sleep(1)  # agents keep their trainers running without a master
        # As the README says: the run directory alone (it remembers its job spec).
        run.args = [GOODPUT, "run", "--run-dir", run.run_dir]
        self.assertEqual(run.run(resume=True), 0, self.diag(run))
        with sqlite3.connect(run.db) as db:
            after = db.execute("SELECT seq, time_ns, type, payload FROM events ORDER BY seq").fetchall()
        self.assertEqual(after[:len(before)], before, "nothing the old master logged was lost or changed")
        ev = run.events()
        self.assertEqual(len(of_type(ev, "restart_job")), 1, "healthy trainers were not restarted")
        self.assertEqual(of_type(ev, "failure_observed"), [])
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        self.assertIn("400 of 400 done, 0 trained twice", run.stdout)

    def test_a_master_killed_after_a_scale_resumes_with_the_new_layout(self):
        # The layout after `goodput scale ps 2` is folded from the log: a master killed (SIGKILL)
        # while the scaled world trains comes back with the second server at slot 1 and the
        # workers at 2 and 3, and leaves the healthy trainers running.
        run = LiveRun(self, ps_spec(job="psresume", total_steps=240))
        proc = run.start()
        try:
            run.wait_for_step(60)
            r = ask_scale(run, "ps", 2)
            self.assertEqual(r.returncode, 0, r.stderr)
            deadline = time.time() + 120
            while time.time() < deadline:  # the four-node world trains past the checkpoint it restored
                ev = run.events()
                if len(of_type(ev, "checkpoint_loaded")) == 2 and of_type(ev, "checkpoint_saved")[-1]["step"] > \
                        of_type(ev, "checkpoint_loaded")[-1]["step"]:
                    break
                time.sleep(0.3)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        finally:
            if proc.poll() is None:
                proc.kill()
        seen = {}

        def during():  # the resumed master listens where the old one did (its agents know it there)
            for _ in range(100):
                try:
                    with urllib.request.urlopen(run.url() + "/status", timeout=2) as resp:
                        seen.update(json.loads(resp.read()))
                    break
                except (OSError, ValueError):
                    time.sleep(0.2)

        run.args.append("--resume")
        self.assertEqual(run.run_while(during), 0, self.diag(run))
        self.assertEqual((seen.get("replicas"), seen.get("world_size")), ({"ps": 2, "worker": 2}, 4), seen)
        self.assertEqual(sorted(n["slot"] for n in seen["nodes"]), [0, 1, 2, 3], seen["nodes"])
        ev = run.events()
        self.assertEqual([(r["world_size"], r["restore_tier"]) for r in of_type(ev, "restart_job")],
                         [(3, "none"), (4, "storage")], "healthy trainers were not restarted")
        self.assertEqual(of_type(ev, "failure_observed"), [])
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        joined = of_type(ev, "node_joined")
        self.assertEqual(len(joined), 4, joined)
        # Ranks of the scaled layout: the server stays at 0, the new one is 1, the workers moved up.
        ranks = {j["name"]: (j["slot"] + 1 if j["slot"] > 0 else 0) for j in joined[:3]}
        ranks[joined[3]["name"]] = 1
        for name, rank in ranks.items():
            with open(os.path.join(run.run_dir, "nodes", name, "r1-stdout.log")) as f:
                self.assertIn(f"rank {rank} (", f.read())

    def test_a_command_that_cannot_run_fails_the_job_at_once_with_the_reason(self):
        # The mistake of a new user: a trainer command that does not exist (exit code 127, "cannot
        # run ...: No such file or directory"). Before, it was restarted 207 times in 90 s and then
        # its nodes were relaunched as hardware faults; now it is a configuration error.
        run = run_a_command_that_cannot_run(self, spec(command=["/nonexistent/python9", "train.py"]))
        self.assertIn("configuration_error (process_exit, exit code 127", run.stderr, self.diag(run))
        self.assertIn("-> give_up [cannot-exec", run.stderr)
        rep = run.report()
        self.assertTrue(rep["gave_up"], rep)
        self.assertIn("cannot run /nonexistent/python9", rep["gave_up_reason"])
        self.assertIn("GAVE UP after", run.stdout)

    def test_an_agent_stopped_with_sigterm_is_replaced_as_a_preemption_not_a_hardware_fault(self):
        # SIGTERM is how a node is taken away on purpose (a pod deleted, a Ray job stopped, an
        # operator): the agent says it is leaving before it goes.
        run = LiveRun(self, spec(total_steps=160))

        def term():
            run.wait_for_step(40)
            name = [j for j in of_type(run.events(), "node_joined") if j["slot"] == 1][-1]["name"]
            with open(os.path.join(run.run_dir, "nodes", name, "agent.pid")) as f:
                os.kill(int(f.read()), signal.SIGTERM)

        self.assertEqual(run.run_while(term), 0, self.diag(run))
        ev = run.events()
        failures = of_type(ev, "failure_observed")
        self.assertEqual(len(failures), 1, failures)
        self.assertEqual(failures[0]["kind"], "maintenance")
        self.assertIn("agent leaving (received SIGTERM)", failures[0]["reason"])
        decided = of_type(ev, "recovery_decided")
        self.assertEqual([(d["diagnosis"], d["action"]) for d in decided], [("preemption", "relaunch_node")], decided)
        self.assertIn("preemption (maintenance: agent leaving (received SIGTERM)", run.stderr)
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

    def test_the_api_wants_the_token_and_bounds_bodies(self):
        run = LiveRun(self, spec(total_steps=100000, step_time="1s"))
        proc = subprocess.Popen([GOODPUT, "master", run.job_path, "--run-dir", run.run_dir, "--quiet"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = run.wait_for_master()

            def post(path, body, token):
                req = urllib.request.Request(url + path, data=body, method="POST",
                                             headers={"Authorization": "Bearer " + token} if token else {})
                try:
                    with urllib.request.urlopen(req, timeout=5) as r:
                        return r.status, json.loads(r.read())
                except urllib.error.HTTPError as e:
                    return e.code, json.loads(e.read() or b"{}")

            self.assertEqual(post("/v1/register", b'{"name":"x"}', None)[0], 401)
            self.assertEqual(post("/v1/register", b'{"name":"x"}', "not-the-token-xyz")[0], 401)
            # A body over the 1 MiB limit is refused from its Content-Length, before it is read.
            host, port = url[len("http://"):].split(":")
            with socket.create_connection((host, int(port)), timeout=5) as sk:
                sk.sendall(("POST /v1/register HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + run.token() +
                            "\r\nContent-Length: 2097152\r\n\r\n").encode() + b"x" * 1000)
                self.assertTrue(sk.recv(4096).startswith(b"HTTP/1.1 413"))
            code, body = post("/v1/register", b'{"name": 5}', run.token())
            self.assertEqual((code, body["error"]), (400, "field 'name' has the wrong type"))
            code, body = post("/v1/register", b'{"name":"n0"}', run.token())
            self.assertEqual((code, body["slot"]), (200, 0))
            # A node that names no host is reached where its request came from; one that does, there.
            self.assertEqual(post("/v1/register", b'{"name":"n1","host":"10.1.2.3","slot":1}', run.token())[1]["slot"], 1)
            with urllib.request.urlopen(url + "/status", timeout=5) as r:
                hosts = {n["name"]: n["host"] for n in json.loads(r.read())["nodes"]}
            self.assertEqual(hosts, {"n0": "127.0.0.1", "n1": "10.1.2.3"})
            with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
                metrics = r.read().decode()
            self.assertIn('goodput_nodes{state="not_training"} 2', metrics)
            self.assertIn("goodput_ratio ", metrics)
            self.assertIn("goodput_api_unauthorized_total 2", metrics)
            # Every refusal by reason, the HTTP server's own (the 413 above) included.
            self.assertIn('goodput_api_refused_total{reason="token"} 2\n', metrics)
            self.assertIn('goodput_api_refused_total{reason="body_too_large"} 1\n', metrics)
            self.assertIn('goodput_api_refused_total{reason="bad_request"} 1\n', metrics)
            with urllib.request.urlopen(url + "/healthz", timeout=5) as r:
                self.assertEqual(r.read(), b"ok\n")
            # A client that sends half a request and stalls (slowloris) holds only its own connection.
            with socket.create_connection((host, int(port)), timeout=5) as slow:
                slow.sendall(b"POST /v1/register HTTP/1.1\r\nHost: x\r\nContent-Le")
                t0 = time.time()
                with urllib.request.urlopen(url + "/status", timeout=5) as r:
                    self.assertEqual(r.status, 200)
                self.assertLess(time.time() - t0, 2)
            with urllib.request.urlopen(url + "/", timeout=5) as r:  # the live page: the report, refreshing
                page = r.read().decode()
            self.assertIn('http-equiv="refresh"', page)
            self.assertIn('id="goodput"', page)
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=20)
        # The refusals are in the log: the first at once, the second (within the minute) before
        # the job ended; where they came from, never the token they presented.
        ev = run.events()
        refused = of_type(ev, "api_refused")
        self.assertEqual([(r["count"], r["peer"]) for r in refused], [(1, "127.0.0.1"), (1, "127.0.0.1")], refused)
        self.assertNotIn("not-the-token-xyz", json.dumps(ev))


class CollectiveProbeTest(unittest.TestCase):
    """goodput.collective_probe on its own: two real processes all-reducing through torch.distributed."""

    def probe(self, rank, port, *extra):
        env = dict(os.environ, PYTHONPATH=PYTHONPATH)
        return subprocess.Popen(["/usr/bin/python3", "-m", "goodput.collective_probe", "--rank", str(rank), "--addr",
                                 "127.0.0.1", "--port", str(port), "--bytes", str(1 << 20), "--timeout", "30", *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)

    @staticmethod
    def has_cuda():
        return subprocess.run(["/usr/bin/python3", "-c", "import torch; print(torch.cuda.is_available())"],
                              capture_output=True, text=True, check=True).stdout.strip() == "True"

    def test_auto_picks_the_backend_the_node_has_and_measures_a_correct_sum(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = [self.probe(r, port, "--backend", "auto") for r in (0, 1)]
        outs = [p.communicate(timeout=120) for p in procs]
        has_cuda = self.has_cuda()
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, err)
            r = json.loads(out.strip().splitlines()[-1])
            self.assertTrue(r["ok"], r)
            self.assertEqual(r["backend"], "nccl" if has_cuda else "gloo")
            self.assertGreater(r["mb_per_s"], 0)

    def test_nccl_without_a_gpu_fails_with_the_reason(self):
        if self.has_cuda():
            self.skipTest("this machine has a CUDA device")
        p = self.probe(0, 1, "--backend", "nccl")
        out, err = p.communicate(timeout=120)
        r = json.loads(out.strip().splitlines()[-1])
        self.assertEqual(p.returncode, 1, err)
        self.assertIn("needs a CUDA device", r["error"])


class LiveResumeHostsTest(unittest.TestCase):
    def test_a_resumed_master_learns_node_hosts_again_from_heartbeats(self):
        run = LiveRun(self, spec(total_steps=100000, step_time="1s"))
        args = [GOODPUT, "master", run.job_path, "--run-dir", run.run_dir, "--quiet"]

        def call(url, path, body=None):
            req = urllib.request.Request(url + path, data=json.dumps(body).encode() if body is not None else None,
                                         method="POST" if body is not None else "GET",
                                         headers={"Authorization": "Bearer " + run.token()})
            for _ in range(100):  # a master just started may not listen yet
                try:
                    with urllib.request.urlopen(req, timeout=5) as r:
                        return json.loads(r.read())
                except urllib.error.URLError:
                    time.sleep(0.1)
            raise AssertionError("no master at " + url)

        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = run.wait_for_master()
            node = call(url, "/v1/register", {"name": "n0", "host": "10.1.2.3"})["node"]
            proc.kill()
            proc.wait()
            proc = subprocess.Popen(args + ["--resume"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            hosts = {n["name"]: n["host"] for n in call(url, "/status")["nodes"]}
            self.assertEqual(hosts, {"n0": ""}, "hosts are not in the log")
            call(url, "/v1/heartbeat", {"node": node, "host": "10.1.2.3"})
            hosts = {n["name"]: n["host"] for n in call(url, "/status")["nodes"]}
            self.assertEqual(hosts, {"n0": "10.1.2.3"})
        finally:
            proc.kill()
            proc.wait()


class LiveTlsTest(unittest.TestCase):
    def test_a_job_runs_over_https_and_the_master_speaks_nothing_else(self):
        run = LiveRun(self, spec(total_steps=60, data_shards=120))
        cert, key = os.path.join(run.dir, "cert.pem"), os.path.join(run.dir, "key.pem")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                        "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
                       check=True, capture_output=True)
        run.args += ["--tls-cert", cert, "--tls-key", key]
        proc = subprocess.Popen(run.args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            url = run.wait_for_master()
            self.assertTrue(url.startswith("https://127.0.0.1:"), url)
            ok = ssl.create_default_context(cafile=cert)
            with urllib.request.urlopen(url + "/status", timeout=5, context=ok) as r:
                self.assertEqual(r.status, 200)
            with self.assertRaises(urllib.error.URLError):  # a certificate nobody vouches for
                urllib.request.urlopen(url + "/status", timeout=5, context=ssl.create_default_context())
            with self.assertRaises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
                urllib.request.urlopen("http://" + url[len("https://"):] + "/status", timeout=5)  # plain HTTP
            out, _ = proc.communicate(timeout=240)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        self.assertEqual(proc.returncode, 0)
        self.assertIn("120 of 120 done", out)  # agents and trainers (shards) all went through TLS


class LiveLogTest(unittest.TestCase):
    def test_a_master_that_cannot_write_its_log_stops_and_resumes_from_it(self):
        run = LiveRun(self, spec(total_steps=100000, step_time="1s"))
        env = dict(os.environ, GOODPUT_TOKEN="tok")
        args = [GOODPUT, "master", run.job_path, "--run-dir", run.run_dir, "--quiet"]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
        try:
            url = run.wait_for_master()

            def register(name):
                req = urllib.request.Request(url + "/v1/register", data=json.dumps({"name": name}).encode(),
                                             method="POST", headers={"Authorization": "Bearer tok"})
                try:
                    with urllib.request.urlopen(req, timeout=10) as r:
                        return r.status
                except urllib.error.HTTPError as e:
                    return e.code

            self.assertEqual(register("n0"), 200)
            # Someone else holds the database's write lock longer than the master's 5 s busy timeout.
            db = sqlite3.connect(run.db, timeout=1, isolation_level=None)
            db.execute("BEGIN EXCLUSIVE")
            self.assertEqual(register("n1"), 503)
            self.assertEqual(proc.wait(timeout=20), 3, "3: the job is on, resume the master")
            self.assertIn("the event log could not be written", proc.stderr.read())
            db.execute("ROLLBACK")
            db.close()
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.stderr.close()
        # Restarted, it knows n0 from the log and takes n1 now.
        proc = subprocess.Popen(args + ["--resume"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        try:
            time.sleep(1.0)
            self.assertEqual(register("n1"), 200)
            with urllib.request.urlopen(url + "/status", timeout=5) as r:
                names = sorted(n["name"] for n in json.loads(r.read())["nodes"])
            self.assertEqual(names, ["n0", "n1"])
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=20)


if __name__ == "__main__":
    unittest.main()
