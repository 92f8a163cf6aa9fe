"""The Ray backend end to end. Ray cannot be installed here, so the cluster is the Ray dashboard
emulator (tests/emulators/ray/ray_emulator.py): it speaks the Jobs and State APIs in the wire format
of the fixtures in shared/data/ray/ and really runs what is submitted. `goodput run` submits one
Ray job per node (a real `goodput agent`, which starts a real PyTorch DDP trainer); faults are the
cluster's own (a job killed for memory, a node that dies, a job no node can take, a dashboard
that fails or drops connections). Every assertion reads what the run left behind: the SQLite event
log, and the requests the emulated dashboard received."""

import glob
import json
import os
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_live import ROOT, LiveRun, of_type, run_a_command_that_cannot_run, spec  # noqa: E402

FIXTURES = os.environ.get("GOODPUT_SHARED_DATA", os.path.join(ROOT, "..", "shared", "data")) + "/ray"
EMULATOR = os.path.join(ROOT, "tests", "emulators", "ray", "ray_emulator.py")
MiB = 1 << 20


class Emulator:
    def __init__(self, test, nodes=3, require_header=None):
        self.dir = tempfile.mkdtemp(prefix="goodput-rayemu-")
        args = [sys.executable, EMULATOR, "--fixtures", FIXTURES, "--state-dir", self.dir, "--nodes", str(nodes),
                "--node-resources", json.dumps({"goodput_node": 1})]
        if require_header:
            args += ["--require-header", require_header]
        self.headers = {}
        if require_header:
            name, _, value = require_header.partition(":")
            self.headers[name.strip()] = value.strip()
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        test.addCleanup(subprocess.run, ["rm", "-rf", self.dir])
        test.addCleanup(self.close)
        line = self.proc.stdout.readline()
        test.assertTrue(line.startswith("listening on "), line)
        self.url = line.split()[-1]

    def close(self):
        self.proc.terminate()  # the emulator kills the process groups of the jobs it runs
        self.proc.wait()
        self.proc.stdout.close()
        # Emulated machines share this one's /dev/shm: a node killed here leaves its host memory,
        # which a real dead machine would take with it.
        for path in glob.glob("/dev/shm/goodput-raytest-*"):
            os.unlink(path)

    def call(self, method, path, body=None, headers=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers=self.headers if headers is None else headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.headers.get("Content-Type"), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type"), e.read().decode()

    def json(self, method, path, body=None):
        status, _, text = self.call(method, path, body)
        assert status == 200, (status, text)
        return json.loads(text)

    def jobs(self):
        return {j["submission_id"]: j for j in self.json("GET", "/api/jobs/")}

    def requests(self):
        return self.json("GET", "/_emulator/requests")

    def submits(self):
        return [r["body"] for r in self.requests() if r["method"] == "POST" and r["path"] == "/api/jobs/"]

    def job_of(self, node_name):
        for j in self.jobs().values():
            if j["metadata"].get("goodput_node") == node_name:
                return j
        raise AssertionError(f"no Ray job for node {node_name}")


def ray_spec(emu, **over):
    backend = {"type": "ray", "address": emu.url, "num_cpus": 1, "memory_mb": 512,
               "resources": {"goodput_node": 1}, "pending_timeout": "60s", "poll_interval": "300ms"}
    backend.update(over.pop("backend", {}))
    return spec(job="raytest", backend=backend, **over)




def decisions(events):
    """What the policies decided, without the names and times that differ between runs."""
    out = []
    for e in events:
        d = e["data"]
        if e["type"] == "recovery_decided":
            out.append(("recovery", d["diagnosis"], d["action"], d["memory_permille"]))
        elif e["type"] == "restart_job":
            out.append(("restart", d["restart"], d["world_size"], d["restore_tier"]))
        elif e["type"] == "scale_decided":
            out.append(("scale", d["from"], d["to"]))
    return out


class RayEmulatorWireFormatTest(unittest.TestCase):
    """The emulator answers as the fixtures show Ray does, so the backend is tested against Ray's
    wire format, not against itself."""

    def fixture(self, name):
        with open(os.path.join(FIXTURES, name)) as f:
            return json.load(f)

    def test_responses_have_the_fixtures_shapes(self):
        emu = Emulator(self)
        self.assertEqual(emu.json("GET", "/api/version").keys(), self.fixture("version-response.json").keys())
        submit = dict(self.fixture("jobs-submit-request.json"), entrypoint="echo hello; exit 3",
                      submission_id="raysubmit_wire")
        submit["runtime_env"] = {"env_vars": submit["runtime_env"]["env_vars"]}  # no package upload here
        out = emu.json("POST", "/api/jobs/", submit)
        self.assertEqual(out, {"job_id": "raysubmit_wire", "submission_id": "raysubmit_wire"})
        self.assertEqual(out.keys(), self.fixture("jobs-submit-response.json").keys())
        status, ctype, text = emu.call("POST", "/api/jobs/", submit)  # the same submission_id again
        self.assertEqual((status, ctype.split(";")[0]), (400, "text/plain"))
        self.assertIn("already exists", text)
        deadline = time.time() + 20
        while emu.json("GET", "/api/jobs/raysubmit_wire")["status"] not in ("FAILED",) and time.time() < deadline:
            time.sleep(0.1)
        job = emu.json("GET", "/api/jobs/raysubmit_wire")
        failed = self.fixture("jobs-get-response-failed.json")
        self.assertEqual(list(job.keys()), list(failed.keys()))
        self.assertEqual((job["status"], job["error_type"], job["driver_exit_code"]),
                         ("FAILED", failed["error_type"], 3))
        self.assertTrue(job["message"].startswith("Job entrypoint command failed with exit code 3, last available logs"))
        self.assertEqual({k: type(v) for k, v in job["driver_info"].items()},
                         {k: type(v) for k, v in failed["driver_info"].items()})
        listed = emu.json("GET", "/api/jobs/")
        self.assertIsInstance(listed, list)
        self.assertEqual(list(listed[0].keys()), list(self.fixture("jobs-list-response.json")[0].keys()))
        self.assertEqual(emu.json("GET", "/api/jobs/raysubmit_wire/logs"), {"logs": "hello\n"})
        self.assertEqual(emu.json("POST", "/api/jobs/raysubmit_wire/stop"), {"stopped": False})
        self.assertEqual(emu.json("DELETE", "/api/jobs/raysubmit_wire"), self.fixture("jobs-delete-response.json"))
        status, ctype, text = emu.call("GET", "/api/jobs/raysubmit_wire")
        with open(os.path.join(FIXTURES, "jobs-404.txt")) as f:
            self.assertEqual((status, ctype.split(";")[0], text.strip()),
                             (404, "text/plain", f.read().strip().replace("raysubmit_doesnotexist", "raysubmit_wire")))
        nodes = emu.json("GET", "/api/v0/nodes?timeout=5")
        want = self.fixture("state-nodes-response.json")
        self.assertEqual(nodes.keys(), want.keys())
        self.assertEqual(nodes["data"]["result"].keys(), want["data"]["result"].keys())
        self.assertEqual(list(nodes["data"]["result"]["result"][0].keys()),
                         list(want["data"]["result"]["result"][0].keys()))


class RayBackendTest(unittest.TestCase):
    def test_a_job_failed_for_memory_is_resubmitted_with_more_memory(self):
        emu = Emulator(self)
        run = LiveRun(self, ray_spec(emu, total_steps=160))

        def oom():
            run.wait_for_step(40)
            job = emu.job_of("ray-1")
            self.assertEqual(emu.json("POST", "/_emulator/oom", {"submission_id": job["submission_id"]}), {"ok": True})

        self.assertEqual(run.run_while(oom), 0, run.diag())
        ev = run.events()
        failures = of_type(ev, "failure_observed")
        self.assertEqual(len(failures), 1, failures)
        self.assertIn("FAILED", failures[0]["reason"])
        self.assertIn("OutOfMemoryError", failures[0]["reason"], "the job's log tail reached the diagnosis")
        self.assertEqual([(d["diagnosis"], d["action"], d["memory_permille"]) for d in of_type(ev, "recovery_decided")],
                         [("out_of_memory", "relaunch_with_more_memory", 1500)])
        submits = emu.submits()
        self.assertEqual(len(submits), 3)
        self.assertEqual([s["entrypoint_memory"] for s in submits], [512 * MiB, 512 * MiB, 768 * MiB])
        self.assertIn("--memory-permille 1500", submits[2]["entrypoint"])
        self.assertNotIn(run.token(), submits[2]["entrypoint"], "the token travels in env_vars, not the command")
        self.assertEqual(submits[2]["runtime_env"]["env_vars"]["GOODPUT_TOKEN"], run.token())
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        # The State API was always asked with a timeout.
        node_calls = [r for r in emu.requests() if r["path"] == "/api/v0/nodes"]
        self.assertTrue(node_calls)
        self.assertTrue(all("timeout" in r["query"] for r in node_calls))

    def test_a_dead_node_is_replaced_on_another_node(self):
        emu = Emulator(self)
        run = LiveRun(self, ray_spec(emu, total_steps=160))
        dead = {}

        def kill_node():
            run.wait_for_step(50)
            dead["ip"] = emu.job_of("ray-0")["driver_info"]["node_ip_address"]
            emu.json("POST", "/_emulator/kill-node", {"node_ip": dead["ip"]})

        self.assertEqual(run.run_while(kill_node), 0, run.diag())
        ev = run.events()
        failures = of_type(ev, "failure_observed")
        self.assertEqual([f["kind"] for f in failures], ["node_lost"], failures)
        self.assertIn(f"Ray node {dead['ip']}", failures[0]["reason"])
        self.assertIn("DEAD", failures[0]["reason"])
        self.assertEqual([(d["diagnosis"], d["action"]) for d in of_type(ev, "recovery_decided")],
                         [("hardware_error", "relaunch_node")])
        replacement = emu.job_of("ray-2")
        self.assertNotEqual(replacement["driver_info"]["node_ip_address"], dead["ip"])
        self.assertEqual(replacement["status"], "SUCCEEDED")
        self.assertEqual({j["name"]: j["slot"] for j in of_type(ev, "node_joined")}, {"ray-0": 0, "ray-1": 1, "ray-2": 0})
        self.assertEqual(of_type(ev, "checkpoint_loaded")[1]["tier"], "storage", "the dead node took its memory")
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

    def test_a_lost_node_s_slot_goes_to_a_spare_ray_job_that_restores_its_peer_s_copy(self):
        # "spares": 1 and checkpoint.replicas: 1 on Ray: a third job is placed and its agent waits;
        # each memory checkpoint is copied to the other rank's node. Slot 0's Ray node dies after
        # the save at step 90: the spare takes the slot at once and restores rank 0's step from
        # slot 1's copy (tier peer); the job submitted in its stead joins as the next spare.
        emu = Emulator(self, nodes=4)
        policy = {"recovery": {"policy": "diagnose", "restore_from": "memory"},
                  "checkpoint": {"policy": "flash", "every_steps": 30, "persist_every": 2, "replicas": 1},
                  "scaling": {"policy": "wait"}}
        run = LiveRun(self, ray_spec(emu, spares=1, policy=policy, data_shards=320))

        def kill_node():
            run.wait_for_step(100)
            slot0 = [j["name"] for j in of_type(run.events(), "node_joined") if j["slot"] == 0][0]
            emu.json("POST", "/_emulator/kill-node", {"node_ip": emu.job_of(slot0)["driver_info"]["node_ip_address"]})

        self.assertEqual(run.run_while(kill_node), 0, run.diag())
        ev = run.events()
        self.assertEqual([(d["diagnosis"], d["action"]) for d in of_type(ev, "recovery_decided")],
                         [("hardware_error", "relaunch_node")])
        joins = [e for e in ev if e["type"] == "node_joined"]
        self.assertEqual(sorted(j["data"]["slot"] for j in joins[:3]), [-1, 0, 1], "two ranks and a spare job")
        self.assertEqual([j["data"]["slot"] for j in joins[3:]], [-1], "the new job refills the pool")
        decided = [e for e in ev if e["type"] == "recovery_decided"][0]
        restart = [e for e in ev if e["type"] == "restart_job" and e["seq"] > decided["seq"]][0]
        self.assertLess(restart["seq"], joins[3]["seq"], "the restart did not wait for the new job")
        self.assertEqual(restart["data"]["restore_tier"], "peer")
        loaded = of_type(ev, "checkpoint_loaded")[1]
        self.assertEqual((loaded["tier"], loaded["step"]), ("peer", restart["data"]["restore_step"]))
        self.assertEqual(len(emu.submits()), 4)
        self.assertIn("320 of 320 done, 0 trained twice", run.stdout)
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

    def test_a_node_that_fails_its_check_is_relaunched_on_another_ray_node(self):
        # Slot 1's first node computes wrong products in its pre-flight check: a hardware error.
        # Each emulated Ray node takes one of this job's nodes ("goodput_node": 1), so without
        # exclusion the replacement would land on the machine just freed, the bad one. It is
        # pinned (through Ray's own "node:<ip>" resource) to the third node instead, while the bad
        # node is still ALIVE.
        emu = Emulator(self)
        check = {"compute": "200ms", "link_mib": 2, "straggler_factor": 1000,
                 "faults": [{"slot": 1, "fault": "corrupt"}]}
        run = LiveRun(self, ray_spec(emu, total_steps=60, node_check=check))
        self.assertEqual(run.run(), 0, run.diag())
        ev = run.events()
        joined = {j["node"]: j for j in of_type(ev, "node_joined")}
        faulty = [c for c in of_type(ev, "node_checked") if c["verdict"] == "faulty"]
        self.assertEqual([joined[c["node"]]["name"] for c in faulty], ["ray-1"], of_type(ev, "node_checked"))
        self.assertEqual([(d["diagnosis"], d["action"]) for d in of_type(ev, "recovery_decided")],
                         [("hardware_error", "relaunch_node")])
        bad_ip = emu.job_of("ray-1")["driver_info"]["node_ip_address"]
        replacement = emu.job_of("ray-2")
        self.assertNotEqual(replacement["driver_info"]["node_ip_address"], bad_ip)
        self.assertEqual(replacement["status"], "SUCCEEDED")
        pins = [k for k in [b for b in emu.submits() if b["submission_id"] == replacement["submission_id"]][0]
                ["entrypoint_resources"] if k.startswith("node:")]
        self.assertEqual(pins, ["node:" + replacement["driver_info"]["node_ip_address"]])
        self.assertNotIn("node:", json.dumps([b["entrypoint_resources"] for b in emu.submits()
                                              if b["submission_id"] != replacement["submission_id"]]))
        alive = {n["node_ip"]: n["state"] for n in emu.json("GET", "/api/v0/nodes")["data"]["result"]["result"]}
        self.assertEqual(alive[bad_ip], "ALIVE")
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

    def test_workers_scale_down_when_no_machine_comes_and_back_up_when_one_does(self):
        # A parameter-server job (examples/pytorch/train_ps.py) under an elastic policy. A worker's
        # machine dies and no machine is free (every Ray job submitted after that stays PENDING,
        # and each is given up after the timeout): the world goes on without that worker. Once
        # the smaller world has saved a checkpoint, machines are free again: the next node asked
        # for comes and the world grows back. The server keeps its slot and its own shape.
        emu = Emulator(self, nodes=4)
        policy = {"recovery": {"policy": "diagnose"}, "checkpoint": {"policy": "flash", "every_steps": 20},
                  "scaling": {"policy": "elastic", "min_nodes": 2}}
        job = ray_spec(emu, total_steps=200, policy=policy, backend={"pending_timeout": "4s"},
                       command=["/usr/bin/python3", os.path.join(ROOT, "examples/pytorch/train_ps.py"),
                                "--step-seconds", "0.03", "--hidden", "64"],
                       replicas=[{"type": "ps", "backend": {"num_cpus": 2, "memory_mb": 256}},
                                 {"type": "worker", "count": 2}])
        del job["nodes"]
        run = LiveRun(self, job)

        def lose_a_worker():
            run.wait_for_step(40)
            emu.json("POST", "/_emulator/hold", {"count": 1000})
            emu.json("POST", "/_emulator/kill-node", {"node_ip": emu.job_of("ray-2")["driver_info"]["node_ip_address"]})
            deadline = time.time() + 120
            while time.time() < deadline:
                ev = run.events()
                scaled = [i for i, e in enumerate(ev) if e["type"] == "scale_decided"]
                if scaled and any(e["type"] == "checkpoint_saved" for e in ev[scaled[0]:]):
                    break
                time.sleep(0.5)
            emu.json("POST", "/_emulator/release", {})

        self.assertEqual(run.run_while(lose_a_worker), 0, run.diag())
        ev = run.events()
        self.assertEqual([d for d in decisions(ev) if d[0] == "recovery"],
                         [("recovery", "hardware_error", "relaunch_node", 1000)])
        self.assertEqual(of_type(ev, "no_spare_node"), [{"slot": 2}])
        self.assertEqual([(d["from"], d["to"]) for d in of_type(ev, "scale_decided")], [(3, 2), (2, 3)])
        self.assertEqual([r["world_size"] for r in of_type(ev, "restart_job")][-2:], [2, 3])
        late = of_type(ev, "node_joined")[-1]
        self.assertEqual((late["slot"], late["replica_type"]), (-1, "worker"),
                         "the late machine joins as a spare, then is placed")
        # Meanwhile the smaller world trained and saved checkpoints.
        scaled = [i for i, e in enumerate(ev) if e["type"] == "scale_decided"]
        self.assertTrue([e for e in ev[scaled[0]:scaled[1]] if e["type"] == "checkpoint_saved"])
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        # In the last world the server is still rank 0 and the late machine is worker rank 2.
        last = of_type(ev, "restart_job")[-1]["restart"]
        for name, rank in (("ray-0", 0), (late["name"], 2)):
            with open(os.path.join(emu.dir, emu.job_of(name)["submission_id"] + ".log")) as f:
                self.assertIn(f"(restart {last}, rank {rank}/3)", f.read())
        # Each group's Ray jobs asked for its own resources.
        asked = {b["metadata"]["goodput_node"]: (b["metadata"]["goodput_replica_type"], b["entrypoint_num_cpus"],
                                                 b["entrypoint_memory"]) for b in emu.submits()}
        self.assertEqual(asked.pop("ray-0"), ("ps", 2, 256 * MiB))
        self.assertEqual(set(asked.values()), {("worker", 1, 512 * MiB)})

    def test_a_job_stuck_pending_is_given_up_and_resubmitted(self):
        emu = Emulator(self)
        emu.json("POST", "/_emulator/hold", {"count": 1})  # the first job to reach Ray never gets a machine
        run = LiveRun(self, ray_spec(emu, total_steps=80, backend={"pending_timeout": "2s"}))
        self.assertEqual(run.run_while(), 0, run.diag())
        ev = run.events()
        # The nodes' jobs are submitted at once: the held one is whichever reached Ray first. Its slot
        # waited for a machine, and the node that did start took the slot it was launched for.
        jobs = emu.jobs()
        held = next(j for j in jobs.values() if j["status"] == "STOPPED")
        held_name, held_slot = held["metadata"]["goodput_node"], int(held["metadata"]["goodput_rank"])
        self.assertIn(held_name, ("ray-0", "ray-1"))
        other = "ray-1" if held_name == "ray-0" else "ray-0"
        self.assertEqual(of_type(ev, "no_spare_node"), [{"slot": held_slot}])
        self.assertEqual({j["name"]: j["slot"] for j in of_type(ev, "node_joined")}, {other: 1 - held_slot, "ray-2": held_slot})
        # The Ray jobs' status changes are in the log too, by node name, with the submission id.
        running = {x["name"] for x in of_type(ev, "status_observed")
                   if x["object"] == "ray_job" and x["status"].startswith("RUNNING (goodput-")}
        self.assertEqual(running, {other, "ray-2"})
        self.assertEqual(len(jobs), 3, "one more submission replaced the stuck one")
        self.assertEqual(of_type(ev, "failure_observed"), [], "a node that never joined is not a failure of the job")
        self.assertIn("still PENDING after", run.stderr)
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

    def test_a_job_no_node_can_take_fails_with_a_reason_instead_of_looping(self):
        emu = Emulator(self)
        run = LiveRun(self, ray_spec(emu, total_steps=80,
                                     backend={"pending_timeout": "500ms", "resources": {"goodput_node": 2}}))
        self.assertEqual(run.run_while(timeout=120), 1, run.diag())
        reason = of_type(run.events(), "job_finished")[-1]["reason"]
        self.assertTrue(reason.startswith("failed: nodes keep failing before they join"), reason)
        self.assertIn("no node has the resources", reason)
        self.assertTrue(all(j["status"] == "STOPPED" for j in emu.jobs().values()), emu.jobs())

    def test_a_trainer_command_that_cannot_run_fails_the_job_at_once(self):
        # The same mistake as on the local backend (tests/python/test_live.py), through Ray jobs:
        # a configuration error gives up with the reason; no job is resubmitted for it.
        emu = Emulator(self)
        run = run_a_command_that_cannot_run(self, ray_spec(emu, command=["/nonexistent/python9", "train.py"]))
        self.assertTrue(run.report()["gave_up"])
        self.assertEqual(len(emu.submits()), 2, "no job was resubmitted for it")

    def test_a_job_a_user_stops_is_replaced_as_a_preemption_not_a_hardware_fault(self):
        # `ray job stop` on a node's job: Ray sends its agent SIGTERM, the agent says it is leaving,
        # and the job is replaced without its Ray node being kept off.
        emu = Emulator(self)
        run = LiveRun(self, ray_spec(emu, total_steps=160))

        def stop():
            run.wait_for_step(40)
            name = [j for j in of_type(run.events(), "node_joined") if j["slot"] == 1][-1]["name"]
            emu.json("POST", "/api/jobs/" + emu.job_of(name)["submission_id"] + "/stop")

        self.assertEqual(run.run_while(stop), 0, run.diag())
        ev = run.events()
        decided = of_type(ev, "recovery_decided")
        self.assertEqual([(d["diagnosis"], d["action"]) for d in decided], [("preemption", "relaunch_node")], decided)
        self.assertNotIn("excluded", run.stderr)
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

    def test_dashboard_errors_are_retried_and_no_job_is_submitted_twice(self):
        emu = Emulator(self, require_header="Authorization: Bearer ray-secret")
        # The first two submits are carried out but their answers are lost; list calls fail with
        # 500s and dropped connections for a while.
        emu.json("POST", "/_emulator/faults", {"count": 2, "mode": "drop-after", "method": "POST", "path": "/api/jobs/"})
        emu.json("POST", "/_emulator/faults", {"count": 3, "mode": "500", "method": "GET", "path": "/api/jobs/"})
        emu.json("POST", "/_emulator/faults", {"count": 2, "mode": "drop", "method": "GET", "path": "/api/v0/nodes"})
        run = LiveRun(self, ray_spec(emu, total_steps=80,
                                     backend={"headers": {"Authorization": "Bearer ray-secret"}}))
        self.assertEqual(run.run_while(), 0, run.diag())
        jobs = emu.jobs()
        self.assertEqual(sorted(j["metadata"]["goodput_node"] for j in jobs.values()), ["ray-0", "ray-1"])
        submits = emu.submits()
        self.assertGreater(len(submits), 2, "the lost answers were retried")
        self.assertEqual({s["submission_id"] for s in submits}, set(jobs))
        # Each submission ran once: one log per job, one process per log.
        self.assertEqual(len(glob.glob(os.path.join(emu.dir, "*.log"))), 2)
        self.assertEqual(of_type(run.events(), "failure_observed"), [])
        self.assertEqual(of_type(run.events(), "job_finished")[-1]["reason"], "completed")
        status, _, _ = emu.call("GET", "/api/version", headers={})
        self.assertEqual(status, 401, "the emulator does check the header")

    def test_a_job_of_two_ray_jobs_with_two_trainers_each_recovers_a_killed_local_rank_from_memory(self):
        # torchrun's shape on this backend: one Ray job per node, two trainer processes in it.
        emu = Emulator(self)
        run = LiveRun(self, ray_spec(emu, total_steps=100, nproc_per_node=2, checkpoint_bytes_per_node=8 << 20),
                      [{"fault": "kill-process", "slot": 1, "local_rank": 1, "at_step": 40}])
        seen = []

        def watch():
            run.wait_for_step(10)
            with urllib.request.urlopen(run.url() + "/status", timeout=5) as r:
                seen.append(json.loads(r.read()))

        self.assertEqual(run.run_while(watch), 0, run.diag())
        self.assertEqual(sorted(p["rank"] for n in seen[0]["nodes"] for p in n["trainer"]["ranks"]), [0, 1, 2, 3])
        ev = run.events()
        failures = of_type(ev, "failure_observed")
        self.assertEqual(len(failures), 1, failures)
        self.assertIn("local rank 1 (rank 3): killed by signal 9", failures[0]["reason"])
        self.assertEqual([d["action"] for d in of_type(ev, "recovery_decided")], ["restart_process"])
        self.assertEqual(of_type(ev, "checkpoint_loaded")[1]["tier"], "memory")
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

    def test_local_and_ray_make_the_same_decisions_for_the_same_faults(self):
        faults = [{"fault": "kill-process", "slot": 1, "at_step": 40}, {"fault": "kill-node", "slot": 0, "at_step": 100}]
        local = LiveRun(self, spec(total_steps=160), faults)
        self.assertEqual(local.run(), 0, local.diag())
        emu = Emulator(self)
        ray = LiveRun(self, ray_spec(emu, total_steps=160), faults)
        self.assertEqual(ray.run(), 0, ray.diag())
        want = [("recovery", "software_error", "restart_process", 1000), ("recovery", "hardware_error", "relaunch_node", 1000)]
        got_local, got_ray = decisions(local.events()), decisions(ray.events())
        self.assertEqual([d for d in got_local if d[0] == "recovery"], want,
                         [f["reason"][-300:] for f in of_type(local.events(), "failure_observed")])  # why, if not
        self.assertEqual(got_ray, got_local)
        self.assertIn("FAILED", of_type(ray.events(), "failure_observed")[1]["reason"])


if __name__ == "__main__":
    unittest.main()
