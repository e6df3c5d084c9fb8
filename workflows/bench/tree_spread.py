"""Label trees built over a cluster: the same trees, their node classifiers trained on one
worker, then spread over N (as a fit on a cluster builds them).

Each count gets a LocalCluster of that many single-threaded worker processes; from a task
on one worker the fit's label trees of the training rows (the splits there, the nodes'
classifiers dealt out over the workers by their cost, ``ClusterNodes``) are built and
timed, the rows and labels already on that worker. Both builds must give the same trees
(checked), so only the seconds differ. Times are the best of ``--repeat``.
"""

from __future__ import annotations

import argparse
import json
import time

SUMMARY = "label trees built on 1 worker and spread over N: seconds, the same trees"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--train", required=True, metavar="URL", help="training data (XC text)")
    parser.add_argument("--workers", type=int, default=2, metavar="N", help="(default: 2)")
    parser.add_argument("--trees", type=int, default=None, help="(default: the fit's rule)")
    parser.add_argument("--repeat", type=int, default=2, help="best of (default: 2)")
    parser.add_argument("--json", metavar="OUT", help="also write the figures here")


def _build(rows, y_ptr, y_idx, centroids, n_trees: int, workers: tuple) -> tuple[float, list]:
    from dslide_dask.distributed.fused_build import ClusterNodes, worker_threads
    from dslide_dask.model.label_tree import build_forest

    worker_threads()  # a worker of one thread: one core, as a fit's building task
    nodes = ClusterNodes(workers) if len(workers) > 1 else None
    t0 = time.perf_counter()
    trees = build_forest(rows, y_ptr, y_idx, centroids, [t << 20 for t in range(n_trees)], nodes)
    return time.perf_counter() - t0, [tree.state() for tree in trees]


def _timed(n_workers: int, index, n_trees: int, repeat: int) -> tuple[float, list]:
    import logging

    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=n_workers, threads_per_worker=1, dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        workers = tuple(sorted(client.scheduler_info()["workers"]))
        args = (index._rows(), index.y_ptr, index.y_idx, index.centroids)
        sent = client.scatter(list(args), workers=[workers[0]])
        best, trees = float("inf"), []
        for _ in range(repeat + 1):  # the first compiles the kernels on the workers
            seconds, trees = client.submit(
                _build, *sent, n_trees, workers, workers=[workers[0]], pure=False
            ).result()
            best = min(best, seconds)
        return best, trees


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from dslide_dask.data import read_xc
    from dslide_dask.model.label_tree import trees_for
    from dslide_dask.model.neighbours import NeighbourIndex

    train = read_xc(args.train)
    index = NeighbourIndex.build(train.X, train.Y).with_centroids()
    n_trees = args.trees or trees_for(train.Y.indices, train.n_labels)
    one, want = _timed(1, index, n_trees, args.repeat)
    spread, got = _timed(args.workers, index, n_trees, args.repeat)
    same = all(np.array_equal(a[k], b[k]) for a, b in zip(want, got, strict=True) for k in a)
    print(f"{n_trees} label tree(s) of {train.n_points:,} rows, {train.n_labels:,} labels")
    print(f"  1 worker:   {one:.2f} s")
    print(
        f"  {args.workers} workers:  {spread:.2f} s ({spread / one:.2f}x); the same trees: {same}"
    )
    if args.json:
        figures = {"one": one, "spread": spread, "workers": args.workers, "same": same,
                   "trees": n_trees, "rows": train.n_points, "labels": train.n_labels}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0 if same else 1
