"""The runs of ``dslide bench cluster`` (:mod:`.cluster`) on the emulated nodes: the Dask
cluster, one dslide-dask run (driven by :func:`dslide_runner` inside the head namespace:
``python -m dslide_workflows.bench.cluster_runs --runner CONFIG``) and one DDP run (a
:mod:`.ddp` rank in each node).

Apart from the benchmark's plan and report because these are the processes it starts in
the namespaces, and what runs inside them.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dslide_workflows.bench.data import load_datasets
from dslide_workflows.cluster.netns import EmulatedCluster, bytes_sent, read_counters

SCHEDULER_PORT = 8786


def child_env() -> dict[str, str]:
    """Environment of every node process: one compute thread, quiet spinning."""
    one = {
        k: "1"
        for k in ("NUMBA_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
    }
    return {**os.environ, **one, "OMP_WAIT_POLICY": "PASSIVE", "TORCH_CPP_LOG_LEVEL": "ERROR"}


def _wait_all(net: EmulatedCluster, procs: list[subprocess.Popen], what: str, log: Path) -> None:
    """Wait for every process; if one fails, stop the rest and fail naming the log."""
    while True:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            for p in procs:
                net.stop(p)
            from dslide_workflows.errors import JobFailed

            raise JobFailed(f"{what} failed (exit codes {codes}); see {log}")
        if all(c == 0 for c in codes):
            return
        time.sleep(0.2)


# -- dslide-dask -----------------------------------------------------------------------------
@contextlib.contextmanager
def dask_cluster(net: EmulatedCluster, logs: Path) -> Iterator[str]:
    """A Dask scheduler in the head namespace and a 1-thread worker in each node."""
    address = f"tcp://{net.head_node.address}:{SCHEDULER_PORT}"
    py = [sys.executable, "-m"]
    log = open(logs / "dask.log", "ab")  # noqa: SIM115 - closed below
    procs = [
        net.popen(
            net.head_node,
            [
                *py,
                "distributed.cli.dask_scheduler",
                "--host",
                net.head_node.address,
                "--port",
                str(SCHEDULER_PORT),
                "--no-dashboard",
            ],
            env=child_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    ]
    for node in net.nodes:
        argv = [
            *py,
            "distributed.cli.dask_worker",
            address,
            "--host",
            node.address,
            "--nthreads",
            "1",
            "--no-nanny",
            "--no-dashboard",
            "--memory-limit",
            "0",
            "--name",
            node.name,
            "--death-timeout",
            "60",
        ]
        procs.append(net.popen(node, argv, env=child_env(), stdout=log, stderr=subprocess.STDOUT))
    try:
        yield address
    finally:
        for proc in reversed(procs):
            net.stop(proc)
        log.close()


def run_dslide(net: EmulatedCluster, scheduler: str, config: dict, logs: Path) -> dict:
    """One dslide-dask run, driven from the head namespace; its measurements."""
    result = logs / f"dslide-{config['tag']}.json"
    config = {**config, "scheduler": scheduler, "switch": net.switch, "result": str(result)}
    log_path = logs / f"dslide-{config['tag']}.log"
    with open(log_path, "wb") as log:
        argv = [
            sys.executable,
            "-m",
            "dslide_workflows.bench.cluster_runs",
            "--runner",
            json.dumps(config),
        ]
        proc = net.popen(net.head_node, argv, env=child_env(), stdout=log, stderr=subprocess.STDOUT)
        _wait_all(net, [proc], "the dslide-dask run", log_path)
    return json.loads(result.read_text())


def dslide_runner(config: dict[str, Any]) -> None:
    """In the head namespace: train on the Dask cluster, time the steps after the warm-up
    (read at a coordinator-call boundary), count their bytes, optionally score P@k."""
    from distributed import Client

    from dslide_dask import SlideConfig
    from dslide_dask.data.stream import Stream
    from dslide_dask.distributed import DistributedTrainer
    from dslide_dask.distributed.trainer import STEPS_PER_CALL as PER_CALL

    if config["warmup"] % PER_CALL:  # the window opens between two coordinator calls
        raise ValueError(f"the warm-up must be a multiple of {PER_CALL} steps")
    train, test = load_datasets(Path(config["data"]))
    steps, warmup, batch = config["steps"], config["warmup"], config["batch_size"]
    cfg = SlideConfig(**config["params"])
    marks: dict[str, Any] = {}

    def mark(stats: dict) -> None:
        if stats["step"] == warmup:
            marks["c0"], marks["t0"] = read_counters(config["switch"]), time.perf_counter()

    with Client(config["scheduler"], timeout=60) as client:
        client.wait_for_workers(config["nodes"], timeout=120)
        with DistributedTrainer(client, cfg, train.n_features, train.n_labels) as trainer:
            stream = Stream(batch, seed=config["seed"], shuffle=False)
            history = trainer.train(train.slice(0, steps * batch), stream, callback=mark)
            t1, c1 = time.perf_counter(), read_counters(config["switch"])
            timed = steps - warmup
            out = {
                "seconds_per_step": (t1 - marks["t0"]) / timed,
                "bytes_per_step": bytes_sent(marks["c0"], c1) / timed,
                "timed_steps": timed,
                "samples": steps * batch,
                "step_seconds": [h["seconds"] for h in history],
                "payload_bytes_per_step": sum(
                    h["bytes_sent"] + h["bytes_received"] for h in history[warmup:]
                )
                / timed,
                "active": sum(h["active"] for h in history[warmup:]) / timed,
            }
            if config["evaluate"]:
                out.update(trainer.evaluate(test))
    Path(config["result"]).write_text(json.dumps(out))


# -- DDP ------------------------------------------------------------------------------------
def run_ddp(net: EmulatedCluster, config: dict, logs: Path, port: int) -> dict:
    """One DDP run, a rank in each node; rank 0's measurements."""
    result = logs / f"ddp-{config['tag']}.json"
    log_path = logs / f"ddp-{config['tag']}.log"
    master = f"{net.nodes[0].address}:{port}"
    with open(log_path, "wb") as log:
        procs = []
        for rank, node in enumerate(net.nodes):
            argv = [
                sys.executable,
                "-m",
                "dslide_workflows.bench.ddp",
                "--rank",
                str(rank),
                "--world",
                str(len(net.nodes)),
                "--master",
                master,
                "--data",
                config["data"],
                "--steps",
                str(config["steps"]),
                "--warmup",
                str(config["warmup"]),
                "--batch-size",
                str(config["batch_size"]),
                "--lr",
                str(config["lr"]),
                "--hidden",
                ",".join(map(str, config["hidden"])),
                "--seed",
                str(config["seed"]),
                "--switch-netns",
                net.switch,
                "--result",
                str(result),
            ] + ["--evaluate"] * config["evaluate"]
            procs.append(net.popen(node, argv, env=child_env(), stdout=log, stderr=log))
        _wait_all(net, procs, "the DDP run", log_path)
    return json.loads(result.read_text())


def main(argv: list[str] | None = None) -> int:
    """``python -m dslide_workflows.bench.cluster_runs --runner CONFIG``: the dslide-dask run
    inside the head namespace. The benchmark itself is ``dslide bench cluster``."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] != "--runner":
        print(
            "usage: python -m dslide_workflows.bench.cluster_runs --runner CONFIG_JSON "
            "(the benchmark itself: dslide bench cluster)",
            file=sys.stderr,
        )
        return 2
    dslide_runner(json.loads(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
