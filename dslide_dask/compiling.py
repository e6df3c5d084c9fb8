"""The first run compiles the numba kernels (about a minute and a half on 2 cores, then
cached on disk): :func:`warm_up` does it up front and says what is compiling and how
far it is, instead of a silent first step.

Silent unless asked: nothing is printed or logged by the library; a caller passes a
``callback(done, total, module)``, called as each kernel module's first compilation
starts (the CLI prints it). ``total`` counts the modules the warm-up compiles whose
kernels are not all in numba's cache yet; with every one cached, nothing runs.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Callable, Iterator

from numba.core import event

#: ``callback(done, total, module)``: module (e.g. ``wide_layer``) is the done-th of total.
Progress = Callable[[int, int, str], None]

#: The modules whose kernels :func:`warm_up` compiles (measured on a cold cache; a test
#: checks that it uses them): a fit of both kinds of negatives, its fused parts,
#: evaluation, and reading XC text. (The LSH tables' are not among them: no fit this
#: small builds tables.)
WARM_MODULES = (
    "dslide_dask.kernels.csr_checks",
    "dslide_dask.kernels.xc_text",
    "dslide_dask.kernels.synthetic",
    "dslide_dask.kernels.sparse_input",
    "dslide_dask.kernels.hashing",
    "dslide_dask.kernels.active_sets",
    "dslide_dask.kernels.wide_layer",
    "dslide_dask.kernels.adam",
    "dslide_dask.kernels.topk",
    "dslide_dask.kernels.neighbours",
    "dslide_dask.kernels.hidden_votes",
    "dslide_dask.kernels.label_centroids",
    "dslide_dask.kernels.label_svm",
    "dslide_dask.kernels.label_tree",
    "dslide_dask.kernels.shared_dots",
    "dslide_dask.kernels.tree_inner",
    "dslide_dask.kernels.tree_query",
    "dslide_dask.kernels.fusion",
    "dslide_dask.metrics",
)


def _kernels(module: str) -> list:
    """The numba functions defined in ``module`` and compiled on their own (not those
    always inlined into their callers, which have no cache entry of their own)."""
    from numba.core.registry import CPUDispatcher

    mod = importlib.import_module(module)
    return [
        v
        for v in vars(mod).values()
        if isinstance(v, CPUDispatcher)
        and v.py_func.__module__ == module
        and v.targetoptions.get("inline", "never") != "always"
    ]


def uncached(modules=WARM_MODULES) -> list[str]:
    """The modules of ``modules`` none of whose kernels numba's on-disk cache holds for
    their current source (a module a run uses has some cached: not every kernel of a
    module is used by every run)."""
    return [m for m in modules if not any(_cached(k) for k in _kernels(m))]


def _cached(kernel) -> bool:
    """Whether numba's cache index of ``kernel`` exists and matches its source (numba
    drops an index whose source file changed since)."""
    try:
        return bool(kernel._cache._cache_file._load_index())
    except (AttributeError, OSError, ValueError, EOFError):  # numba's internals moved
        return False


class _Listener(event.Listener):
    """Calls ``report`` with the module of each kernel numba starts compiling."""

    def __init__(self, report: Callable[[str], None]) -> None:
        self.report = report

    def on_start(self, ev: event.Event) -> None:
        dispatcher = ev.data.get("dispatcher") if isinstance(ev.data, dict) else None
        module = getattr(getattr(dispatcher, "py_func", None), "__module__", None) or ""
        inline = getattr(dispatcher, "targetoptions", {}).get("inline", "never") == "always"
        cached = hasattr(getattr(dispatcher, "_cache", None), "_cache_file")
        if module.startswith("dslide_dask.") and cached and not inline:
            self.report(module)  # (inlined helpers and overloads are part of a caller)

    def on_end(self, ev: event.Event) -> None:
        pass


@contextlib.contextmanager
def reporting_compiles(callback: Progress, expected: list[str]) -> Iterator[set[str]]:
    """While inside, each module's first kernel compilation calls ``callback(done,
    total, short name)``, ``total`` being ``expected``'s length (more if other modules
    compile too); yields the set of modules seen."""
    seen: set[str] = set()
    total = [len(expected)]

    def report(module: str) -> None:
        if module in seen:
            return
        seen.add(module)
        if module not in expected:
            total[0] += 1
        callback(len(seen), max(total[0], len(seen)), module.rsplit(".", 1)[-1])

    with event.install_listener("numba:compile", _Listener(report)):
        yield seen


def warm_up(callback: Progress | None = None) -> set[str]:
    """Compile (into numba's disk cache) the kernels a fit, its evaluation and reading
    XC text use, on a few hundred synthetic rows, reporting progress to ``callback``.

    Parameters
    ----------
    callback : callable or None, default=None
        ``callback(done, total, module)`` as each kernel module starts compiling.

    Returns
    -------
    set of str
        The modules compiled (empty: every kernel was cached, nothing ran).
    """
    expected = uncached()
    if not expected:
        return set()
    with reporting_compiles(callback or (lambda *_: None), expected) as seen:
        _workload()
    return seen


def _workload() -> None:
    """A fit of each kind of negatives with its fused parts, evaluation, and XC text
    written and read back: what a first run compiles, on data too small to take time."""
    import tempfile

    from dslide_dask import SlideClassifier
    from dslide_dask.data.synthetic import SyntheticSpec, make_synthetic
    from dslide_dask.data.xc_text import read_xc, write_xc

    spec = SyntheticSpec(
        n_features=300, n_labels=200, n_train=600, n_test=60, avg_labels=3.0, avg_nnz=12.0
    )
    train, test = make_synthetic(spec, seed=0)
    with tempfile.TemporaryDirectory(prefix="dslide-warm-up-") as folder:
        write_xc(os.path.join(folder, "t.txt"), test)
        read_xc(os.path.join(folder, "t.txt"))
    for negatives in ("shared", "example"):
        clf = SlideClassifier(
            epochs=1, hidden=(16,), batch_size=128, negatives=negatives, client=False
        )
        clf.fit(train.X, train.Y).evaluate(test.X, test.Y)
