"""What a checkpoint holds of a model, and how it goes back in, under any sharding.

Shard files keep each shard's rows in its own local order; the metadata keeps the layout
that order came from. A shard of a *different* layout (another number or mix of workers)
picks its rows out of the old shards by global neuron id: re-sharding on load.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from dslide_dask.checkpoint.arrays import CheckpointError
from dslide_dask.checkpoint.store import Checkpoint, CheckpointStore, Folder
from dslide_dask.model.config import SlideConfig
from dslide_dask.model.hidden import HiddenLayers, gather_units
from dslide_dask.model.layout import ShardLayout
from dslide_dask.model.network import SlideNetwork
from dslide_dask.model.optimizer import arrays_to_read, with_row_updates
from dslide_dask.model.wide_shard import WideShard


@dataclass(frozen=True)
class CheckpointPolicy:
    """Where and how often to checkpoint: every ``every_steps`` steps and/or every
    ``every_seconds`` seconds (0: not by that measure), keeping the newest ``keep``."""

    url: str
    every_steps: int = 0
    every_seconds: float = 0.0
    keep: int = 3
    storage_options: dict | None = None

    def __post_init__(self) -> None:
        if self.every_steps < 0 or self.every_seconds < 0:
            raise ValueError("checkpoint intervals must be >= 0 (0: off)")
        if self.keep < 0:
            raise ValueError(f"keep must be >= 0 (0: keep all), got {self.keep}")

    def store(self) -> CheckpointStore:
        return CheckpointStore(self.url, self.storage_options, self.keep)

    def due(self, step: int, seconds_since_last: float) -> bool:
        by_steps = self.every_steps > 0 and step % self.every_steps == 0
        by_time = self.every_seconds > 0 and seconds_since_last >= self.every_seconds
        return by_steps or by_time


def shard_prefix(index: int) -> str:
    return f"shard-{index:04d}"


def hidden_prefix(holder: int | None = None) -> str:
    """Where the hidden stack's arrays go: ``hidden/``, or ``hidden-NNNN/`` for the units
    shard ``holder``'s worker holds of a layer split by units."""
    return "hidden" if holder is None else f"hidden-{holder:04d}"


def write_hidden(
    folder: Folder, hidden: HiddenLayers, holder: int | None = None
) -> dict[str, dict]:
    """The hidden stack's arrays (or a slice's) into ``folder``; their entries."""
    prefix = hidden_prefix(holder)
    return {f"{prefix}/{k}": folder.write(f"{prefix}/{k}", v) for k, v in hidden.state().items()}


def write_shard(folder: Folder, shard: WideShard) -> tuple[dict[str, dict], dict[str, int]]:
    """One shard's rows into ``folder``: ``(entries, counters)`` (not the first moments
    with ``beta1 = 0``: never written, they stay zero).

    The shard's hash tables are rebuilt from its weights first, as a restored shard's are:
    training then goes on identically from the live shard and from the checkpoint.
    """
    shard.rehash()
    arrays, counters = shard.state()
    prefix = shard_prefix(shard.shard_index)
    entries = {
        f"{prefix}/{k}": folder.write(f"{prefix}/{k}", arrays[k]) for k in shard.kept_arrays()
    }
    return entries, {**counters, "neurons": shard.n_local}


def model_meta(
    cfg: SlideConfig,
    n_features: int,
    n_labels: int,
    layout: ShardLayout,
    hidden_step: int,
    shards: list[tuple[dict, dict]],
    hidden_entries: dict,
    extra: dict | None = None,
) -> dict:
    """The metadata of a checkpoint whose arrays are all written."""
    arrays = dict(hidden_entries)
    for entries, _ in shards:
        arrays.update(entries)
    counters = [c for _, c in shards]
    hidden: dict = {"step": int(hidden_step)}
    split = [(s, c) for s, c in enumerate(counters) if "hidden_units" in c]
    if split:  # a layer split by units: who holds which
        hidden = {
            "step": int(split[0][1]["hidden_step"]),
            "slices": [[s, *c["hidden_units"]] for s, c in split],
        }
    return {
        "step": int(counters[0]["step"]),
        "config": cfg.to_dict(),
        "n_features": int(n_features),
        "n_labels": int(n_labels),
        "layout": {"n_neurons": layout.n_neurons, "pattern": list(layout.pattern)},
        "hidden": hidden,
        "shards": counters,
        "arrays": arrays,
        **(extra or {}),
    }


def config_of(ckpt: Checkpoint) -> SlideConfig:
    try:
        # a model saved before negatives could be shared drew them for each example
        return SlideConfig.from_dict({"negatives": "example", **ckpt.meta["config"]})
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{ckpt.url}: its config is not valid here: {err}") from None


def layout_of(ckpt: Checkpoint) -> ShardLayout:
    lay = ckpt.meta["layout"]
    return ShardLayout(int(lay["n_neurons"]), tuple(lay["pattern"]))


def check_shape(ckpt: Checkpoint, n_features: int, n_labels: int) -> None:
    """The checkpoint's model must fit data of ``n_features`` x ``n_labels``."""
    have = (ckpt.meta["n_features"], ckpt.meta["n_labels"])
    if have != (n_features, n_labels):
        raise CheckpointError(
            f"{ckpt.url}: the checkpoint's model has {have[0]} features and {have[1]} labels, "
            f"the data {n_features} and {n_labels}"
        )


#: Per-row Adam update counts, which checkpoints written before rows counted their own
#: updates lack; ``set_state`` fills them in. Any other missing array is an error.
ADDED_LATER = ("W.n", "W0.n")


def _read_arrays(ckpt: Checkpoint, prefix: str, names) -> Iterator[tuple[str, np.ndarray]]:
    """``(name, array)`` of ``names`` under ``prefix``, read one at a time (a big shard's
    arrays need not all be in memory at once), leaving out the ADDED_LATER ones a
    checkpoint lacks."""
    for k in names:
        if k not in ADDED_LATER or ckpt.has(f"{prefix}/{k}"):
            yield k, ckpt.read(f"{prefix}/{k}")


def restore_hidden(ckpt: Checkpoint, hidden: HiddenLayers, moments: bool = True) -> None:
    """Load the hidden stack, or the units of it ``hidden`` holds, whether the checkpoint
    kept the layer whole or split by units (any split); without ``moments``, the Adam
    moments are not read (left at zero: a model loaded to answer)."""
    names = arrays_to_read(hidden.state(), moments)
    slices = ckpt.meta["hidden"].get("slices")
    if slices is None and hidden.columns is None:
        arrays = dict(_read_arrays(ckpt, "hidden", names))
    else:
        arrays = _hidden_units(ckpt, hidden, slices, names)
    try:
        hidden.set_state(arrays, int(ckpt.meta["hidden"]["step"]), moments)
    except ValueError as err:
        raise CheckpointError(f"{ckpt.url}: hidden layers don't fit the config: {err}") from None


def _hidden_units(
    ckpt: Checkpoint, hidden: HiddenLayers, slices: list | None, names: list[str]
) -> dict:
    """The arrays ``names`` of ``hidden``'s units, cut out of the whole layer or the
    slices that hold them."""
    width = ckpt.meta["config"]["hidden"][0]

    def reader(prefix: str):
        def get(name: str) -> np.ndarray | None:
            if name in ADDED_LATER and not ckpt.has(f"{prefix}/{name}"):
                return None
            return ckpt.read(f"{prefix}/{name}")

        return get

    sources = [(a, b, reader(hidden_prefix(s))) for s, a, b in slices or [(None, 0, width)]]
    return gather_units(names, hidden.columns or (0, width), sources)


def restore_shard(ckpt: Checkpoint, shard: WideShard, moments: bool = True) -> None:
    """Load ``shard``'s rows (whatever layout wrote them) and counters; without
    ``moments``, not its Adam moments (left at zero: a model loaded to answer)."""
    old = layout_of(ckpt)
    if old.n_neurons != shard.n_neurons:
        raise CheckpointError(
            f"{ckpt.url}: the checkpoint's wide layer has {old.n_neurons} neurons, "
            f"this one {shard.n_neurons}"
        )
    counters = ckpt.meta["shards"][0]
    names = arrays_to_read(shard.kept_arrays(), moments)
    got: set[str] = set()
    sources: Sequence[tuple[int, np.ndarray | slice, np.ndarray | slice]]
    if old == shard.layout:  # the shard's own file of each array
        sources = [(shard.shard_index, slice(None), slice(None))]
    else:  # its rows, picked out of every old shard that holds some of them
        sources = shard.layout.sources(shard.shard_index, old)
    try:
        for j, here, there in sources:  # one array in memory at a time, straight into place
            for name, value in _read_arrays(ckpt, shard_prefix(j), names):
                shard.put_rows(here, {name: value[there]})
                got.add(name)
        if "W.n" not in got:  # written before rows counted their updates
            shard.put_rows(
                slice(None), with_row_updates({}, "W.n", shard.n_local, counters["step"])
            )
        shard.set_counters(counters)
    except CheckpointError:
        raise  # names its file
    except ValueError as err:
        raise CheckpointError(f"{ckpt.url}: shard arrays don't fit the config: {err}") from None


#: Writes more of a model (its fused parts, its output index) into a checkpoint folder
#: (its URL; the metadata so far) before the checkpoint is committed; returns more
#: metadata to keep.
PartsWriter = Callable[[str, dict], dict]


def save_network(
    store: CheckpointStore,
    net: SlideNetwork,
    extra: dict | None = None,
    parts: PartsWriter | None = None,
) -> Checkpoint:
    """A checkpoint of an in-process network (same format as a distributed one), with
    what ``parts`` writes beside it, committed once everything is written."""
    folder = store.new_folder(net.shards[0].step)
    hidden = write_hidden(folder, net.hidden)
    shards = [write_shard(folder, shard) for shard in net.shards]
    meta = model_meta(
        net.cfg, net.n_features, net.n_labels, net.layout, net.hidden.step, shards, hidden, extra
    )
    if parts is not None:
        meta.update(parts(folder.url, meta))
    return store.commit(folder, meta)


def load_network(
    ckpt: Checkpoint, n_shards: int | None = None, *, answering: bool = False
) -> SlideNetwork:
    """The network of a checkpoint, in its own layout or split into ``n_shards``;
    ``answering``: to answer only, its Adam moments not read (their zeroed pages are
    never touched: a third to a half of a loaded model's memory)."""
    n_labels = int(ckpt.meta["n_labels"])
    layout = layout_of(ckpt) if n_shards is None else ShardLayout.strided(n_labels, n_shards)
    n_features = int(ckpt.meta["n_features"])
    net = SlideNetwork(config_of(ckpt), n_features, n_labels, layout=layout, initialize=False)
    restore_hidden(ckpt, net.hidden, moments=not answering)
    for shard in net.shards:
        restore_shard(ckpt, shard, moments=not answering)
    return net
