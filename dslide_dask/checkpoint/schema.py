"""The shape ``meta.json`` must have before any of its numbers is used.

Loading indexes the metadata (``meta["shards"][0]["step"]``, ``meta["layout"]...``) and
sizes arrays and networks by it: a missing key, a wrong type or a size that disagrees
with the files would surface as a KeyError, an IndexError or a huge allocation. Here the
whole structure is checked once, and every array entry against its file's real size, so
what loading then allocates is bounded by what is on disk.
"""

from __future__ import annotations

import dataclasses
import numbers

import numpy as np

from dslide_dask.checkpoint.arrays import CheckpointError
from dslide_dask.model.config import SlideConfig, check_float, check_int
from dslide_dask.model.fused import MAX_TREE_POWER
from dslide_dask.model.fusion import CENTROID_WEIGHTS, TAILS
from dslide_dask.model.neighbours import MAX_TREES

_INT32_MAX = int(np.iinfo(np.int32).max)
#: a .npy header is at most this long (numpy pads it to 64-byte multiples, < 64 KiB)
_NPY_HEADER_MAX = 1 << 16
_REQUIRED = ("step", "config", "n_features", "n_labels", "layout", "shards", "arrays", "hidden")


def check_meta(meta, where: str, sizes: dict[str, int] | None = None) -> None:
    """Raise :class:`CheckpointError` naming ``where`` unless ``meta`` is complete and
    consistent; ``sizes`` (array name -> bytes on storage) are checked against the
    entries when given."""
    _require(isinstance(meta, dict), where, "not a JSON object")
    missing = [k for k in _REQUIRED if k not in meta]
    _require(not missing, where, f"metadata lacks {', '.join(missing)}")
    _int(meta["step"], f"{where}: step", 0, 1 << 62)
    n_features = _int(meta["n_features"], f"{where}: n_features", 1, _INT32_MAX)
    n_labels = _int(meta["n_labels"], f"{where}: n_labels", 1, _INT32_MAX)
    _require(isinstance(meta["config"], dict), where, "config is not a mapping")
    hidden = meta["config"].get("hidden")
    _require(
        isinstance(hidden, list) and hidden and all(_is_int(h) and h >= 1 for h in hidden),
        where,
        f"config hidden must be a list of positive integers, got {hidden!r}",
    )
    layout = meta["layout"]
    _require(isinstance(layout, dict), where, "layout is not a mapping")
    n_neurons = _int(layout.get("n_neurons"), f"{where}: layout n_neurons", 1, _INT32_MAX)
    _require(n_neurons == n_labels, where, f"layout has {n_neurons} neurons, n_labels {n_labels}")
    pattern = layout.get("pattern")
    _require(
        isinstance(pattern, list) and pattern and all(_is_int(p) and p >= 0 for p in pattern),
        where,
        "layout pattern must be a non-empty list of shard numbers",
    )
    shards = meta["shards"]
    _require(isinstance(shards, list) and shards, where, "shards must be a non-empty list")
    for i, s in enumerate(shards):
        _require(isinstance(s, dict), where, f"shards[{i}] is not a mapping")
        for key in ("step", "neurons"):
            _int(s.get(key), f"{where}: shards[{i}] {key}", 0, 1 << 62)
    _require(
        max(pattern) < len(shards),
        where,
        f"layout pattern names shard {max(pattern)} but there are {len(shards)} shards",
    )
    _require(isinstance(meta["hidden"], dict), where, "hidden is not a mapping")
    _int(meta["hidden"].get("step"), f"{where}: hidden step", 0, 1 << 62)
    if "position" in meta:
        pos = meta["position"]
        _require(isinstance(pos, dict), where, "position is not a mapping")
        for key in ("epoch", "batch"):
            _int(pos.get(key), f"{where}: position {key}", 0, 1 << 62)
    arrays = meta["arrays"]
    _require(isinstance(arrays, dict), where, "arrays is not a mapping")
    for name, entry in arrays.items():
        check_entry(name, entry, where, None if sizes is None else sizes.get(name, -1))
    parts = _check_hidden(
        meta["hidden"].get("slices"), arrays, n_features, hidden, len(shards), where
    )
    rows = 0
    for i in range(len(shards)):
        entry = arrays.get(f"shard-{i:04d}/W")
        _require(entry is not None, where, f"no array shard-{i:04d}/W")
        _require(
            entry["shape"] == [shards[i]["neurons"], hidden[-1]],
            where,
            f"shard-{i:04d}/W has shape {entry['shape']}, expected "
            f"[{shards[i]['neurons']}, {hidden[-1]}]",
        )
        rows += shards[i]["neurons"]
    _require(rows == n_labels, where, f"the shards hold {rows} neurons, n_labels is {n_labels}")
    _check_shapes(arrays, _expected_shapes(parts, n_features, hidden, shards), where)
    if "estimator" in meta:
        check_estimator(meta["estimator"], meta["config"], n_labels, where)


#: The estimator's parameters besides the network's (those are :class:`SlideConfig`'s),
#: as its fit checks them: (kind, low, high, None allowed).
_ESTIMATOR_PARAMS = {
    "epochs": ("int", 1, 1 << 20, False),
    "batch_size": ("int", 1, 1 << 20, False),
    "n_iter_no_change": ("int", 1, 1 << 20, False),
    "tol": ("float", 0.0, 1.0, False),
    "n_threads": ("int", 1, 1 << 16, True),
    "n_shards": ("int", 1, 1 << 16, True),
    "random_state": ("int", 0, (1 << 63) - 1, True),
    "checkpoint_every": ("int", 0, 1 << 40, False),
    "neighbours": ("int", 0, 1 << 16, False),
    "neighbour_mix": ("float", 0.0, 1.0, False),
    "tail_exponent": ("float", 0.0, max(TAILS), True),
    "label_classifiers": ("int", 0, 1 << 40, False),
    "label_centroids": ("float", 0.0, max(CENTROID_WEIGHTS), True),
    "label_tree": ("float", 0.0, MAX_TREE_POWER, False),
    "n_label_trees": ("int", 1, MAX_TREES, True),
}


def check_estimator(block, config: dict, n_labels: int, where: str) -> None:
    """The estimator's block of ``meta.json`` (its parameters, classes, history), as the
    estimator checks them before a fit: a bad value is refused here, naming the file and
    the parameter, not met later as a ValueError, or an IndexError at predict (fewer
    classes than labels)."""
    what = f"{where}: estimator"
    _require(isinstance(block, dict), what, "estimator must be an object")
    classes = block.get("classes")
    if classes is not None:
        ok = isinstance(classes, list) and all(
            isinstance(c, str | int | float) and not isinstance(c, bool) for c in classes
        )
        _require(
            ok and len(classes) == n_labels and len(set(classes)) == len(classes),
            what,
            f"classes must be {n_labels} distinct classes, got "
            f"{len(classes) if isinstance(classes, list) else type(classes).__name__}",
        )
    _int(block.get("epochs_done", 0), f"{what}: epochs_done", 0, 1 << 62)
    _require(isinstance(block.get("evals", []), list), what, "evals must be a list")
    try:
        for name, (kind, low, high, optional) in _ESTIMATOR_PARAMS.items():
            value = block.get(name)
            if name not in block or (value is None and optional):
                continue
            if kind == "int":
                check_int(name, value, int(low), int(high))
            else:
                check_float(name, value, low, high)
        if "validation_fraction" in block:
            value = block["validation_fraction"]
            check_float("validation_fraction", value, 0.0, 1.0, low_open=True, high_open=True)
        _check_pair(block.get("neighbour_weight"))
        # the network's parameters: what the estimator's config() makes of them
        fields = {f.name for f in dataclasses.fields(SlideConfig)} - {"hidden", "seed"}
        mine = {k: v for k, v in block.items() if k in fields}
        SlideConfig.from_dict({"negatives": "example", **config, **mine})
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{what}: {err}") from None


def _check_pair(weight) -> None:
    """``neighbour_weight``: None, a number in [0, 1] or two of sum at most 1."""
    pair = [weight] if isinstance(weight, int | float) and not isinstance(weight, bool) else weight
    if weight is None:
        return
    ok = isinstance(pair, list) and 1 <= len(pair) <= 2
    ok = ok and all(isinstance(w, int | float) and not isinstance(w, bool) for w in pair)
    if not (ok and all(0.0 <= w <= 1.0 for w in pair) and sum(pair) <= 1.0 + 1e-9):
        raise ValueError(
            "neighbour_weight must be None, a number in [0, 1] or two of sum at most 1, "
            f"got {weight!r}"
        )


def _expected_shapes(parts, n_features: int, hidden: list, shards: list) -> dict[str, list]:
    """The shape of every parameter a model of this metadata has (their Adam moments
    ``.m``/``.v`` share it; the row counts ``.n`` have one entry a row)."""
    out: dict[str, list] = {}
    for prefix, a, b in parts:
        out[f"{prefix}/W0"], out[f"{prefix}/b0"] = [n_features, b - a], [b - a]
    for j in range(1, len(hidden)):
        out[f"hidden/W{j}"], out[f"hidden/b{j}"] = [hidden[j - 1], hidden[j]], [hidden[j]]
    for i, s in enumerate(shards):
        out[f"shard-{i:04d}/W"] = [s["neurons"], hidden[-1]]
        out[f"shard-{i:04d}/bias"] = [s["neurons"]]
    return out


def _check_shapes(arrays: dict, expected: dict[str, list], where: str) -> None:
    """Each array entry against the shape the model gives it: a 0-d bias, say, would
    load and then fail inside a kernel (on a worker, as a traceback)."""
    for name, entry in arrays.items():
        base, _, suffix = name.rpartition(".")
        if not base or suffix not in ("m", "v", "n"):
            base, suffix = name, ""
        want = expected.get(base)
        if want is not None and suffix == "n":
            want = want[:1]
        if want is not None and entry["shape"] != want:
            raise CheckpointError(
                f"{where}: array {name!r} has shape {entry['shape']}, expected {want}"
            )


def _check_hidden(slices, arrays, n_features: int, hidden: list, n_shards: int, where: str):
    """The input layer's weights: whole (``hidden/W0``), or split by units into slices
    ``[shard, first unit, end]`` that cover the layer in order."""
    if slices is None:
        parts = [("hidden", 0, hidden[0])]
    else:
        _require(
            isinstance(slices, list) and slices and len(hidden) == 1,
            where,
            "hidden slices must be a non-empty list, of a one-layer stack",
        )
        parts, end = [], 0
        for i, part in enumerate(slices):
            ok = isinstance(part, list) and len(part) == 3 and all(_is_int(v) for v in part)
            _require(ok, where, f"hidden slices[{i}] must be [shard, first unit, end]")
            holder, a, b = part
            _require(
                0 <= holder < n_shards and a == end < b <= hidden[0],
                where,
                f"hidden slices[{i}] = {part}: not the next units of {hidden[0]} on a shard",
            )
            parts.append((f"hidden-{holder:04d}", a, b))
            end = b
        _require(end == hidden[0], where, f"hidden slices cover {end} of {hidden[0]} units")
    for prefix, a, b in parts:
        w0 = arrays.get(f"{prefix}/W0")
        _require(
            w0 is not None and w0["shape"] == [n_features, b - a],
            where,
            f"{prefix}/W0 must have shape [{n_features}, {b - a}] (n_features x units), "
            f"the entry says {None if w0 is None else w0['shape']}",
        )
    return parts


def check_entry(name, entry, where: str, size: int | None) -> None:
    _require(isinstance(name, str) and isinstance(entry, dict), where, f"bad entry {name!r}")
    what = f"{where}: array {name!r}"
    nbytes = _int(entry.get("bytes"), f"{what} bytes", 0, 1 << 62)
    _int(entry.get("crc32"), f"{what} crc32", 0, (1 << 32) - 1)
    shape = entry.get("shape")
    _require(
        isinstance(shape, list) and all(_is_int(d) and 0 <= d <= 1 << 62 for d in shape),
        what,
        f"shape must be a list of non-negative integers, got {shape!r}",
    )
    try:
        dtype = np.dtype(entry.get("dtype"))
    except (TypeError, ValueError):
        raise CheckpointError(f"{what}: unknown dtype {entry.get('dtype')!r}") from None
    _require(not dtype.hasobject, what, "object arrays are not allowed")
    data = dtype.itemsize * int(np.prod(shape, dtype=object))
    _require(
        data <= nbytes <= data + _NPY_HEADER_MAX,
        what,
        f"{nbytes} bytes cannot hold {dtype.str}{shape} ({data} bytes of data)",
    )
    if size is not None:
        file = f"{where.rsplit('/', 1)[0]}/{name}.npy"
        _require(size >= 0, file, "file missing from the checkpoint")
        _require(size == nbytes, file, f"expected {nbytes} bytes, found {size} bytes (truncated?)")


def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _int(v, what: str, low: int, high: int) -> int:
    if not _is_int(v) or not low <= v <= high:
        raise CheckpointError(f"{what} must be an integer in [{low}, {high}], got {v!r}")
    return int(v)


def _require(ok: object, where: str, problem: str) -> None:
    """Raise unless ``ok`` is truthy (a check's bool, or the value checked itself)."""
    if not ok:
        raise CheckpointError(f"{where}: {problem}")
