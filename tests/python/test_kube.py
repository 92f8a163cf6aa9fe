"""The Kubernetes backend end to end. No real API server can run here, so the cluster is the
Kubernetes API emulator (tests/emulators/kube/kube_emulator.py): it speaks core/v1 in the wire
format of the fixtures in shared/data/k8s/ (PodList/NodeList with resourceVersion, chunked
newline-delimited watch frames, BOOKMARK and ERROR 410 frames, Status objects) and really runs the
pods it is given. `goodput run` creates one pod per node (a real `goodput agent`, which starts a
real PyTorch DDP trainer); faults are the cluster's own (a container OOMKilled with the fixture's
status, a node going NotReady/Unknown with the fixture's conditions and taints, a watch cut in the
middle of a frame, history compacted so a resume gets 410 Expired, an image that never pulls).
The real kubectl is run against the emulator too, so it follows the protocol, not just our client."""

import base64
import copy
import datetime
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_live import GOODPUT, ROOT, LiveRun, ask_scale, of_type, run_a_command_that_cannot_run, spec  # noqa: E402

FIXTURES = os.environ.get("GOODPUT_SHARED_DATA", os.path.join(ROOT, "..", "shared", "data")) + "/k8s"
EMULATOR = os.path.join(ROOT, "tests", "emulators", "kube", "kube_emulator.py")
NS = "training"


class Emulator:
    def __init__(self, test, nodes=3, tls_args=()):
        self.dir = tempfile.mkdtemp(prefix="goodput-kubeemu-")
        self.proc = subprocess.Popen([sys.executable, EMULATOR, "--fixtures", FIXTURES, "--state-dir", self.dir,
                                      "--nodes", str(nodes), *tls_args], stdout=subprocess.PIPE, text=True)
        test.addCleanup(subprocess.run, ["rm", "-rf", self.dir])
        test.addCleanup(self.close)
        line = self.proc.stdout.readline()
        test.assertTrue(line.startswith("listening on "), line)
        self.url = line.split()[-1]
        self.context = None
        self.kubeconfig = os.path.join(self.dir, "kubeconfig")
        with open(self.kubeconfig, "w") as f:
            f.write(f"apiVersion: v1\nkind: Config\nclusters:\n- name: emu\n  cluster:\n    server: {self.url}\n"
                    f"users:\n- name: trainer\n  user:\n    token: emulator-token\ncontexts:\n- name: emu\n  context:\n"
                    f"    cluster: emu\n    user: trainer\n    namespace: {NS}\ncurrent-context: emu\n")

    def close(self):
        self.proc.terminate()
        self.proc.wait()
        self.proc.stdout.close()
        for name in os.listdir("/dev/shm"):  # emulated machines share this one's host memory
            if name.startswith("goodput-kubetest-"):
                os.unlink(os.path.join("/dev/shm", name))

    def call(self, method, path, body=None, context=None):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method)
        try:
            with urllib.request.urlopen(req, timeout=10, context=context or self.context) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def ok(self, method, path, body=None):
        code, out = self.call(method, path, body)
        assert 200 <= code < 300, (code, out)
        return out

    def pods(self):
        return {p["metadata"]["name"]: p for p in self.ok("GET", f"/api/v1/namespaces/{NS}/pods")["items"]}

    def secrets(self):
        return [s["metadata"]["name"] for s in self.ok("GET", f"/api/v1/namespaces/{NS}/secrets")["items"]]

    def created(self):
        return [r["body"] for r in self.ok("GET", "/_emulator/requests")
                if r["method"] == "POST" and r["path"] == f"/api/v1/namespaces/{NS}/pods"]

    def pod_of_slot(self, run, slot):
        events = run.events()
        joined = [j for j in of_type(events, "node_joined") if j["slot"] == slot]
        return joined[-1]["name"]


def kube_spec(emu, **over):
    backend = {"type": "kubernetes", "kubeconfig": emu.kubeconfig, "image": "registry.example/goodput-trainer:1",
               "agent": GOODPUT, "memory_mb": 512, "cpu": "1"}
    backend.update(over.pop("backend", {}))
    return spec(job="kubetest", backend=backend, **over)




def kube_ps_spec(emu, **over):
    """examples/pytorch/train_ps.py with one server (its own pod shape: 256 MiB, 2 CPUs) and two workers."""
    job = kube_spec(emu, command=["/usr/bin/python3", os.path.join(ROOT, "examples/pytorch/train_ps.py"),
                                  "--step-seconds", "0.03", "--hidden", "64"],
                    replicas=[{"type": "ps", "backend": {"memory_mb": 256, "cpu": "2"}},
                              {"type": "worker", "count": 2}], **over)
    del job["nodes"]  # it follows from the groups
    return job


def decisions(events):
    out = []
    for e in events:
        d = e["data"]
        if e["type"] == "recovery_decided":
            out.append((d["diagnosis"], d["action"], d["memory_permille"]))
    return out


class KubeEmulatorProtocolTest(unittest.TestCase):
    """The emulator follows the real protocol: the real kubectl lists and watches through it."""

    def test_kubectl_gets_and_watches_pods(self):
        kubectl = shutil.which("kubectl")
        if not kubectl:
            self.skipTest("kubectl is not installed on this machine")
        emu = Emulator(self)
        nodes = subprocess.run([kubectl, "--server", emu.url, "get", "nodes", "-o", "name"], capture_output=True,
                               text=True, timeout=30)
        self.assertEqual(nodes.stdout.split(), ["node/node-a", "node/node-b", "node/node-c"], nodes.stderr)
        watch = subprocess.Popen([kubectl, "--server", emu.url, "-n", NS, "get", "pods", "-w", "-o", "name"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            time.sleep(1.5)  # kubectl has listed and is watching
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "labels": {"app": "probe"}},
                   "spec": {"restartPolicy": "Never",
                            "containers": [{"name": "main", "image": "busybox", "command": ["/bin/sh", "-c", "exit 3"]}]}}
            self.assertEqual(emu.call("POST", f"/api/v1/namespaces/{NS}/pods", pod)[0], 201)
            code, status = emu.call("POST", f"/api/v1/namespaces/{NS}/pods", pod)
            self.assertEqual((code, status["kind"], status["reason"]), (409, "Status", "AlreadyExists"))
            deadline = time.time() + 20
            while emu.pods()["probe"]["status"]["phase"] != "Failed" and time.time() < deadline:
                time.sleep(0.1)
            time.sleep(1)
        finally:
            watch.terminate()
            out, err = watch.communicate()
        # Watch output: one line per event kubectl received (added, scheduled, running, failed).
        self.assertGreaterEqual(out.split().count("pod/probe"), 3, (out, err))
        terminated = emu.pods()["probe"]["status"]["containerStatuses"][0]["state"]["terminated"]
        self.assertEqual((terminated["exitCode"], terminated["reason"]), (3, "Error"))
        got = subprocess.run([kubectl, "--server", emu.url, "-n", NS, "get", "pod", "probe", "-o", "json"],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(json.loads(got.stdout)["status"]["phase"], "Failed")
        # kubectl label sends a PATCH: a label set, one changed (--overwrite), one removed.
        for args in (["goodput/rank=5"], ["goodput/rank=6", "--overwrite"], ["app-"]):
            labelled = subprocess.run([kubectl, "--server", emu.url, "-n", NS, "label", "pod", "probe", *args],
                                      capture_output=True, text=True, timeout=30)
            self.assertEqual(labelled.returncode, 0, labelled.stderr)
        self.assertEqual(emu.pods()["probe"]["metadata"]["labels"], {"goodput/rank": "6"})
        refused = subprocess.run([kubectl, "--server", emu.url, "-n", NS, "label", "pod", "probe", "goodput/rank=7"],
                                 capture_output=True, text=True, timeout=30)
        self.assertIn("already has a value (6)", refused.stderr)  # kubectl's own check, from the pod it read
        missing = subprocess.run([kubectl, "--server", emu.url, "-n", NS, "get", "pod", "nope"], capture_output=True,
                                 text=True, timeout=30)
        self.assertIn('pods "nope" not found', missing.stderr)

class Kubectl:
    """The real kubectl against the test's emulator (self.emu; self.kubectl is its path)."""

    def kc(self, *args, ok=True):
        r = subprocess.run([self.kubectl, "--kubeconfig", self.emu.kubeconfig, *args], capture_output=True, text=True,
                           timeout=60)
        if ok:
            self.assertEqual(r.returncode, 0, (args, r.stdout, r.stderr))
        return r


class GoodputJobResourceTest(Kubectl, unittest.TestCase):
    """The GoodputJob custom resource (backends/kubernetes/deploy/crd.yaml) as Kubernetes users meet it:
    the real kubectl applies the CRD and the example job, lists them with their printer columns, and
    is refused what the schema does not allow; the official Python client (python3-kubernetes) writes
    the status subresource and an Event; deleting the job takes what it owns. The API server is the
    emulator, in the wire format of the API reference (see kube_objects.py)."""

    def setUp(self):
        self.kubectl = shutil.which("kubectl")
        if not self.kubectl:
            self.skipTest("kubectl is not installed on this machine")
        self.emu = Emulator(self)

    def apply_job(self, text):
        path = os.path.join(self.emu.dir, "job.yaml")
        with open(path, "w") as f:
            f.write(text)
        return self.kc("apply", "-f", path, ok=False)

    def test_kubectl_applies_lists_and_refuses_goodputjobs_and_deleting_one_takes_what_it_owns(self):
        crd = os.path.join(ROOT, "backends", "kubernetes", "deploy", "crd.yaml")
        example = os.path.join(ROOT, "examples", "unified", "goodputjob.yaml")
        for manifest in (crd, os.path.join(ROOT, "backends", "kubernetes", "deploy", "goodput.yaml")):
            dry = self.kc("apply", "--dry-run=client", "-f", manifest)
            self.assertIn("(dry run)", dry.stdout)
        self.assertIn("created", self.kc("apply", "-f", crd).stdout)
        resources = self.kc("api-resources", "--api-group=goodput.dev").stdout
        self.assertRegex(resources, r"goodputjobs\s+gpj\s+goodput.dev/v1alpha1\s+true\s+GoodputJob")
        self.assertEqual(self.kc("apply", "-f", example).stdout.strip(), "goodputjob.goodput.dev/llama-ft created")
        listed = self.kc("get", "goodputjobs").stdout.splitlines()
        self.assertEqual(listed[0].split(), ["NAME", "PHASE", "NODES", "STEP", "GOODPUT", "RESTARTS", "AGE"])
        self.assertEqual(listed[1].split()[0], "llama-ft")

        # The schema refuses, through the real kubectl (which sends fieldValidation=Strict), a field it
        # does not declare and a value out of bounds; nothing is created.
        with open(example) as f:
            text = f.read()
        unknown = self.apply_job(text.replace("name: llama-ft", "name: typo").replace("  nodes: 4", "  nodez: 4"))
        self.assertNotEqual(unknown.returncode, 0)
        self.assertIn('strict decoding error: unknown field "spec.nodez"', unknown.stderr)
        zero = self.apply_job(text.replace("name: llama-ft", "name: zero").replace("  nodes: 4", "  nodes: 0"))
        self.assertIn("spec.nodes: Invalid value: 0: spec.nodes in body should be greater than or equal to 1",
                      zero.stderr)
        no_image = self.apply_job(text.replace("name: llama-ft", "name: noimage").replace(
            "    image: registry.example/goodput-trainer:1\n", ""))
        self.assertIn("spec.backend.image: Required value", no_image.stderr)
        self.assertEqual(self.kc("get", "gpj", "-o", "name").stdout.split(), ["goodputjob.goodput.dev/llama-ft"])
        # A second apply is a merge patch; the spec's generation moves.
        self.assertIn("configured", self.apply_job(text.replace("  nodes: 4", "  nodes: 8")).stdout)
        got = json.loads(self.kc("get", "gpj", "llama-ft", "-o", "json").stdout)
        self.assertEqual((got["spec"]["nodes"], got["metadata"]["generation"]), (8, 2))

        # The official Python client: the status subresource moves the printer columns; a write to the
        # object itself leaves the status alone; an Event about the job is what kubectl get events shows.
        from kubernetes import client, config
        config.load_kube_config(config_file=self.emu.kubeconfig)
        crs, core = client.CustomObjectsApi(), client.CoreV1Api()
        crs.patch_namespaced_custom_object_status("goodput.dev", "v1alpha1", NS, "goodputjobs", "llama-ft", {
            "status": {"phase": "Running", "nodes": "8/8", "nodes_ready": 8, "nodes_target": 8, "step": 120,
                       "goodput": "97.5%", "restarts": 1}})
        row = self.kc("get", "gpj", "llama-ft", "--no-headers").stdout.split()
        self.assertEqual(row[:6], ["llama-ft", "Running", "8/8", "120", "97.5%", "1"])
        crs.patch_namespaced_custom_object("goodput.dev", "v1alpha1", NS, "goodputjobs", "llama-ft",
                                           {"status": {"phase": "Failed"}, "metadata": {"labels": {"team": "llm"}}})
        job = crs.get_namespaced_custom_object("goodput.dev", "v1alpha1", NS, "goodputjobs", "llama-ft")
        self.assertEqual((job["status"]["phase"], job["metadata"]["labels"]), ("Running", {"team": "llm"}))
        owner = client.V1OwnerReference(api_version="goodput.dev/v1alpha1", kind="GoodputJob", name="llama-ft",
                                        uid=job["metadata"]["uid"], controller=True, block_owner_deletion=True)
        core.create_namespaced_event(NS, client.CoreV1Event(
            metadata=client.V1ObjectMeta(name="llama-ft.oom", owner_references=[owner]),
            involved_object=client.V1ObjectReference(api_version="goodput.dev/v1alpha1", kind="GoodputJob",
                                                     name="llama-ft", namespace=NS, uid=job["metadata"]["uid"]),
            reason="Recovering", message="node 2: OOMKilled, relaunched with 1.5x memory", type="Warning",
            first_timestamp=datetime.datetime.now(datetime.timezone.utc),
            last_timestamp=datetime.datetime.now(datetime.timezone.utc), count=1))
        events = self.kc("get", "events").stdout
        self.assertRegex(events, r"Warning\s+Recovering\s+goodputjob/llama-ft\s+node 2: OOMKilled")
        # What the job owns: a ConfigMap, and a pod that really runs.
        core.create_namespaced_config_map(NS, client.V1ConfigMap(
            metadata=client.V1ObjectMeta(name="llama-ft-spec", owner_references=[owner]), data={"job.json": "{}"}))
        core.create_namespaced_pod(NS, client.V1Pod(
            metadata=client.V1ObjectMeta(name="llama-ft-master", owner_references=[owner]),
            spec=client.V1PodSpec(restart_policy="Never", containers=[client.V1Container(
                name="master", image="goodput", command=["/bin/sleep", "600"])])))
        deadline = time.time() + 20
        while self.emu.pods()["llama-ft-master"]["status"]["phase"] != "Running" and time.time() < deadline:
            time.sleep(0.1)
        self.assertEqual(self.kc("get", "configmaps", "-o", "name").stdout.split(), ["configmap/llama-ft-spec"])
        self.assertIn("deleted", self.kc("delete", "goodputjob", "llama-ft").stdout)
        self.assertEqual(self.kc("get", "gpj", "-o", "name").stdout.split(), [])
        self.assertEqual(self.kc("get", "configmaps", "-o", "name").stdout.split(), [])
        self.assertEqual(self.kc("get", "events", "-o", "name").stdout.split(), [])
        self.assertNotIn("llama-ft-master", self.emu.pods())
        # Deleting the CRD takes its kind away.
        self.kc("delete", "-f", crd)
        gone = self.kc("get", "goodputjobs", ok=False)
        self.assertNotEqual(gone.returncode, 0)
        self.assertIn("goodputjobs", gone.stderr)  # kubectl's cached discovery may still name it: a 404 either way
        self.assertEqual(self.emu.call("GET", "/apis/goodput.dev/v1alpha1")[0], 404)


    def test_goodput_k8s_convert_turns_a_pytorchjob_into_a_goodputjob_kubectl_applies(self):
        # A PyTorchJob in the Kubeflow training operator's v1 format (kubeflow.org/v1: a Master and
        # Workers with a pod template each, nprocPerNode, elasticPolicy, runPolicy), constructed here
        # from its API reference: no PyTorchJob manifest is in shared/data.
        worker = {"replicas": 3, "restartPolicy": "OnFailure", "template": {"spec": {
            "nodeSelector": {"accelerator": "h100"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "volumes": [{"name": "ckpt", "persistentVolumeClaim": {"claimName": "ckpt"}}],
            "schedulerName": "volcano",
            "containers": [
                {"name": "pytorch", "image": "registry.example/llama:2", "imagePullPolicy": "Always",
                 "command": ["torchrun", "--nnodes=4", "--nproc_per_node", "8", "--rdzv_backend=c10d",
                             "--rdzv_endpoint=$(MASTER_ADDR):29400", "train.py", "--lr", "3e-4"],
                 "env": [{"name": "NCCL_DEBUG", "value": "WARN"},
                         {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
                 "resources": {"limits": {"nvidia.com/gpu": 8, "memory": "64Gi", "cpu": "32"}},
                 "volumeMounts": [{"name": "ckpt", "mountPath": "/ckpt"}], "ports": [{"containerPort": 23456}]},
                {"name": "log-shipper", "image": "fluent-bit"}]}}}
        job = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
               "metadata": {"name": "llama-pt", "namespace": NS, "labels": {"team": "llm"}},
               "spec": {"nprocPerNode": "8", "elasticPolicy": {"minReplicas": 2, "maxReplicas": 4, "maxRestarts": 10},
                        "runPolicy": {"cleanPodPolicy": "None", "backoffLimit": 5},
                        "pytorchReplicaSpecs": {"Master": copy.deepcopy(worker) | {"replicas": 1}, "Worker": worker}}}
        path = os.path.join(self.emu.dir, "pytorchjob.json")
        with open(path, "w") as f:
            json.dump(job, f)
        converted = subprocess.run([GOODPUT, "k8s", "convert", path, "--format", "json"], capture_output=True,
                                   text=True, timeout=30)
        self.assertEqual(converted.returncode, 0, converted.stderr)
        out = json.loads(converted.stdout)
        self.assertEqual((out["apiVersion"], out["kind"], out["metadata"]),
                         ("goodput.dev/v1alpha1", "GoodputJob", {"name": "llama-pt", "namespace": NS,
                                                                 "labels": {"team": "llm"}}))
        spec = out["spec"]
        self.assertEqual((spec["nodes"], spec["nproc_per_node"]), (4, 8))  # a Master and 3 Workers, 8 each
        self.assertEqual(spec["command"], ["python3", "train.py", "--lr", "3e-4"])  # torchrun's own options gone
        self.assertEqual(spec["env"], {"NCCL_DEBUG": "WARN"})
        self.assertEqual({k: spec["backend"][k] for k in ("image", "image_pull_policy", "gpus", "memory_mb", "cpu")},
                         {"image": "registry.example/llama:2", "image_pull_policy": "Always", "gpus": 8,
                          "memory_mb": 65536, "cpu": "32"})
        self.assertEqual(spec["backend"]["volume_mounts"], [{"name": "ckpt", "mountPath": "/ckpt"}])
        for lost in ("restartPolicy (OnFailure)", "containers[log-shipper]: a second container", "env HF_TOKEN: valueFrom",
                     "the launcher's --nnodes, --rdzv-backend, --rdzv-endpoint", "spec.elasticPolicy", "spec.runPolicy (",
                     "template.spec.schedulerName", "containers[pytorch].ports"):
            self.assertIn(lost, converted.stderr)
        self.assertNotIn("Master.template", converted.stderr)  # the same template as the Workers'
        # The YAML form, with what was not carried over as comments, is a GoodputJob the CRD's strict schema takes.
        yaml_out = os.path.join(self.emu.dir, "goodputjob.yaml")
        self.assertEqual(subprocess.run([GOODPUT, "k8s", "convert", path, "-o", yaml_out], capture_output=True,
                                        timeout=30).returncode, 0)
        with open(yaml_out) as f:
            self.assertIn("# not carried over: spec.elasticPolicy", f.read())
        self.kc("apply", "-f", os.path.join(ROOT, "backends", "kubernetes", "deploy", "crd.yaml"))
        self.assertEqual(self.kc("apply", "-f", yaml_out).stdout.strip(), "goodputjob.goodput.dev/llama-pt created")
        # What is not a PyTorchJob is refused with the field.
        with open(path, "w") as f:
            json.dump(dict(job, kind="TFJob"), f)
        refused = subprocess.run([GOODPUT, "k8s", "convert", path], capture_output=True, text=True, timeout=30)
        self.assertEqual(refused.returncode, 2)
        self.assertIn("field 'kind' is 'kubeflow.org/v1 TFJob', not a kubeflow.org PyTorchJob", refused.stderr)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class GoodputOperatorTest(Kubectl, unittest.TestCase):
    """`goodput operator` as Kubernetes users meet it: the real kubectl applies the CRD and a
    GoodputJob, the operator (a real process, SIGKILLed and started again mid-job) creates the
    job's master (a pod the emulator runs: a real `goodput run`, its event log on the job's
    PersistentVolumeClaim), the master creates its worker pods (real agents, real PyTorch DDP
    trainers), and `kubectl get goodputjobs` and `kubectl get events` show what happens. The API
    server is the emulator (tests/emulators/kube), in the wire format of shared/data/k8s and the API
    reference; its pods' volumes are directories on this machine (see its docstring)."""

    def setUp(self):
        self.kubectl = shutil.which("kubectl")
        if not self.kubectl:
            self.skipTest("kubectl is not installed on this machine")
        self.emu = Emulator(self, nodes=4)  # the master's pod takes a node of its own here
        self.kc("apply", "-f", os.path.join(ROOT, "backends", "kubernetes", "deploy", "crd.yaml"))
        self.operators = []
        self.addCleanup(self.stop_operators)

    def start_operator(self, *args):
        log = open(os.path.join(self.emu.dir, f"operator-{len(self.operators)}.log"), "w")
        proc = subprocess.Popen([GOODPUT, "operator", "--kubeconfig", self.emu.kubeconfig, "--resync", "0.5", *args],
                                stdout=log, stderr=subprocess.STDOUT)
        self.operators.append((proc, log))
        return proc

    def stop_operators(self):
        for proc, log in self.operators:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()

    def operator_log(self):
        text = ""
        for i in range(len(self.operators)):
            with open(os.path.join(self.emu.dir, f"operator-{i}.log")) as f:
                text += f.read()
        master = os.path.join(self.emu.dir, "opjob-master", "container.log")
        if os.path.exists(master):
            with open(master) as f:
                text += "\n--- master:\n" + f.read()[-4000:]
        return text

    def apply(self, manifest):
        path = os.path.join(self.emu.dir, manifest["metadata"]["name"] + ".json")
        with open(path, "w") as f:
            json.dump(manifest, f)
        return self.kc("apply", "-f", path)

    def job(self, name):
        return json.loads(self.kc("get", "gpj", name, "-o", "json").stdout)

    def row(self, name):
        return self.kc("get", "gpj", name, "--no-headers").stdout.split()

    def wait(self, what, cond, timeout=90):
        deadline = time.time() + timeout
        while time.time() < deadline:
            got = cond()
            if got:
                return got
            time.sleep(0.2)
        self.fail(f"{what} never happened\n{self.operator_log()}")

    def goodputjob(self, name, port, **over):
        with open(os.path.join(ROOT, "examples/pytorch/policy.json")) as f:
            policy = json.load(f)
        job = spec(total_steps=1200, policy=policy, storage_dir=os.path.join(self.emu.dir, name + "-checkpoints"),
                   backend={"image": "registry.example/goodput-trainer:1", "agent": GOODPUT, "memory_mb": 512,
                            "cpu": "1"},
                   master={"url": f"http://127.0.0.1:{port}", "port": port}, **over)
        del job["job"]
        return {"apiVersion": "goodput.dev/v1alpha1", "kind": "GoodputJob", "metadata": {"name": name}, "spec": job}

    def test_the_operator_runs_a_goodputjob_through_an_oom_its_own_death_and_its_masters_then_deletes_it(self):
        for manifest in ("operator.yaml", "job-namespace.yaml"):
            self.assertIn("(dry run)", self.kc("apply", "--dry-run=client", "-f", os.path.join(
                ROOT, "backends", "kubernetes", "deploy", "operator", manifest)).stdout)
        operator = self.start_operator()
        port = free_port()
        # Its policy from a ConfigMap, as YAML (oom_memory_factor: 1.5 is a number there).
        import yaml
        policy = os.path.join(self.emu.dir, "policy.yaml")
        with open(os.path.join(ROOT, "examples/pytorch/policy.json")) as f, open(policy, "w") as out:
            yaml.safe_dump(json.load(f), out)
        self.kc("create", "configmap", "training-policy", f"--from-file=policy.yaml={policy}")
        job = self.goodputjob("opjob", port)
        del job["spec"]["policy"]
        job["spec"]["policy_from"] = {"configMapKeyRef": {"name": "training-policy", "key": "policy.yaml"}}
        self.assertIn("created", self.apply(job).stdout)
        # A job whose policy (free-form in the schema) has a key no policy knows: refused with the
        # reason as a condition and an Event; nothing is made for it.
        bad = self.goodputjob("badjob", free_port())
        bad["spec"]["policy"]["recovery"]["max_restart"] = 3
        self.assertIn("created", self.apply(bad).stdout)

        uid = self.job("opjob")["metadata"]["uid"]
        self.wait("Running on 2 of 2 nodes", lambda: self.row("opjob")[1:3] == ["Running", "2/2"])
        masters = [r for r in self.emu.ok("GET", "/_emulator/requests")
                   if r["method"] == "POST" and r["path"] == f"/api/v1/namespaces/{NS}/pods"
                   and r["body"]["metadata"]["name"] == "opjob-master"]
        self.assertEqual(len(masters), 1)
        # What the job owns, each with its owner reference.
        for kind, name in (("configmap", "opjob-job"), ("secret", "opjob-token"), ("service", "opjob-master"),
                           ("persistentvolumeclaim", "opjob-log"), ("pod", "opjob-master")):
            obj = json.loads(self.kc("get", kind, name, "-o", "json").stdout)
            self.assertEqual([o["uid"] for o in obj["metadata"]["ownerReferences"]], [uid], (kind, name))
        token = base64.b64decode(self.emu.ok("GET", f"/api/v1/namespaces/{NS}/secrets/opjob-token")["data"]["token"])
        workers = {n: p for n, p in self.emu.pods().items() if n != "opjob-master"}
        self.assertEqual(len(workers), 2)
        for p in list(workers.values()) + [self.emu.pods()["opjob-master"]]:
            self.assertEqual(p["metadata"]["ownerReferences"][0]["uid"], uid)  # the master's pods are the job's too
            self.assertNotIn(token.decode(), json.dumps(p), "the token is read from the Secret, never in a pod")
        self.assertEqual(self.emu.secrets(), ["opjob-token"], "the master makes no Secret of its own")

        bad_job = self.wait("badjob refused", lambda: (lambda j: j if j.get("status", {}).get("phase") == "Failed"
                                                       else None)(self.job("badjob")))
        failed = [c for c in bad_job["status"]["conditions"] if c["type"] == "Failed"][0]
        self.assertEqual((failed["status"], failed["reason"]), ("True", "InvalidSpec"))
        self.assertIn("max_restart", failed["message"])
        self.assertNotIn("badjob-master", self.emu.pods())
        self.assertNotIn("configmap/badjob-job", self.kc("get", "configmaps", "-o", "name").stdout)

        # A worker pod killed for memory: Recovering, then Running again, each an Event.
        step = lambda: int(self.job("opjob")["status"].get("step", 0))
        self.wait("step 100", lambda: step() >= 100)
        victim = sorted(workers)[1]
        phases = []
        self.emu.ok("POST", "/_emulator/oom", {"namespace": NS, "pod": victim})
        def recovered():
            phases.append(self.row("opjob")[1])
            return "Recovering" in phases and phases[-1] == "Running"
        self.wait("recovery", recovered)
        events = self.kc("get", "events").stdout
        self.assertRegex(events, r"Warning\s+Recovering\s+goodputjob/opjob\s+node \S+ \(slot \d\): out_of_memory")
        self.assertRegex(events, r"Normal\s+Recovered\s+goodputjob/opjob\s+training again")
        self.assertRegex(events, r"Warning\s+InvalidSpec\s+goodputjob/badjob")
        self.assertEqual(self.row("opjob")[5], "1", "one restart")

        # The operator SIGKILLed mid-job and started again (watching every namespace now): the same
        # master, no second one.
        master_uid = self.emu.pods()["opjob-master"]["metadata"]["uid"]
        operator.kill()
        operator.wait()
        self.start_operator("--all-namespaces")
        at = step()
        self.wait("progress under the new operator", lambda: step() >= at + 30)
        self.assertEqual(self.emu.pods()["opjob-master"]["metadata"]["uid"], master_uid)

        # The master's pod deleted: made again, it resumes from the log on the claim; the trainers
        # were not restarted (the same worker pods, no restart in the log but the OOM's).
        workers = {n: p["metadata"]["uid"] for n, p in self.emu.pods().items() if n != "opjob-master"}
        self.kc("delete", "pod", "opjob-master")
        self.wait("a new master", lambda: self.emu.pods().get("opjob-master", {}).get("metadata", {}).get(
            "uid", master_uid) != master_uid)
        self.wait("Succeeded", lambda: self.row("opjob")[1] == "Succeeded", timeout=180)
        done = self.job("opjob")
        self.assertEqual(done["status"]["step"], 1200)
        self.assertRegex(done["status"]["goodput"], r"^\d+\.\d%$")
        self.assertEqual(done["status"]["restarts"], 1)
        self.assertNotIn("master_restarts", done["status"], "a deleted master is recreated, not counted as failed")
        self.assertEqual(done["status"]["observed_generation"], 1)
        log = os.path.join(self.emu.dir, "claims", NS, "opjob-log", "run", "events.db")
        records = [json.loads(l) for l in subprocess.run([GOODPUT, "report", log, "--format", "events"],
                                                         capture_output=True, text=True, check=True).stdout.splitlines()]
        self.assertEqual(len(of_type(records, "restart_job")), 2, "the start and the OOM's restart, nothing more")
        # The ConfigMap's policy decided: 1.5 times the memory.
        self.assertEqual(decisions(records), [("out_of_memory", "relaunch_with_more_memory", 1500)])
        self.assertEqual(of_type(records, "job_finished")[-1]["reason"], "completed")
        self.assertEqual(len(of_type(records, "node_joined")), 3, "two pods, and the OOM's replacement")
        events = self.kc("get", "events").stdout
        self.assertRegex(events, r"Warning\s+MasterRecreated\s+goodputjob/opjob")
        self.assertRegex(events, r"Normal\s+Succeeded\s+goodputjob/opjob\s+completed 1200 steps")
        masters = [r for r in self.emu.ok("GET", "/_emulator/requests")
                   if r["method"] == "POST" and r["path"] == f"/api/v1/namespaces/{NS}/pods"
                   and r["body"]["metadata"]["name"] == "opjob-master"]
        self.assertEqual(len(masters), 2, "one master, and the one made after it was deleted")

        # Deleting the GoodputJob takes everything it owns.
        self.kc("delete", "goodputjob", "opjob", "badjob")
        self.assertEqual(self.kc("get", "configmaps", "-o", "name").stdout.split(), ["configmap/training-policy"],
                         "the user's ConfigMap is not the job's")
        self.kc("delete", "configmap", "training-policy")
        for kind in ("configmaps", "services", "persistentvolumeclaims", "events"):
            self.assertEqual(self.kc("get", kind, "-o", "name").stdout.split(), [], kind)
        self.assertEqual(self.emu.secrets(), [])
        self.assertEqual(self.emu.pods(), {})


class KubeBackendTest(unittest.TestCase):
    def test_an_oomkilled_pod_is_relaunched_with_more_memory(self):
        emu = Emulator(self)
        run = LiveRun(self, kube_spec(emu, total_steps=160))

        secrets, versions = [], []

        def oom():
            run.wait_for_step(40)
            secrets.extend(emu.secrets())
            versions.append(emu.ok("GET", f"/api/v1/namespaces/{NS}/pods")["metadata"]["resourceVersion"])
            emu.ok("POST", "/_emulator/oom", {"namespace": NS, "pod": emu.pod_of_slot(run, 1)})

        self.assertEqual(run.run_while(oom), 0, run.diag())
        self.assertEqual(len(secrets), 1, "the agents' token is a Secret while the job runs")
        self.assertEqual(emu.secrets(), [], "and is deleted when it ends")
        ev = run.events()
        failures = of_type(ev, "failure_observed")
        self.assertEqual(len(failures), 1, failures)
        # The fixture's status: reason OOMKilled with exit code 1 (not 137): the reason decides.
        self.assertIn("reason=OOMKilled exitCode=1", failures[0]["reason"])
        self.assertEqual(decisions(ev), [("out_of_memory", "relaunch_with_more_memory", 1500)])
        # The cluster's own history of the run (the pods' watch stream from before the OOM, saved
        # as NDJSON), imported as a trace, replays with the live master's diagnosis and action.
        stream = os.path.join(run.dir, "pods.ndjson")
        with urllib.request.urlopen(f"{emu.url}/api/v1/namespaces/{NS}/pods?watch=1&resourceVersion={versions[0]}"
                                    "&timeoutSeconds=1", timeout=30) as r, open(stream, "wb") as f:
            f.write(r.read())
        history = os.path.join(run.dir, "history.jsonl")
        imported = subprocess.run([GOODPUT, "trace", "import", "--from", "k8s", stream, "-o", history,
                                   "--cost-model", run.db],  # how long a restart takes here: the run's own medians
                                  capture_output=True, text=True)
        self.assertEqual(imported.returncode, 0, imported.stderr)
        self.assertIn("1 failures (1 process_crash)", imported.stderr)
        replay_db = os.path.join(run.dir, "history.db")
        subprocess.run([GOODPUT, "replay", history, "--events", replay_db, "--policy",
                        os.path.join(ROOT, "examples/pytorch/policy.json")], capture_output=True, text=True, check=True)
        out = subprocess.run([GOODPUT, "report", replay_db, "--format", "events"], capture_output=True, text=True,
                             check=True)
        self.assertEqual([d[:2] for d in decisions([json.loads(l) for l in out.stdout.splitlines()])],
                         [("out_of_memory", "relaunch_with_more_memory")])
        created = emu.created()
        self.assertEqual(len(created), 3)
        limits = [c["spec"]["containers"][0]["resources"]["limits"]["memory"] for c in created]
        self.assertEqual(limits, ["512Mi", "512Mi", "768Mi"])
        for c in created:  # the token comes from a Secret, never in the pod spec
            self.assertNotIn(run.token(), json.dumps(c))
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        self.assertEqual(emu.pods(), {}, "the job's pods are deleted when it ends")
        # A pod labelled rank r took slot r, the replacement included.
        rank = {c["metadata"]["name"]: int(c["metadata"]["labels"]["goodput/rank"]) for c in created}
        self.assertEqual({j["name"]: j["slot"] for j in of_type(ev, "node_joined")}, rank)
        # The first two pods are created at once (in either order); the relaunch comes after both.
        self.assertEqual(sorted(list(rank.values())[:2]), [0, 1])
        self.assertEqual(list(rank.values())[2], 1)

    def test_replica_groups_get_their_own_pods_and_a_parameter_server_comes_back_as_one(self):
        # A parameter-server job (examples/pytorch/train_ps.py): the server's pod has its group's
        # shape; killed for memory, it is relaunched as a server with more memory, and the
        # workers' pods are left as they are.
        emu = Emulator(self)
        run = LiveRun(self, kube_ps_spec(emu, total_steps=160))

        def oom():
            run.wait_for_step(40)
            emu.ok("POST", "/_emulator/oom", {"namespace": NS, "pod": emu.pod_of_slot(run, 0)})

        self.assertEqual(run.run_while(oom), 0, run.diag())
        ev = run.events()
        self.assertEqual(decisions(ev), [("out_of_memory", "relaunch_with_more_memory", 1500)])
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        shapes = []
        for c in emu.created():
            labels, res = c["metadata"]["labels"], c["spec"]["containers"][0]["resources"]
            self.assertIn(f"-{labels['goodput/replica-type']}-", c["metadata"]["name"])
            shapes.append((labels["goodput/replica-type"], labels["goodput/replica-index"], labels["goodput/rank"],
                           res["limits"]["memory"], res["requests"]["cpu"]))
        self.assertEqual(sorted(shapes[:3]), [("ps", "0", "0", "256Mi", "2"), ("worker", "0", "1", "512Mi", "1"),
                                              ("worker", "1", "2", "512Mi", "1")])
        self.assertEqual(shapes[3:], [("ps", "0", "0", "384Mi", "2")])
        joined = of_type(ev, "node_joined")
        self.assertEqual([(j["slot"], j["replica_type"]) for j in joined if "-ps-" in j["name"]], [(0, "ps"), (0, "ps")])

    def test_an_operator_scales_the_parameter_servers_and_pods_follow_the_new_layout(self):
        # `goodput scale ps 2` then `ps 1` on the emulated cluster: the second server's pod gets the
        # ps group's shape and labels (index 1 at rank 1), the workers move up a rank and their pods'
        # goodput/rank labels are patched to say so, and the second server's pod is deleted when the
        # group shrinks (the workers' labels go back). Both restarts restore from storage and the
        # job completes. (One pod per node here: the fourth node is for the second server.)
        emu = Emulator(self, nodes=4)
        run = LiveRun(self, kube_ps_spec(emu, total_steps=200))
        answers = []

        ranks = []

        def scale(count, at_step):
            run.wait_for_step(at_step, timeout=180)
            answers.append(ask_scale(run, "ps", count))  # asked again while the new server's pod starts
            run.wait_for_step(at_step + 20, timeout=180)  # the new world is training
            labels = {n: p["metadata"]["labels"]["goodput/rank"] for n, p in emu.pods().items()}
            first = sorted(of_type(run.events(), "node_joined")[:3], key=lambda j: j["slot"])[1:]  # the workers
            ranks.append([labels[j["name"]] for j in first])

        self.assertEqual(run.run_while(lambda: (scale(2, 60), scale(1, 130)), timeout=300), 0, run.diag())
        self.assertEqual([a.returncode for a in answers], [0, 0], [a.stderr for a in answers])
        ev = run.events()
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        self.assertEqual([(r["world_size"], r["restore_tier"]) for r in of_type(ev, "restart_job")],
                         [(3, "none"), (4, "storage"), (3, "storage")])
        shapes = []
        for c in emu.created():
            labels, res = c["metadata"]["labels"], c["spec"]["containers"][0]["resources"]
            shapes.append((labels["goodput/replica-type"], labels["goodput/replica-index"], labels["goodput/rank"],
                           res["limits"]["memory"], res["requests"]["cpu"]))
        self.assertEqual(len(shapes), 4, shapes)
        self.assertEqual(shapes[3], ("ps", "1", "1", "256Mi", "2"))
        second = of_type(ev, "node_joined")[3]
        self.assertEqual((second["slot"], second["replica_type"]), (1, "ps"))
        deleted = [r["path"].rsplit("/", 1)[-1] for r in emu.ok("GET", "/_emulator/requests") if r["method"] == "DELETE"]
        self.assertIn(second["name"], deleted)
        self.assertEqual(of_type(ev, "scale_decided")[1]["released"], [second["node"]])
        workers = [j["name"] for j in sorted(of_type(ev, "node_joined")[:3], key=lambda j: j["slot"])[1:]]
        patches = [r for r in emu.ok("GET", "/_emulator/requests") if r["method"] == "PATCH"]
        self.assertEqual({r["content_type"] for r in patches}, {"application/merge-patch+json"})
        # Each pod's relabels in the order of the scales (pods are patched several at a time).
        relabels = {w: [r["body"] for r in patches if r["path"].rsplit("/", 1)[-1] == w] for w in workers}
        self.assertEqual(len(patches), 4)
        label = lambda rank: {"metadata": {"labels": {"goodput/rank": rank}}}  # noqa: E731
        self.assertEqual(relabels, {workers[0]: [label("2"), label("1")], workers[1]: [label("3"), label("2")]})
        # While the job ran (its pods are deleted when it ends), the labels read as the ranks.
        self.assertEqual(ranks, [["2", "3"], ["1", "2"]])

    def test_a_node_going_not_ready_loses_its_pods_to_other_nodes(self):
        emu = Emulator(self)
        run = LiveRun(self, kube_spec(emu, total_steps=160))
        bad = {}

        def node_down():
            run.wait_for_step(50)
            pod = emu.pods()[emu.pod_of_slot(run, 0)]
            bad["node"] = pod["spec"]["nodeName"]
            emu.ok("POST", "/_emulator/node-down", {"node": bad["node"], "form": "unknown"})

        self.assertEqual(run.run_while(node_down), 0, run.diag())
        ev = run.events()
        failures = of_type(ev, "failure_observed")
        self.assertEqual([f["kind"] for f in failures], ["node_lost"], failures)
        self.assertIn(f"node {bad['node']} lost: node Ready=Unknown (NodeStatusUnknown", failures[0]["reason"])
        # The log also tells how the cluster changed, in order: the pod running there, the node
        # going Unknown, the replacement pod scheduled on another node.
        status = of_type(ev, "status_observed")
        node_changes = [x for x in status if x["object"] == "node" and x["name"] == bad["node"]]
        self.assertTrue(node_changes and node_changes[0]["status"].startswith("node Ready=Unknown"), status)
        ran_there = [x for x in status if x["object"] == "pod" and x["status"].startswith(f"Running on {bad['node']}")]
        self.assertTrue(ran_there, status)
        first_pod = ran_there[0]["name"]
        self.assertTrue(any(x["object"] == "pod" and x["name"] == first_pod and x["status"] == "deleted" for x in status))
        self.assertEqual(decisions(ev), [("hardware_error", "relaunch_node", 1000)])
        # Detected from the node's status (the reason above), not from the 300 s toleration or the
        # heartbeat timeout: no failure was taken from a silent node.
        self.assertFalse([f for f in failures if f["reason"].startswith("no heartbeat")], failures)
        # The node carries the cluster's unreachable NoExecute taint: the scheduler keeps pods off it
        # by itself, so the replacement needs no NotIn (a zone's thousand names would weigh on every
        # pod), and it ran elsewhere.
        replacement = emu.created()[-1]
        self.assertNotIn("affinity", replacement["spec"])
        where = [x["status"] for x in status if x["object"] == "pod" and x["name"] == replacement["metadata"]["name"]
                 and x["status"].startswith("Running on ")]
        self.assertTrue(where, status)
        self.assertFalse(where[0].startswith(f"Running on {bad['node']};"), where)
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

    def test_a_lost_node_s_slot_goes_to_a_spare_pod_that_restores_its_peer_s_copy(self):
        # "spares": 1 and checkpoint.replicas: 1 on Kubernetes: a third pod (its image pulled, its
        # agent registered) waits beside the two of the world, and each memory checkpoint is copied
        # to the other rank's pod. Slot 0's node goes down after the save at step 90: the spare pod
        # takes the slot in the same decision, fetches rank 0's step from slot 1's pod, and the
        # world restores it (tier peer); the pod asked for in the slot's stead joins as a spare.
        emu = Emulator(self, nodes=4)
        policy = {"recovery": {"policy": "diagnose", "restore_from": "memory"},
                  "checkpoint": {"policy": "flash", "every_steps": 30, "persist_every": 2, "replicas": 1},
                  "scaling": {"policy": "wait"}}
        run = LiveRun(self, kube_spec(emu, spares=1, policy=policy, data_shards=320))

        def node_down():
            run.wait_for_step(100)
            emu.ok("POST", "/_emulator/node-down",
                   {"node": emu.pods()[emu.pod_of_slot(run, 0)]["spec"]["nodeName"], "form": "unknown"})

        self.assertEqual(run.run_while(node_down), 0, run.diag())
        ev = run.events()
        self.assertEqual(decisions(ev), [("hardware_error", "relaunch_node", 1000)])
        joins = [e for e in ev if e["type"] == "node_joined"]
        self.assertEqual(sorted(j["data"]["slot"] for j in joins[:3]), [-1, 0, 1], "two ranks and a spare pod")
        spare = [j["data"] for j in joins[:3] if j["data"]["slot"] == -1][0]
        self.assertEqual(len(joins), 4, joins)
        self.assertEqual(joins[3]["data"]["slot"], -1, "the replacement pod refills the pool")
        decided = [e for e in ev if e["type"] == "recovery_decided"][0]
        restart = [e for e in ev if e["type"] == "restart_job" and e["seq"] > decided["seq"]][0]
        self.assertLess(restart["seq"], joins[3]["seq"], "the restart did not wait for the new pod")
        self.assertEqual(restart["data"]["restore_tier"], "peer")
        stored = [e["data"]["step"] for e in ev if e["type"] == "replica_stored" and e["seq"] < decided["seq"]]
        self.assertEqual(stored[-1], restart["data"]["restore_step"])
        loaded = of_type(ev, "checkpoint_loaded")[1]
        self.assertEqual((loaded["tier"], loaded["step"]), ("peer", restart["data"]["restore_step"]))
        self.assertEqual([s for s in of_type(ev, "status_observed") if s["object"] == "replica"], [])
        self.assertEqual(len(emu.created()), 4, "two ranks, a spare, and the spare that refills the pool")
        self.assertIn(spare["name"], [p["metadata"]["name"] for p in emu.created()[:3]])
        self.assertIn("320 of 320 done, 0 trained twice", run.stdout)
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

    def test_no_node_free_for_a_replacement_the_elastic_world_trains_on_without_it(self):
        # Three pods on three nodes; slot 2's node goes NotReady. Its replacement pod finds no node
        # (the others run a pod each): the scheduler marks it Unschedulable, and after
        # pending_timeout it is given up, so the slot is reported waiting and the elastic policy
        # goes on with two. Pods keep being asked for (a node may come back; later each time), and,
        # the world training meanwhile, none of that fails the job.
        emu = Emulator(self, nodes=3)
        policy = {"recovery": {"policy": "diagnose"}, "checkpoint": {"policy": "flash", "every_steps": 20},
                  "scaling": {"policy": "elastic", "min_nodes": 2}}
        run = LiveRun(self, kube_spec(emu, nodes=3, total_steps=400, policy=policy, backend={"pending_timeout": "1500ms"}))

        def node_down():
            run.wait_for_step(40)
            node = emu.pods()[emu.pod_of_slot(run, 2)]["spec"]["nodeName"]
            emu.ok("POST", "/_emulator/node-down", {"node": node, "form": "false"})

        self.assertEqual(run.run_while(node_down, timeout=300), 0, run.diag())
        ev = run.events()
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        self.assertEqual(decisions(ev), [("hardware_error", "relaunch_node", 1000)])
        self.assertEqual(of_type(ev, "no_spare_node"), [{"slot": 2}])
        self.assertEqual([(d["from"], d["to"]) for d in of_type(ev, "scale_decided")], [(3, 2)])
        self.assertEqual(of_type(ev, "restart_job")[-1]["world_size"], 2)
        # The scheduler's word is in the log; the pods it could not place were given up (deleted)
        # and others asked for.
        unschedulable = {x["name"] for x in of_type(ev, "status_observed")
                         if x["object"] == "pod" and "(Unschedulable: 0/3 nodes are available" in x["status"]}
        deleted = {x["name"] for x in of_type(ev, "status_observed") if x["object"] == "pod" and x["status"] == "deleted"}
        self.assertGreaterEqual(len(unschedulable & deleted), 2, (unschedulable, deleted))
        self.assertGreaterEqual(len(emu.created()), 3 + len(unschedulable))

    def test_kubectl_delete_pod_replaces_the_pod_and_leaves_its_node_usable(self):
        # An operator deletes a worker's pod with the real kubectl: not a fault of its node, so the
        # pod is replaced (preemption) and its Kubernetes node is not excluded.
        kubectl = shutil.which("kubectl")
        if not kubectl:
            self.skipTest("kubectl is not installed on this machine")
        emu = Emulator(self)
        run = LiveRun(self, kube_spec(emu, total_steps=160))

        def delete():
            run.wait_for_step(40)
            out = subprocess.run([kubectl, "--server", emu.url, "-n", NS, "delete", "pod", emu.pod_of_slot(run, 1),
                                  "--wait=false"], capture_output=True, text=True, timeout=30)
            self.assertEqual(out.returncode, 0, out.stderr)

        self.assertEqual(run.run_while(delete), 0, run.diag())
        ev = run.events()
        failures = of_type(ev, "failure_observed")
        self.assertEqual(len(failures), 1, failures)
        self.assertIn("deleted by someone else", failures[0]["reason"])
        self.assertEqual([d[:2] for d in decisions(ev)], [("preemption", "relaunch_node")])
        self.assertNotIn("excluded", run.stderr)
        created = emu.created()
        self.assertEqual(len(created), 3)
        self.assertNotIn("affinity", created[-1]["spec"], "the node stays usable: no NotIn affinity")
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

    def test_a_master_sent_sigterm_leaves_its_pods_training_and_resumes_from_its_log(self):
        # What the manifest's master does when Kubernetes evicts its pod or drains its node
        # (--detach-on-sigterm): it exits 3, "run me again with --resume", leaving the job's pods
        # and token Secret; the trainers train on; the master run again takes them back.
        emu = Emulator(self)
        run = LiveRun(self, kube_spec(emu, total_steps=200))
        run.args.append("--detach-on-sigterm")
        proc = subprocess.Popen(run.args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            run.wait_for_step(40)
            proc.send_signal(signal.SIGTERM)
            self.assertEqual(proc.wait(timeout=30), 3)
            self.assertIn("the master leaves, its agents keep training", proc.stderr.read())
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.stderr.close()
        pods = emu.pods()
        self.assertEqual(sorted(p["status"]["phase"] for p in pods.values()), ["Running", "Running"])
        self.assertEqual(len(emu.secrets()), 1, "the job is not over: its token stays")
        self.assertEqual(run.run(resume=True), 0, run.diag())
        ev = run.events()
        self.assertEqual(len(of_type(ev, "restart_job")), 1, "no trainer was restarted")
        self.assertEqual(of_type(ev, "failure_observed"), [])
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")
        self.assertEqual(len(emu.created()), 2, "the resumed master took the same pods back")
        self.assertEqual(emu.secrets(), [])

    def test_a_trainer_command_that_cannot_run_fails_the_job_at_once(self):
        # The same mistake as on the local backend (tests/python/test_live.py), through pods: the
        # job gives up with the reason; no pod is relaunched for it and no node excluded.
        emu = Emulator(self)
        run_a_command_that_cannot_run(self, kube_spec(emu, command=["/nonexistent/python9", "train.py"]))
        self.assertEqual(len(emu.created()), 2, "no pod was relaunched for it")

    def test_a_node_that_fails_its_check_is_excluded_from_placement(self):
        # Slot 1's first pod computes wrong products (a bad machine): the check fails it before any
        # trainer starts; its Kubernetes node is kept off for the rest of the job (required node
        # affinity NotIn), so the replacement runs on the third node although the bad one is Ready.
        emu = Emulator(self, nodes=3)
        run = LiveRun(self, kube_spec(emu, total_steps=60,
                                      node_check={"compute": "300ms", "link_mib": 4, "straggler_factor": 50,
                                                  "faults": [{"slot": 1, "fault": "corrupt"}]}))
        seen = {}

        def training():
            run.wait_for_step(20)
            seen["pods"] = emu.pods()

        self.assertEqual(run.run_while(training), 0, run.diag())
        ev = run.events()
        checked = of_type(ev, "node_checked")
        faulty = [c for c in checked if c["verdict"] == "faulty"]
        self.assertEqual(len(faulty), 1, checked)
        self.assertFalse(faulty[0]["compute_ok"])
        self.assertIn("differs from the exact result", faulty[0]["detail"])
        self.assertEqual(decisions(ev), [("hardware_error", "relaunch_node", 1000)])
        created = emu.created()
        self.assertEqual(len(created), 3)
        bad_pod = [j["name"] for j in of_type(ev, "node_joined") if j["node"] == faulty[0]["node"]][0]
        terms = created[-1]["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        excluded = terms["nodeSelectorTerms"][0]["matchExpressions"][0]
        self.assertEqual((excluded["key"], excluded["operator"]), ("kubernetes.io/hostname", "NotIn"))
        self.assertEqual(len(excluded["values"]), 1)
        self.assertIn(f"node {excluded['values'][0]} excluded (pod {bad_pod} ", run.stderr)
        replacement = seen["pods"][emu.pod_of_slot(run, 1)]
        self.assertNotEqual(replacement["spec"]["nodeName"], excluded["values"][0])
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

    def test_a_cut_watch_and_an_expired_version_miss_no_failure_and_relaunch_once(self):
        emu = Emulator(self)
        run = LiveRun(self, kube_spec(emu, total_steps=160, heartbeat_timeout="20s", hang_timeout="20s"))

        def chaos():
            run.wait_for_step(40)
            # The watches stall; a pod is OOMKilled; the history is compacted past it; the watches
            # are cut in the middle of the OOM frame. A resume from the last version gets an HTTP
            # 410: only a re-list can see the failure.
            emu.ok("POST", "/_emulator/pause-watches", {})
            emu.ok("POST", "/_emulator/oom", {"namespace": NS, "pod": emu.pod_of_slot(run, 1)})
            emu.ok("POST", "/_emulator/compact", {"in_stream": False})
            emu.ok("POST", "/_emulator/cut-watches", {})
            run.wait_for_step(100)
            # Again with the 410 as an ERROR frame in a 200 stream, and nothing to miss this time.
            emu.ok("POST", "/_emulator/pause-watches", {})
            emu.ok("POST", "/_emulator/compact", {"in_stream": True})
            emu.ok("POST", "/_emulator/cut-watches", {})

        self.assertEqual(run.run_while(chaos), 0, run.diag())
        ev = run.events()
        self.assertEqual(decisions(ev), [("out_of_memory", "relaunch_with_more_memory", 1500)])
        self.assertEqual(len(emu.created()), 3, "exactly one relaunch")
        self.assertGreaterEqual(run.stderr.count("pods watch expired (410): listing again"), 2, run.stderr)
        self.assertEqual(of_type(ev, "job_finished")[-1]["reason"], "completed")

    def test_an_image_that_never_pulls_fails_the_job_at_once(self):
        emu = Emulator(self)
        run = LiveRun(self, kube_spec(emu, total_steps=160, backend={"image": "registry.example/does-not-exist:1"}))
        self.assertEqual(run.run_while(timeout=120), 1, run.diag())
        self.assertEqual(of_type(run.events(), "processes_started"), [], "failed before any trainer was started")
        reason = of_type(run.events(), "job_finished")[-1]["reason"]
        self.assertTrue(reason.startswith("failed: container agent cannot start: Err"), reason)
        self.assertIn("registry.example/does-not-exist:1", reason)
        self.assertEqual(len(emu.created()), 2, "no relaunch loop")
        self.assertEqual(of_type(run.events(), "recovery_decided"), [])

    def test_throttling_and_server_errors_are_retried_with_the_servers_delay(self):
        emu = Emulator(self)
        pods = f"/api/v1/namespaces/{NS}/pods"
        emu.ok("POST", "/_emulator/faults", {"count": 1, "code": 429, "retry_after": 2, "method": "POST", "path": pods})
        emu.ok("POST", "/_emulator/faults", {"count": 2, "code": 503, "method": "POST", "path": pods})
        emu.ok("POST", "/_emulator/faults", {"count": 2, "code": 500, "method": "GET", "path": "/api/v1/nodes"})
        run = LiveRun(self, kube_spec(emu, total_steps=60))
        self.assertEqual(run.run_while(), 0, run.diag())
        posts = [r for r in emu.ok("GET", "/_emulator/requests") if r["method"] == "POST" and r["path"] == pods]
        self.assertEqual(len(posts), 2 + 3, "two pods, after one 429 and two 503s")
        # Pods are created several at a time: one sent with the throttled one may be under way, but
        # once the 429 is answered no request goes out before its Retry-After, a retry of a 503 neither.
        throttled = next(p["time"] for p in posts if p.get("fault") == 429)
        self.assertEqual([p["time"] for p in posts if throttled + 0.1 < p["time"] < throttled + 1.9], [],
                         "Retry-After: 2 was honoured by every call")
        self.assertTrue(any(p["time"] >= throttled + 1.9 for p in posts))
        self.assertEqual(len({p["body"]["metadata"]["name"] for p in posts}), 2)
        self.assertEqual(of_type(run.events(), "job_finished")[-1]["reason"], "completed")

    def test_https_with_a_client_certificate_from_the_kubeconfig(self):
        tmp = tempfile.mkdtemp(prefix="goodput-kubetls-")
        self.addCleanup(subprocess.run, ["rm", "-rf", tmp])
        def cert(name, cn, san=None):
            args = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=" + cn,
                    "-keyout", f"{tmp}/{name}.key", "-out", f"{tmp}/{name}.pem"]
            subprocess.run(args + (["-addext", "subjectAltName=" + san] if san else []), check=True, capture_output=True)
            with open(f"{tmp}/{name}.pem", "rb") as c, open(f"{tmp}/{name}.key", "rb") as k:
                return base64.b64encode(c.read()).decode(), base64.b64encode(k.read()).decode()
        server_pem, _ = cert("server", "127.0.0.1", "IP:127.0.0.1")
        client_pem, client_key = cert("client", "goodput-master")
        other_pem, _ = cert("other", "127.0.0.1", "IP:127.0.0.1")
        emu = Emulator(self, tls_args=["--tls-cert", f"{tmp}/server.pem", "--tls-key", f"{tmp}/server.key",
                                       "--client-ca", f"{tmp}/client.pem"])
        self.assertTrue(emu.url.startswith("https://"), emu.url)
        emu.context = ssl.create_default_context(cafile=f"{tmp}/server.pem")
        emu.context.load_cert_chain(f"{tmp}/client.pem", f"{tmp}/client.key")

        def kubeconfig(ca):
            path = os.path.join(tmp, f"kubeconfig-{len(os.listdir(tmp))}")
            with open(path, "w") as f:
                f.write(f"apiVersion: v1\nkind: Config\ncurrent-context: c\nclusters:\n- name: k\n  cluster:\n"
                        f"    server: {emu.url}\n    certificate-authority-data: {ca}\nusers:\n- name: u\n  user:\n"
                        f"    client-certificate-data: {client_pem}\n    client-key-data: {client_key}\n"
                        f"contexts:\n- name: c\n  context: {{cluster: k, user: u, namespace: {NS}}}\n")
            return path

        run = LiveRun(self, kube_spec(emu, total_steps=60, backend={"kubeconfig": kubeconfig(server_pem)}))
        self.assertEqual(run.run_while(), 0, run.diag())
        self.assertEqual(of_type(run.events(), "job_finished")[-1]["reason"], "completed")
        requests = emu.ok("GET", "/_emulator/requests")
        self.assertTrue(any(r["query"].get("watch") == "true" for r in requests), "the watches ran over TLS")
        self.assertTrue(all(r["authorization"] is None for r in requests), "authenticated by the certificate")
        # An API server whose certificate the kubeconfig's CA does not vouch for is refused.
        bad = LiveRun(self, kube_spec(emu, total_steps=60, backend={"kubeconfig": kubeconfig(other_pem)}))
        self.assertEqual(bad.run_while(timeout=120), 1, bad.diag())
        self.assertIn("no answer from the API server at " + emu.url, bad.stderr)

    def test_a_job_of_two_pods_with_two_trainers_each_recovers_a_killed_local_rank_from_memory(self):
        # torchrun's shape on this backend: one pod per node, two trainer processes in it.
        emu = Emulator(self)
        run = LiveRun(self, kube_spec(emu, total_steps=100, nproc_per_node=2, checkpoint_bytes_per_node=8 << 20),
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

    def test_a_replay_of_the_emulated_run_makes_the_same_decisions(self):
        emu = Emulator(self)
        run = LiveRun(self, kube_spec(emu, total_steps=160),
                      [{"fault": "kill-process", "slot": 1, "at_step": 40}])

        def oom():
            run.wait_for_step(100)
            emu.ok("POST", "/_emulator/oom", {"namespace": NS, "pod": emu.pod_of_slot(run, 0)})

        self.assertEqual(run.run_while(oom), 0, run.diag())
        live = decisions(run.events())
        self.assertEqual(live, [("software_error", "restart_process", 1000),
                                ("out_of_memory", "relaunch_with_more_memory", 1500)])
        replay_db = os.path.join(run.dir, "replay.db")
        subprocess.run([GOODPUT, "replay", "--from-log", run.db, "--events", replay_db,
                        "--policy", os.path.join(ROOT, "examples/pytorch/policy.json")],
                       capture_output=True, text=True, check=True)
        out = subprocess.run([GOODPUT, "report", replay_db, "--format", "events"], capture_output=True, text=True,
                             check=True)
        replayed = decisions([json.loads(line) for line in out.stdout.splitlines()])
        self.assertEqual(replayed, live)


if __name__ == "__main__":
    unittest.main()
