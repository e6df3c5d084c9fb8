"""The nightly CronJob of workflows/k8s, checked without a cluster (the manifests are
loaded by tests/k8s.py): it has what it needs (one namespace, the RBAC its creator script
uses, the ConfigMap that holds the script and the one-off DaskJob as its template), and
the creator script runs against a fake Kubernetes API: it starts tonight's run, never
overlaps runs, deletes a run whose runner is never scheduled, and does nothing when
retried.
"""

from __future__ import annotations

import copy
import datetime as dt
import urllib.parse

import pytest

from tests.k8s import K8S, MANIFESTS, crd_errors, env_value, manifest, pod_specs


# -- the nightly CronJob -----------------------------------------------------------------------
def test_cronjob_has_what_it_needs():
    cron = manifest("CronJob", "dslide-nightly")
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
    account = manifest("ServiceAccount", pod["serviceAccountName"])
    assert pod.get("automountServiceAccountToken", True), "the creator calls the API"
    bindings = [
        o
        for o in in_file
        if o["kind"] == "RoleBinding"
        and {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": namespace}
        in o["subjects"]
    ]
    assert bindings, "no RoleBinding for the creator's ServiceAccount"
    rules = manifest(bindings[0]["roleRef"]["kind"], bindings[0]["roleRef"]["name"])["rules"]
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
    data = manifest("ConfigMap", volume["configMap"]["name"])["data"]
    assert c["args"][:2] == ["python", f"{mount['mountPath']}/create_daskjob.py"]
    assert {"create_daskjob.py", "daskjob.yaml"} <= set(data)
    compile(data["create_daskjob.py"], "create_daskjob.py", "exec")
    assert any(
        r["apiGroups"] == [""] and r["resources"] == ["pods"] and r["verbs"] == ["get"]
        for r in rules
    ), "the creator reads earlier runs' runner Pods"
    # the nightly template is the one-off manifest itself: nothing hand-copied
    assert data["daskjob.yaml"] == (K8S / "daskjob.yaml").read_text()


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
    data = manifest("ConfigMap", "dslide-nightly")["data"]
    template = tmp_path / "daskjob.yaml"
    template.write_text(data["daskjob.yaml"])
    monkeypatch.setenv("DASKJOB_TEMPLATE", str(template))
    monkeypatch.setenv("POD_NAMESPACE", "dslide")
    monkeypatch.setenv("KEEP_FINISHED", "2")
    (cron,) = pod_specs(manifest("CronJob", "dslide-nightly"))["cron"]["containers"]
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
    assert verbs <= set(manifest("Role", "dslide-nightly")["rules"][0]["verbs"])


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
