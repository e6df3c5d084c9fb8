"""Every object of the Kubernetes manifests in workflows/k8s validates, checked without
a cluster (the manifests are loaded by tests/k8s.py).

Every DaskJob (also the template inside the nightly CronJob's ConfigMap, and the TLS
variant tls-patch.yaml makes) validates against the OpenAPI schema of the CRDs that the
installed dask-kubernetes operator ships, with unknown fields rejected as by kubectl's
strict field validation; the other objects get a structural check. The check is checked
too: the schema conversion follows the API server, and a broken DaskJob fails.
"""

from __future__ import annotations

import copy

import pytest

from tests.k8s import (
    DASK_KINDS,
    IDS,
    MANIFESTS,
    OBJECT_META,
    crd_errors,
    errors,
    manifest,
    pod_specs,
    to_json_schema,
)

jsonschema = pytest.importorskip("jsonschema")

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


def test_the_manifests_are_all_there():
    files = {where.split(":")[0] for where in IDS}
    assert {"daskjob.yaml", "cronjob.yaml"} <= files
    assert "kustomization.yaml: ConfigMap/dslide-nightly" in IDS, "no nightly template"
    assert any(obj["kind"] == "CronJob" for _, obj in MANIFESTS)


@pytest.fixture(scope="module")
def pod_spec_schema(crds):
    """Kubernetes' PodSpec as the operator's CRD has it (the DaskJob runner's Pod spec)."""
    schema = crds["kubernetes.dask.org/v1", "DaskJob"].schema
    return schema["properties"]["spec"]["properties"]["job"]["properties"]["spec"]


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
    job = copy.deepcopy(manifest("DaskJob", "dslide-amazon-670k"))
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
