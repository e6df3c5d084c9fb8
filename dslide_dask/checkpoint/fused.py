"""A saved model's fused parts: the neighbour index in ``neighbours/`` and the fusion
settings in ``meta.json``'s ``fusion`` block, written into the checkpoint folder before
it is committed, so a model is saved, and loaded, whole or not at all.

Models saved before the block existed keep their settings in the estimator's block
(``neighbour_weight_``, ``tail_exponent_`` and the parameters): read from there.
"""

from __future__ import annotations

from dslide_dask.checkpoint.arrays import CheckpointError
from dslide_dask.checkpoint.neighbours import load_neighbours, model_expects, save_neighbours
from dslide_dask.checkpoint.store import META, Checkpoint
from dslide_dask.model.fused import MAX_TREE_POWER, FusedModel, Fusion, check_weights
from dslide_dask.model.fusion import CENTROID_WEIGHTS, TAILS

#: The metadata block of the fusion settings.
BLOCK = "fusion"


def save_fused(
    folder_url: str,
    fused: FusedModel,
    storage_options: dict | None = None,
    pieces: dict[str, dict] | None = None,
) -> dict:
    """Write ``fused``'s index into the (uncommitted) checkpoint folder ``folder_url``
    (``pieces``: the entries its label trees' pieces wrote there); the metadata block to
    commit it with."""
    if fused.fusion.weight is None:
        raise ValueError("a fused model is saved once its weights are chosen")
    save_neighbours(folder_url, fused.index, storage_options, pieces)
    return {BLOCK: fused.fusion.params()}


def has_fused(ckpt: Checkpoint) -> bool:
    """Whether the checkpoint's model has fused parts."""
    old = ckpt.meta.get("estimator")
    return BLOCK in ckpt.meta or (isinstance(old, dict) and "neighbour_weight_" in old)


def load_fused(
    ckpt: Checkpoint, storage_options: dict | None = None, trees: bool = True
) -> FusedModel | None:
    """The fused parts of a checkpoint's model, checked (None: its network answers
    alone); :class:`CheckpointError` naming the file and the setting that is wrong.
    ``trees=False``: without the label trees, which are loaded in pieces elsewhere
    (``checkpoint.neighbours.load_tree_pieces``)."""
    if not has_fused(ckpt):
        return None
    fusion = _fusion(ckpt)
    expects = model_expects(ckpt.meta, fusion.weight, fusion.tree_power)
    index = load_neighbours(ckpt.url, storage_options, **expects, trees=trees)
    if index.n_labels != int(ckpt.meta["n_labels"]):
        raise CheckpointError(f"{ckpt.url}: the neighbour index has other labels")
    if fusion.weight is not None and len(fusion.weight) == 4 and fusion.weight[3] > 0:
        index = index.with_centroids()  # derived from the points, never stored
    return FusedModel(index, fusion)


def check_fused(ckpt: Checkpoint) -> Fusion | None:
    """The fusion settings of a checkpoint's model, checked from its metadata alone
    (None: no fused parts), as a client checks a model before its workers load it."""
    return _fusion(ckpt) if has_fused(ckpt) else None


def _fusion(ckpt: Checkpoint) -> Fusion:
    where = f"{ckpt.url}/{META}"
    block = ckpt.meta.get(BLOCK)
    if block is None:  # saved before the block: the estimator's names
        old = ckpt.meta["estimator"]
        block = {
            "neighbours": old.get("neighbours"),
            "neighbour_mix": old.get("neighbour_mix", 0.0),  # before it: hidden space alone
            "neighbour_weight": old.get("neighbour_weight_"),
            "tail_exponent": old.get("tail_exponent_", 0.0),  # before the tail boost: 0
            "label_tree": old.get("label_tree", 0.0),  # before the trees: none
        }
        suffix = "_"
    elif isinstance(block, dict):
        suffix = ""
    else:
        raise CheckpointError(f"{where}: {BLOCK} must be an object")
    weight = block.get("neighbour_weight")
    if isinstance(weight, int | float) and not isinstance(weight, bool):
        weight = [weight, 0.0]  # one weight: the input's
    if not (
        isinstance(weight, list)
        and all(isinstance(w, int | float) and not isinstance(w, bool) for w in weight)
        and _valid(weight)
    ):
        raise CheckpointError(
            f"{where}: neighbour_weight{suffix} must be two weights in [0, 1] of sum <= 1, "
            f"the label classifiers' in [0, 1] and the centroids' in "
            f"[0, {max(CENTROID_WEIGHTS)}]"
        )
    ranges = {
        "tail_exponent": max(TAILS),
        "neighbour_mix": 1.0,
        "label_tree": MAX_TREE_POWER,
    }
    for name, high in ranges.items():
        value = block.get(name)
        if not (isinstance(value, int | float) and not isinstance(value, bool)) or not (
            0.0 <= value <= high
        ):
            raise CheckpointError(f"{where}: {name}{suffix} must be in [0, {high}]")
    k = block.get("neighbours")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= 1 << 16:
        raise CheckpointError(f"{where}: neighbours must be an integer in [1, 65536]")
    return Fusion(
        k,
        float(block["neighbour_mix"]),
        tuple(float(w) for w in weight),
        float(block["tail_exponent"]),
        float(block["label_tree"]),
    )


def _valid(weight: list) -> bool:
    try:
        check_weights(tuple(weight))
    except ValueError:
        return False
    return True
