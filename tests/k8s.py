"""Shared helpers of the Kubernetes manifest tests (``tests/test_k8s_*.py``), which check
the manifests in workflows/k8s without a cluster: the manifests loaded as ``kubectl
apply`` would apply them (the ConfigMaps kustomize generates, the objects inside a
ConfigMap, the TLS variant tls-patch.yaml makes of the DaskJob), the parts of their Pods,
and the OpenAPI schemas of the CRDs that the installed dask-kubernetes operator ships as
JSON schemas with the API server's semantics (the ``crds`` fixture in conftest.py).
"""

from __future__ import annotations

import importlib.resources
import re
from pathlib import Path

import pytest
import yaml

jsonschema = pytest.importorskip("jsonschema")
jsonpatch = pytest.importorskip("jsonpatch")  # with dask-kubernetes (kopf needs it)
pytest.importorskip("dask_kubernetes")

K8S = Path(__file__).resolve().parents[1] / "workflows" / "k8s"
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
CRD_DIR = ("operator", "deployment", "helm", "dask-kubernetes-operator", "crds")
DASK_KINDS = {"DaskJob", "DaskCluster", "DaskWorkerGroup", "DaskAutoscaler"}
DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
OBJECT_META = {  # the metadata a manifest may set
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 253, "pattern": rf"^{DNS_LABEL}(\.{DNS_LABEL})*$"},
        "generateName": {"type": "string"},
        "namespace": {"type": "string", "maxLength": 63, "pattern": f"^{DNS_LABEL}$"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
    "anyOf": [{"required": ["name"]}, {"required": ["generateName"]}],
}


# -- the manifests -----------------------------------------------------------------------------
def _load_manifests() -> list[tuple[str, dict]]:
    """(where, object) for every document of every YAML file (kustomization.yaml: the
    ConfigMaps it generates), and for every object in a ConfigMap's ``*.yaml`` value."""
    found = []
    for path in sorted(K8S.glob("*.y*ml")):
        if path.name == "tls-patch.yaml":
            continue  # a patch of daskjob.yaml, loaded as the DaskJob it makes (below)
        if path.name == "kustomization.yaml":
            docs = _generated_config_maps(yaml.safe_load(path.read_text()))
        else:
            docs = yaml.safe_load_all(path.read_text())
        for doc in docs:
            if doc is None:
                continue
            where = f"{path.name}: {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
            found.append((where, doc))
            if doc.get("kind") != "ConfigMap" or path.name == "kustomization.yaml":
                continue  # a generated ConfigMap holds files that are loaded themselves
            for key, value in (doc.get("data") or {}).items():
                if key.endswith((".yaml", ".yml")):
                    found += [
                        (f"{where}[{key}]", inner)
                        for inner in yaml.safe_load_all(value)
                        if isinstance(inner, dict) and "kind" in inner
                    ]
    (job,) = [d for w, d in found if w.startswith("daskjob.yaml: DaskJob/")]
    patch = jsonpatch.JsonPatch(yaml.safe_load((K8S / "tls-patch.yaml").read_text()))
    found.append((f"tls-patch.yaml: DaskJob/{job['metadata']['name']}", patch.apply(job)))
    return found


def _generated_config_maps(kustomization: dict) -> list[dict]:
    """The ConfigMaps kustomize makes from ``configMapGenerator`` (files as data, in the
    kustomization's namespace), as ``kubectl apply -k`` would apply them."""
    assert kustomization["generatorOptions"]["disableNameSuffixHash"], "mounted by name"
    maps = []
    for gen in kustomization["configMapGenerator"]:
        data = {f: (K8S / f).read_text() for f in gen["files"]}
        meta = {
            "name": gen["name"],
            "namespace": kustomization["namespace"],
            "labels": gen.get("options", {}).get("labels", {}),
        }
        maps.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    return maps


MANIFESTS = _load_manifests()
IDS = [where for where, _ in MANIFESTS]
DASKJOBS = [(where, obj) for where, obj in MANIFESTS if obj["kind"] == "DaskJob"]
DASKJOB_IDS = [where for where, _ in DASKJOBS]
POD_OWNERS = [(where, obj) for where, obj in MANIFESTS if obj["kind"] in ("DaskJob", "CronJob")]
POD_OWNER_IDS = [where for where, _ in POD_OWNERS]


def manifest(kind: str, name: str) -> dict:
    """The object of that kind and name (of the files as they are: not a patched variant)."""
    (obj,) = [
        o
        for w, o in MANIFESTS
        if o["kind"] == kind and o["metadata"]["name"] == name and not w.startswith("tls-")
    ]
    return obj


def pod_specs(obj: dict) -> dict[str, dict]:
    """Role -> Pod spec of a DaskJob or CronJob."""
    if obj["kind"] == "DaskJob":
        cluster = obj["spec"]["cluster"]["spec"]
        return {
            "job": obj["spec"]["job"]["spec"],
            "scheduler": cluster["scheduler"]["spec"],
            "worker": cluster["worker"]["spec"],
        }
    if obj["kind"] == "CronJob":
        return {"cron": obj["spec"]["jobTemplate"]["spec"]["template"]["spec"]}
    return {}


def containers(pod: dict) -> list[dict]:
    return pod["containers"] + pod.get("initContainers", [])


def container(pod: dict, name: str) -> dict:
    (found,) = [c for c in containers(pod) if c["name"] == name]
    return found


def env_value(c: dict, name: str) -> str:
    (value,) = [e["value"] for e in c.get("env", []) if e["name"] == name]
    return value


def quantity(text: str | int | float) -> float:
    """A Kubernetes resource quantity ("1500m", "5Gi", "2") as a number."""
    number, suffix = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text)).groups()
    scale = {
        "": 1,
        "m": 1e-3,
        "k": 1e3,
        "M": 1e6,
        "G": 1e9,
        "T": 1e12,
        "Ki": 2**10,
        "Mi": 2**20,
        "Gi": 2**30,
        "Ti": 2**40,
    }[suffix]
    return float(number) * scale


# -- CRD schemas -> JSON schema ----------------------------------------------------------------
def to_json_schema(node):
    """An OpenAPI v3 schema of a Kubernetes CRD as a JSON schema, with the API server's
    semantics: ``nullable``, ``x-kubernetes-int-or-string``; objects with ``properties``
    reject unknown fields unless ``x-kubernetes-preserve-unknown-fields`` (or an embedded
    resource) keeps them open. Other ``x-kubernetes-*`` keys only shape merges: dropped."""
    if isinstance(node, list):
        return [to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "description", "default"):
            continue
        if key in ("properties", "patternProperties", "definitions"):
            out[key] = {name: to_json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not", "allOf", "anyOf", "oneOf"):
            out[key] = to_json_schema(value)
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable"):
        if isinstance(out.get("type"), str):
            out["type"] = [out["type"], "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    keeps_unknown = any(
        node.get(k)
        for k in ("x-kubernetes-preserve-unknown-fields", "x-kubernetes-embedded-resource")
    )
    if "properties" in out and "additionalProperties" not in out and not keeps_unknown:
        out["additionalProperties"] = False
    return out


def crd_validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """(apiVersion, kind) -> validator, from the CRDs the dask-kubernetes package ships."""
    crds = importlib.resources.files("dask_kubernetes")
    for part in CRD_DIR:
        crds = crds / part
    validators = {}
    for path in crds.iterdir():
        if not path.name.endswith(".yaml"):
            continue
        text = path.read_text()
        assert "$ref" not in text, f"{path.name}: not a resolved CRD"
        crd = yaml.load(text, Loader=LOADER)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            api_version = f"{group}/{version['name']}"
            schema = to_json_schema(version["schema"]["openAPIV3Schema"])
            schema["properties"] |= {
                "apiVersion": {"const": api_version},
                "kind": {"const": kind},
                "metadata": OBJECT_META,
            }
            schema["required"] = sorted(
                {*schema.get("required", ()), "apiVersion", "kind", "metadata"}
            )
            validators[api_version, kind] = jsonschema.Draft7Validator(schema)
    return validators


def errors(validator, obj) -> list[str]:
    return sorted(
        f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in validator.iter_errors(obj)
    )


def crd_errors(crds, obj) -> list[str]:
    validator = crds.get((obj.get("apiVersion"), obj.get("kind")))
    if validator is None:
        return [f"no CRD for apiVersion {obj.get('apiVersion')!r} kind {obj.get('kind')!r}"]
    return errors(validator, obj)
