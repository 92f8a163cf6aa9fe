#!/usr/bin/python3
"""A Ray dashboard emulator for tests (Ray itself cannot be installed here).

It speaks the wire format of the Ray Jobs REST API and the State API's node list exactly as the
fixtures in shared/data/ray/ show it: JobDetails objects with the fixture's fields in its order,
{"job_id", "submission_id"} for a submit, {"stopped"}, {"deleted"}, {"logs"}, the State API's
{"result", "msg", "data": {"result": ListApiResponse}} envelope, and plain-text error bodies.
The fixtures are read at start and every response is checked against their field sets.

Jobs really run: a submitted entrypoint is a shell command started in its own session on this
machine, placed on an emulated node whose free resources (CPU, GPU, memory, custom) fit what the
job asks for, else it stays PENDING. Its output is the job's log, its exit status the job's fate
(SUCCEEDED, or FAILED with Ray's "Job entrypoint command failed with exit code N" message).

Faults for tests, on /_emulator/ (not part of Ray's API):
  POST /_emulator/kill-node {"node_ip"} or {"node_ips": [...]}
                                              the node (or a zone of them) turns DEAD, its jobs'
                                              processes are killed
  POST /_emulator/oom {"submission_id"}       the job is killed by "the OOM killer", logs say so
  POST /_emulator/faults {"count", "mode", "method", "path"}
        the next `count` matching API requests fail: mode "500" (a text 500), "drop" (connection
        closed, nothing done) or "drop-after" (the request is carried out, then the answer is lost)
  POST /_emulator/hold {"count"}              the next `count` submitted jobs stay PENDING
  POST /_emulator/release {}                  held jobs may start; later ones are not held
  GET  /_emulator/requests                    every API request seen: method, path, query, body
  GET  /_emulator/request-counts              how many, by method, and how many got a fault's answer
With --cheap-jobs a job runs no process (it stays RUNNING until stopped or its node dies):
`goodput bench ray` stands its simulated agents in for thousands of nodes.
Usage: ray_emulator.py --fixtures DIR --state-dir DIR [--nodes N] [--node-resources JSON] [--cheap-jobs]
Prints "listening on http://127.0.0.1:PORT" once ready.
"""

import argparse
import hashlib
import json
import os
import signal
import threading
import time
import urllib.parse
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (the emulators' shared server, processes and loops)

SUBMIT_FIELDS = {"entrypoint", "submission_id", "job_id", "runtime_env", "metadata", "entrypoint_num_cpus",
                 "entrypoint_num_gpus", "entrypoint_memory", "entrypoint_resources"}
OOM_LOG = ("ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory.\n"
           "Memory on the node where the task was running exceeded the memory usage threshold of 0.95; "
           "Ray killed this worker because it was the most recently scheduled task.\n")


def now_ms():
    return int(time.time() * 1000)


class Cluster:
    def __init__(self, fixtures, state_dir, nodes, node_resources, cheap_jobs=False):
        def load(name):
            with open(os.path.join(fixtures, name)) as f:
                return f.read() if name.endswith(".txt") else json.load(f)

        self.job_fields = list(load("jobs-get-response-running.json").keys())
        self.version = load("version-response.json")
        nodes_fixture = load("state-nodes-response.json")
        self.node_fields = list(nodes_fixture["data"]["result"]["result"][0].keys())
        self.list_fields = list(nodes_fixture["data"]["result"].keys())
        self.submit_response_fields = list(load("jobs-submit-response.json").keys())
        self.not_found = load("jobs-404.txt").strip()  # "Job <id> does not exist"
        self.state_dir = state_dir
        self.cheap_jobs = cheap_jobs  # jobs run no process (a benchmark's simulated agents stand in)
        self.lock = threading.RLock()
        self.jobs = {}  # submission_id -> job dict (internal)
        self.order = []
        self.requests = []
        self.faults = []
        self.faults_answered = 0
        self.hold = 0
        self.job_counter = 1
        self.nodes = []
        for i in range(nodes):
            node_id = hashlib.sha256(f"emulated-node-{i}".encode()).hexdigest()[:56]
            ip = f"10.0.0.{5 + i}" if i < 250 else f"10.{1 + i // 65536}.{i // 256 % 256}.{i % 256}"
            total = {"CPU": 8.0, "memory": 17179869184.0, "object_store_memory": 4294967296.0, f"node:{ip}": 1.0}
            total.update(node_resources)
            if i == 0:
                total["node:__internal_head__"] = 1.0
            self.nodes.append({"node_id": node_id, "node_ip": ip, "is_head_node": i == 0, "state": "ALIVE",
                               "state_message": None, "node_name": ip, "resources_total": total,
                               "labels": {"ray.io/node_id": node_id}, "start_time_ms": now_ms(), "end_time_ms": 0})
        harness.every(0.1, self.schedule)

    # ---- the Jobs API --------------------------------------------------------------------------
    def submit(self, body):
        unknown = set(body) - SUBMIT_FIELDS
        if unknown:
            return 400, f"JobSubmitRequest.__init__() got an unexpected keyword argument '{sorted(unknown)[0]}'"
        if not isinstance(body.get("entrypoint"), str) or not body["entrypoint"]:
            return 400, "entrypoint must be a non-empty string"
        with self.lock:
            sid = body.get("submission_id") or f"raysubmit_{len(self.order) + 1:016d}"
            if sid in self.jobs:
                return 400, f"Job with submission_id {sid} already exists. Please use a different submission_id."
            env = (body.get("runtime_env") or {}).get("env_vars") or {}
            need = {"CPU": float(body.get("entrypoint_num_cpus") or 0), "GPU": float(body.get("entrypoint_num_gpus") or 0),
                    "memory": float(body.get("entrypoint_memory") or 0)}
            for k, v in (body.get("entrypoint_resources") or {}).items():
                need[k] = float(v)
            job = {"submission_id": sid, "job_id": None, "status": "PENDING", "entrypoint": body["entrypoint"],
                   "message": "Job has not started yet. It may be waiting for resources (CPUs, GPUs, memory, custom "
                              "resources) to become available.",
                   "error_type": None, "start_time": now_ms(), "end_time": None, "metadata": body.get("metadata") or {},
                   "runtime_env": body.get("runtime_env") or {}, "env": env, "need": need, "node": None,
                   "proc": None, "driver_exit_code": None, "held": self.hold > 0, "log": os.path.join(self.state_dir, sid + ".log")}
            self.hold = max(0, self.hold - 1)
            self.jobs[sid] = job
            self.order.append(sid)
            self.schedule()
            return 200, dict(zip(self.submit_response_fields, [sid, sid]))

    def details(self, job):
        node = job["node"]
        running_or_ran = job["job_id"] is not None
        d = {"type": "SUBMISSION", "job_id": job["job_id"], "submission_id": job["submission_id"],
             "driver_info": {"id": job["job_id"], "node_ip_address": node["node_ip"],
                             "pid": str(job["proc"].pid) if job["proc"] else "0"}
             if running_or_ran else None,
             "status": job["status"], "entrypoint": job["entrypoint"], "message": job["message"],
             "error_type": job["error_type"], "start_time": job["start_time"], "end_time": job["end_time"],
             "metadata": job["metadata"], "runtime_env": job["runtime_env"],
             "driver_agent_http_address": f"http://{node['node_ip']}:52365" if running_or_ran else None,
             "driver_node_id": node["node_id"] if running_or_ran else None,
             "driver_exit_code": job["driver_exit_code"]}
        assert list(d.keys()) == self.job_fields, (list(d.keys()), self.job_fields)
        return d

    def find(self, ident):
        with self.lock:
            if ident in self.jobs:
                return self.jobs[ident]
            for j in self.jobs.values():
                if j["job_id"] == ident:
                    return j
        return None

    def stop(self, job):
        with self.lock:
            if job["status"] in ("STOPPED", "SUCCEEDED", "FAILED"):
                return False
            self.finish(job, "STOPPED", "Job was intentionally stopped.")
            proc = job["proc"]
        if proc:
            # As Ray does: SIGTERM to the entrypoint's process group, SIGKILL if it lingers.
            harness.kill_group(proc, signal.SIGTERM)
            threading.Timer(3.0, harness.kill_group, [proc]).start()
        return True

    def finish(self, job, status, message, error_type=None):
        job["status"], job["message"], job["error_type"] = status, message, error_type
        job["end_time"] = now_ms()

    def logs(self, job):
        try:
            with open(job["log"], errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    # ---- placement and processes -----------------------------------------------------------------
    def schedule(self):
        with self.lock:
            pending = [self.jobs[sid] for sid in self.order
                       if self.jobs[sid]["status"] == "PENDING" and not self.jobs[sid]["held"]]
            if not pending:
                return
            # Each node's free resources once, kept as jobs are placed (not again per job and node).
            free = {n["node_id"]: dict(n["resources_total"]) for n in self.nodes if n["state"] == "ALIVE"}
            for j in self.jobs.values():
                if j["status"] == "RUNNING" and j["node"]["node_id"] in free:
                    for k, v in j["need"].items():
                        free[j["node"]["node_id"]][k] = free[j["node"]["node_id"]].get(k, 0.0) - v

            def fits(node, job):
                return all(free[node["node_id"]].get(k, 0.0) >= v - 1e-9 for k, v in job["need"].items() if v > 0)
            for job in pending:  # first fit, in the nodes' order
                for node in self.nodes:
                    if node["node_id"] in free and fits(node, job):
                        for k, v in job["need"].items():
                            free[node["node_id"]][k] = free[node["node_id"]].get(k, 0.0) - v
                        self.start(job, node)
                        break

    def start(self, job, node):
        env = dict(os.environ)
        env.update({k: str(v) for k, v in job["env"].items()})
        env["RAY_JOB_SUBMISSION_ID"] = job["submission_id"]
        workdir = os.path.join(self.state_dir, job["submission_id"])
        if not self.cheap_jobs:
            os.makedirs(workdir, exist_ok=True)
            job["proc"] = harness.spawn(["/bin/bash", "-c", job["entrypoint"]], workdir, env, job["log"],
                                        lambda proc, rc: self.exited(job, rc))
        job["node"] = node
        job["job_id"] = f"{self.job_counter:02x}000000"
        self.job_counter += 1
        job["status"], job["message"] = "RUNNING", "Job is currently running."

    def exited(self, job, rc):
        with self.lock:
            if job["status"] != "RUNNING":
                return
            job["driver_exit_code"] = rc
            if rc == 0:
                self.finish(job, "SUCCEEDED", "Job finished successfully.")
            else:
                tail = self.logs(job)[-20000:]
                self.finish(job, "FAILED", f"Job entrypoint command failed with exit code {rc}, last available logs "
                                           f"(truncated to 20,000 chars):\n{tail}", "JOB_ENTRYPOINT_COMMAND_ERROR")
            self.schedule()

    # ---- faults ------------------------------------------------------------------------------------
    def kill_node(self, ip):
        with self.lock:
            node = next((n for n in self.nodes if n["node_ip"] == ip or n["node_id"] == ip), None)
            if node is None:
                return False
            node["state"], node["end_time_ms"] = "DEAD", now_ms()
            node["state_message"] = "Unexpected termination: health check failed due to missing too many heartbeats"
            for job in self.jobs.values():
                if job["node"] is node and job["status"] == "RUNNING":
                    self.finish(job, "FAILED", "Job supervisor actor died: the node it ran on is dead.",
                                "JOB_SUPERVISOR_ACTOR_DIED")
                    if job["proc"]:
                        harness.kill_group(job["proc"])
            return True

    def oom(self, sid):
        with self.lock:
            job = self.jobs.get(sid)
            if job is None or job["status"] != "RUNNING":
                return False
            with open(job["log"], "a") as f:
                f.write(OOM_LOG)
            if job["proc"] is None:  # a cheap job: nothing runs to be killed, it just ends
                self.exited(job, -9)
                return True
            harness.kill_group(job["proc"])  # wait() reports it FAILED with exit code -9 and the log tail
            return True

    def take_fault(self, method, path):
        with self.lock:
            for f in self.faults:
                if f["count"] > 0 and f.get("method", method) == method and path.startswith(f.get("path", "/api/")):
                    f["count"] -= 1
                    self.faults_answered += 1
                    return f["mode"]
        return None


class Handler(harness.Handler):
    cluster = None
    required_header = None

    def drop(self):
        self.close_connection = True  # nothing written: the client sees the connection close

    def route(self, method):
        c = self.cluster
        url = urllib.parse.urlsplit(self.path)
        path, query = url.path, urllib.parse.parse_qs(url.query)
        raw = self.body().decode(errors="replace")
        if path.startswith("/_emulator/"):
            return self.control(method, path, raw)
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = raw
        with c.lock:
            c.requests.append({"method": method, "path": path, "query": {k: v[0] for k, v in query.items()},
                               "body": body, "time": time.time()})
        if self.required_header:
            name, value = self.required_header
            if self.headers.get(name) != value:
                return self.reply(401, "Unauthorized")
        mode = c.take_fault(method, path)
        if mode == "500":
            return self.reply(500, "Internal Server Error: emulated dashboard failure")
        if mode == "drop":
            return self.drop()
        status, out = self.api(method, path, query, body)
        if mode == "drop-after":
            return self.drop()
        self.reply(status, out)

    def api(self, method, path, query, body):
        c = self.cluster
        parts = [p for p in path.split("/") if p]
        if method == "GET" and path == "/api/version":
            return 200, c.version
        if method == "GET" and path == "/api/v0/nodes":
            with c.lock:
                nodes = [dict(n) for n in c.nodes]
            for n in nodes:
                assert list(n.keys()) == c.node_fields
            lst = {"total": len(nodes), "num_after_truncation": len(nodes), "num_filtered": len(nodes),
                   "result": nodes, "partial_failure_warning": "", "warnings": None}
            assert list(lst.keys()) == c.list_fields
            return 200, {"result": True, "msg": "", "data": {"result": lst}}
        if parts[:2] != ["api", "jobs"]:
            return 404, "Not Found"
        if len(parts) == 2:
            if method == "POST":
                if not isinstance(body, dict):
                    return 400, "the request body must be a JSON object"
                return c.submit(body)
            if method == "GET":
                with c.lock:
                    return 200, [c.details(c.jobs[s]) for s in c.order]
            return 405, "Method Not Allowed"
        job = c.find(parts[2])
        if job is None:
            return 404, c.not_found.replace("raysubmit_doesnotexist", parts[2])
        if len(parts) == 3 and method == "GET":
            with c.lock:
                return 200, c.details(job)
        if len(parts) == 3 and method == "DELETE":
            with c.lock:
                if job["status"] not in ("STOPPED", "SUCCEEDED", "FAILED"):
                    return 400, (f"Attempted to delete job '{job['submission_id']}', but it is in a non-terminal "
                                 f"state {job['status']}.")
                del c.jobs[job["submission_id"]]
                c.order.remove(job["submission_id"])
            return 200, {"deleted": True}
        if len(parts) == 4 and parts[3] == "stop" and method == "POST":
            return 200, {"stopped": c.stop(job)}
        if len(parts) == 4 and parts[3] == "logs" and method == "GET":
            return 200, {"logs": c.logs(job)}
        return 404, "Not Found"

    def control(self, method, path, raw):
        c = self.cluster
        body = json.loads(raw) if raw else {}
        if method == "GET" and path == "/_emulator/requests":
            with c.lock:
                return self.reply(200, c.requests)
        if method == "GET" and path == "/_emulator/request-counts":  # requests by method, and the faults answered
            with c.lock:
                counts = {"faults": c.faults_answered}
                for r in c.requests:
                    counts[r["method"]] = counts.get(r["method"], 0) + 1
                return self.reply(200, counts)
        if method == "POST" and path == "/_emulator/kill-node":
            ips = body["node_ips"] if "node_ips" in body else [body["node_ip"]]  # a zone: many at once
            found = [c.kill_node(ip) for ip in ips]
            return self.reply(200 if all(found) else 404, {"ok": True})
        if method == "POST" and path == "/_emulator/oom":
            return self.reply(200 if c.oom(body["submission_id"]) else 404, {"ok": True})
        if method == "POST" and path == "/_emulator/faults":
            with c.lock:
                c.faults.append(body)
            return self.reply(200, {"ok": True})
        if method == "POST" and path == "/_emulator/hold":
            with c.lock:
                c.hold += int(body["count"])
            return self.reply(200, {"ok": True})
        if method == "POST" and path == "/_emulator/release":
            with c.lock:  # machines are free again: held jobs may start, new ones are not held
                c.hold = 0
                for job in c.jobs.values():
                    job["held"] = False
            return self.reply(200, {"ok": True})
        return self.reply(404, "Not Found")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", required=True, help="shared/data/ray")
    ap.add_argument("--state-dir", required=True, help="jobs' logs and working directories")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--node-resources", default="{}", help='extra resources on every node, e.g. {"goodput_node": 1}')
    ap.add_argument("--require-header", help='"Name: value" every API request must carry')
    ap.add_argument("--cheap-jobs", action="store_true",
                    help="jobs run no process: a benchmark's simulated agents stand in for them")
    a = ap.parse_args()
    os.makedirs(a.state_dir, exist_ok=True)
    Handler.cluster = Cluster(a.fixtures, a.state_dir, a.nodes, json.loads(a.node_resources), a.cheap_jobs)
    if a.require_header:
        name, _, value = a.require_header.partition(":")
        Handler.required_header = (name.strip(), value.strip())

    def stop():
        with Handler.cluster.lock:
            for job in Handler.cluster.jobs.values():
                if job["proc"] and job["proc"].poll() is None:
                    harness.kill_group(job["proc"])

    harness.serve(Handler, a.port, stop)


if __name__ == "__main__":
    main()
