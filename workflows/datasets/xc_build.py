"""What both Debian builders share: points, the seeded split by source package, pruning
rare labels and features, id assignment, TF-IDF matrices, statistics and the output
folder (Extreme Classification Repository text format, written by
:func:`dslide_dask.data.write_xc`).

Output folder: ``train.txt`` and ``test.txt`` (header ``N_points N_features N_labels``,
0-based ids), ``labels.txt`` and ``features.txt`` (the name of id i on line i+1, ids by
falling frequency, ties by name) and ``stats.json``; asked for, ``train-label-rows.txt``:
a row of each label's own name, labelled with it (:func:`label_rows`).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from dslide_dask.data.csr import CSR
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.xc_text import write_xc
from dslide_workflows.datasets.features import idf_weights, ngram_counts, ranked, tfidf_rows

#: The split's seed: kept from the first Debian-26K build, so the same lists give the
#: same train/test sides.
SEED = "debian-xc-v1"
TRAIN_PERCENT = 80
QUANTILES = (0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1)
#: The labels' own rows (:func:`label_rows`): train on ``train*.txt`` to have them.
LABEL_ROWS = "train-label-rows.txt"
#: Each test row's own item among the labels (:func:`own_label_pairs`), as the XC
#: Repository's label-feature sets name it.
FILTER_TEST = "filter_labels_test.txt"


@dataclass
class Point:
    """A binary package: its labels (names) and n-gram counts; ``train`` is its side."""

    name: str
    source: str
    labels: set[str]
    counts: Counter
    train: bool
    has_long: bool = True


@dataclass
class Built:
    """A data set ready to write: the id -> name lists and the two splits."""

    labels: list[str]
    features: list[str]
    train: XCDataset
    test: XCDataset
    points: list[Point] = field(default_factory=list)
    #: Each feature's inverse document frequency over the training points.
    idf: np.ndarray = field(default_factory=lambda: np.zeros(0))


def is_train(source: str, seed: str = SEED, percent: int = TRAIN_PERCENT) -> bool:
    """The side of a source package: a seeded SHA-1, so its binaries stay together."""
    digest = hashlib.sha1(f"{seed}:{source}".encode()).hexdigest()
    return int(digest[:8], 16) % 100 < percent


def prune(
    points: Sequence[Point],
    *,
    min_label_points: int = 2,
    labels_from_train: bool = False,
    min_feature_df: int = 2,
    max_labels: int | None = None,
) -> tuple[list[Point], Counter, Counter]:
    """Drop points left without a frequent label or a frequent feature (or with more
    than ``max_labels`` frequent labels) until nothing changes.

    A label is frequent with ``min_label_points`` points (training points only with
    ``labels_from_train``), a feature with ``min_feature_df`` training points. Returns
    the points kept and the final label counts and training document frequencies."""
    points = list(points)
    while True:
        label_n = Counter(
            lab for p in points if p.train or not labels_from_train for lab in p.labels
        )
        df = Counter(f for p in points if p.train for f in p.counts)
        kept = []
        for p in points:
            n_labels = sum(label_n[lab] >= min_label_points for lab in p.labels)
            if not n_labels or (max_labels is not None and n_labels > max_labels):
                continue
            if any(df[f] >= min_feature_df for f in p.counts):
                kept.append(p)
        if len(kept) == len(points):
            return kept, label_n, df
        points = kept


def assemble(
    points: Sequence[Point],
    label_n: Counter,
    df: Counter,
    *,
    min_label_points: int = 2,
    min_feature_df: int = 2,
) -> Built:
    """Ids (by falling frequency) and the train and test matrices of pruned points, each
    side in package-name order."""
    labels = ranked(label_n, min_label_points)
    features = ranked(df, min_feature_df)
    label_ids = {lab: i for i, lab in enumerate(labels)}
    feature_ids = {f: i for i, f in enumerate(features)}
    ordered = sorted(points, key=lambda p: p.name)
    idf = idf_weights(features, df, sum(p.train for p in ordered))
    sides = {}
    for train in (True, False):
        side = [p for p in ordered if p.train == train]
        label_rows = [sorted(label_ids[lab] for lab in p.labels if lab in label_ids) for p in side]
        Y = CSR.from_lists(label_rows, len(labels))
        X = tfidf_rows([p.counts for p in side], feature_ids, idf)
        sides[train] = XCDataset(X, Y)
    return Built(labels, features, sides[True], sides[False], ordered, idf)


def _quantiles(values: np.ndarray) -> dict[str, float]:
    if not len(values):
        return {str(q): 0.0 for q in QUANTILES}
    return {str(q): round(float(np.quantile(values, q)), 1) for q in QUANTILES}


def _mean(values: np.ndarray) -> float:
    return round(float(np.mean(values)), 4) if len(values) else 0.0


def _side(data: XCDataset) -> dict:
    return {
        "points": data.n_points,
        "avg_labels_per_point": _mean(np.diff(data.Y.indptr)),
        "avg_features_per_point": _mean(np.diff(data.X.indptr)),
    }


def statistics(built: Built, label_kind: Callable[[str], str]) -> dict:
    """Sizes, averages, label-frequency quantiles and how much of the test labels the
    training side has seen (the keys of the Debian-26K stats.json)."""
    n_labels = len(built.labels)
    train_freq = np.bincount(built.train.Y.indices, minlength=n_labels)
    all_freq = train_freq + np.bincount(built.test.Y.indices, minlength=n_labels)
    test_Y = built.test.Y
    seen = train_freq[test_Y.indices] > 0
    rows = np.repeat(np.arange(test_Y.n_rows), np.diff(test_Y.indptr))
    seen_a_row = np.bincount(rows, weights=seen, minlength=test_Y.n_rows) > 0
    kinds = Counter(label_kind(lab) for lab in built.labels)
    return {
        "points": built.train.n_points + built.test.n_points,
        "features": len(built.features),
        "labels": n_labels,
        "train": _side(built.train),
        "test": _side(built.test),
        "test_points_with_a_label_seen_in_train": _mean(seen_a_row),
        "test_label_occurrences_seen_in_train": round(_mean(seen), 3),
        "labels_without_train_points": int((train_freq == 0).sum()),
        "label_kinds": dict(kinds.most_common()),
        "label_frequency_quantiles_train": _quantiles(train_freq),
        "label_frequency_quantiles_all": _quantiles(all_freq),
        "points_with_long_description": sum(p.has_long for p in built.points),
        "seed": SEED,
        "train_percent": TRAIN_PERCENT,
    }


def label_rows(built: Built, label_text: Callable[[str], str]) -> XCDataset:
    """A training row of each label's own words, labelled with it alone: the label's
    ``label_text`` as a point's text is (n-grams, the training points' IDF, unit rows).
    Labels without a word among the features get none.

    Beside the training points they tie a label's name to the rows that carry it: the
    network learns to place a name and the descriptions of its label's points together,
    and a test row's neighbours then include the names of labels it shares words with.
    On debian-files-rare (file and folder names) this lifted the fused P@1 by 0.02-0.03, but
    it cost 0.018 on Debian-26K, whose labels are package names and tags
    (docs/accuracy.md): a choice for each data set, so the rows are a file of their own."""
    feature_ids = {f: i for i, f in enumerate(built.features)}
    X = tfidf_rows(
        [ngram_counts([label_text(lab)]) for lab in built.labels], feature_ids, built.idf
    )
    return own_rows(X)


def own_rows(X: CSR) -> XCDataset:
    """Row ``l`` of ``X`` (a label's features) labelled with ``l``, for each row with a
    feature: the others would be points of no words."""
    kept = np.flatnonzero(np.diff(X.indptr) > 0)
    return XCDataset(X.take_rows(kept), CSR.from_lists([[int(i)] for i in kept], X.n_rows))


def own_label_pairs(built: Built) -> list[tuple[int, int]]:
    """``(test row, label)`` where the label is the test row's own package: never a true
    label of it, and the one a model that reads the labels' names is drawn to. The XC
    Repository's label-feature sets, whose items are labels too, ship these pairs as
    ``filter_labels_test.txt`` and score without them; so do sets built here."""
    label_ids = {lab: i for i, lab in enumerate(built.labels)}
    test = [p for p in built.points if not p.train]  # assemble's order of the test rows
    return [(row, label_ids[p.name]) for row, p in enumerate(test) if p.name in label_ids]


def write_dataset(
    out: str, built: Built, stats: dict, label_text: Callable[[str], str] | None = None
) -> None:
    """train.txt, test.txt, labels.txt, features.txt and stats.json under ``out``; given
    ``label_text`` (a label's words), train-label-rows.txt too (:func:`label_rows`); where
    test rows are labels too, filter_labels_test.txt (:func:`own_label_pairs`)."""
    os.makedirs(out, exist_ok=True)
    write_xc(os.path.join(out, "train.txt"), built.train)
    if label_text is not None:
        rows = label_rows(built, label_text)
        write_xc(os.path.join(out, LABEL_ROWS), rows)
        stats["label_rows"] = rows.n_points
    write_xc(os.path.join(out, "test.txt"), built.test)
    if pairs := own_label_pairs(built):
        with open(os.path.join(out, FILTER_TEST), "w", encoding="utf-8") as f:
            f.writelines(f"{row} {label}\n" for row, label in pairs)
        stats["filter_labels_test"] = len(pairs)
    for name, items in (("labels.txt", built.labels), ("features.txt", built.features)):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            f.writelines(item + "\n" for item in items)
    with open(os.path.join(out, "stats.json"), "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=2)
        f.write("\n")
