"""``dslide leave``: a worker about to be stopped hands its part of the model off first.

Run it where a worker learns that it will go: a Kubernetes ``preStop`` hook (the worker
Pods of ``k8s/daskjob.yaml`` have one), a spot or preemptible instance's termination
notice, a maintenance script. It asks the scheduler to retire the worker; a worker that
holds part of a model is not retired by Dask, and the training run takes that as its
notice: at its next step boundary it moves the model onto the other workers (no step
redone) and retires the worker itself. Exits 0 once the worker has gone, 1 if it is
still there after ``--timeout`` seconds (keep that under the grace period).
"""

from __future__ import annotations

import argparse
import os
import time


def add_leave_parser(sub: argparse._SubParsersAction) -> None:
    from dslide_workflows.run_schema import TLS_FILES, add_setting_flags

    p = sub.add_parser(
        "leave",
        help="retire a worker, letting a training run hand its rows off first",
        description=__doc__.split("\n\n")[1].replace("\n", " ").replace("``", ""),
    )
    default = os.environ.get("DSLIDE_SCHEDULER_ADDRESS") or os.environ.get("DASK_SCHEDULER_ADDRESS")
    p.add_argument(
        "--scheduler-address",
        metavar="ADDR",
        default=default,
        help="(default: $DSLIDE_SCHEDULER_ADDRESS, else $DASK_SCHEDULER_ADDRESS, "
        "which the dask-kubernetes operator sets)",
    )
    p.add_argument(
        "--worker",
        metavar="WHO",
        default=os.environ.get("DASK_WORKER_NAME"),
        help="its address, name or host (default: $DASK_WORKER_NAME)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=100.0,
        metavar="SECONDS",
        help="give up after this long (default: 100, under Kubernetes' "
        "terminationGracePeriodSeconds of 120 in k8s/daskjob.yaml)",
    )
    # the certificates and the deadline of a run's settings (no LocalCluster: no --tls)
    add_setting_flags(p, names=(*TLS_FILES, "connect_timeout"))
    p.set_defaults(func=cmd_leave)


def cmd_leave(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout  # the whole of it, reaching the scheduler too
    from dslide_dask.distributed.moves.policy import leave
    from dslide_workflows.security import CONNECT_TIMEOUT, client_security, connect_client

    if not args.scheduler_address:
        raise ValueError("--scheduler-address (or DASK_SCHEDULER_ADDRESS) is required")
    if not args.worker:
        raise ValueError("--worker (or DASK_WORKER_NAME) is required")
    if not 0 < args.timeout <= 24 * 3600:
        raise ValueError(f"--timeout must be in (0, 86400] seconds, got {args.timeout:g}")
    security = client_security(args, args.scheduler_address)
    given = CONNECT_TIMEOUT if args.connect_timeout is None else args.connect_timeout
    if not 0 < given <= 24 * 3600:
        raise ValueError(f"--connect-timeout must be in (0, 86400] seconds, got {given:g}")
    left = max(1.0, deadline - time.monotonic())
    limit = f"{args.timeout:g} s (--timeout)" if left < given else None
    with connect_client(args.scheduler_address, security, min(left, given), limit) as client:
        try:
            left = max(0.0, deadline - time.monotonic())
            gone = leave(client, args.worker, left, stated=args.timeout)
        except TimeoutError as err:
            print(f"dslide leave: {err}")
            return 1
    if gone:
        print(f"dslide leave: {', '.join(gone)} retired")
    else:
        print(f"dslide leave: no worker {args.worker!r} in the cluster: nothing to do")
    return 0
