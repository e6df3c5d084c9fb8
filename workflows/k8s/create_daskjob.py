"""Create tonight's DaskJob from the template daskjob.yaml (run by the nightly CronJob).

The template is the one-off ``daskjob.yaml`` itself (kustomization.yaml puts both files
in the ConfigMap), made a nightly run here: named RUN_PREFIX-YYYYMMDD-HHMM after the
CronJob's scheduled time (so a retried Pod finds the DaskJob it made instead of starting a
second run), labelled ``app.kubernetes.io/instance=RUN_PREFIX``, in this Pod's namespace,
with the runner's deadline RUN_DEADLINE_SECONDS (below a day: a stuck run ends before the
next one). Nothing starts while an earlier run is still going; finished runs beyond the
newest KEEP_FINISHED are deleted. A run whose runner Pod was never scheduled (no node has
room for it) is deleted after PENDING_MINUTES: its Pod deadline only counts once it runs,
so it would otherwise block every later night. Standard library and PyYAML only: runs in
the dslide image.
"""

import copy
import datetime as dt
import json
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request

import yaml

SA = "/var/run/secrets/kubernetes.io/serviceaccount"
FINISHED = {"Successful", "Failed"}  # every other jobStatus (or none yet) is running


def api(method, path, body=None):
    """One Kubernetes API call as this Pod's service account: the decoded JSON reply."""
    host = os.environ["KUBERNETES_SERVICE_HOST"]
    port = os.environ["KUBERNETES_SERVICE_PORT"]
    with open(f"{SA}/token") as f:
        token = f.read().strip()
    request = urllib.request.Request(
        f"https://{host}:{port}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {token}",
            "Accept": "application/json",
            "Content-Type": "application/json",
        },
    )
    context = ssl.create_default_context(cafile=f"{SA}/ca.crt")
    with urllib.request.urlopen(request, context=context, timeout=60) as reply:
        return json.load(reply)


def run_name(prefix, job_name, now):
    """PREFIX-YYYYMMDD-HHMM of the scheduled time: a CronJob names its Jobs
    CRONJOB-<minutes since the epoch>; for any other Job (kubectl create job --from)
    the time is now."""
    stamp = job_name.rpartition("-")[2]
    if stamp.isdigit() and len(stamp) >= 8:
        now = dt.datetime.fromtimestamp(int(stamp) * 60, dt.UTC)
    return f"{prefix}-{now:%Y%m%d-%H%M}"


def render(template, name, prefix, namespace, deadline):
    """The template as DaskJob NAME of the nightly runs ``prefix``: its name, namespace,
    instance label, runner deadline and the scheduler Service selector."""
    job = copy.deepcopy(template)
    meta = job["metadata"]
    meta["name"], meta["namespace"] = name, namespace
    meta.setdefault("labels", {})["app.kubernetes.io/instance"] = prefix
    if deadline:
        job["spec"]["job"]["spec"]["activeDeadlineSeconds"] = deadline
    service = job["spec"]["cluster"]["spec"]["scheduler"]["service"]
    service.setdefault("selector", {})["dask.org/cluster-name"] = name
    return job


def never_scheduled(namespace, name, now, limit_minutes):
    """Why the runner Pod of DaskJob ``name`` is still unscheduled after ``limit_minutes``
    (the scheduler's message), or None if it runs, ran, or is younger."""
    try:
        pod = api("GET", f"/api/v1/namespaces/{namespace}/pods/{name}-runner")
    except urllib.error.HTTPError as err:
        if err.code == 404:  # not created yet by the operator
            return None
        raise
    status = pod.get("status") or {}
    if status.get("phase") != "Pending":
        return None
    scheduled = [c for c in status.get("conditions", []) if c.get("type") == "PodScheduled"]
    if not scheduled or scheduled[0].get("status") != "False":
        return None
    created = dt.datetime.fromisoformat(pod["metadata"]["creationTimestamp"].replace("Z", "+00:00"))
    if now - created < dt.timedelta(minutes=limit_minutes):
        return None
    return scheduled[0].get("message") or scheduled[0].get("reason") or "unschedulable"


def main():
    namespace = os.environ["POD_NAMESPACE"]
    keep = int(os.environ.get("KEEP_FINISHED", "14"))
    pending_limit = float(os.environ.get("PENDING_MINUTES", "60"))
    deadline = int(os.environ.get("RUN_DEADLINE_SECONDS", "0"))
    with open(os.environ.get("DASKJOB_TEMPLATE", "/etc/dslide/daskjob.yaml")) as f:
        template = yaml.safe_load(f)
    prefix = os.environ.get("RUN_PREFIX") or template["metadata"]["name"]
    now = dt.datetime.now(dt.UTC)
    name = run_name(prefix, os.environ.get("JOB_NAME", ""), now)
    base = f"/apis/kubernetes.dask.org/v1/namespaces/{namespace}/daskjobs"
    labels = {**template["metadata"].get("labels", {}), "app.kubernetes.io/instance": prefix}
    selector = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    runs = api("GET", f"{base}?labelSelector={urllib.parse.quote(selector)}")["items"]
    status = {r["metadata"]["name"]: (r.get("status") or {}).get("jobStatus") for r in runs}
    if name in status:
        print(f"daskjob/{name} exists already (this Job was retried): nothing to do")
        return 0
    for run in sorted(n for n, s in status.items() if s not in FINISHED):
        why = never_scheduled(namespace, run, now, pending_limit)
        if why is not None:
            api(
                "DELETE",
                f"{base}/{run}",
                {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
            )
            print(
                f"deleted daskjob/{run}: its runner was not scheduled in {pending_limit:g} "
                f"minutes ({why}); size the Pods for your nodes",
                file=sys.stderr,
            )
            runs = [r for r in runs if r["metadata"]["name"] != run]
            del status[run]
    running = sorted(n for n, s in status.items() if s not in FINISHED)
    if running:
        print(f"not starting {name}: still running: {', '.join(running)}", file=sys.stderr)
        return 1
    runs.sort(key=lambda r: r["metadata"]["creationTimestamp"])
    for old in runs[: max(0, len(runs) - keep)]:
        old_name = old["metadata"]["name"]
        api(
            "DELETE",
            f"{base}/{old_name}",
            {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"},
        )
        print(f"deleted daskjob/{old_name} ({status[old_name]})")
    job = api(
        "POST",
        f"{base}?fieldValidation=Strict",
        render(template, name, prefix, namespace, deadline),
    )
    print(
        f"created daskjob/{job['metadata']['name']}; logs: "
        f"kubectl -n {namespace} logs -f {name}-runner -c job"
    )
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except urllib.error.HTTPError as err:  # e.g. 403: check the Role and RoleBinding
        print(f"{err.code} {err.reason}: {err.read().decode()}", file=sys.stderr)
        sys.exit(1)
