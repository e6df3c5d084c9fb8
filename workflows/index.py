"""``dslide index MODEL``: build a saved model's output index and store it beside it.

Only wiring: the index is :mod:`dslide_dask.model.output_index`'s, its files
:mod:`dslide_dask.checkpoint.output_index`'s. The model is loaded in this process, the
index built over its whole output layer (keyed by label id, so it serves the model at any
shard count) and written into the model's folder, ``output_index/``; the model's own
files are not touched. ``dslide predict --index``, ``SlideClassifier.load`` and
``dslide bench topk`` then use it.
"""

from __future__ import annotations

import argparse
import time

from dslide_workflows.args import add_storage_arguments, key_value, storage_options


def add_index_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "index",
        help="build a saved model's output index (fast top-k for serving)",
        description="Build the output index of the model at MODEL (a checkpoint, a model "
        "saved by SlideClassifier.save, or a run folder) and store it in the model's "
        "folder (output_index/): faiss IVF-fp16 over the output layer; predictions score "
        'its candidates exactly. Needs faiss: pip install "dslide-dask[serve]".',
    )
    p.add_argument("model", metavar="MODEL", help="model URL")
    p.add_argument(
        "--setting",
        type=key_value,
        action="append",
        default=[],
        metavar="K=V",
        help="index setting: lists, probes, candidates, head, codes (fp16, sq8, flat), "
        "train_per_list, iterations, seed, threads (repeatable; default: chosen for the "
        "layer's size)",
    )
    add_storage_arguments(p)
    p.set_defaults(func=cmd_index)


def cmd_index(args: argparse.Namespace) -> int:
    from dslide_dask.checkpoint.label_counts import load_label_counts
    from dslide_dask.checkpoint.model import load_network
    from dslide_dask.checkpoint.output_index import save_output_index
    from dslide_dask.inference.model_cache import resolve
    from dslide_dask.model.output_index import IndexSettings, OutputIndex

    so = storage_options(args.storage_option)
    settings = IndexSettings.of(dict(args.setting))  # bad settings fail before the load
    ckpt = resolve(args.model, so)
    net = load_network(ckpt)
    labels = load_label_counts(ckpt, so)  # half the head rows: the most frequent labels
    t0 = time.perf_counter()
    index = OutputIndex.build(net.shards, settings, None if labels is None else labels.counts)
    seconds = time.perf_counter() - t0
    where = save_output_index(ckpt, index)
    layer = sum(s.W.nbytes + s.bias.nbytes for s in net.shards)
    s = index.settings
    print(
        f"indexed {index.n_labels:,} labels in {seconds:.1f} s: {s.lists} lists, {s.probes} "
        f"probes, {s.candidates} candidates, {s.codes}; {index.nbytes / 1e6:.1f} MB "
        f"({index.nbytes / layer:.2f} x the output layer) -> {where}"
    )
    return 0
