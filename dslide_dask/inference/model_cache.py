"""One loaded model per worker process, kept across tasks.

A model may be hundreds of MB: every task of a prediction graph asks for it, and only
the first one on a worker reads it from storage. The cache is keyed by the resolved
checkpoint URL (a checkpoint folder never changes once committed) and the serving
tables asked for, and holds the newest few models only.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from dslide_dask.checkpoint.arrays import CheckpointError
from dslide_dask.checkpoint.fused import load_fused
from dslide_dask.checkpoint.label_counts import load_label_counts
from dslide_dask.checkpoint.model import load_network
from dslide_dask.checkpoint.output_index import load_output_index
from dslide_dask.checkpoint.store import Checkpoint, open_checkpoint
from dslide_dask.inference.serving import reindex
from dslide_dask.inference.spec import PredictSpec
from dslide_dask.metrics import propensity
from dslide_dask.model.fused import FusedModel
from dslide_dask.model.network import SlideNetwork

KEEP = 2  # models kept per process
_models: OrderedDict[tuple, tuple[SlideNetwork | None, FusedModel | None]] = OrderedDict()
_lock = threading.Lock()
loads = 0  # how many models this process read from storage (tests look)


def resolve(url: str, storage_options: dict | None = None) -> Checkpoint:
    """The checkpoint a model URL names: a checkpoint folder, a checkpoint store, or a
    run folder (its final ``model/``, else its latest checkpoint)."""
    try:
        return open_checkpoint(url.rstrip("/") + "/model", storage_options)
    except CheckpointError:
        return open_checkpoint(url, storage_options)


def model(spec: PredictSpec) -> SlideNetwork:
    """The network of checkpoint ``spec.model_url`` with the serving tables ``spec``
    asks for, loaded and hashed at most once per process."""
    net = served(spec)[0]
    if net is None:  # fused parts that never ask it: loaded only now
        net = served(spec, network=True)[0]
    assert net is not None
    return net


def fused(spec: PredictSpec) -> FusedModel | None:
    """The fused parts of the model (None: its network answers alone), loaded with it."""
    return served(spec)[1]


def served(
    spec: PredictSpec, network: bool = False
) -> tuple[SlideNetwork | None, FusedModel | None]:
    """The network and fused parts of checkpoint ``spec.model_url``, loaded at most once
    per process (``spec.fused`` False: the network alone); with ``spec.output_index``,
    the fused parts answer through their serving indexes too, as the estimator's after
    ``build_index`` (:meth:`~dslide_dask.model.fused.FusedModel.served`). The network
    (its output layer: hundreds of MB) and its output index are not read where the
    fused parts never ask it (None), unless ``network``."""
    global loads
    key = (spec.model_url, spec.mips, spec.index, spec.output_index, spec.fused)
    with _lock:  # threads of one worker wait for the first load instead of repeating it
        entry = _models.get(key)
        if entry is None or (network and entry[0] is None):
            ckpt = open_checkpoint(spec.model_url, spec.storage_options)
            parts = load_fused(ckpt, spec.storage_options) if spec.fused else None
            net, index = None, None
            if network or parts is None or parts.asks_network():
                net = load_network(ckpt, answering=True)
                reindex(net, spec.mips, **dict(spec.index))
                if spec.output_index:  # checked, and split for the model's shards
                    index = load_output_index(ckpt)
                    index.attach(net.shards)
            if parts is not None and spec.output_index:
                parts = parts.served(None if index is None else index.settings)
            loads += 1
            entry = _models[key] = (net, parts)
            while len(_models) > KEEP:
                _models.popitem(last=False)
        _models.move_to_end(key)
        return entry


def propensities(spec: PredictSpec) -> np.ndarray | None:
    """PSP@k's label propensities of the model, as ``evaluate`` takes them: from its
    fused parts' indexed rows, else from the rows its network trained on (None: saved
    without counts, no PSP@k); worked out once per process."""
    fused_parts = fused(spec)
    if fused_parts is not None:  # cached with its index
        return fused_parts.index.propensities
    key = (spec.model_url, spec.fused)
    if key not in _propensities:  # two threads at once work out the same numbers
        labels = load_label_counts(open_checkpoint(spec.model_url, spec.storage_options))
        args = labels.metric_args() if labels is not None else None
        _propensities[key] = propensity(args["label_counts"], args["n_train"]) if args else None
    return _propensities[key]


_propensities: dict[tuple, np.ndarray | None] = {}
