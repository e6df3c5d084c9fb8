"""Prediction graphs: per input partition, named tasks that run on workers.

``read-rows-<token>-i -> hidden-<token>-i -> shard-topk-<token>-i-s (every shard s) ->
merge-write-<token>-i``, then one ``write-manifest-<token>`` over the small entries
(with pairs left out of the answers: ``merge-<token>-i -> write-kept-<token>-i``).
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
from dslide_dask.data.label_pairs import LabelPairs
from dslide_dask.data.source import DataSource
from dslide_dask.distributed.liveness import workers_now
from dslide_dask.inference import model_cache, tasks
from dslide_dask.inference.output import check_output, clear_manifest, write_manifest
from dslide_dask.inference.serving import RANGES, check_ranges, serving_config
from dslide_dask.inference.spec import LeftOut, PredictSpec
from dslide_dask.inference.worker_memory import check_room, worker_bytes
from dslide_dask.masking import mask_text
from dslide_dask.metrics import add_sums, metrics_of_sums, widened


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
    entries, info = part_entries(spec, source, out_url, n_shards)
    token = dask.base.tokenize(spec, source, out_url)
    return delayed(write_manifest)(
        out_url, entries, info, spec.storage_options, dask_key_name=f"write-manifest-{token}"
    )


def part_entries(
    spec: PredictSpec,
    source: DataSource,
    out_url: str,
    n_shards: int,
    left_out: LeftOut | None = None,
) -> tuple[list, dict]:
    """Each partition's delayed manifest entry, its answers written, and the manifest's
    ``info``. ``left_out`` given, each partition's ``spec.k`` answers lose their rows'
    pairs on the worker and keep ``left_out.k``: a partition's first row is the rows
    counted before it, a chain of ``start-<token>-i`` tasks of one number each."""
    token = dask.base.tokenize(spec, source, out_url, left_out)
    entries, start = [], 0
    for i, part in enumerate(source.partitions):
        rows = delayed(tasks.read_rows)(part, dask_key_name=f"read-rows-{token}-{i}")
        if left_out is not None:
            entries.append(
                delayed(tasks.write_kept)(
                    spec, _answers(spec, rows, n_shards, token, i), start, left_out.pairs,
                    left_out.k, out_url, i, dask_key_name=f"write-kept-{token}-{i}",
                )
            )  # fmt: skip
            start = _next_start(start, rows, token, i)
        elif spec.fused:  # the whole model answers on one worker
            write = delayed(tasks.fused_write)
            entries.append(write(spec, rows, out_url, i, dask_key_name=f"fused-write-{token}-{i}"))
        else:
            entries.append(
                delayed(tasks.merge_write)(spec, _shard_tops(spec, rows, n_shards, token, i),
                                           out_url, i, dask_key_name=f"merge-write-{token}-{i}")
            )  # fmt: skip
    names = ("k", "exact", "tables", "candidates", "mips", "output_index", "fused")
    info = {name: getattr(spec, name) for name in names} | {"index": dict(spec.index)}
    info.update(model=spec.model_url, input=source.url)
    if left_out is not None:
        info.update(k=left_out.k, filter_labels=left_out.url)
    return entries, info


def _answers(spec: PredictSpec, rows, n_shards: int, token: str, i: int):
    """Partition ``i``'s delayed top-k ``(ids, scores)``: the whole model on one worker,
    or the network's shards' merged."""
    if spec.fused:
        return delayed(tasks.fused_topk_scores)(spec, rows, dask_key_name=f"fused-topk-{token}-{i}")
    tops = _shard_tops(spec, rows, n_shards, token, i)
    return delayed(tasks.merge)(spec, tops, dask_key_name=f"merge-{token}-{i}")


def _next_start(start, rows, token: str, i: int):
    """The delayed first row of partition ``i + 1``: ``start`` (partition ``i``'s) and
    the rows it read, one number a task."""
    n_rows = delayed(tasks.count_rows)(rows, dask_key_name=f"count-rows-{token}-{i}")
    return delayed(tasks.next_start)(start, n_rows, dask_key_name=f"start-{token}-{i}")


def metric_sums_graph(
    spec: PredictSpec,
    source: DataSource,
    ks: tuple[int, ...],
    n_shards: int,
    pairs=None,
) -> list:
    """Each partition's delayed metric sums (:func:`~dslide_dask.metrics.metric_sums`):
    its rows and labels read, answered and scored on a worker, ``pairs`` (a
    :class:`~dslide_dask.data.label_pairs.LabelPairs`, or a future of one) left out
    first; ``read-data -> fused-topk (or the shards') -> score``."""
    token = dask.base.tokenize(spec, source, ks, pairs)
    sums, start = [], 0
    for i, part in enumerate(source.partitions):
        data = delayed(tasks.read_data)(part, dask_key_name=f"read-data-{token}-{i}")
        rows = delayed(tasks.features)(data, dask_key_name=f"features-{token}-{i}")
        answers = _answers(spec, rows, n_shards, token, i)
        sums.append(
            delayed(tasks.score_part)(spec, answers, data, ks, start, pairs,
                                      dask_key_name=f"score-{token}-{i}")
        )  # fmt: skip
        if pairs is not None:
            start = _next_start(start, rows, token, i)
    return sums


def evaluate_on_cluster(
    client: Client,
    spec: PredictSpec,
    source: DataSource,
    ks: tuple[int, ...],
    *,
    exclude: LabelPairs | None = None,
    show_progress: bool = False,
) -> tuple[dict[str, float], int]:
    """``evaluate``'s metrics of the model ``spec`` names on every row of ``source``, on
    the cluster, and the rows scored: each worker reads its partitions' rows and labels
    and answers them with its cached model (``spec.k``: the most of ``ks``), and only
    each partition's metric sums reach the client. ``exclude`` (rows in input order) as
    :func:`predict_to_storage` takes it."""
    spec, n_shards = _answering(client, replace(spec, k=max(ks)), source, exclude)
    pairs = client.scatter(exclude) if exclude is not None else None
    futures = client.compute(metric_sums_graph(spec, source, ks, n_shards, pairs))
    if show_progress:
        progress(futures)
    total = add_sums(client.gather(futures))
    if not total["rows"]:
        raise ValueError(f"{source.url}: no rows to score")
    if exclude is not None:
        exclude.check_rows(int(total["rows"]), rows_of="the test set's")
    return metrics_of_sums(total), int(total["rows"])


def _answering(
    client: Client, spec: PredictSpec, source: DataSource, exclude: LabelPairs | None
) -> tuple[PredictSpec, int]:
    """``spec`` as the workers answer it, and the model's shard count: its model resolved
    (workers cache by the URL), the fused parts asked only where the model has them (else
    the network answers shard by shard), ``k`` widened past the most labels a row of
    ``exclude`` leaves out; the input and the workers' room checked."""
    ckpt = model_cache.resolve(spec.model_url, spec.storage_options)
    spec = replace(spec, model_url=ckpt.url, fused=spec.fused and has_fused(ckpt))
    if exclude is not None:
        spec = replace(spec, k=widened(spec.k, exclude.widest(), int(ckpt.meta["n_labels"])))
    n_shards = check_input(spec, source)
    check_room(worker_bytes(ckpt, spec), workers_now(client))
    return spec, n_shards


def _shard_tops(spec: PredictSpec, rows, n_shards: int, token: str, i: int) -> list:
    """Each shard's delayed top-k of partition ``i``'s rows (their hidden vectors once)."""
    h = delayed(tasks.hidden)(spec, rows, dask_key_name=f"hidden-{token}-{i}")
    return [
        delayed(tasks.shard_topk)(spec, h, s, dask_key_name=f"shard-topk-{token}-{i}-{s}")
        for s in range(n_shards)
    ]


def predict_to_storage(
    client: Client,
    spec: PredictSpec,
    source: DataSource,
    out_url: str,
    *,
    show_progress=False,
    exclude: LabelPairs | None = None,
) -> dict:
    """Predict every row of ``source`` on the cluster into folder ``out_url`` (see
    :mod:`dslide_dask.inference.output`); returns the manifest written. ``exclude``
    (rows in input order): each row's ``spec.k`` answers are those left once its pairs
    are dropped, on the workers (the pairs scattered once). The rows are counted as
    they are read, so a pair past them is found at the end: it raises
    :class:`~dslide_dask.errors.XCFormatError` naming its line, here (not in a task,
    whose worker would log it), and the folder gets no manifest."""
    k = spec.k
    spec, n_shards = _answering(client, spec, source, exclude)
    check_output(out_url, len(source.partitions), spec.storage_options)
    clear_manifest(out_url, spec.storage_options)
    if exclude is None:
        future = client.compute(prediction_graph(spec, source, out_url, n_shards))
        if show_progress:
            progress(future)
        return future.result()
    left_out = LeftOut(client.scatter(exclude), k, mask_text(exclude.url))
    entries, info = part_entries(spec, source, out_url, n_shards, left_out)
    futures = client.compute(entries)
    if show_progress:
        progress(futures)
    parts = client.gather(futures)
    exclude.check_rows(sum(p["n_points"] for p in parts), rows_of="the input's")
    return write_manifest(out_url, parts, {**info, "left_out": len(exclude.rows)},
                          spec.storage_options)  # fmt: skip


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
