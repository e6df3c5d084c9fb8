"""The benchmarks' data: synthetic train/test prefixes, generated once and cached as .npz.

Every benchmark (and each contender's process) loads the same file, so all of them
train and test on exactly the same rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

CACHE_FORMAT = 2  # bump when the cached arrays change meaning (2: prefixes, not shuffled)


def default_cache_dir() -> Path:
    """``$DSLIDE_CACHE_DIR``, else ``$XDG_CACHE_HOME/dslide-dask``, else ``~/.cache/...``."""
    if os.environ.get("DSLIDE_CACHE_DIR"):
        return Path(os.environ["DSLIDE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "dslide-dask"


def check_data_args(preset: str, train_points: int, test_points: int):
    """The preset's spec, once the point counts are known to fit it."""
    from dslide_dask.data import synthetic

    spec = synthetic.resolve_spec(preset)
    if not 1 <= train_points <= spec.n_train:
        raise ValueError(f"--train-points must be in [1, {spec.n_train}], got {train_points}")
    if not 1 <= test_points <= spec.n_test:
        raise ValueError(f"--test-points must be in [1, {spec.n_test}], got {test_points}")
    return spec


def bench_data(
    preset: str,
    train_points: int,
    test_points: int,
    seed: int = 0,
    cache_dir: Path | None = None,
    refresh: bool = False,
    log: Callable[[str], None] = print,
) -> tuple[Path, dict[str, Any]]:
    """The cached .npz of the benchmark's train/test prefixes (made if missing) and a
    description of it. Synthetic rows are drawn independently (nothing sorts them, unlike
    real XC files), so a prefix is a sample of the split, and only the prefix is made:
    50K points of ``amazon-3m`` cost 50K points, not 1.7M."""
    from dslide_dask.data import synthetic

    spec = check_data_args(preset, train_points, test_points)
    key = json.dumps([CACHE_FORMAT, dataclasses.asdict(spec), synthetic.CHUNK_POINTS, seed])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    name = f"{preset}-seed{seed}-train{train_points}-test{test_points}-{digest}.npz"
    path = Path(cache_dir or default_cache_dir()) / "bench" / name
    info = {
        "preset": preset,
        "seed": seed,
        "train_points": train_points,
        "test_points": test_points,
        "spec": dataclasses.asdict(spec),
        "cache": str(path),
    }
    if path.exists() and not refresh:
        log(f"data: cached {path}")
        return path, info
    t0 = time.perf_counter()
    prefix = dataclasses.replace(spec, n_train=train_points, n_test=test_points)
    train, test = synthetic.make_synthetic(prefix, seed=seed)
    save_datasets(path, train, test)
    log(f"data: generated {preset} and cached {path} in {time.perf_counter() - t0:.1f} s")
    return path, info


def save_datasets(path: Path, train, test) -> None:
    """Write train/test XCDatasets to one .npz (atomically: temp file, then rename)."""
    arrays: dict[str, np.ndarray] = {}
    for split, ds in (("train", train), ("test", test)):
        arrays[f"{split}_X_indptr"] = ds.X.indptr
        arrays[f"{split}_X_indices"] = ds.X.indices
        arrays[f"{split}_X_data"] = ds.X.values()
        arrays[f"{split}_Y_indptr"] = ds.Y.indptr
        arrays[f"{split}_Y_indices"] = ds.Y.indices
    arrays["shape"] = np.array([train.n_features, train.n_labels], np.int64)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npz.tmp", delete=False) as f:
        np.savez(f, **arrays)  # type: ignore[arg-type]  # array names, no allow_pickle
    os.replace(f.name, path)


def save_exclusions(path: Path, exclude) -> None:
    """The test rows' excluded pairs (``--filter-labels``, a pattern CSR) beside the data
    sets in ``path``'s folder."""
    np.savez(
        _exclusions(path), indptr=exclude.indptr, indices=exclude.indices, n_cols=exclude.n_cols
    )


def load_exclusions(path: Path):
    """The pattern CSR :func:`save_exclusions` wrote for the data sets at ``path``."""
    from dslide_dask.data import CSR

    with np.load(_exclusions(path)) as z:
        return CSR(z["indptr"], z["indices"], None, int(z["n_cols"]))


def _exclusions(path: Path) -> Path:
    return path.with_name(f"{path.stem}-excluded.npz")


def load_datasets(path: Path):
    """The (train, test) XCDatasets written by :func:`save_datasets`."""
    from dslide_dask.data import CSR, XCDataset

    with np.load(path) as z:
        n_features, n_labels = (int(v) for v in z["shape"])
        out = []
        for split in ("train", "test"):
            X = CSR(
                z[f"{split}_X_indptr"], z[f"{split}_X_indices"], z[f"{split}_X_data"], n_features
            )
            Y = CSR(z[f"{split}_Y_indptr"], z[f"{split}_Y_indices"], None, n_labels)
            out.append(XCDataset(X, Y))
    return out[0], out[1]
