"""A saved model's training label counts: ``label_counts.npy`` beside its arrays and the
``training_labels`` block of ``meta.json`` (the rows counted, the training set's size).

PSP@k weighs each label by its propensity, which comes from how often the label occurred
in training. A trainer counts labels as batches go by (:class:`~dslide_dask.metrics.
TrainingLabels`), but a loaded model had only what its folder held: a model without a
neighbour index (a ``dslide train`` run's, or ``neighbours=0``) evaluated after ``load``
gave no PSP@k. The counts are written into the checkpoint folder before it is committed
and given back to the trainer on load; a model saved before them loads as before.
"""

from __future__ import annotations

import posixpath

import fsspec
import numpy as np

from dslide_dask.checkpoint.arrays import CheckpointError, read_array, write_array
from dslide_dask.checkpoint.schema import check_entry
from dslide_dask.checkpoint.store import META, Checkpoint
from dslide_dask.metrics import TrainingLabels
from dslide_dask.paths import guard_read, guard_write

#: The metadata block, and the file of the counts.
BLOCK = "training_labels"
FILE = "label_counts.npy"
_DTYPE = np.dtype(np.int64)


def save_label_counts(
    folder_url: str, labels: TrainingLabels | None, storage_options: dict | None = None
) -> dict:
    """Write the counts into the (uncommitted) checkpoint folder ``folder_url``; the
    metadata block to commit it with (empty when nothing was counted: no file)."""
    if labels is None or labels.rows <= 0 or labels.n_points <= 0:
        return {}
    fs, root = fsspec.core.url_to_fs(folder_url, **(storage_options or {}))
    path = guard_write(fs, root, posixpath.join(root, FILE))
    entry = write_array(fs, path, np.asarray(labels.counts, _DTYPE))
    return {BLOCK: {"rows": int(labels.rows), "n_points": int(labels.n_points), **entry}}


def load_label_counts(
    ckpt: Checkpoint, storage_options: dict | None = None
) -> TrainingLabels | None:
    """The counts saved with ``ckpt``'s model, checked (None: saved without them);
    :class:`CheckpointError` naming the file and what is wrong."""
    block = ckpt.meta.get(BLOCK)
    if block is None:
        return None
    where = f"{ckpt.url}/{META}"
    n_labels = int(ckpt.meta["n_labels"])
    if not isinstance(block, dict):
        raise CheckpointError(f"{where}: {BLOCK} must be an object")
    check_entry(posixpath.splitext(FILE)[0], block, where, None)
    rows, n_points = block.get("rows"), block.get("n_points")
    for name, value in (("rows", rows), ("n_points", n_points)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 62:
            raise CheckpointError(f"{where}: {BLOCK} {name} must be a positive integer")
    if block["dtype"] != _DTYPE.str or block["shape"] != [n_labels]:
        raise CheckpointError(
            f"{where}: {BLOCK} must be {_DTYPE.str}[{n_labels}] (one count a label), "
            f"got {block['dtype']}{block['shape']}"
        )
    path = guard_read(ckpt.fs, ckpt.path, posixpath.join(ckpt.path, FILE))
    counts = read_array(ckpt.fs, path, block)
    if counts.size and (counts.min() < 0 or counts.max() > rows):
        raise CheckpointError(
            f"{ckpt.fs.unstrip_protocol(path)}: label counts must be in [0, {rows}] "
            "(the rows counted)"
        )
    labels = TrainingLabels(n_labels)
    labels.counts = counts.astype(np.int64, copy=True)
    labels.rows, labels.n_points = int(rows), int(n_points)  # type: ignore[arg-type]
    return labels


def training_labels(trainer) -> TrainingLabels | None:
    """The label counts of a trainer in this process or on a cluster (its coordinator's)."""
    if hasattr(trainer, "coordinator"):  # a DistributedTrainer
        return trainer._wait(trainer.coordinator.training_labels())
    return getattr(trainer, "labels", None)


def give_labels(trainer, labels: TrainingLabels | None) -> None:
    """Hand a loaded model's counts to its trainer (here or its coordinator)."""
    if labels is None:
        return
    if hasattr(trainer, "coordinator"):
        trainer._wait(trainer.coordinator.set_training_labels(labels))
    else:
        trainer.labels = labels


def parts_with_labels(trainer, storage_options: dict | None = None, parts=None):
    """A ``parts`` writer for ``trainer.save`` that also writes the trainer's label
    counts (and then what ``parts``, if given, writes)."""

    def write(folder_url: str, meta: dict) -> dict:
        more = save_label_counts(folder_url, training_labels(trainer), storage_options)
        if parts is not None:
            more.update(parts(folder_url, {**meta, **more}))
        return more

    return write
