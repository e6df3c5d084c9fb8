"""The label-tree contenders of ``dslide bench accuracy``, each run in its own process by
it, and the scorer that every contender of that benchmark shares.

- ``omikuji`` (Parabel-style label trees), with its default hyper-parameters, trained
  from the XC text file (its only input), so its time includes parsing it;
- ``napkinxc`` (probabilistic label trees), its ``PLT`` with the default settings;
- ``pecos`` (Amazon's PECOS XR-Linear), as its README's quick start trains it: PIFA label
  features, a hierarchical k-means cluster chain and ``XLinearModel.train``; predicted
  with beam size 10.

omikuji and napkinXC come with ``pip install 'dslide-dask[bench-trees]'``; libpecos
1.2.8 pins numpy<2 and scipy<1.14 (it fails on newer ones) and pulls PyTorch, so it has
an extra of its own, ``[bench-pecos]``, best installed in an environment of its own; where
numpy or scipy is too new, the benchmark skips it (:func:`pecos_conflict`).

"train s" runs from constructing the model to the end of training, as for the engine;
converting the rows into the library's input format is outside it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dslide_workflows.classifier import make_classifier

KS = (1, 3, 5)
PECOS_PIP = "pip install 'dslide-dask[bench-pecos]' in an environment of its own"
#: How each label-tree contender is installed.
INSTALL = {
    "omikuji": "pip install 'dslide-dask[bench-trees]'",
    "napkinxc": "pip install 'dslide-dask[bench-trees]'",
    "pecos": f"{PECOS_PIP} (it pins numpy<2 and scipy<1.14)",
}
#: libpecos 1.2.8's upper bounds, (major, minor) excluded: it calls what newer ones removed.
PECOS_BOUNDS = {"numpy": (2, 0), "scipy": (1, 14)}


def answer_width(config: dict[str, Any]) -> int:
    """The labels each contender answers a test row with: the largest k, and as many more
    as any row's excluded pairs (``--filter-labels``) take out again."""
    return max(KS) + int(config.get("excluded_widest", 0))


def scorer(train, test, config: dict[str, Any]) -> Callable[[np.ndarray], dict[str, float]]:
    """Top-k predictions on ``test`` -> metrics, with propensities from ``train``, each
    row's excluded pairs (``--filter-labels``) left out of its answer first."""
    from dslide_dask.metrics import drop_pairs, label_counts, xc_metrics
    from dslide_workflows.bench.data import load_exclusions

    counts, (A, B) = label_counts(train.Y), config["propensity"]
    exclude = load_exclusions(Path(config["data"])) if config.get("excluded_widest") else None

    def score(topk: np.ndarray) -> dict[str, float]:
        kept = topk if exclude is None else drop_pairs(topk, exclude, max(KS))
        return xc_metrics(kept, test.Y, KS, counts, train.n_points, A, B)

    return score


def pecos_conflict(versions: dict[str, str] | None = None) -> str | None:
    """Why libpecos cannot run with this environment's numpy and scipy, or None."""
    if versions is None:
        from importlib.metadata import version

        versions = {name: version(name) for name in PECOS_BOUNDS}
    too_new = [
        f"{name} {versions[name]}"
        for name, bound in PECOS_BOUNDS.items()
        if tuple(int(p) for p in versions[name].split(".")[:2]) >= bound
    ]
    if not too_new:
        return None
    return f"libpecos 1.2.8 needs numpy<2 and scipy<1.14, not {', '.join(too_new)}: {PECOS_PIP}"


@contextlib.contextmanager
def silenced():
    """This process's stdout and stderr file descriptors go to /dev/null meanwhile (a
    contender's result travels as a file, never on them)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def omikuji_rows(X) -> list[list[tuple[int, float]]]:
    """The rows of ``X`` (CSR) as omikuji's predict takes them: (feature, value) pairs."""
    values, indices = X.values().tolist(), X.indices.tolist()
    bounds = zip(X.indptr[:-1].tolist(), X.indptr[1:].tolist(), strict=True)
    return [list(zip(indices[lo:hi], values[lo:hi], strict=True)) for lo, hi in bounds]


def scipy_csr(M, dtype=None):
    """A scipy CSR matrix of the project's CSR (binary label rows get ones)."""
    from scipy.sparse import csr_matrix

    return csr_matrix((M.values(), M.indices, M.indptr), shape=M.shape, dtype=dtype)


def run_omikuji(train, test, config: dict[str, Any]) -> dict[str, Any]:
    """omikuji with its default hyper-parameters, trained from the XC text file."""
    import omikuji

    threads = config["classifier"]["n_threads"]
    t0 = time.perf_counter()
    with silenced():  # its Rust side draws a progress bar per example and label
        model = omikuji.Model.train_on_data(
            config["train_text"], omikuji.Model.default_hyper_param(), n_threads=threads
        )
    seconds = time.perf_counter() - t0
    model.init_prediction_thread_pool(threads)
    width = answer_width(config)
    topk = np.full((test.n_points, width), -1, np.int64)
    for i, row in enumerate(omikuji_rows(test.X)):
        pred = model.predict(row, top_k=width)
        topk[i, : len(pred)] = [label for label, _ in pred]
    return tree_result("omikuji", seconds, scorer(train, test, config)(topk))


def run_napkinxc(train, test, config: dict[str, Any]) -> dict[str, Any]:
    """napkinXC's PLT with its default settings, from scipy CSR features."""
    from napkinxc.models import PLT

    c = config["classifier"]
    X, Y = scipy_csr(train.X), [train.Y.row(i).tolist() for i in range(train.n_points)]
    with tempfile.TemporaryDirectory(prefix="dslide-napkinxc-") as out:
        model = PLT(out, threads=c["n_threads"], seed=make_classifier(c).config().seed)
        t0 = time.perf_counter()
        model.fit(X, Y)
        seconds = time.perf_counter() - t0
        pred = model.predict(scipy_csr(test.X), top_k=answer_width(config))
    topk = np.full((test.n_points, answer_width(config)), -1, np.int64)
    for i, labels in enumerate(pred):
        topk[i, : len(labels)] = labels
    return tree_result("napkinxc", seconds, scorer(train, test, config)(topk))


def run_pecos(train, test, config: dict[str, Any]) -> dict[str, Any]:
    """PECOS XR-Linear with its default settings, from float32 scipy CSR X and Y: PIFA
    label features, hierarchical k-means, ``XLinearModel.train``; beam size 10."""
    c = config["classifier"]
    threads, seed = c["n_threads"], make_classifier(c).config().seed
    t0 = time.perf_counter()
    model = train_pecos(train, threads, seed)
    seconds = time.perf_counter() - t0
    width = answer_width(config)
    pred = model.predict(
        scipy_csr(test.X, np.float32), beam_size=10, only_topk=width, threads=threads
    ).tocsr()
    return tree_result("pecos", seconds, scorer(train, test, config)(_csr_topk(pred, width)))


def train_pecos(train, threads: int, seed: int):
    """An ``XLinearModel`` of PECOS's quick start on the data set ``train``: PIFA label
    features, a hierarchical k-means chain, default training."""
    from pecos.xmc import Indexer, LabelEmbeddingFactory
    from pecos.xmc.xlinear.model import XLinearModel

    X, Y = scipy_csr(train.X, np.float32), scipy_csr(train.Y, np.float32)
    label_feat = LabelEmbeddingFactory.create(Y, X, method="pifa", threads=threads)
    chain = Indexer.gen(label_feat, indexer_type="hierarchicalkmeans", threads=threads, seed=seed)
    return XLinearModel.train(X, Y, C=chain, threads=threads)


def _csr_topk(scores, k: int) -> np.ndarray:
    """(n, k) label ids of each row's k highest-scored entries, best first, -1 padded."""
    counts = np.diff(scores.indptr)
    rows = np.repeat(np.arange(scores.shape[0]), counts)
    order = np.lexsort((-scores.data, rows))  # by row, then by score descending
    rank = np.arange(len(order)) - scores.indptr[rows[order]]
    keep = rank < k
    topk = np.full((scores.shape[0], k), -1, np.int64)
    topk[rows[order][keep], rank[keep]] = scores.indices[order][keep]
    return topk


def tree_result(name: str, seconds: float, scores: dict[str, float]) -> dict[str, Any]:
    from dslide_workflows.bench.torch_dense import peak_rss_mb

    return {"contender": name, "train_seconds": seconds, **scores, "peak_rss_mb": peak_rss_mb()}


RUNNERS: dict[str, Callable[..., dict[str, Any]]] = {
    "omikuji": run_omikuji,
    "napkinxc": run_napkinxc,
    "pecos": run_pecos,
}
