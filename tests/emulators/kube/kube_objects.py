"""The Kubernetes emulator's generic API objects: every kind beyond pods, nodes and secrets.

What the apiserver does for them, in its wire format (checked against the Kubernetes API reference):
  - a registry of resources (group, version, plural, kind, scope, short names) for discovery
    (/api/v1, /apis, /apis/{group}/{version}), to which a CustomResourceDefinition adds its kind
    once created (status Established and NamesAccepted, as the apiextensions controller sets them);
  - create / get / list / watch / update (PUT) / patch (JSON merge patch) / delete, with
    resourceVersion, uid, creationTimestamp and generation (bumped when the spec changes);
  - custom resources checked against their version's openAPIV3Schema (types, required, enum,
    bounds, lengths, int-or-string, preserve-unknown-fields), unknown fields handled as the
    request's fieldValidation says (Strict: 400 "strict decoding error", Warn: pruned with a
    Warning header, Ignore: pruned);
  - the status subresource: writes to the object leave its status alone, writes to /status change
    only the status;
  - server-side tables (Accept: ...;as=Table;g=meta.k8s.io;v=v1) with a CRD's
    additionalPrinterColumns, dates shown as ages, as kubectl get prints them;
  - garbage collection: deleting an object deletes what names it in metadata.ownerReferences
    (background cascading, transitively, pods included).
Kinds that a controller runs in a real cluster (Job, Deployment, Service...) are stored, not run.
"""

import copy
import json
import re
import uuid
from datetime import datetime, timezone

BUILTIN = [  # group, version, plural, kind, namespaced, short names
    ("", "v1", "configmaps", "ConfigMap", True, ["cm"]),
    ("", "v1", "services", "Service", True, ["svc"]),
    ("", "v1", "events", "Event", True, ["ev"]),
    ("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True, ["pvc"]),
    ("", "v1", "serviceaccounts", "ServiceAccount", True, ["sa"]),
    ("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False, ["crd", "crds"]),
    ("rbac.authorization.k8s.io", "v1", "roles", "Role", True, []),
    ("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True, []),
    ("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False, []),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False, []),
    ("batch", "v1", "jobs", "Job", True, []),
    ("apps", "v1", "deployments", "Deployment", True, ["deploy"]),
]


def now_rfc3339():
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(code, reason, message, details=None):
    s = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
         "reason": reason, "code": code}
    if details:
        s["details"] = details
    return s


def key_of(group, version, plural):
    return f"{group}/{version}/{plural}"


class Resource:
    def __init__(self, group, version, plural, kind, namespaced, short=(), singular=None, crd=None):
        self.group, self.version, self.plural, self.kind = group, version, plural, kind
        self.namespaced, self.short = namespaced, list(short)
        self.singular = singular or kind.lower()
        self.key = key_of(group, version, plural)
        self.schema, self.columns, self.status_subresource, self.crd = None, [], False, crd

    @property
    def api_version(self):
        return f"{self.group}/{self.version}" if self.group else self.version

    def discovery(self):
        verbs = ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
        out = [{"name": self.plural, "singularName": self.singular, "namespaced": self.namespaced, "kind": self.kind,
                "verbs": verbs, "shortNames": self.short}]
        if self.crd:
            out[0]["categories"] = self.crd["spec"]["names"].get("categories", [])
        if self.status_subresource:
            out.append({"name": self.plural + "/status", "singularName": "", "namespaced": self.namespaced,
                        "kind": self.kind, "verbs": ["get", "patch", "update"]})
        return out


# ---- openAPIV3Schema -----------------------------------------------------------------------------
def _type_name(v):
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "integer"
    if isinstance(v, float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return "null"


def validate(schema, value, path, errors, unknown):
    """Checks value against a structural schema; returns the value with unknown fields pruned.
    errors gets apiserver-worded field errors, unknown the paths of fields the schema does not know."""
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, (int, str)) or isinstance(value, bool):
            errors.append(f'{path}: Invalid value: "{_type_name(value)}": {path} in body must be of type '
                          f'integer-or-string: "{_type_name(value)}"')
        return value
    want = schema.get("type")
    got = _type_name(value)
    if want and not (got == want or (want == "number" and got == "integer")):
        errors.append(f'{path}: Invalid value: "{got}": {path} in body must be of type {want}: "{got}"')
        return value
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(json.dumps(e) for e in schema["enum"])
        errors.append(f"{path}: Unsupported value: {json.dumps(value)}: supported values: {supported}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: Invalid value: {value}: {path} in body should be greater than or equal to "
                          f"{schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: Invalid value: {value}: {path} in body should be less than or equal to "
                          f"{schema['maximum']}")
    if isinstance(value, str) and len(value) < schema.get("minLength", 0):
        errors.append(f'{path}: Invalid value: "{value}": {path} in body should be at least '
                      f'{schema["minLength"]} chars long')
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{path}: Invalid value: {len(value)}: {path} in body should have at least "
                          f"{schema['minItems']} items")
        if "items" in schema:
            value = [validate(schema["items"], v, f"{path}[{i}]", errors, unknown) for i, v in enumerate(value)]
    if isinstance(value, dict):
        props = schema.get("properties")
        extra = schema.get("additionalProperties")
        keep = schema.get("x-kubernetes-preserve-unknown-fields")
        for r in schema.get("required", []):
            if r not in value:
                errors.append(f"{path}.{r}: Required value" if path else f"{r}: Required value")
        out = {}
        for k, v in value.items():
            sub = f"{path}.{k}" if path else k
            if props and k in props:
                out[k] = validate(props[k], v, sub, errors, unknown)
            elif isinstance(extra, dict):
                out[k] = validate(extra, v, sub, errors, unknown)
            elif keep or extra is True:
                out[k] = v
            else:
                unknown.append(sub)  # pruned, as a structural schema prunes what it does not declare
        return out
    return value


def check_object(res, obj, validation):
    """A custom resource as the apiserver stores it: (code, Status) on a refusal, else (None, pruned, warnings)."""
    if res.schema is None:
        return None, obj, []
    errors, unknown = [], []
    body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    pruned = validate(res.schema, body, "", errors, unknown)
    name = obj.get("metadata", {}).get("name", "")
    if unknown and validation == "Strict":
        fields = ", ".join(f'unknown field "{u}"' for u in unknown)
        return 400, status(400, "BadRequest", f'{res.kind} in version "{res.version}" cannot be handled as a '
                                               f'{res.kind}: strict decoding error: {fields}'), []
    if errors:
        what = errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
        causes = [{"reason": "FieldValueRequired" if e.endswith("Required value") else "FieldValueInvalid",
                   "message": e.split(": ", 1)[1], "field": e.split(": ", 1)[0]} for e in errors]
        return 422, status(422, "Invalid", f'{res.kind}.{res.group} "{name}" is invalid: {what}',
                           {"name": name, "group": res.group, "kind": res.kind, "causes": causes}), []
    out = dict(pruned, apiVersion=obj.get("apiVersion"), kind=obj.get("kind"), metadata=obj.get("metadata", {}))
    warnings = [f'unknown field "{u}"' for u in unknown] if validation == "Warn" else []
    return None, out, warnings


def merge_patch(target, patch):
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = merge_patch(out.get(k), v)
    return out


# ---- tables --------------------------------------------------------------------------------------
def _age(ts):
    try:
        then = datetime.strptime(ts, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except (TypeError, ValueError):
        return "<unknown>"
    s = int((datetime.now(timezone.utc) - then).total_seconds())
    if s < 120:
        return f"{max(s, 0)}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 172800:
        return f"{s // 3600}h"
    return f"{s // 86400}d"


def json_path(obj, path):
    """A printer column's simple JSONPath: .a.b, .a[0].b."""
    cur = obj
    for part in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path):
        name, index = part
        if name:
            cur = cur.get(name) if isinstance(cur, dict) else None
        else:
            cur = cur[int(index)] if isinstance(cur, list) and int(index) < len(cur) else None
        if cur is None:
            return None
    return cur


def table(res, objects, resource_version):
    columns = res.columns or [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}]
    defs = [{"name": "Name", "type": "string", "format": "name", "description": "the object's name", "priority": 0}]
    defs += [{"name": c["name"], "type": c.get("type", "string"), "format": c.get("format", ""),
              "description": c.get("description", ""), "priority": c.get("priority", 0)} for c in columns]
    rows = []
    for o in objects:
        cells = [o["metadata"]["name"]]
        for c in columns:
            if c["jsonPath"] == "@object":  # an Event's object, as kubectl shows it: kind/name
                io = o.get("involvedObject") or {}
                cells.append(f'{io.get("kind", "").lower()}/{io.get("name", "")}')
                continue
            v = json_path(o, c["jsonPath"])
            cells.append(_age(v) if c.get("type") == "date" and v is not None else v)
        meta = {k: o["metadata"][k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if k in o["metadata"]}
        rows.append({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                                                "metadata": meta}})
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": {"resourceVersion": resource_version},
            "columnDefinitions": defs, "rows": rows}


EVENT_COLUMNS = [{"name": "Last Seen", "type": "date", "jsonPath": ".lastTimestamp"},
                 {"name": "Type", "type": "string", "jsonPath": ".type"},
                 {"name": "Reason", "type": "string", "jsonPath": ".reason"},
                 {"name": "Object", "type": "string", "jsonPath": "@object"},
                 {"name": "Message", "type": "string", "jsonPath": ".message"}]


def resources_of_crd(crd):
    """The resources a CustomResourceDefinition serves, one per served version."""
    spec = crd["spec"]
    names = spec["names"]
    out = []
    for v in spec.get("versions", []):
        if not v.get("served", True):
            continue
        r = Resource(spec["group"], v["name"], names["plural"], names["kind"], spec.get("scope") == "Namespaced",
                     names.get("shortNames", []), names.get("singular"), crd)
        r.schema = (v.get("schema") or {}).get("openAPIV3Schema")
        r.columns = v.get("additionalPrinterColumns", [])
        r.status_subresource = "status" in (v.get("subresources") or {})
        out.append(r)
    return out


def established(crd):
    crd = copy.deepcopy(crd)
    t = now_rfc3339()
    crd["status"] = {
        "acceptedNames": copy.deepcopy(crd["spec"]["names"]),
        "storedVersions": [v["name"] for v in crd["spec"].get("versions", []) if v.get("storage")],
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found",
             "lastTransitionTime": t},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": t}]}
    return crd


def new_metadata(meta, ns, namespaced):
    meta = dict(meta or {})
    if namespaced:
        meta["namespace"] = ns
    else:
        meta.pop("namespace", None)
    if not meta.get("name") and meta.get("generateName"):
        meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
    meta.update({"uid": str(uuid.uuid4()), "creationTimestamp": now_rfc3339(), "generation": 1})
    return meta


# ---- OpenAPI v3 ----------------------------------------------------------------------------------
def openapi_index(resources):
    """/openapi/v3: one document per group-version, as the apiserver lists them."""
    gvs = {"api/v1"} | {f"apis/{r.group}/{r.version}" for r in resources if r.group}
    return {"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={abs(hash(gv)) % 10**16:016d}"}
                      for gv in sorted(gvs)}}


def openapi_document(gv, resources):
    """/openapi/v3/{api/v1 | apis/G/V}: each resource's PATCH operation declares the fieldValidation query
    parameter (how kubectl tells the server validates fields itself), and a custom resource's schema
    is in components with its group-version-kind. Pods, nodes and secrets are there too."""
    group, version = ("", "v1") if gv == "api/v1" else tuple(gv.split("/")[1:3])
    param = {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True},
             "description": "Strict, Warn or Ignore: what the server does with unknown or duplicate fields"}
    paths, schemas = {}, {}
    for r in resources:
        if r.group != group or r.version != version:
            continue
        base = f"/{gv}/namespaces/{{namespace}}/{r.plural}" if r.namespaced else f"/{gv}/{r.plural}"
        gvk = {"group": r.group, "version": r.version, "kind": r.kind}
        op = {"parameters": [param], "x-kubernetes-action": "patch", "x-kubernetes-group-version-kind": gvk,
              "responses": {"200": {"description": "OK"}}}
        paths[base + "/{name}"] = {"patch": op, "put": dict(op, **{"x-kubernetes-action": "put"})}
        paths[base] = {"post": dict(op, **{"x-kubernetes-action": "post"})}
        if r.schema is not None:
            rdns = ".".join(reversed(r.group.split(".")))
            schemas[f"{rdns}.{r.version}.{r.kind}"] = dict(copy.deepcopy(r.schema),
                                                              **{"x-kubernetes-group-version-kind": [gvk]})
    return {"openapi": "3.0.0", "info": {"title": "Kubernetes", "version": "v1.30.0-goodput-emulator"},
            "paths": paths, "components": {"schemas": schemas}}
