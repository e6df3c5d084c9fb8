"""Debian-files: binary packages labelled with where they install files and which shared
file names they ship, from the archive's Contents indexes.

Points and features are Debian-26K's (:mod:`dslide_workflows.datasets.debian`). Labels,
from Contents-<arch> and Contents-all (every suite in the lists; a package's files are
the union): ``dir:/<d>`` for every directory that directly holds one of its files (not
the ancestors) and ``file:<name>`` for the base name of every file, except under the
trees every package has (``usr/share/doc``, ``usr/share/lintian``,
``usr/share/doc-base``). Directories alone give about 8K labels shared by two training
points: the file names make it a 100K-label task. Packages with more than ``max_dirs``
directories (icon themes, TeX Live, kernels: thousands) are dropped, then labels of
fewer than 2 *training* points, points with more than ``max_labels`` labels left, and
points left without label or feature, until nothing changes. Every test label has been
seen in training. With ``max_label_points``, the labels of more training points are then
dropped, and the points left without a label: the regime of the sets where nearly every
label is rare (``--max-label-points 20``: 119K labels of 2-20 training points).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.data.dataset import XCDataset
from dslide_workflows.datasets import apt_lists, debian
from dslide_workflows.datasets.xc_build import (
    Built,
    Point,
    assemble,
    prune,
    statistics,
    write_dataset,
)

#: Trees of per-package boilerplate (copyright, changelogs, lintian overrides).
SKIPPED_TREES = ("usr/share/doc/", "usr/share/lintian/", "usr/share/doc-base/")
MAX_DIRS = 100
#: None: no cap (1000 keeps 97K labels, 100 keeps 52K; see docs/datasets.md)
MAX_LABELS = None

Files = dict[str, tuple[set[str], set[str]]]
#: Contents lines grouped by their package list: ``{packages: (dirs, names)}`` (bytes).
ContentGroups = dict[bytes, tuple[set[bytes], set[bytes]]]


def contents_kinds(arch: str) -> tuple[str, str]:
    return f"Contents-{arch}", "Contents-all"


def read_contents(lines: Iterable[bytes], groups: ContentGroups | None = None) -> ContentGroups:
    """Group Contents lines ``path   section/pkg,area/section/pkg`` (paths may hold
    blanks, the package list may not) by their package list: ``{packages: (dirs,
    names)}`` (bytes), boilerplate trees, headers and blank lines skipped. Extends
    ``groups`` when given (several files). One loop, inlined: 7M lines."""
    groups = {} if groups is None else groups
    skipped, get = _SKIPPED, groups.get
    for line in lines:
        path, _, packages = line.rstrip().rpartition(b" ")
        if b"/" not in packages or path.startswith(skipped):
            continue
        directory, _, name = path.rstrip().rpartition(b"/")
        entry = get(packages)
        if entry is None:
            entry = groups[packages] = (set(), set())
        entry[0].add(directory)
        entry[1].add(name)
    return groups


_SKIPPED = tuple(t.encode() for t in SKIPPED_TREES)


def package_files(groups: Mapping[bytes, tuple[set, set]]) -> Files:
    """``{package: (directories, file names)}`` from :func:`read_contents` groups."""
    files: Files = {}
    for packages, (dirs, names) in groups.items():
        text_dirs = {d.decode("utf-8", "replace") for d in dirs}
        text_names = {n.decode("utf-8", "replace") for n in names}
        for qualified in packages.decode("utf-8", "replace").split(","):
            package = qualified.rsplit("/", 1)[-1]
            entry = files.setdefault(package, (set(), set()))
            entry[0].update(text_dirs)
            entry[1].update(text_names)
    return files


def file_labels(dirs: Iterable[str], names: Iterable[str]) -> set[str]:
    """``dir:/<directory>`` and ``file:<name>`` labels."""
    return {f"dir:/{d}" for d in dirs} | {f"file:{n}" for n in names}


def label_kind(label: str) -> str:
    return label.split(":", 1)[0]


def label_text(label: str) -> str:
    """A label's words: a file's name, a folder's path (``dir:/usr/share/doc`` -> ``usr
    share doc``)."""
    return label.split(":", 1)[-1].replace("/", " ")


def build_points(records, long_by_md5: Mapping[str, str], files: Files, max_dirs: int):
    """Points of the packages with files; also how many were dropped for more than
    ``max_dirs`` directories and how many have no file outside the boilerplate trees."""
    points, too_many, no_files = [], 0, 0
    for record in records:
        dirs, names = files.get(record["Package"], ((), ()))
        if not dirs:
            no_files += 1
        elif len(dirs) > max_dirs:
            too_many += 1
        else:
            points.append(debian.make_point(record, long_by_md5, file_labels(dirs, names)))
    return points, too_many, no_files


def make_dataset(points: list[Point], max_labels: int | None) -> tuple[Built, dict]:
    """Prune (labels of >= 2 training points, at most ``max_labels`` a point, features
    of >= 2 training points) and assemble."""
    kept, label_n, df = prune(points, labels_from_train=True, max_labels=max_labels)
    built = assemble(kept, label_n, df)
    stats = statistics(built, label_kind)
    stats["points_dropped_by_pruning"] = len(points) - len(kept)
    per_point = np.concatenate([np.diff(built.train.Y.indptr), np.diff(built.test.Y.indptr)])
    stats["labels_per_point_quantiles"] = (
        {str(q): round(float(np.quantile(per_point, q)), 1) for q in (0.5, 0.9, 0.99, 1)}
        if len(per_point)
        else {}
    )
    return built, stats


def rare_labels_only(built: Built, max_points: int) -> Built:
    """``built`` with the labels of at most ``max_points`` training points (ids kept in
    order), less the points left without a label; features and values unchanged."""
    counts = np.bincount(built.train.Y.indices, minlength=len(built.labels))
    keep = counts <= max_points
    new_id = np.where(keep, np.cumsum(keep) - 1, -1)
    sides, points = [], []
    for data, train in ((built.train, True), (built.test, False)):
        rows = [new_id[data.Y.row(i)] for i in range(data.n_points)]
        rows = [np.sort(r[r >= 0]) for r in rows]
        kept = np.flatnonzero([len(r) > 0 for r in rows])
        Y = CSR.from_lists([rows[i] for i in kept], int(keep.sum()))
        sides.append(XCDataset(data.X.take_rows(kept), Y))
        side_points = [p for p in built.points if p.train == train]  # the rows' order
        points += [side_points[i] for i in kept]
    labels = [name for name, k in zip(built.labels, keep, strict=True) if k]
    points.sort(key=lambda p: p.name)
    return Built(labels, built.features, sides[0], sides[1], points, built.idf)


def read_files(lists_dir: str, arch: str) -> tuple[Files, list[str]]:
    """The files of every package in the Contents indexes, and the index names read."""
    paths = [p for kind in contents_kinds(arch) for p in apt_lists.index_files(lists_dir, kind)]
    apt_lists.require(
        paths, f"*_Contents-{arch} / *_Contents-all indexes", lists_dir, apt_lists.FETCH_CONTENTS
    )
    groups: dict = {}
    for path in sorted(paths):
        with apt_lists.open_index(path) as stream:
            read_contents(stream, groups)
    return package_files(groups), [p.rsplit("/", 1)[-1] for p in sorted(paths)]


def build(
    out: str,
    lists_dir: str = apt_lists.LISTS,
    arch: str | None = None,
    *,
    max_dirs: int = MAX_DIRS,
    max_labels: int | None = MAX_LABELS,
    max_label_points: int | None = None,
    label_rows: bool = False,
) -> dict:
    """Build Debian-files from the apt lists into the folder ``out`` (with
    ``label_rows``, the labels' own rows too); returns its stats."""
    arch = arch or apt_lists.native_arch()
    files, contents_used = read_files(lists_dir, arch)
    records = apt_lists.read_packages(lists_dir, arch)
    long_by_md5, translations = apt_lists.read_long_descriptions(lists_dir)
    debian.check_long_descriptions(records, long_by_md5, lists_dir)
    points, too_many, no_files = build_points(records, long_by_md5, files, max_dirs)
    built, stats = make_dataset(points, max_labels)
    if max_label_points is not None:
        built = rare_labels_only(built, max_label_points)
        stats = {**stats, **statistics(built, label_kind)}
    stats["source"] = {
        "packages_read": len(records),
        "packages_without_files": no_files,
        f"packages_dropped_over_{max_dirs}_dirs": too_many,
        "max_labels_per_point": max_labels,
        "max_label_points": max_label_points,
        "contents_files": contents_used,
        "translation_files": translations,
    }
    write_dataset(out, built, stats, label_text if label_rows else None)
    return stats
