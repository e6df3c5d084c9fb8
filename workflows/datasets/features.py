"""Text features of a package: lowercase word unigrams and bigrams of its name, short and
long descriptions, weighted by TF-IDF and L2-normalised a row.

Tokens are runs of ``[a-z0-9]`` of two or more characters that are not stop words;
bigrams join neighbouring tokens (after stop words are removed) within one part, never
across the name and the descriptions. A row's value of feature f is
``(1 + ln tf) * (ln((1 + N_train) / (1 + df_f)) + 1)`` with df counted over the training
points only, then the row is scaled to unit length.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from dslide_dask.data.csr import CSR

_STOP_TEXT = (
    "about above after again all also an and any are as at be been being both but by can "
    "could do does doing each for from further had has have having he her here his how if "
    "in into is it its itself just may more most no nor not of off on once only or other "
    "our out over own same she should so some such than that the their them then there "
    "these they this those through to too under until up very via was we were what when "
    "where which while who whom why will with within without would you your"
)
STOP_WORDS = frozenset(_STOP_TEXT.split(" "))
_WORD = re.compile(r"[a-z0-9]+")
_NAME_SEPARATORS = re.compile(r"[-._+0-9]+")


def tokenize(text: str) -> list[str]:
    """Lowercase words of two or more characters, stop words removed."""
    return [w for w in _WORD.findall(text.lower()) if len(w) > 1 and w not in STOP_WORDS]


def name_words(package: str) -> str:
    """A package name as words: split at - . _ + and digits (``libqt5-core`` -> ``libqt core``)."""
    return " ".join(_NAME_SEPARATORS.split(package))


def ngram_counts(parts: Iterable[str]) -> Counter:
    """Counts of the unigrams and bigrams (``a_b``) of each part."""
    counts: Counter = Counter()
    for part in parts:
        words = tokenize(part)
        counts.update(words)
        counts.update(f"{a}_{b}" for a, b in zip(words, words[1:], strict=False))
    return counts


def package_counts(package: str, short: str, long: str) -> Counter:
    """The n-gram counts of a package: its name, short and long descriptions."""
    return ngram_counts((name_words(package), short, long))


def ranked(counts: Mapping[str, int], min_count: int) -> list[str]:
    """The keys counted at least ``min_count`` times, most frequent first (ties by name):
    the id order of labels.txt and features.txt."""
    return sorted((k for k, c in counts.items() if c >= min_count), key=lambda k: (-counts[k], k))


def idf_weights(features: Sequence[str], df: Mapping[str, int], n_train: int) -> np.ndarray:
    """Smoothed inverse document frequency of each feature: ``ln((1+N)/(1+df)) + 1``."""
    dfs = np.fromiter((df[f] for f in features), dtype=np.float64, count=len(features))
    return np.log((1.0 + n_train) / (1.0 + dfs)) + 1.0


def tfidf_rows(rows: Sequence[Mapping[str, int]], feature_ids: Mapping[str, int], idf) -> CSR:
    """The L2-normalised TF-IDF matrix of ``rows`` (n-gram counts), ids ascending a row;
    n-grams without an id are ignored."""
    ids: list[int] = []
    tfs: list[float] = []
    lengths = np.zeros(len(rows), dtype=np.int64)
    for r, counts in enumerate(rows):
        kept = [(feature_ids[f], c) for f, c in counts.items() if f in feature_ids]
        kept.sort()
        lengths[r] = len(kept)
        ids.extend(i for i, _ in kept)
        tfs.extend(1.0 + math.log(c) for _, c in kept)
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    col = np.asarray(ids, dtype=np.int64)
    values = np.asarray(tfs, dtype=np.float64) * np.asarray(idf, dtype=np.float64)[col]
    row_of = np.repeat(np.arange(len(rows)), lengths)
    norms = np.sqrt(np.bincount(row_of, weights=values * values, minlength=len(rows)))
    values /= np.where(norms > 0, norms, 1.0)[row_of]
    return CSR(indptr, col, values, len(feature_ids))
