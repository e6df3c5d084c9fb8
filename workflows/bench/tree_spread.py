"""Label trees built over a cluster: the same trees, their node classifiers trained on one
worker, then spread over N (as a fit on a cluster builds them).

Each count gets a LocalCluster of that many single-threaded worker processes; from a task
on one worker the fit's label trees of the training rows (the splits there, the nodes'
classifiers dealt out over the workers by their cost and kept there, ``ShardNodes``) are
built and timed, the rows and labels already on that worker. Both builds must give the
same trees (checked: the pieces saved and joined), so only the seconds differ. Times are
the best of ``--repeat``.
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


def _build(rows, y_ptr, y_idx, centroids, n_trees: int, shards: tuple) -> tuple[float, list]:
    from dslide_dask.distributed.fused_worker import worker_threads
    from dslide_dask.distributed.tree_shards import ShardNodes
    from dslide_dask.model.label_tree import build_forest

    worker_threads()  # a worker of one thread: one core, as a fit's building task
    nodes = ShardNodes(list(shards)) if shards else None
    t0 = time.perf_counter()
    trees = build_forest(rows, y_ptr, y_idx, centroids, [t << 20 for t in range(n_trees)], nodes)
    for call in [shard.assemble(trees) for shard in shards]:
        call.result()
    return time.perf_counter() - t0, [] if shards else [tree.state() for tree in trees]


def _joined(actors: list) -> list:
    """The trees the pieces hold, saved and joined as a load joins them."""
    import tempfile

    import numpy as np

    from dslide_dask.checkpoint.tree_pieces import joined_trees

    with tempfile.TemporaryDirectory() as folder:
        entries: dict = {}
        for p, actor in enumerate(actors):
            entries.update(actor.save(folder, p, None).result())
        arrays = joined_trees({n: np.load(f"{folder}/neighbours/{n}.npy") for n in entries})
    prefixes = sorted({n.rsplit("_", 1)[0] for n in arrays if n.endswith("_perm")})
    return [{k.split("_", 1)[1]: v for k, v in arrays.items() if k.startswith(f"{p}_")}
            for p in prefixes]  # fmt: skip


def _timed(n_workers: int, index, n_trees: int, repeat: int) -> tuple[float, list]:
    import logging

    from distributed import Client, LocalCluster

    from dslide_dask.distributed.tree_shards import start_shards

    with (
        LocalCluster(
            n_workers=n_workers, threads_per_worker=1, dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        workers = sorted(client.scheduler_info()["workers"])
        args = (index._rows(), index.y_ptr, index.y_idx, index.centroids)
        sent = client.scatter(list(args), workers=[workers[0]])
        best, trees = float("inf"), []
        for _ in range(repeat + 1):  # the first compiles the kernels on the workers
            shards = start_shards(client, workers) if n_workers > 1 else []
            actors = tuple(shard.result() for shard in shards)
            seconds, trees = client.submit(
                _build, *sent, n_trees, actors, workers=[workers[0]], pure=False
            ).result()
            best = min(best, seconds)
            if shards:
                trees = _joined(list(actors))
            for shard in shards:
                shard.release()
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
