#!/usr/bin/python3
"""A Kubernetes API server emulator for tests (no real API server can run here).

It speaks the core/v1 REST API the way the apiserver does, in the wire format of the fixtures in
shared/data/k8s/: PodList/NodeList with metadata.resourceVersion, watches as chunked
newline-delimited {"type","object"} frames (ADDED, MODIFIED, DELETED, BOOKMARK, ERROR), Status
objects for errors (404, 409, 410 Expired, 422), and the discovery documents kubectl reads first,
so the real `kubectl --server=http://127.0.0.1:PORT get pods -w` works against it. A pod's labels
and annotations can be changed with PATCH (a JSON merge patch, or a strategic merge patch, which
for these string maps merges the same way), as `kubectl label` does; other pod fields are refused
as the apiserver refuses them (422).

Pods really run: a created pod is scheduled on a Ready, untainted node that matches its
nodeSelector and required node affinity (one pod per node), and its container's command + args run
as a local process with its env (secretKeyRef values resolved from Secrets). The exit status becomes
containerStatuses[0].state.terminated (Completed / Error, exitCode, and the termination message:
the file at terminationMessagePath, or with FallbackToLogsOnError the log's tail) and the pod phase.
This machine has no mount namespaces to give a pod, so its volumes are directories here: a
persistentVolumeClaim's lives as long as the emulator (a new pod on the claim sees what the last one
wrote), configMap and secret volumes hold their keys as files, an emptyDir is the pod's own; /dev/shm
stays this machine's shared memory. A mountPath (and the terminationMessagePath) in the container's
command, args, env values and workingDir is rewritten to its directory. A pod whose claim or
ConfigMap does not exist is not scheduled (as the kubelet cannot mount it). In place of the service
account volume a kubelet mounts at a fixed path, every pod gets KUBECONFIG, a kubeconfig for this
emulator.

Every other kind (ConfigMaps, Services, Events, PVCs, RBAC, Jobs, CustomResourceDefinitions and the
custom resources they define, with their schema, status subresource, printer columns and
ownerReferences garbage collection) is tests/emulators/kube/kube_objects.py's; /openapi/v3 says the
server validates fields itself, so the real `kubectl apply` sends fieldValidation=Strict.

Faults for tests, on /_emulator/ (not part of the Kubernetes API):
  POST /_emulator/oom {"pod"}            killed for memory: terminated reason OOMKilled, exitCode 1
                                          and the message of the fixture ih-oomkilled-unhealthy.yaml
  POST /_emulator/node-down {"node" or "nodes": [...], "form": "unknown"|"false"}
                                          the node's conditions and taints become those of
                                          node-not-ready-unknown.json / node-ready-false.json; its
                                          processes die, its pods still read Running (as they do
                                          until the 300 s toleration runs out)
  POST /_emulator/pause-watches {}        open watches hold back their events (a slow or stuck stream)
  POST /_emulator/cut-watches {}          every open watch is cut in the middle of its next frame
  POST /_emulator/compact {"in_stream"}   history is dropped: a watch from any version a client holds
                                          gets 410 Expired (HTTP status, or with in_stream an ERROR
                                          frame in a 200 stream)
  POST /_emulator/faults {"count", "code", "method", "path", "retry_after"}
                                          the next `count` matching requests get a 429 or 5xx Status
  GET  /_emulator/requests                every API request seen
  GET  /_emulator/request-counts          how many, by method, and how many got a fault's answer
Images whose name contains "does-not-exist" never pull (ErrImagePull, then ImagePullBackOff).
With --cheap-pods a pod runs no process (it stays Running until deleted or its node goes down):
`goodput bench kube` stands its simulated agents in for thousands of pods.
"""

import argparse
import base64
import copy
import json
import os
import re
import shutil
import signal
import ssl
import threading
import time
import urllib.parse
import uuid
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import harness  # noqa: E402  (the emulators' shared server, processes and loops)
import kube_objects as ko  # noqa: E402  (every kind beyond pods, nodes and secrets)
from kube_objects import now_rfc3339, status  # noqa: E402


class Cluster:
    def __init__(self, fixtures, state_dir, nodes, cheap_pods=False):
        def load(name):
            with open(os.path.join(fixtures, name)) as f:
                return yaml.safe_load(f) if name.endswith(".yaml") else json.load(f)

        self.fx_not_ready = load("node-not-ready-unknown.json")
        self.fx_ready_false = load("node-ready-false.json")
        self.fx_expired = load("status-410-expired-watch.json")
        oom = load("ih-oomkilled-unhealthy.yaml")["status"]["containerStatuses"][0]["lastState"]["terminated"]
        self.fx_oom = {k: oom[k] for k in ("reason", "exitCode", "message")}
        pull = load("ih-pod-imagepullbackoff.yaml")["status"]["containerStatuses"][0]["state"]["waiting"]
        self.fx_pull_reason = pull["reason"]
        self.state_dir = state_dir
        self.cheap_pods = cheap_pods  # pods run no process (a benchmark's simulated agents stand in)
        self.pod_kubeconfig = os.path.join(state_dir, "pod-kubeconfig")
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.rv = 100
        self.history = []  # (rv, resource, type, object)
        self.oldest = self.rv  # a watch from an rv older than this is Expired
        self.in_stream_410 = False
        self.cut = 0  # watches to cut
        self.paused = False  # open watches hold their events
        self.pods, self.nodes, self.secrets, self.procs = {}, {}, {}, {}
        self.registry = {}  # "group/version/plural" -> ko.Resource
        self.objects = {}   # "group/version/plural" -> {(namespace, name): object}
        for b in ko.BUILTIN:
            self.register(ko.Resource(*b))
        self.registry["/v1/events"].columns = ko.EVENT_COLUMNS
        self.requests = []
        self.faults = []  # {"count", "code", "method", "path", "retry_after"}
        for i in range(nodes):
            name = f"node-{chr(ord('a') + i)}" if i < 26 else f"node-{i}"
            address = f"10.0.1.{10 + i}" if i < 26 else f"10.{1 + i // 65536}.{i // 256 % 256}.{i % 256}"
            self.put("nodes", "ADDED", {
                "kind": "Node", "apiVersion": "v1",
                "metadata": {"name": name, "uid": str(uuid.uuid4()), "labels": {"kubernetes.io/hostname": name},
                             "creationTimestamp": now_rfc3339()},
                "spec": {},
                "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                           "message": "kubelet is posting ready status",
                                           "lastHeartbeatTime": now_rfc3339(), "lastTransitionTime": now_rfc3339()}],
                           "addresses": [{"type": "InternalIP", "address": address}]}})
        harness.every(0.1, self.schedule)

    # ---- the store -------------------------------------------------------------------------------
    def put(self, resource, kind, obj):
        with self.lock:
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            table = self.pods if resource == "pods" else self.nodes if resource == "nodes" else self.objects[resource]
            key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            if kind == "DELETED":
                table.pop(key, None)
            else:
                table[key] = obj
            self.history.append((self.rv, resource, kind, copy.deepcopy(obj)))
            self.changed.notify_all()

    def compact(self, in_stream):
        with self.lock:
            # As an apiserver whose watch cache restarted: every version a client holds is too old;
            # a fresh list gives one that is not.
            self.history = []
            self.rv += 1
            self.oldest = self.rv
            self.in_stream_410 = in_stream

    # ---- every other kind ------------------------------------------------------------------------------
    def register(self, res):
        self.registry[res.key] = res
        self.objects.setdefault(res.key, {})

    def resource(self, group, version, plural):
        res = self.registry.get(ko.key_of(group, version, plural))
        if res is None:  # a short name or a kind, as some clients send
            res = next((r for r in self.registry.values() if r.group == group and r.version == version
                        and plural in r.short), None)
        return res

    def create(self, res, ns, body, validation, dry=False):
        if not isinstance(body, dict) or body.get("kind", res.kind) != res.kind:
            return 400, ko.status(400, "BadRequest", f"the body must be a {res.kind}"), []
        meta = body.get("metadata") or {}
        if not (meta.get("name") or meta.get("generateName")):
            return 422, ko.status(422, "Invalid", f"{res.kind} is invalid: metadata.name: Required value: name or "
                                                  f"generateName is required"), []
        code, obj, warnings = ko.check_object(res, body, validation)
        if code:
            return code, obj, []
        with self.lock:
            obj = copy.deepcopy(obj)
            obj["apiVersion"], obj["kind"] = res.api_version, res.kind
            obj["metadata"] = ko.new_metadata(meta, ns, res.namespaced)
            key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            if key in self.objects[res.key]:
                return 409, ko.status(409, "AlreadyExists", f'{res.plural}.{res.group or "core"} "{key[1]}" already '
                                                            f'exists', {"name": key[1], "group": res.group,
                                                                        "kind": res.plural}), []
            if res.status_subresource:
                obj.pop("status", None)
            if dry:  # dryRun=All: checked and answered, not stored
                return 201, obj, warnings
            if res.kind == "CustomResourceDefinition":
                obj = ko.established(obj)
                for r in ko.resources_of_crd(obj):
                    self.register(r)
            self.put(res.key, "ADDED", obj)
            return 201, obj, warnings

    def write(self, res, ns, name, body, validation, subresource, merge=False, dry=False):
        """PUT (merge=False: body replaces) or PATCH (a JSON merge patch) of an object or its status."""
        with self.lock:
            old = self.objects[res.key].get((ns or "", name))
            if old is None:
                return 404, self.not_found(res, name), []
            if not isinstance(body, dict):
                return 400, ko.status(400, "BadRequest", "the body must be a JSON object"), []
            rv = (body.get("metadata") or {}).get("resourceVersion")
            if not merge and rv not in (None, old["metadata"]["resourceVersion"]):
                return 409, ko.status(409, "Conflict", f'Operation cannot be fulfilled on {res.plural}.{res.group} '
                                                       f'"{name}": the object has been modified; please apply your '
                                                       f'changes to the latest version and try again'), []
            new = ko.merge_patch(old, body) if merge else copy.deepcopy(body)
            code, new, warnings = ko.check_object(res, new, validation)
            if code:
                return code, new, []
            new = copy.deepcopy(new)
            meta = dict(old["metadata"])
            if subresource != "status":  # labels, annotations, owners and finalizers may change; the rest is the server's
                for k in ("labels", "annotations", "ownerReferences", "finalizers"):
                    if k in (new.get("metadata") or {}):
                        meta[k] = new["metadata"][k]
                    else:
                        meta.pop(k, None)
            new["metadata"], new["apiVersion"], new["kind"] = meta, res.api_version, res.kind
            if res.status_subresource and subresource == "status":
                new = dict(copy.deepcopy(old), status=new.get("status"))
                if new["status"] is None:
                    new.pop("status")
            elif res.status_subresource:
                new["status"] = copy.deepcopy(old.get("status"))
                if new["status"] is None:
                    new.pop("status")
            if {k: v for k, v in new.items() if k not in ("metadata", "status")} != \
                    {k: v for k, v in old.items() if k not in ("metadata", "status")}:
                new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
            if dry:
                return 200, new, warnings
            self.put(res.key, "MODIFIED", new)
            return 200, new, warnings

    def not_found(self, res, name):
        return ko.status(404, "NotFound", f'{res.plural}{"." + res.group if res.group else ""} "{name}" not found',
                         {"name": name, "group": res.group, "kind": res.plural})

    def delete(self, res, ns, name, dry=False):
        with self.lock:
            obj = self.objects[res.key].get((ns or "", name))
            if obj is None:
                return 404, self.not_found(res, name)
            if dry:
                return 200, copy.deepcopy(obj)
            self.put(res.key, "DELETED", copy.deepcopy(obj))
            if res.kind == "CustomResourceDefinition":  # its kind goes, and every object of it
                for r in ko.resources_of_crd(obj):
                    for (ons, oname) in list(self.objects.get(r.key, {})):
                        self.delete(r, ons, oname)
                    self.registry.pop(r.key, None)
            self.collect(obj["metadata"]["uid"])
            return 200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                         "details": {"name": name, "group": res.group, "kind": res.plural,
                                     "uid": obj["metadata"]["uid"]}}

    def collect(self, uid):
        """The garbage collector: what an object that is gone owned goes too (background cascading)."""
        def owned(o):
            return any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences") or [])
        with self.lock:
            for key, table in list(self.objects.items()):
                for (ns, name), o in list(table.items()):
                    if owned(o) and key in self.registry:
                        self.delete(self.registry[key], ns, name)
            for (ns, name), p in list(self.pods.items()):
                if owned(p):
                    self.delete_pod(ns, name)
            for key, secret in list(self.secrets.items()):
                if owned(secret):
                    del self.secrets[key]

    # ---- pods --------------------------------------------------------------------------------------
    def create_pod(self, ns, body):
        if not isinstance(body, dict) or body.get("kind", "Pod") != "Pod":
            return 400, status(400, "BadRequest", "the body must be a Pod")
        name = (body.get("metadata") or {}).get("name")
        containers = (body.get("spec") or {}).get("containers")
        if not name or not containers:
            return 422, status(422, "Invalid", "Pod is invalid: metadata.name and spec.containers are required")
        with self.lock:
            if (ns, name) in self.pods:
                return 409, status(409, "AlreadyExists", f'pods "{name}" already exists',
                                   {"name": name, "kind": "pods"})
            pod = copy.deepcopy(body)
            pod["apiVersion"], pod["kind"] = "v1", "Pod"
            pod["metadata"].update({"namespace": ns, "uid": str(uuid.uuid4()), "creationTimestamp": now_rfc3339()})
            pod["status"] = {"phase": "Pending", "qosClass": "Burstable"}
            self.put("pods", "ADDED", pod)
            return 201, pod

    def patch_pod(self, ns, name, patch, content_type):
        if content_type.split(";")[0].strip() not in ("application/merge-patch+json",
                                                      "application/strategic-merge-patch+json"):
            return 415, status(415, "UnsupportedMediaType",
                               f"the emulator applies merge patches only, not '{content_type}'")
        if not isinstance(patch, dict):
            return 400, status(400, "BadRequest", "the patch must be a JSON object")
        meta = patch.get("metadata") or {}
        if set(patch) - {"metadata", "kind", "apiVersion"} or not isinstance(meta, dict) or \
                set(meta) - {"labels", "annotations", "name", "namespace", "resourceVersion"}:
            return 422, status(422, "Invalid", f'Pod "{name}" is invalid: spec: Forbidden: pod updates may not '
                                               f'change fields other than labels and annotations here')
        with self.lock:
            pod = self.pods.get((ns, name))
            if pod is None:
                return 404, status(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
            if meta.get("resourceVersion") not in (None, pod["metadata"]["resourceVersion"]):
                return 409, status(409, "Conflict", f'Operation cannot be fulfilled on pods "{name}": the object '
                                                    f'has been modified; please apply your changes to the latest '
                                                    f'version and try again')
            pod = copy.deepcopy(pod)
            for key in ("labels", "annotations"):
                if not isinstance(meta.get(key), (dict, type(None))) or \
                        any(not isinstance(v, (str, type(None))) for v in (meta.get(key) or {}).values()):
                    return 400, status(400, "BadRequest", f"metadata.{key} must map names to strings")
                merged = dict(pod["metadata"].get(key) or {})
                for k, v in (meta.get(key) or {}).items():  # RFC 7386: null removes the key
                    if v is None:
                        merged.pop(k, None)
                    else:
                        merged[k] = v
                if merged:
                    pod["metadata"][key] = merged
                else:
                    pod["metadata"].pop(key, None)
            self.put("pods", "MODIFIED", pod)
            return 200, pod

    def delete_pod(self, ns, name):
        with self.lock:
            pod = self.pods.get((ns, name))
            if pod is None:
                return 404, status(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
            self.kill(ns, name)
            pod = copy.deepcopy(pod)
            pod["metadata"]["deletionTimestamp"] = now_rfc3339()
            self.put("pods", "DELETED", pod)
            self.collect(pod["metadata"]["uid"])
            return 200, pod

    def kill(self, ns, name, sig=signal.SIGKILL):
        proc = self.procs.pop((ns, name), None)
        if proc:
            harness.kill_group(proc, sig)

    @staticmethod
    def usable(node):
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])
        return ready and not any(t.get("effect") in ("NoSchedule", "NoExecute") for t in node["spec"].get("taints", []))

    def busy_nodes(self):
        return {p["spec"].get("nodeName") for p in self.pods.values() if p["status"]["phase"] in ("Pending", "Running")}

    def fits(self, pod, node, ignore_busy=False, busy=None):
        spec = pod["spec"]
        labels = node["metadata"].get("labels", {})
        if not self.usable(node):
            return False
        if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
            return False
        terms = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                 .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or []
        for term in terms[:1]:
            for e in term.get("matchExpressions", []):
                value = labels.get(e["key"])
                if e["operator"] == "NotIn" and value in e["values"]:
                    return False
                if e["operator"] == "In" and value not in e["values"]:
                    return False
        if ignore_busy:
            return True
        return node["metadata"]["name"] not in (self.busy_nodes() if busy is None else busy)

    def schedule(self):
        with self.lock:
            pending = [(key, pod) for key, pod in self.pods.items()
                       if pod["status"]["phase"] == "Pending" and not pod["spec"].get("nodeName")]
            if not pending:
                return
            busy = self.busy_nodes()  # kept up to date as pods are placed (one pod per node)
            free = [n for n in self.nodes.values() if n["metadata"]["name"] not in busy and self.usable(n)]
            for (ns, name), pod in pending:
                image = pod["spec"]["containers"][0].get("image", "")
                if self.unmountable(ns, pod):
                    continue
                node = next((n for n in free if n["metadata"]["name"] not in busy and self.fits(pod, n, busy=busy)), None)
                if node is not None:
                    busy.add(node["metadata"]["name"])
                if node is None:
                    # As the scheduler says it: a PodScheduled=False condition, once.
                    if not any(c["type"] == "PodScheduled" for c in pod["status"].get("conditions", [])):
                        pod = copy.deepcopy(pod)
                        busy = sum(1 for n in self.nodes.values() if self.fits(pod, n, ignore_busy=True))
                        pod["status"]["conditions"] = [{
                            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "lastProbeTime": None, "lastTransitionTime": now_rfc3339(),
                            "message": f"0/{len(self.nodes)} nodes are available: {busy} node(s) already run a pod, "
                                       f"{len(self.nodes) - busy} node(s) were not ready, tainted or did not match "
                                       f"the pod's node selector or affinity. preemption: 0/{len(self.nodes)} nodes "
                                       f"are available: {len(self.nodes)} Preemption is not helpful for scheduling."}]
                        self.put("pods", "MODIFIED", pod)
                    continue
                pod = copy.deepcopy(pod)
                pod["spec"]["nodeName"] = node["metadata"]["name"]
                pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True", "lastProbeTime": None,
                                                "lastTransitionTime": now_rfc3339()}]
                pod["status"]["hostIP"] = node["status"]["addresses"][0]["address"]
                c = pod["spec"]["containers"][0]
                if "does-not-exist" in image:
                    pod["status"]["containerStatuses"] = [{"name": c["name"], "image": image, "ready": False,
                                                           "restartCount": 0, "started": False, "state": {"waiting": {
                                                               "reason": "ErrImagePull",
                                                               "message": f'rpc error: code = NotFound desc = failed to pull and unpack image "{image}": not found'}}}]
                    self.put("pods", "MODIFIED", pod)
                    threading.Timer(0.5, self.back_off, [ns, name]).start()
                    continue
                self.start(ns, pod)

    def unmountable(self, ns, pod):
        """A volume the pod cannot get (its claim or ConfigMap is missing): it waits, said once."""
        missing = None
        for v in pod["spec"].get("volumes") or []:
            if "persistentVolumeClaim" in v and (ns, v["persistentVolumeClaim"].get("claimName")) not in \
                    self.objects.get(ko.key_of("", "v1", "persistentvolumeclaims"), {}):
                missing = f'persistentvolumeclaim "{v["persistentVolumeClaim"].get("claimName")}" not found'
            elif "configMap" in v and not v["configMap"].get("optional") and (ns, v["configMap"].get("name")) not in \
                    self.objects.get(ko.key_of("", "v1", "configmaps"), {}):
                missing = f'configmap "{v["configMap"].get("name")}" not found'
        if missing and not any(c["type"] == "PodScheduled" for c in pod["status"].get("conditions", [])):
            pod = copy.deepcopy(pod)
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                            "lastProbeTime": None, "lastTransitionTime": now_rfc3339(),
                                            "message": f"0/{len(self.nodes)} nodes are available: {missing}."}]
            self.put("pods", "MODIFIED", pod)
        return missing is not None

    def mounts(self, ns, pod):
        """The container's volumes as directories here: {mountPath: directory}, the termination
        message's path included (as a file)."""
        c = pod["spec"]["containers"][0]
        name = pod["metadata"]["name"]
        volumes = {v.get("name"): v for v in pod["spec"].get("volumes") or []}
        out = {}
        for m in c.get("volumeMounts") or []:
            path, v = m.get("mountPath", "").rstrip("/"), volumes.get(m.get("name"))
            if v is None or not path or path == "/dev/shm":
                continue
            if "persistentVolumeClaim" in v:
                host = os.path.join(self.state_dir, "claims", ns, v["persistentVolumeClaim"]["claimName"])
            else:
                host = os.path.join(self.state_dir, name, "volumes", v["name"])
                shutil.rmtree(host, ignore_errors=True)
            os.makedirs(host, exist_ok=True)
            files = {}
            if "configMap" in v:
                cm = self.objects[ko.key_of("", "v1", "configmaps")].get((ns, v["configMap"].get("name"))) or {}
                files = {k: val.encode() for k, val in (cm.get("data") or {}).items()}
            elif "secret" in v:
                secret = self.secrets.get((ns, v["secret"].get("secretName"))) or {}
                files = {k: base64.b64decode(val) for k, val in (secret.get("data") or {}).items()}
            for key, data in files.items():
                with open(os.path.join(host, key), "wb") as f:
                    f.write(data)
            out[path] = host
        log = os.path.join(self.state_dir, name, "termination-log")
        if os.path.exists(log):
            os.unlink(log)
        out[c.get("terminationMessagePath", "/dev/termination-log")] = log
        return out

    @staticmethod
    def rewrite(text, mounts):
        for path in sorted(mounts, key=len, reverse=True):
            text = re.sub(r"(?<![\w./-])" + re.escape(path) + r"(?=/|$|[\s'\";:])", lambda _: mounts[path], text)
        return text

    def termination_message(self, pod, code):
        c = pod["spec"]["containers"][0]
        name = pod["metadata"]["name"]
        try:
            with open(os.path.join(self.state_dir, name, "termination-log"), "rb") as f:
                msg = f.read(4096).decode(errors="replace")
        except OSError:
            msg = ""
        if not msg.strip() and code != 0 and c.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            try:
                with open(os.path.join(self.state_dir, name, "container.log"), "rb") as f:
                    msg = b"\n".join(f.read().splitlines()[-80:])[-2048:].decode(errors="replace")
            except OSError:
                msg = ""
        return msg

    def back_off(self, ns, name):
        with self.lock:
            pod = self.pods.get((ns, name))
            if pod is None:
                return
            pod = copy.deepcopy(pod)
            image = pod["spec"]["containers"][0]["image"]
            pod["status"]["containerStatuses"][0]["state"] = {
                "waiting": {"reason": self.fx_pull_reason, "message": f'Back-off pulling image "{image}"'}}
            self.put("pods", "MODIFIED", pod)

    def start(self, ns, pod):
        c = pod["spec"]["containers"][0]
        env = dict(os.environ)
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = e["value"]
            elif "secretKeyRef" in e.get("valueFrom", {}):
                ref = e["valueFrom"]["secretKeyRef"]
                env[e["name"]] = base64.b64decode(self.secrets[(ns, ref["name"])]["data"][ref["key"]]).decode()
            elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "status.podIP":
                env[e["name"]] = "127.0.0.1"  # every emulated pod really runs on this machine
        mounts = self.mounts(ns, pod)
        declared = {e["name"] for e in c.get("env", [])}  # the container's own: the ones that may name a mountPath
        env = {k: self.rewrite(v, mounts) if k in declared else v for k, v in env.items()}
        env["KUBECONFIG"] = self.pod_kubeconfig
        # The kubelet expands $(VAR) in command and args from the container's environment.
        argv = [self.rewrite(re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), a), mounts)
                for a in list(c.get("command", [])) + list(c.get("args", []))]
        env["POD_NAME"] = pod["metadata"]["name"]
        name = pod["metadata"]["name"]
        workdir = os.path.join(self.state_dir, name)
        if c.get("workingDir") and os.path.isdir(self.rewrite(c["workingDir"], mounts)):
            workdir = self.rewrite(c["workingDir"], mounts)
        if not self.cheap_pods:
            with self.lock:  # re-entrant: its end is written only once it is known as this pod's process
                proc = harness.spawn(argv, workdir, env, os.path.join(workdir, "container.log"),
                                     lambda p, rc: self.exited(ns, name, p, rc))
                self.procs[(ns, name)] = proc
        pod["status"].update({"phase": "Running", "startTime": now_rfc3339(), "podIP": pod["status"]["hostIP"]})
        pod["status"]["containerStatuses"] = [{"name": c["name"], "image": c.get("image", ""), "ready": True,
                                               "restartCount": 0, "started": True,
                                               "state": {"running": {"startedAt": now_rfc3339()}}}]
        self.put("pods", "MODIFIED", pod)

    def exited(self, ns, name, proc, rc):
        with self.lock:
            pod = self.pods.get((ns, name))
            if pod is None or self.procs.get((ns, name)) is not proc:
                return  # deleted, or its end was already written (OOM, node down)
            self.procs.pop((ns, name), None)
            code = rc if rc >= 0 else 128 - rc
            terminated = {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}
            message = self.termination_message(pod, code)
            if message.strip():
                terminated["message"] = message
            self.terminate(pod, terminated, "Succeeded" if code == 0 else "Failed")

    def terminate(self, pod, terminated, phase):
        pod = copy.deepcopy(pod)
        cs = pod["status"]["containerStatuses"][0]
        started = cs["state"].get("running", {}).get("startedAt", now_rfc3339())
        cs["state"] = {"terminated": dict(terminated, startedAt=started, finishedAt=now_rfc3339(),
                                          containerID="containerd://" + uuid.uuid4().hex)}
        cs["ready"] = False
        pod["status"]["phase"] = phase
        self.put("pods", "MODIFIED", pod)

    # ---- faults --------------------------------------------------------------------------------------
    def oom(self, ns, name):
        with self.lock:
            pod = self.pods.get((ns, name))
            if pod is None or pod["status"]["phase"] != "Running":
                return False
            self.kill(ns, name)
            self.terminate(pod, self.fx_oom, "Failed")
            return True

    def node_down(self, name, form):
        with self.lock:
            node = self.nodes.get(("", name))
            if node is None:
                return False
            node = copy.deepcopy(node)
            if form == "unknown":  # the node lifecycle controller's view: conditions Unknown, tainted unreachable
                node["status"]["conditions"] = copy.deepcopy(self.fx_not_ready["status"]["conditions"])
                node["spec"]["taints"] = copy.deepcopy(self.fx_not_ready["spec"]["taints"])
            else:  # the kubelet's own Ready=False condition
                node["status"]["conditions"] = [copy.deepcopy(self.fx_ready_false)]
            self.put("nodes", "MODIFIED", node)
            for (ns, pname) in list(self.procs):
                if self.pods.get((ns, pname), {}).get("spec", {}).get("nodeName") == name:
                    self.kill(ns, pname)  # the machine is gone; the API still says Running
            return True


class Handler(harness.Handler):
    cluster = None

    def route(self, method):
        c = self.cluster
        url = urllib.parse.urlsplit(self.path)
        q = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        raw = self.body()
        body = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                return self.reply(400, status(400, "BadRequest", "the body is not JSON"))
        parts = [p for p in url.path.split("/") if p]
        if parts[:1] == ["_emulator"]:
            return self.control(method, parts[1] if len(parts) > 1 else "", body or {})
        with c.lock:
            c.requests.append({"method": method, "path": url.path, "query": q, "body": body,
                               "content_type": self.headers.get("Content-Type"),
                               "authorization": self.headers.get("Authorization"), "time": time.time()})
            fault = next((f for f in c.faults if f["count"] > 0 and f.get("method", method) == method
                          and url.path.startswith(f.get("path", "/api/"))), None)
            if fault:
                fault["count"] -= 1
                c.requests[-1]["fault"] = int(fault["code"])  # what it was answered
        if fault:
            code = int(fault["code"])
            data = json.dumps(status(code, "TooManyRequests" if code == 429 else "InternalError",
                                     "emulated: " + ("too many requests" if code == 429 else "internal error"))).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            if "retry_after" in fault:
                self.send_header("Retry-After", str(fault["retry_after"]))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if url.path == "/api":
            return self.reply(200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": self.headers.get("Host", "127.0.0.1")}]})
        if url.path == "/apis":
            with c.lock:
                groups = {}
                for r in c.registry.values():
                    if r.group:
                        groups.setdefault(r.group, []).append(r.version)
            return self.reply(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v} for v in sorted(set(vs))],
                 "preferredVersion": {"groupVersion": f"{g}/{sorted(set(vs))[0]}", "version": sorted(set(vs))[0]}}
                for g, vs in sorted(groups.items())]})
        if url.path == "/openapi/v3" or url.path.startswith("/openapi/v3/"):
            with c.lock:
                core = [ko.Resource("", "v1", "pods", "Pod", True), ko.Resource("", "v1", "nodes", "Node", False),
                        ko.Resource("", "v1", "secrets", "Secret", True),
                        ko.Resource("", "v1", "namespaces", "Namespace", False, ["ns"])]
                resources = core + list(c.registry.values())
            if url.path == "/openapi/v3":
                return self.reply(200, ko.openapi_index(resources))
            doc = ko.openapi_document(url.path[len("/openapi/v3/"):], resources)
            if not doc["paths"]:
                return self.reply(404, status(404, "NotFound", "the server could not find the requested resource"))
            return self.reply(200, doc)
        if url.path == "/version":
            return self.reply(200, {"major": "1", "minor": "30", "gitVersion": "v1.30.0-goodput-emulator",
                                    "platform": "linux/amd64"})
        if url.path == "/api/v1":
            def res(name, kind, namespaced, verbs):
                return {"name": name, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind,
                        "verbs": verbs, "shortNames": {"pods": ["po"], "nodes": ["no"]}.get(name, [])}
            with c.lock:
                more = [d for r in c.registry.values() if r.group == "" for d in r.discovery()]
            return self.reply(200, {"kind": "APIResourceList", "groupVersion": "v1", "resources": [
                res("pods", "Pod", True, ["create", "delete", "get", "list", "patch", "watch"]),
                res("nodes", "Node", False, ["get", "list", "watch"]),
                res("secrets", "Secret", True, ["create", "delete", "get", "list"]),
                res("namespaces", "Namespace", False, ["get"])] + more})
        if parts[:1] == ["apis"] and len(parts) >= 3:
            group, version = parts[1], parts[2]
            with c.lock:
                served = [r for r in c.registry.values() if r.group == group and r.version == version]
            if len(parts) == 3:
                if not served:
                    return self.reply(404, status(404, "NotFound", "the server could not find the requested resource"))
                return self.reply(200, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{group}/{version}",
                                        "resources": [d for r in served for d in r.discovery()]})
            return self.generic(method, group, version, parts[3:], q, body)
        if parts[:2] == ["api", "v1"] and len(parts) >= 3:
            rest = parts[2:]
            plural = rest[2] if rest[:1] == ["namespaces"] and len(rest) >= 3 else rest[0]
            with c.lock:
                known = ko.key_of("", "v1", plural) in c.registry
            if known:
                return self.generic(method, "", "v1", rest, q, body)
        # /api/v1/namespaces/{ns}/{resource}[/{name}] and /api/v1/{nodes,pods}[/{name}]
        if parts[:2] != ["api", "v1"]:
            return self.reply(404, status(404, "NotFound", "the server could not find the requested resource"))
        rest = parts[2:]
        ns = None
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            ns, rest = rest[1], rest[2:]
        resource, name = rest[0] if rest else "", rest[1] if len(rest) > 1 else None
        if resource == "namespaces" and name and method == "GET":  # every namespace exists
            return self.reply(200, {"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": name},
                                    "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}})
        if resource == "secrets" and ns and method == "POST":
            with c.lock:
                key = (ns, body["metadata"]["name"])
                if key in c.secrets:
                    return self.reply(409, status(409, "AlreadyExists", f'secrets "{key[1]}" already exists'))
                c.secrets[key] = body
            return self.reply(201, body)
        if resource == "secrets" and ns and method == "GET" and name is None:
            with c.lock:
                items = [copy.deepcopy(s) for (n, _), s in sorted(c.secrets.items()) if n == ns]
            return self.reply(200, {"kind": "SecretList", "apiVersion": "v1",
                                    "metadata": {"resourceVersion": str(c.rv)}, "items": items})
        if resource == "secrets" and ns and name and method in ("GET", "DELETE"):
            with c.lock:
                secret = c.secrets.get((ns, name))
                if secret is not None and method == "DELETE":
                    del c.secrets[(ns, name)]
            if secret is None:
                return self.reply(404, status(404, "NotFound", f'secrets "{name}" not found',
                                              {"name": name, "kind": "secrets"}))
            if method == "GET":
                return self.reply(200, secret)
            # A Secret has no graceful deletion: the API answers with a Status, not the object.
            return self.reply(200, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                                    "details": {"name": name, "kind": "secrets"}})
        if resource not in ("pods", "nodes"):
            return self.reply(404, status(404, "NotFound", "the server could not find the requested resource"))
        if method == "GET" and name is None and q.get("watch") in ("true", "1"):
            return self.watch(resource, ns, q)
        if method == "GET" and name is None:
            return self.reply(200, self.list(resource, ns, q))
        if method == "GET":
            with c.lock:
                obj = (c.pods if resource == "pods" else c.nodes).get((ns or "", name))
            if obj is None:
                return self.reply(404, status(404, "NotFound", f'{resource} "{name}" not found',
                                              {"name": name, "kind": resource}))
            return self.reply(200, obj)
        if resource == "pods" and method == "POST" and name is None and ns:
            return self.reply(*c.create_pod(ns, body))
        if resource == "pods" and method == "PATCH" and name and ns:
            return self.reply(*c.patch_pod(ns, name, body, self.headers.get("Content-Type", "")))
        if resource == "pods" and method == "DELETE" and name and ns:
            return self.reply(*c.delete_pod(ns, name))
        return self.reply(405, status(405, "MethodNotAllowed", f"{method} is not supported here"))

    def wants_table(self):
        return "as=Table" in (self.headers.get("Accept") or "")

    def reply_warned(self, code, body, warnings):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        for w in warnings:  # as the apiserver warns: RFC 7234 warn-code 299, agent "-"
            self.send_header("Warning", '299 - "' + w.replace('"', '\\"') + '"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def generic(self, method, group, version, rest, q, body):
        """[namespaces/{ns}/]{plural}[/{name}[/status]] of any registered kind."""
        c = self.cluster
        ns = None
        if rest[:1] == ["namespaces"] and len(rest) >= 3:
            ns, rest = rest[1], rest[2:]
        plural, name = rest[0], rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else None
        with c.lock:
            res = c.resource(group, version, plural)
        if res is None or (sub not in (None, "status")) or (sub == "status" and not res.status_subresource):
            return self.reply(404, status(404, "NotFound", "the server could not find the requested resource"))
        if res.namespaced and name and not ns and method != "GET":
            return self.reply(404, status(404, "NotFound", "the server could not find the requested resource"))
        if not res.namespaced:
            ns = None
        dry = q.get("dryRun") == "All"
        validation = q.get("fieldValidation", "Warn")
        if validation not in ("Strict", "Warn", "Ignore"):
            return self.reply(400, status(400, "BadRequest", f'fieldValidation must be Strict, Warn or Ignore, not '
                                                             f'"{validation}"'))
        if method == "GET" and name is None and q.get("watch") in ("true", "1"):
            return self.watch(res.key, ns, q)
        if method == "GET" and name is None:
            lst = self.list(res.key, ns, q)
            if self.wants_table():
                return self.reply(200, ko.table(res, lst["items"], lst["metadata"]["resourceVersion"]))
            return self.reply(200, lst)
        if method == "GET":
            with c.lock:
                obj = copy.deepcopy(c.objects[res.key].get((ns or "", name)))
            if obj is None:
                return self.reply(404, c.not_found(res, name))
            if self.wants_table():
                return self.reply(200, ko.table(res, [obj], obj["metadata"]["resourceVersion"]))
            return self.reply(200, obj)
        if method == "POST" and name is None and (ns or not res.namespaced):
            code, obj, warnings = c.create(res, ns or "", body, validation, dry)
            return self.reply_warned(code, obj, warnings)
        if method == "PUT" and name:
            code, obj, warnings = c.write(res, ns, name, body, validation, sub, dry=dry)
            return self.reply_warned(code, obj, warnings)
        if method == "PATCH" and name:
            ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
            if ctype not in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                return self.reply(415, status(415, "UnsupportedMediaType",
                                              f"the emulator applies merge patches only, not '{ctype}'"))
            if ctype == "application/strategic-merge-patch+json" and res.crd:
                return self.reply(415, status(415, "UnsupportedMediaType", "the body of the request was in an unknown "
                                              "format - accepted media types include: application/json-patch+json, "
                                              "application/merge-patch+json, application/apply-patch+yaml"))
            code, obj, warnings = c.write(res, ns, name, body, validation, sub, merge=True, dry=dry)
            return self.reply_warned(code, obj, warnings)
        if method == "DELETE" and name and sub is None:
            return self.reply(*c.delete(res, ns, name, dry))
        return self.reply(405, status(405, "MethodNotAllowed", f"{method} is not supported here"))

    @staticmethod
    def selected(obj, ns, selector):
        if ns and obj["metadata"].get("namespace") != ns:
            return False
        labels = obj["metadata"].get("labels", {})
        for term in filter(None, (selector or "").split(",")):
            k, _, v = term.partition("=")
            if labels.get(k) != v:
                return False
        return True

    def list(self, resource, ns, q):
        c = self.cluster
        with c.lock:
            table = c.pods if resource == "pods" else c.nodes if resource == "nodes" else c.objects[resource]
            rows = sorted(table.items()) if table is c.objects.get(resource) else table.items()  # etcd's key order
            items = [copy.deepcopy(o) for _, o in rows if self.selected(o, ns, q.get("labelSelector"))]
            res = c.registry.get(resource)
            kind = "PodList" if resource == "pods" else "NodeList" if resource == "nodes" else res.kind + "List"
            return {"kind": kind, "apiVersion": res.api_version if res else "v1",
                    "metadata": {"resourceVersion": str(c.rv)}, "items": items}

    def watch(self, resource, ns, q):
        c = self.cluster
        rv = int(q.get("resourceVersion") or 0)
        timeout = float(q.get("timeoutSeconds") or 1800)
        bookmarks = q.get("allowWatchBookmarks") == "true"
        with c.lock:
            expired = rv != 0 and rv < c.oldest
            in_stream = c.in_stream_410
        if expired and not in_stream:
            return self.reply(410, c.fx_expired)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def chunk(data):
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        res = c.registry.get(resource)
        as_table = res is not None and self.wants_table()

        def frame(kind, obj):
            if as_table and kind != "BOOKMARK" and kind != "ERROR":  # a table of one row, as the apiserver sends
                obj = ko.table(res, [obj], obj["metadata"]["resourceVersion"])
            return (json.dumps({"type": kind, "object": obj}) + "\n").encode()

        try:
            if expired:
                chunk(frame("ERROR", c.fx_expired))
                chunk(b"")
                return
            sent = rv
            if rv == 0:  # no version: the current state first, as ADDED
                with c.lock:
                    lst = self.list(resource, ns, q)
                    sent = int(lst["metadata"]["resourceVersion"])
                for obj in lst["items"]:
                    chunk(frame("ADDED", obj))
            deadline = time.time() + timeout
            cut_seen = None
            with c.lock:
                cut_seen = c.cut
            last_bookmark = time.time()
            while time.time() < deadline:
                with c.lock:
                    pending = [h for h in c.history if h[0] > sent]
                    if not pending or c.paused:
                        c.changed.wait(timeout=0.2)
                        pending = [h for h in c.history if h[0] > sent]
                    cut = c.cut != cut_seen
                    if c.paused and not cut:
                        continue
                for hrv, of, kind, obj in pending:
                    sent = hrv
                    if of != resource or not self.selected(obj, ns, q.get("labelSelector")):
                        continue
                    data = frame(kind, obj)
                    if cut:  # half a frame, then the connection drops
                        chunk(data[:len(data) // 2])
                        self.close_connection = True
                        return
                    chunk(data)
                if cut:
                    self.close_connection = True
                    return
                if bookmarks and time.time() - last_bookmark > 1.0:
                    last_bookmark = time.time()
                    with c.lock:
                        sent = max(sent, c.rv)
                    chunk(frame("BOOKMARK", {"kind": "Pod" if resource == "pods" else "Node" if resource == "nodes"
                                             else res.kind, "apiVersion": res.api_version if res else "v1",
                                             "metadata": {"resourceVersion": str(sent)}}))
            chunk(b"")
        except OSError:  # the client went away (a broken pipe, a reset, a TLS close without notify)
            self.close_connection = True

    def control(self, method, what, body):
        c = self.cluster
        if method == "GET" and what == "requests":
            with c.lock:
                return self.reply(200, c.requests)
        if method == "GET" and what == "request-counts":  # requests by method, and the faults answered
            with c.lock:
                counts = {"faults": sum(1 for r in c.requests if "fault" in r)}
                for r in c.requests:
                    counts[r["method"]] = counts.get(r["method"], 0) + 1
                return self.reply(200, counts)
        if method == "POST" and what == "oom":
            return self.reply(200 if c.oom(body.get("namespace", "default"), body["pod"]) else 404, {"ok": True})
        if method == "POST" and what == "node-down":
            names = body["nodes"] if "nodes" in body else [body["node"]]  # a zone: many at once
            found = [c.node_down(n, body.get("form", "unknown")) for n in names]
            return self.reply(200 if all(found) else 404, {"ok": True})
        if method == "POST" and what == "faults":
            with c.lock:
                c.faults.append(body)
            return self.reply(200, {"ok": True})
        if method == "POST" and what == "pause-watches":
            with c.lock:
                c.paused = True
            return self.reply(200, {"ok": True})
        if method == "POST" and what == "cut-watches":
            with c.lock:
                c.cut += 1
                c.paused = False
                c.changed.notify_all()
            return self.reply(200, {"ok": True})
        if method == "POST" and what == "compact":
            c.compact(bool(body.get("in_stream")))
            return self.reply(200, {"ok": True})
        return self.reply(404, {"error": "no such control"})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixtures", required=True, help="shared/data/k8s")
    ap.add_argument("--state-dir", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--cheap-pods", action="store_true",
                    help="pods run no process: a benchmark's simulated agents stand in for them")
    ap.add_argument("--tls-cert", help="serve HTTPS with this PEM certificate (and --tls-key)")
    ap.add_argument("--tls-key")
    ap.add_argument("--client-ca", help="with --tls-cert: require client certificates this PEM vouches for")
    a = ap.parse_args()
    os.makedirs(a.state_dir, exist_ok=True)
    Handler.cluster = Cluster(a.fixtures, a.state_dir, a.nodes, a.cheap_pods)
    ctx = None
    if a.tls_cert:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(a.tls_cert, a.tls_key)
        if a.client_ca:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(a.client_ca)

    def stop():
        with Handler.cluster.lock:
            for (ns, name) in list(Handler.cluster.procs):
                Handler.cluster.kill(ns, name)

    def kubeconfig_for_pods(url):
        with open(Handler.cluster.pod_kubeconfig, "w") as f:
            f.write(f"apiVersion: v1\nkind: Config\nclusters:\n- name: emulator\n  cluster:\n    server: {url}\n"
                    f"    insecure-skip-tls-verify: {'true' if ctx else 'false'}\nusers:\n- name: pod\n  user:\n"
                    f"    token: pod-service-account\ncontexts:\n- name: emulator\n  context:\n    cluster: emulator\n"
                    f"    user: pod\n    namespace: default\ncurrent-context: emulator\n")

    harness.serve(Handler, a.port, stop, ctx, kubeconfig_for_pods)


if __name__ == "__main__":
    main()
