"""The commands in the Pods of workflows/k8s parse with the real parsers, checked
without a cluster (the manifests are loaded by tests/k8s.py): the runner's ``dslide
train``, the workers' preStop hook ``dslide leave``, ``dask scheduler`` and ``dask
worker`` (threads and memory agreeing with the Pods' resources, TLS where the variant
asks for it); and the one image that runs them all builds from the lock, as a non-root
user, with a warm numba cache.
"""

from __future__ import annotations

import argparse
import math
import re
import tomllib
from importlib.metadata import entry_points

import pytest
from dask.utils import parse_bytes

from tests.k8s import (
    DASKJOB_IDS,
    DASKJOBS,
    K8S,
    MANIFESTS,
    container,
    containers,
    pod_specs,
    quantity,
)


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
