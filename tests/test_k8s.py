"""The Kubernetes manifests in workflows/k8s, checked without a cluster.

Every DaskJob (also the template inside the nightly CronJob's ConfigMap) validates against
the OpenAPI schema of the CRDs that the installed dask-kubernetes operator ships, with
unknown fields rejected as by kubectl's strict field validation; the other objects get a
structural check. The commands in the Pods parse with the real parsers (`dslide train`,
`dask scheduler`, `dask worker`), the parts that must agree do (names, images, replicas,
threads, memory, RBAC), every Pod meets the "restricted" Pod Security Standard, and the
nightly creator script runs against a fake Kubernetes API.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import importlib.resources
import math
import re
import tomllib
import urllib.parse
from importlib.metadata import entry_points
from pathlib import Path

import pytest
import yaml
from dask.utils import parse_bytes

jsonschema = pytest.importorskip("jsonschema")
jsonpatch = pytest.importorskip("jsonpatch")  # with dask-kubernetes (kopf needs it)
pytest.importorskip("dask_kubernetes")

K8S = Path(__file__).resolve().parents[1] / "workflows" / "k8s"
LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
CRD_DIR = ("operator", "deployment", "helm", "dask-kubernetes-operator", "crds")
DASK_KINDS = {"DaskJob", "DaskCluster", "DaskWorkerGroup", "DaskAutoscaler"}
CORE_API_VERSIONS = {
    "ConfigMap": "v1",
    "Secret": "v1",
    "Service": "v1",
    "ServiceAccount": "v1",
    "Namespace": "v1",
    "CronJob": "batch/v1",
    "Job": "batch/v1",
    "Role": "rbac.authorization.k8s.io/v1",
    "RoleBinding": "rbac.authorization.k8s.io/v1",
    "ClusterRole": "rbac.authorization.k8s.io/v1",
    "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
}
#: `dslide train` flags for run folders and checkpoints that are being added: until the
#: parser knows them, the manifests keep them and only the assertions about them skip.
#: Environment the operator adds to the containers (not init containers) of its Pods.
INJECTED_ENV = {
    "job": {"DASK_SCHEDULER_ADDRESS"},
    "worker": {"DASK_SCHEDULER_ADDRESS", "DASK_WORKER_NAME"},
    "scheduler": set(),
    "cron": set(),
}

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


def _one(kind: str, name: str) -> dict:
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


def test_the_manifests_are_all_there():
    files = {where.split(":")[0] for where in IDS}
    assert {"daskjob.yaml", "cronjob.yaml"} <= files
    assert "kustomization.yaml: ConfigMap/dslide-nightly" in IDS, "no nightly template"
    assert any(obj["kind"] == "CronJob" for _, obj in MANIFESTS)


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


@pytest.fixture(scope="module")
def crds():
    validators = crd_validators()
    assert {kind for _, kind in validators} >= DASK_KINDS
    return validators


@pytest.fixture(scope="module")
def pod_spec_schema(crds):
    """Kubernetes' PodSpec as the operator's CRD has it (the DaskJob runner's Pod spec)."""
    schema = crds["kubernetes.dask.org/v1", "DaskJob"].schema
    return schema["properties"]["spec"]["properties"]["job"]["properties"]["spec"]


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


def test_schema_conversion_follows_the_api_server():
    schema = to_json_schema(
        {
            "type": "object",
            "properties": {
                "port": {"type": "string", "x-kubernetes-int-or-string": True},
                "end": {"type": "string", "nullable": True},
                "free": {
                    "type": "object",
                    "x-kubernetes-preserve-unknown-fields": True,
                    "properties": {"n": {"type": "integer"}},
                },
            },
        }
    )
    check = jsonschema.Draft7Validator(schema)
    assert not errors(check, {"port": 8786, "end": None, "free": {"n": 1, "anything": [1]}})
    assert not errors(check, {"port": "http"})
    assert errors(check, {"typo": 1})  # unknown field
    assert errors(check, {"free": {"n": "one"}})  # known fields still checked
    assert errors(check, {"port": 1.5})


# -- every object validates --------------------------------------------------------------------
@pytest.mark.parametrize(("where", "obj"), MANIFESTS, ids=IDS)
def test_manifest_validates(where, obj, crds, pod_spec_schema):
    kind = obj.get("kind")
    if obj.get("apiVersion", "").startswith("kubernetes.dask.org/") or kind in DASK_KINDS:
        problems = crd_errors(crds, obj)
        assert not problems, (
            f"{where} does not match the operator's CRD (unknown fields would be dropped, or "
            "rejected by kubectl's strict field validation):\n  " + "\n  ".join(problems)
        )
        return
    assert kind in CORE_API_VERSIONS, f"{where}: unexpected kind {kind!r}"
    assert obj.get("apiVersion") == CORE_API_VERSIONS[kind], f"{where}: apiVersion"
    assert not errors(jsonschema.Draft7Validator(OBJECT_META), obj.get("metadata")), where
    for pod in pod_specs(obj).values():
        problems = errors(jsonschema.Draft7Validator(pod_spec_schema), pod)
        assert not problems, f"{where}: Pod spec:\n  " + "\n  ".join(problems)
    if kind == "ConfigMap":
        assert all(isinstance(v, str) for v in obj.get("data", {}).values()), where


DELETE = object()
JOB_CONTAINER = ["spec", "job", "spec", "containers", 0]
WORKER = ["spec", "cluster", "spec", "worker"]
BROKEN = {  # what to change in the DaskJob -> the error it must cause
    "no-job": (["spec", "job"], DELETE, "'job' is a required property"),
    "no-container-name": ([*JOB_CONTAINER, "name"], DELETE, "'name' is a required property"),
    "replicas-string": ([*WORKER, "replicas"], "4", "'4' is not of type 'integer'"),
    "typo-field": ([*WORKER, "replica"], 4, "('replica' was unexpected)"),
    # this CRD types resource quantities as strings: `cpu: 2` is rejected, `cpu: "2"` is not
    "cpu-integer": ([*JOB_CONTAINER, "resources", "requests", "cpu"], 2, "not of type 'string'"),
    "wrong-kind": (["kind"], "DaskJobs", "no CRD for"),
}


@pytest.mark.parametrize(("path", "value", "expected"), BROKEN.values(), ids=BROKEN)
def test_a_broken_daskjob_fails_validation(crds, path, value, expected):
    job = copy.deepcopy(_one("DaskJob", "dslide-amazon-670k"))
    assert not crd_errors(crds, job)
    parent = job
    for key in path[:-1]:
        parent = parent[key]
    if value is DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    problems = crd_errors(crds, job)
    assert any(expected in p for p in problems), problems


# -- the DaskJobs ------------------------------------------------------------------------------
@pytest.mark.parametrize(("where", "job"), DASKJOBS, ids=DASKJOB_IDS)
def test_daskjob_fits_together(where, job):
    name = job["metadata"]["name"]
    # NAME-scheduler is a Service: a DNS-1035 label of at most 63 characters
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= 53, name
    pods = pod_specs(job)
    assert pods["job"].get("restartPolicy") == "Never", (
        f"{where}: the runner Pod must be restartPolicy Never, or the job never ends"
    )
    assert [c["name"] for c in pods["job"]["containers"]] == ["job"], where
    images = {c["image"] for pod in pods.values() for c in containers(pod)}
    assert len(images) == 1, f"{where}: client, scheduler and workers need one image: {images}"

    service = job["spec"]["cluster"]["spec"]["scheduler"]["service"]
    assert service["selector"] == {
        "dask.org/cluster-name": name,
        "dask.org/component": "scheduler",
    }, f"{where}: the scheduler Service must select this job's scheduler: {name}"
    ports = {
        p["name"]: p["containerPort"] for p in container(pods["scheduler"], "scheduler")["ports"]
    }
    assert {(p["port"], p["targetPort"]) for p in service["ports"]} == {
        (8786, "tcp-comm"),
        (8787, "http-dashboard"),
    }, where
    assert ports == {"tcp-comm": 8786, "http-dashboard": 8787}, where

    worker = job["spec"]["cluster"]["spec"]["worker"]
    wait = container(pods["job"], "wait-for-workers")
    assert env_value(wait, "DSLIDE_WORKERS") == str(worker["replicas"]), (
        f"{where}: DSLIDE_WORKERS of wait-for-workers != worker replicas"
    )
    compile(wait["args"][2], f"{where}: wait-for-workers", "exec")  # python -c CODE
    assert wait["args"][:2] == ["python", "-c"]


@pytest.mark.parametrize(("where", "obj"), POD_OWNERS, ids=POD_OWNER_IDS)
def test_pods_meet_the_restricted_pod_security_standard(where, obj):
    uid = int(re.search(r"^USER (\d+)", (K8S / "Dockerfile").read_text(), re.M).group(1))
    for role, pod in pod_specs(obj).items():
        pod_security = pod.get("securityContext", {})
        assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), role
        assert not any("hostPath" in v for v in pod.get("volumes", [])), role
        for c in containers(pod):
            sc = {**pod_security, **c.get("securityContext", {})}
            what = f"{where}: {role} Pod, container {c['name']}"
            assert sc.get("runAsNonRoot") is True and sc.get("runAsUser") == uid, what
            assert sc.get("allowPrivilegeEscalation") is False, what
            assert "ALL" in sc.get("capabilities", {}).get("drop", []), what
            assert sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", what
            assert not sc.get("privileged"), what


@pytest.mark.parametrize(("where", "obj"), POD_OWNERS, ids=POD_OWNER_IDS)
def test_variable_references_resolve(where, obj):
    """Kubernetes expands $(VAR) in args for variables the container defines, and in env
    values for those defined earlier in the list (the operator appends its variables at
    the end); anything else stays literally "$(VAR)"."""
    reference = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
    for role, pod in pod_specs(obj).items():
        for c in containers(pod):
            defined = set()
            for e in c.get("env", []):
                for ref in reference.findall(e.get("value", "")):
                    assert ref in defined, f"{where}: {c['name']}: env {e['name']}: $({ref})"
                defined.add(e["name"])
            if c in pod["containers"]:
                defined |= INJECTED_ENV[role]
            for arg in c.get("command", []) + c.get("args", []):
                for ref in reference.findall(arg):
                    assert ref in defined, f"{where}: {c['name']}: $({ref}) is not defined"


# -- the commands parse with the real parsers --------------------------------------------------
def _train_parser() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    from dslide_workflows.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return parser, sub.choices["train"]


def _flag_value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize(("where", "job"), DASKJOBS, ids=DASKJOB_IDS)
def test_runner_command_parses_with_the_dslide_cli(where, job, monkeypatch, capsys):
    from dslide_workflows.run_settings import resolve

    args = container(pod_specs(job)["job"], "job")["args"]
    assert args[:2] == ["dslide", "train"], where
    parser, _ = _train_parser()
    address = "tcp://run-scheduler.dslide.svc.cluster.local:8786"
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", address)  # what the operator injects
    try:
        ns = parser.parse_args(args[1:])
    except SystemExit:
        pytest.fail(f"{where}: {' '.join(args)}\n{capsys.readouterr().err}")
    run, _ = resolve(ns)
    if where.startswith("tls-"):  # TLS: the flags name the scheduler's tls:// Service
        assert run.scheduler_address == "tls://$(DASK_JOB_NAME)-scheduler:8786", where
        assert run.tls_ca_file and run.tls_cert and run.tls_key, where
    else:
        assert run.scheduler_address == address, where
    assert not run.in_process, where
    assert run.train.startswith("s3://") and run.test.startswith("s3://"), where
    assert run.epochs >= 1 and ns.no_progress and ns.log_every > 0, where

    assert _flag_value(args, "--run-dir").startswith("s3://"), where
    assert _flag_value(args, "--run-dir").endswith("/$(DASK_JOB_NAME)"), where
    assert _flag_value(args, "--checkpoint-every") == "500", where
    assert ns.run_dir == _flag_value(args, "--run-dir")
    assert ns.checkpoint_every == 500


@pytest.mark.parametrize(("where", "job"), DASKJOBS, ids=DASKJOB_IDS)
def test_a_stopped_worker_hands_its_rows_off_first(where, job, monkeypatch, capsys):
    """The worker's preStop hook is ``dslide leave``, reading the scheduler and the
    worker's name from what the operator injects, within the grace period."""
    pod = pod_specs(job)["worker"]
    command = container(pod, "worker")["lifecycle"]["preStop"]["exec"]["command"]
    assert command[:2] == ["dslide", "leave"], where
    monkeypatch.setenv("DASK_SCHEDULER_ADDRESS", "tcp://run-scheduler:8786")
    monkeypatch.setenv("DASK_WORKER_NAME", "run-default-worker-0")
    from dslide_workflows.cli import build_parser

    try:
        ns = build_parser().parse_args(command[1:])
    except SystemExit:
        pytest.fail(f"{where}: {' '.join(command)}\n{capsys.readouterr().err}")
    assert ns.scheduler_address == "tcp://run-scheduler:8786" and ns.worker.endswith("-0")
    assert ns.timeout + 10 <= pod["terminationGracePeriodSeconds"], where
    if where.startswith("tls-"):  # the hook reaches the scheduler over TLS too
        env = {e["name"]: e.get("value") for e in container(pod, "worker")["env"]}
        assert env["DSLIDE_SCHEDULER_ADDRESS"].startswith("tls://"), where
        assert ns.tls_ca_file and ns.tls_cert and ns.tls_key, where


TLS_DIR = "/etc/dslide/tls/"  # where tls-patch.yaml mounts the Secret dslide-tls


def _dask_command(name: str):
    from distributed.cli import dask_scheduler, dask_worker

    assert name in {ep.name for ep in entry_points(group="dask_cli")}, f"no `dask {name}`"
    return {"scheduler": dask_scheduler.main, "worker": dask_worker.main}[name]


@pytest.mark.parametrize(("where", "job"), DASKJOBS, ids=DASKJOB_IDS)
def test_scheduler_and_worker_commands_parse_with_dask(where, job, tmp_path):
    pods = pod_specs(job)
    for name in ("ca.crt", "tls.crt", "tls.key"):  # the TLS variant's Secret, mounted
        (tmp_path / name).write_text("")
    for role in ("scheduler", "worker"):
        c = container(pods[role], role)
        mounts = {m["mountPath"] for m in c.get("volumeMounts", [])}
        args = [a.replace(TLS_DIR, f"{tmp_path}/") if TLS_DIR in a else a for a in c["args"]]
        assert all(TLS_DIR.rstrip("/") in mounts for a in c["args"] if TLS_DIR in a), where
        assert args[:2] == ["dask", role], f"{where}: `dask {role} ...` (no dask-{role} script)"
        command = _dask_command(role)
        options = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        flags = [a.split("=")[0] for a in args[2:] if a.startswith("-")]
        # `dask worker` passes unknown options on to preload modules: check them by name
        assert set(flags) <= options, f"{where}: unknown: {set(flags) - options}"
        with command.make_context(f"dask {role}", list(args[2:])) as ctx:
            params = ctx.params
        if role != "worker":
            continue
        if where.startswith("tls-"):  # over TLS, with the scheduler's tls:// address
            assert params["scheduler"].startswith("tls://"), where
            assert {"tls_ca_file", "tls_cert", "tls_key"} <= {k for k, v in params.items() if v}
            scheduler_args = container(pods["scheduler"], "scheduler")["args"]
            assert "--protocol=tls" in scheduler_args, where
        else:
            assert params["scheduler"] is None, "the address comes from DASK_SCHEDULER_ADDRESS"
        resources = c["resources"]
        cores = math.ceil(quantity(resources["requests"]["cpu"]))
        assert params["nthreads"] == cores, f"{where}: --nthreads != CPU request rounded up"
        limit = quantity(resources["limits"]["memory"])
        assert parse_bytes(params["memory_limit"]) == limit, f"{where}: --memory-limit"
        assert quantity(resources["requests"]["memory"]) == limit, f"{where}: memory request"


# -- the image ---------------------------------------------------------------------------------
def test_one_image_runs_every_command():
    dockerfile = (K8S / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim$", dockerfile, re.M)
    assert re.search(r'pip wheel .*"\.\[s3\]"', dockerfile)
    assert re.search(r'pip install .*"dslide-dask\[s3\]"', dockerfile)
    user = re.search(r"^USER (\d+)", dockerfile, re.M)
    assert user and int(user.group(1)) > 0, "runs as a numeric non-root user"
    entrypoint = re.search(r"^ENTRYPOINT (.*)$", dockerfile, re.M).group(1)
    assert "dslide" not in entrypoint and "dask" not in entrypoint, "args carry the command"
    # the commands the manifests run are console scripts the image installs
    pyproject = (K8S.parents[1] / "pyproject.toml").read_text()
    assert re.search(r'^dslide = "dslide_workflows\.cli:main"$', pyproject, re.M)
    assert "dask" in {ep.name for ep in entry_points(group="console_scripts")}
    used = {
        c["args"][0]
        for _, obj in MANIFESTS
        for pod in pod_specs(obj).values()
        for c in containers(pod)
    }
    assert used <= {"dslide", "dask", "python"}, used
    assert not any(
        "command" in c for _, o in MANIFESTS for p in pod_specs(o).values() for c in containers(p)
    ), "keep the image's entrypoint (tini): use args"
    # the build context is an allow-list: sources only, no data, caches or credentials
    ignore = [
        line
        for line in (K8S / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert ignore[0] == "*" and "**/__pycache__" in ignore
    assert "!workflows/k8s/requirements.lock" in ignore and "!LICENSE" in ignore


def test_image_builds_from_the_lock_with_a_cache_and_a_warm_numba_cache():
    dockerfile = (K8S / "Dockerfile").read_text()
    lock = (K8S / "requirements.lock").read_text()
    # dependencies from the lock, before the sources are copied (a layer kept until the
    # lock changes), with pip's download cache mounted
    assert dockerfile.index("-r requirements.lock") < dockerfile.index("COPY dslide_dask")
    assert dockerfile.count("--mount=type=cache,target=/root/.cache/pip") >= 2
    pins = dict(re.findall(r"^([a-z0-9._-]+)==(\S+)", lock, re.M))
    project = tomllib.loads((K8S.parents[1] / "pyproject.toml").read_text())["project"]
    for req in project["dependencies"] + project["optional-dependencies"]["s3"]:
        dep = re.split(r"[\[<>=!~; ]", req, maxsplit=1)[0].lower()
        assert dep in pins, f"{dep} is not in requirements.lock: run pip-compile (README.md)"
    # numba's cache: in the non-root user's home, filled at build time as that user
    cache = re.search(r"NUMBA_CACHE_DIR=(\S+)", dockerfile).group(1)
    assert cache.startswith("/home/dslide/") and not cache.startswith("/tmp")
    user_at = dockerfile.index("USER 10001")
    assert dockerfile.index("dslide train", user_at) > user_at, "warmed as the Pods' user"


# -- the nightly CronJob -----------------------------------------------------------------------
def test_cronjob_has_what_it_needs():
    cron = _one("CronJob", "dslide-nightly")
    namespace = cron["metadata"]["namespace"]
    in_file = [
        o
        for where, o in MANIFESTS
        if where.startswith(("cronjob.yaml:", "kustomization.yaml:")) and "[" not in where
    ]
    assert {o["metadata"].get("namespace") for o in in_file} == {namespace}
    spec = cron["spec"]
    assert len(spec["schedule"].split()) == 5 and spec["concurrencyPolicy"] == "Forbid"
    pod = pod_specs(cron)["cron"]
    assert pod["restartPolicy"] in ("Never", "OnFailure")
    account = _one("ServiceAccount", pod["serviceAccountName"])
    assert pod.get("automountServiceAccountToken", True), "the creator calls the API"
    bindings = [
        o
        for o in in_file
        if o["kind"] == "RoleBinding"
        and {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": namespace}
        in o["subjects"]
    ]
    assert bindings, "no RoleBinding for the creator's ServiceAccount"
    rules = _one(bindings[0]["roleRef"]["kind"], bindings[0]["roleRef"]["name"])["rules"]
    assert any(
        "kubernetes.dask.org" in r["apiGroups"]
        and "daskjobs" in r["resources"]
        and {"create", "list", "delete"} <= set(r["verbs"])
        for r in rules
    )
    # the script and the template come from the ConfigMap mounted where the args look
    (c,) = pod["containers"]
    (mount,) = c["volumeMounts"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    data = _one("ConfigMap", volume["configMap"]["name"])["data"]
    assert c["args"][:2] == ["python", f"{mount['mountPath']}/create_daskjob.py"]
    assert {"create_daskjob.py", "daskjob.yaml"} <= set(data)
    compile(data["create_daskjob.py"], "create_daskjob.py", "exec")
    assert any(
        r["apiGroups"] == [""] and r["resources"] == ["pods"] and r["verbs"] == ["get"]
        for r in rules
    ), "the creator reads earlier runs' runner Pods"
    # the nightly template is the one-off manifest itself: nothing hand-copied
    assert data["daskjob.yaml"] == (K8S / "daskjob.yaml").read_text()


def test_the_nodes_the_readme_recommends_fit_a_worker_beside_the_runner_or_scheduler():
    """2-vCPU / 8-GiB nodes keep about 1.9 CPU and 6 GiB allocatable: a runner or the
    scheduler that does not fit beside a worker is never scheduled (and a runner's
    activeDeadlineSeconds never starts counting)."""
    readme = (K8S / "README.md").read_text()
    assert "2-vCPU / 8-GiB" in readme
    for where, job in DASKJOBS:
        pods = pod_specs(job)

        def requests(role, pods=pods):
            pod = pods[role]
            cpu = sum(quantity(c["resources"]["requests"]["cpu"]) for c in pod["containers"])
            mem = sum(quantity(c["resources"]["requests"]["memory"]) for c in pod["containers"])
            return cpu, mem

        worker = requests("worker")
        for other in ("job", "scheduler"):
            cpu, mem = (a + b for a, b in zip(worker, requests(other), strict=True))
            assert cpu <= 1.9 and mem <= 6 * 2**30, (where, other, cpu, mem / 2**30)


class FakeAPI:
    """The Kubernetes API as the creator script sees it: DaskJobs in one namespace."""

    def __init__(self, runs: list[dict]):
        self.runs, self.calls = runs, []

    def __call__(self, method: str, path: str, body: dict | None = None) -> dict:
        self.calls.append((method, path, body))
        if method == "GET" and "/pods/" in path:
            name = path.rsplit("/", 1)[1]
            return copy.deepcopy(self.pods.get(name, {"status": {"phase": "Running"}}))
        return {"items": copy.deepcopy(self.runs)} if method == "GET" else body or {}

    pods: dict = {}  # runner Pod name -> Pod (default: running)

    def daskjob_calls(self) -> list[str]:
        return [m for m, p, _ in self.calls if "/pods/" not in p]


def _run(name: str, status: str | None, created: str) -> dict:
    return {
        "metadata": {"name": name, "creationTimestamp": created},
        **({"status": {"jobStatus": status}} if status else {}),
    }


@pytest.fixture
def creator(tmp_path, monkeypatch):
    """The nightly creator script, loaded from its ConfigMap, with its template on disk."""
    data = _one("ConfigMap", "dslide-nightly")["data"]
    template = tmp_path / "daskjob.yaml"
    template.write_text(data["daskjob.yaml"])
    monkeypatch.setenv("DASKJOB_TEMPLATE", str(template))
    monkeypatch.setenv("POD_NAMESPACE", "dslide")
    monkeypatch.setenv("KEEP_FINISHED", "2")
    (cron,) = pod_specs(_one("CronJob", "dslide-nightly"))["cron"]["containers"]
    for var in ("RUN_PREFIX", "RUN_DEADLINE_SECONDS", "PENDING_MINUTES"):
        monkeypatch.setenv(var, env_value(cron, var))
    module = {"__name__": "create_daskjob"}
    exec(compile(data["create_daskjob.py"], "create_daskjob.py", "exec"), module)
    return module


MINUTES = 29_000_000  # a CronJob's Job is CRONJOB-<scheduled minute since the epoch>
TONIGHT = f"dslide-nightly-{dt.datetime.fromtimestamp(MINUTES * 60, dt.UTC):%Y%m%d-%H%M}"


def test_creator_starts_tonights_run(creator, crds, monkeypatch):
    monkeypatch.setenv("JOB_NAME", f"dslide-nightly-{MINUTES}")
    runs = [
        _run("dslide-nightly-a", "Successful", "2025-01-01T01:00:00Z"),
        _run("dslide-nightly-c", "Failed", "2025-01-03T01:00:00Z"),
        _run("dslide-nightly-b", "Successful", "2025-01-02T01:00:00Z"),
    ]
    api = creator["api"] = FakeAPI(runs)
    assert creator["main"]() == 0
    methods = [(m, p.split("?")[0].rsplit("/", 1)[-1]) for m, p, _ in api.calls]
    assert methods == [("GET", "daskjobs"), ("DELETE", "dslide-nightly-a"), ("POST", "daskjobs")]
    base = "/apis/kubernetes.dask.org/v1/namespaces/dslide/daskjobs"
    url = urllib.parse.urlsplit(api.calls[0][1])
    assert url.path == base
    selector = urllib.parse.parse_qs(url.query)["labelSelector"][0].split(",")
    assert "app.kubernetes.io/instance=dslide-nightly" in selector
    method, path, job = api.calls[-1]
    assert path == f"{base}?fieldValidation=Strict"
    assert job["metadata"]["name"] == TONIGHT and len(TONIGHT) <= 53
    assert job["spec"]["cluster"]["spec"]["scheduler"]["service"]["selector"] == {
        "dask.org/cluster-name": TONIGHT,
        "dask.org/component": "scheduler",
    }
    assert not crd_errors(crds, job)
    # the Role allows exactly what the script did
    verbs = {{"GET": "list", "POST": "create", "DELETE": "delete"}[m] for m, _, _ in api.calls}
    assert verbs <= set(_one("Role", "dslide-nightly")["rules"][0]["verbs"])


def test_creator_never_overlaps_runs(creator, monkeypatch, capsys):
    monkeypatch.setenv("JOB_NAME", f"dslide-nightly-{MINUTES}")
    runs = [
        _run("dslide-nightly-x", "Running", "2025-01-01T01:00:00Z"),
        _run("dslide-nightly-y", None, "2025-01-02T01:00:00Z"),  # not seen by the operator yet
    ]
    api = creator["api"] = FakeAPI(runs)
    assert creator["main"]() == 1
    assert api.daskjob_calls() == ["GET"]
    assert "still running: dslide-nightly-x, dslide-nightly-y" in capsys.readouterr().err


def test_a_run_whose_runner_is_never_scheduled_is_deleted(creator, monkeypatch, capsys):
    monkeypatch.setenv("JOB_NAME", f"dslide-nightly-{MINUTES}")
    api = creator["api"] = FakeAPI([_run("dslide-nightly-x", "Running", "2025-01-01T01:00:00Z")])
    unschedulable = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/4 nodes are available: 4 Insufficient cpu.",
    }
    api.pods = {
        "dslide-nightly-x-runner": {
            "metadata": {"creationTimestamp": "2025-01-01T01:00:00Z"},
            "status": {"phase": "Pending", "conditions": [unschedulable]},
        }
    }
    assert creator["main"]() == 0
    assert [(m, p.split("?")[0].rsplit("/", 1)[-1]) for m, p, _ in api.calls] == [
        ("GET", "daskjobs"),
        ("GET", "dslide-nightly-x-runner"),
        ("DELETE", "dslide-nightly-x"),
        ("POST", "daskjobs"),
    ]
    assert "Insufficient cpu" in capsys.readouterr().err
    job = api.calls[-1][2]
    assert job["spec"]["job"]["spec"]["activeDeadlineSeconds"] == 82800  # the nightly deadline
    # a young pending runner (nodes being added) is waited for
    api = creator["api"] = FakeAPI([_run("dslide-nightly-x", "Running", "2025-01-01T01:00:00Z")])
    fresh = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    api.pods = {
        "dslide-nightly-x-runner": {
            "metadata": {"creationTimestamp": fresh},
            "status": {"phase": "Pending", "conditions": [unschedulable]},
        }
    }
    assert creator["main"]() == 1


def test_a_retried_creator_does_nothing(creator, monkeypatch):
    monkeypatch.setenv("JOB_NAME", f"dslide-nightly-{MINUTES}")
    api = creator["api"] = FakeAPI([_run(TONIGHT, "Running", "2025-01-01T01:00:00Z")])
    assert creator["main"]() == 0
    assert api.daskjob_calls() == ["GET"]


def test_a_manual_run_is_named_after_now(creator):
    now = dt.datetime(2025, 3, 4, 5, 6, tzinfo=dt.UTC)
    assert creator["run_name"]("p", "manual-1", now) == "p-20250304-0506"
    assert creator["run_name"]("p", "", now) == "p-20250304-0506"
    assert creator["run_name"]("p", f"p-{MINUTES}", now) == TONIGHT.replace("dslide-nightly", "p")


def test_the_autoscaler_scales_the_jobs_cluster_and_retired_workers_can_hand_off():
    job = yaml.safe_load((K8S / "daskjob.yaml").read_text())
    scaler = yaml.safe_load((K8S / "autoscaler.yaml").read_text())
    assert scaler["spec"]["cluster"] == job["metadata"]["name"] == scaler["metadata"]["name"]
    assert scaler["metadata"]["namespace"] == job["metadata"]["namespace"]
    assert 1 <= scaler["spec"]["minimum"] <= scaler["spec"]["maximum"]
    worker = job["spec"]["cluster"]["spec"]["worker"]["spec"]
    assert worker["terminationGracePeriodSeconds"] >= 60  # a checkpoint and a restore
