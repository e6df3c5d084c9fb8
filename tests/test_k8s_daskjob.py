"""The DaskJobs of workflows/k8s and their Pods fit together, checked without a cluster
(the manifests are loaded by tests/k8s.py): the job's name and its scheduler Service,
ports, one image for every Pod, the runner waiting for as many workers as there are
replicas; every Pod meets the "restricted" Pod Security Standard and its ``$(VAR)``
references resolve; a worker fits beside the runner or the scheduler on the nodes the
README recommends; the autoscaler scales the job's cluster and gives retired workers the
time to hand off.
"""

from __future__ import annotations

import re

import pytest
import yaml

from tests.k8s import (
    DASKJOB_IDS,
    DASKJOBS,
    K8S,
    POD_OWNER_IDS,
    POD_OWNERS,
    container,
    containers,
    env_value,
    pod_specs,
    quantity,
)

#: Environment the operator adds to the containers (not init containers) of its Pods.
INJECTED_ENV = {
    "job": {"DASK_SCHEDULER_ADDRESS"},
    "worker": {"DASK_SCHEDULER_ADDRESS", "DASK_WORKER_NAME"},
    "scheduler": set(),
    "cron": set(),
}


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


def test_the_autoscaler_scales_the_jobs_cluster_and_retired_workers_can_hand_off():
    job = yaml.safe_load((K8S / "daskjob.yaml").read_text())
    scaler = yaml.safe_load((K8S / "autoscaler.yaml").read_text())
    assert scaler["spec"]["cluster"] == job["metadata"]["name"] == scaler["metadata"]["name"]
    assert scaler["metadata"]["namespace"] == job["metadata"]["namespace"]
    assert 1 <= scaler["spec"]["minimum"] <= scaler["spec"]["maximum"]
    worker = job["spec"]["cluster"]["spec"]["worker"]["spec"]
    assert worker["terminationGracePeriodSeconds"] >= 60  # a checkpoint and a restore
