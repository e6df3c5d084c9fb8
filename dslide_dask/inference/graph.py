"""Prediction graphs: per input partition, named tasks that run on workers.

``read-rows-<token>-i -> hidden-<token>-i -> shard-topk-<token>-i-s (every shard s) ->
merge-write-<token>-i``, then one ``write-manifest-<token>`` over the small entries.
Rows are read from storage and results written to storage by the tasks themselves:
nothing but the manifest's entries (a few numbers a partition) reaches the client. The
key prefixes are what the dashboard's task stream and progress bars show.
"""

from __future__ import annotations

from dataclasses import replace

import dask
import dask.array as da
import numpy as np
from dask.delayed import delayed
from distributed import Client, progress

from dslide_dask.checkpoint.fused import check_fused, has_fused
from dslide_dask.checkpoint.model import config_of
from dslide_dask.checkpoint.output_index import check_output_index
from dslide_dask.current_client import current_client
from dslide_dask.data.csr import as_csr
from dslide_dask.data.source import DataSource
from dslide_dask.distributed.liveness import workers_now
from dslide_dask.inference import model_cache, tasks
from dslide_dask.inference.output import check_output, clear_manifest, write_manifest
from dslide_dask.inference.serving import RANGES, check_ranges, serving_config
from dslide_dask.inference.spec import PredictSpec
from dslide_dask.inference.worker_memory import check_room, worker_bytes


def check_input(spec: PredictSpec, source: DataSource) -> int:
    """The model's shard count, once the input is checked against the model."""
    ckpt = model_cache.resolve(spec.model_url, spec.storage_options)
    n_features, n_labels = int(ckpt.meta["n_features"]), int(ckpt.meta["n_labels"])
    if source.n_features != n_features:
        raise ValueError(
            f"{source.url}: {source.n_features} features, the model {ckpt.url} takes {n_features}"
        )
    if spec.k > n_labels:
        raise ValueError(f"k must be at most the model's {n_labels} labels, got {spec.k}")
    if spec.output_index:  # checked here (size, checksums, the model's) before any task
        check_output_index(ckpt)
    if spec.fused:
        check_fused(ckpt)
    index = dict(spec.index)
    serving_config(config_of(ckpt), index)
    check_ranges(index.get("ranges", RANGES), spec.mips)
    return len(ckpt.meta["shards"])


def prediction_graph(spec: PredictSpec, source: DataSource, out_url: str, n_shards: int):
    """The delayed manifest of predicting every partition of ``source`` into ``out_url``
    (``spec.model_url`` must already be resolved, see :func:`predict_to_storage`)."""
    token = dask.base.tokenize(spec, source, out_url)
    entries = []
    for i, part in enumerate(source.partitions):
        rows = delayed(tasks.read_rows)(part, dask_key_name=f"read-rows-{token}-{i}")
        if spec.fused:  # the whole model answers on one worker
            write = delayed(tasks.fused_write)
            entries.append(write(spec, rows, out_url, i, dask_key_name=f"fused-write-{token}-{i}"))
            continue
        h = delayed(tasks.hidden)(spec, rows, dask_key_name=f"hidden-{token}-{i}")
        tops = [
            delayed(tasks.shard_topk)(spec, h, s, dask_key_name=f"shard-topk-{token}-{i}-{s}")
            for s in range(n_shards)
        ]
        entries.append(
            delayed(tasks.merge_write)(spec, tops, out_url, i,
                                       dask_key_name=f"merge-write-{token}-{i}")
        )  # fmt: skip
    names = ("k", "exact", "tables", "candidates", "mips", "output_index", "fused")
    info = {name: getattr(spec, name) for name in names} | {"index": dict(spec.index)}
    info.update(model=spec.model_url, input=source.url)
    return delayed(write_manifest)(
        out_url, entries, info, spec.storage_options, dask_key_name=f"write-manifest-{token}"
    )


def predict_to_storage(
    client: Client, spec: PredictSpec, source: DataSource, out_url: str, *, show_progress=False
) -> dict:
    """Predict every row of ``source`` on the cluster into folder ``out_url`` (see
    :mod:`dslide_dask.inference.output`); returns the manifest written."""
    ckpt = model_cache.resolve(spec.model_url, spec.storage_options)
    # workers cache by the URL; a model without fused parts is answered shard by shard
    spec = replace(spec, model_url=ckpt.url, fused=spec.fused and has_fused(ckpt))
    n_shards = check_input(spec, source)
    check_room(worker_bytes(ckpt, spec), workers_now(client))
    check_output(out_url, len(source.partitions), spec.storage_options)
    clear_manifest(out_url, spec.storage_options)
    future = client.compute(prediction_graph(spec, source, out_url, n_shards))
    if show_progress:
        progress(future)
    return future.result()


def _block_topk(block, spec: PredictSpec) -> np.ndarray:
    fused = model_cache.fused(spec)  # its network is read only if it asks it
    n_features = fused.index.n_features if fused else model_cache.model(spec).n_features
    X = as_csr(block, n_features, name="X")
    return tasks.fused_topk_scores(spec, X)[0]


def topk_blocks(X: da.Array, spec: PredictSpec, client: Client | None = None) -> da.Array:
    """Top-k label ids of the rows of a dask array (row blocks of numpy, scipy.sparse or
    ``sparse`` arrays, one block of columns), as a dask array of ``[rows, k]`` int64,
    each block computed on a worker with its cached model: for
    ``SlideClassifier.predict_topk`` on dask collections (the model saved first). The
    workers of ``client`` (None: the current client, if any) are checked for room first,
    as :func:`predict_to_storage` checks them."""
    ckpt = model_cache.resolve(spec.model_url, spec.storage_options)
    spec = replace(spec, model_url=ckpt.url, fused=spec.fused and has_fused(ckpt))
    if (client := client if client is not None else current_client()) is not None:
        check_room(worker_bytes(ckpt, spec), workers_now(client))
    if X.ndim != 2:
        raise ValueError(f"X must be 2-dimensional, got {X.ndim} dimensions")
    n_features = int(ckpt.meta["n_features"])
    if X.shape[1] != n_features:
        raise ValueError(f"X has {X.shape[1]} features, the model {ckpt.url} takes {n_features}")
    if X.numblocks[1] != 1:
        X = X.rechunk({1: -1})
    return da.map_blocks(
        _block_topk, X, spec, dtype=np.int64, chunks=(X.chunks[0], (spec.k,)),
        name="predict-topk-" + dask.base.tokenize(X, spec),
        meta=np.empty((0, 0), np.int64),
    )  # fmt: skip
