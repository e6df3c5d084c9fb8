"""Debian-26K: binary packages labelled with their dependencies, debtags and section.

A point is a binary package of the apt lists (each name's highest version; records with
no Filename, installed-only, are not in the lists read). Features: see
:mod:`dslide_workflows.datasets.features` (name, short description and the long one from
Translation-en, joined by Description-md5). Labels: the packages it Depends /
Pre-Depends / Recommends / Suggests on (both sides of ``a | b``; versions, :arch and
architecture restrictions dropped), its debtags (``role::program``...) and
``section:<Section>`` (area prefix such as ``contrib/`` dropped), never its own name.
Labels of fewer than 2 points, features of fewer than 2 training points and the points
they leave without label or feature are dropped until nothing changes. Split 80/20 by a
seeded hash of the source package.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from dslide_workflows.datasets import apt_lists
from dslide_workflows.datasets.features import name_words, package_counts
from dslide_workflows.datasets.xc_build import (
    Built,
    Point,
    assemble,
    is_train,
    prune,
    statistics,
    write_dataset,
)

DEPENDENCY_FIELDS = ("Depends", "Pre-Depends", "Recommends", "Suggests")
_PACKAGE_NAME = re.compile(r"\s*([a-z0-9][a-z0-9+.\-]*)")
#: Points whose long description is missing beyond this share: the lists are incomplete.
MAX_MISSING_LONG = 0.05


def dependency_names(value: str) -> set[str]:
    """The package names of a dependency field, every alternative of ``a | b``."""
    names = set()
    for alternative in re.split(r"[,|]", value):
        match = _PACKAGE_NAME.match(alternative)
        if match:
            names.add(match.group(1))
    return names


def package_labels(record: Mapping[str, str]) -> set[str]:
    """Dependencies, debtags and ``section:<name>`` of a Packages record, not itself."""
    labels = set()
    for name in DEPENDENCY_FIELDS:
        labels |= dependency_names(record.get(name, ""))
    labels.update(tag.strip() for tag in record.get("Tag", "").split(",") if tag.strip())
    if record.get("Section"):
        labels.add("section:" + record["Section"].rsplit("/", 1)[-1])
    labels.discard(record["Package"])
    return labels


def source_of(record: Mapping[str, str]) -> str:
    """The source package (``Source: foo (1.2-1)`` -> ``foo``; the package itself)."""
    return (record.get("Source") or record["Package"]).split()[0]


def descriptions(record: Mapping[str, str], long_by_md5: Mapping[str, str]) -> tuple[str, str]:
    """Short and long description; the long one inline or from Translation-en."""
    short, _, long = record.get("Description", "").partition("\n")
    return short, long or long_by_md5.get(record.get("Description-md5", ""), "")


def make_point(record: Mapping[str, str], long_by_md5: Mapping[str, str], labels) -> Point:
    """A package as a point with the given labels (its features and split side)."""
    short, long = descriptions(record, long_by_md5)
    name = record["Package"]
    return Point(
        name=name,
        source=source_of(record),
        labels=set(labels),
        counts=package_counts(name, short, long),
        train=is_train(source_of(record)),
        has_long=bool(long),
    )


def check_long_descriptions(records: list, long_by_md5: Mapping[str, str], lists_dir: str):
    """A clear error when the Translation-en lists cover too few packages."""
    missing = sum(
        1
        for r in records
        if "\n" not in r.get("Description", "") and r.get("Description-md5") not in long_by_md5
    )
    if records and missing > MAX_MISSING_LONG * len(records):
        raise apt_lists.MissingAptData(
            f"{missing} of {len(records)} packages have no long description in "
            f"{lists_dir}: run `{apt_lists.FETCH_LISTS}` (as root) first"
        )


def label_kind(label: str) -> str:
    if label.startswith("section:"):
        return "section"
    return "debtag" if "::" in label else "package"


def build_points(records: Iterable[Mapping[str, str]], long_by_md5: Mapping[str, str]):
    """Debian-26K's points, before pruning."""
    return [make_point(r, long_by_md5, package_labels(r)) for r in records]


def make_dataset(points: list[Point]) -> tuple[Built, dict]:
    """Prune (labels of >= 2 points, features of >= 2 training points) and assemble."""
    kept, label_n, df = prune(points)
    built = assemble(kept, label_n, df)
    return built, statistics(built, label_kind)


def build(
    out: str, lists_dir: str = apt_lists.LISTS, arch: str | None = None, label_rows: bool = False
) -> dict:
    """Build Debian-26K from the apt lists into the folder ``out`` (with ``label_rows``,
    the labels' own rows too); returns its stats."""
    records = apt_lists.read_packages(lists_dir, arch)
    long_by_md5, used = apt_lists.read_long_descriptions(lists_dir)
    check_long_descriptions(records, long_by_md5, lists_dir)
    built, stats = make_dataset(build_points(records, long_by_md5))
    stats["source"] = {"packages_read": len(records), "translation_files": used}
    write_dataset(out, built, stats, name_words if label_rows else None)  # a label's words
    return stats
