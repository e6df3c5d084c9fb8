"""The Debian data set builders on small synthetic apt lists written here (no network)."""

import gzip
import json

import numpy as np
import pytest

from dslide_dask.data import read_xc
from dslide_dask.data.source import read_dataset
from dslide_workflows.cli import main
from dslide_workflows.datasets import apt_lists, debian, debian_files
from dslide_workflows.datasets.features import (
    STOP_WORDS,
    name_words,
    ngram_counts,
    tfidf_rows,
    tokenize,
)
from dslide_workflows.datasets.xc_build import FILTER_TEST, LABEL_ROWS, Point, is_train, prune

ARCH = "amd64"
PACKAGES = f"deb.example.org_debian_dists_stable_main_binary-{ARCH}_Packages"
TRANSLATION = "deb.example.org_debian_dists_stable_main_i18n_Translation-en.gz"
CONTENTS = f"deb.example.org_debian_dists_stable_main_Contents-{ARCH}.gz"


def sources(train: bool, n: int) -> list[str]:
    """``n`` source names on the given side of the seeded split."""
    names = (f"src{i}" for i in range(1000))
    return [s for s in names if is_train(s) == train][:n]


def stanza(name: str, source: str, depends: str, section: str = "utils") -> str:
    return (
        f"Package: {name}\nSource: {source} (1.0-1)\nVersion: 1.0-1\nSection: {section}\n"
        f"Depends: {depends}\nTag: role::program,\n interface::commandline\n"
        f"Filename: pool/{name}.deb\nDescription: {name} tool for parsing text\n"
        f"Description-md5: md5-{name}\n"
    )


def write_lists(folder, train_n: int = 6, test_n: int = 3) -> dict[str, str]:
    """Two binaries (``<src>-bin``, ``<src>-data``) a source; every package depends on
    libc6 and a dependency of its own (``only-<name>``). Returns package -> source."""
    folder.mkdir(exist_ok=True)
    owners = {}
    for src in sources(True, train_n) + sources(False, test_n):
        for suffix in ("bin", "data"):
            owners[f"{src}-{suffix}"] = src
    text = "\n".join(
        stanza(p, s, f"libc6 (>= 2.36), only-{p} | other-{p}:any") for p, s in owners.items()
    )
    (folder / PACKAGES).write_text(text)
    translations = "\n\n".join(
        f"Package: {p}\nDescription-md5: md5-{p}\nDescription-en: {p} tool\n"
        f" Reads common text files quickly and writes reports.\n ."
        for p in owners
    )
    with gzip.open(folder / TRANSLATION, "wt") as f:
        f.write(translations + "\n")
    return owners


# -- apt lists ---------------------------------------------------------------------------------
def test_deb822_stanzas_and_continuation_lines():
    text = (
        "Package: a\nDescription: short\n long one\n .\n more\n\n\nPackage: b\nTag: x::y,\n z::w\n"
    )
    records = list(apt_lists.parse_deb822(text))
    assert [r["Package"] for r in records] == ["a", "b"]
    assert records[0]["Description"] == "short\nlong one\n.\nmore"
    assert records[1]["Tag"] == "x::y,\nz::w"


@pytest.mark.parametrize(
    ("a", "b", "order"),
    [
        ("1.0", "1.0", 0),
        ("1.0~rc1", "1.0", -1),
        ("1:0.1", "2.0", 1),
        ("1.10", "1.9", 1),
        ("1.0-2", "1.0-10", -1),
        ("1.0a", "1.0+", -1),
        ("2.36-9+deb12u4", "2.36-9+deb12u10", -1),
    ],
)
def test_debian_version_order(a, b, order):
    assert apt_lists.compare_versions(a, b) == order
    assert apt_lists.compare_versions(b, a) == -order


def test_candidates_take_the_highest_version_and_merge_equal_ones():
    records = [
        {"Package": "x", "Version": "1.0-1", "Filename": "f", "Tag": "role::program"},
        {"Package": "x", "Version": "1.0-2", "Filename": "security"},
        {"Package": "x", "Version": "1.0-2", "Filename": "main", "Tag": "use::editing"},
        {"Package": "installed-only", "Version": "9"},
    ]
    (best,) = apt_lists.candidates(records)
    assert best == {
        "Package": "x",
        "Version": "1.0-2",
        "Filename": "security",
        "Tag": "use::editing",
    }


# -- features ----------------------------------------------------------------------------------
def test_tokens_bigrams_and_name_words():
    assert tokenize("The GNU C library, v2 of it!") == ["gnu", "library", "v2"]
    assert "the" in STOP_WORDS
    assert name_words("libqt5-core.x") == "libqt core x"
    counts = ngram_counts(["fast parser", "the parser library"])
    assert counts == {"fast": 1, "parser": 2, "fast_parser": 1, "library": 1, "parser_library": 1}
    assert "parser_parser" not in counts  # no bigram across parts


def test_tfidf_rows_are_l2_normalised_with_ascending_ids():
    X = tfidf_rows(
        [{"b": 3, "a": 1, "unknown": 5}, {"a": 2}, {}], {"a": 0, "b": 1}, np.array([1.0, 2.0])
    )
    assert X.shape == (3, 2)
    assert X.row(0).tolist() == [0, 1]
    norms = np.sqrt(np.add.reduceat(X.data.astype(np.float64) ** 2, X.indptr[:2]))
    np.testing.assert_allclose(norms, 1.0, rtol=1e-6)
    b_over_a = (1 + np.log(3)) * 2.0 / 1.0
    assert X.data[1] / X.data[0] == pytest.approx(b_over_a, rel=1e-6)
    assert X.row(2).tolist() == []


def test_prune_drops_rare_labels_and_emptied_points_until_stable():
    def point(name, labels, train=True, words=("common",)):
        return Point(name, name, set(labels), dict.fromkeys(words, 1), train)

    points = [
        point("a", {"shared", "rare"}),
        point("b", {"shared"}),
        point("c", {"lonely"}),  # its only label is rare: dropped
        point("d", {"shared"}, words=("unseen",)),  # no feature of 2 training points
    ]
    kept, label_n, _ = prune(points)
    assert [p.name for p in kept] == ["a", "b"]
    assert label_n["shared"] == 2 and label_n["rare"] == 1
    test_point = point("t", {"shared", "x"}, train=False)
    kept, label_n, _ = prune(
        [*points[:2], test_point, point("u", {"x"}, train=False)], labels_from_train=True
    )
    assert [p.name for p in kept] == ["a", "b", "t"] and label_n["x"] == 0


# -- Debian-26K --------------------------------------------------------------------------------
def test_dependency_labels():
    record = {
        "Package": "tool",
        "Depends": "libc6 (>= 2.36), python3:any | python3-minimal, tool",
        "Suggests": "doc-pkg [amd64]",
        "Tag": "role::program,\nuse::editing",
        "Section": "contrib/utils",
    }
    assert debian.package_labels(record) == {
        "libc6",
        "python3",
        "python3-minimal",
        "doc-pkg",
        "role::program",
        "use::editing",
        "section:utils",
    }


def test_debian_builder_end_to_end(tmp_path):
    owners = write_lists(tmp_path / "lists")
    out = tmp_path / "out"
    stats = debian.build(str(out), str(tmp_path / "lists"), ARCH)
    labels = (out / "labels.txt").read_text().split("\n")[:-1]
    assert "libc6" in labels and "section:utils" in labels and "role::program" in labels
    assert not [lab for lab in labels if lab.startswith(("only-", "other-"))]  # 1 point each
    train, test = read_xc(str(out / "train.txt")), read_xc(str(out / "test.txt"))
    assert (train.n_points, test.n_points) == (12, 6) == (stats["train"]["points"], 6)
    assert train.n_labels == len(labels) == stats["labels"]
    assert train.n_features == len((out / "features.txt").read_text().split("\n")) - 1
    for data in (train, test):
        rows = np.repeat(np.arange(data.n_points), np.diff(data.X.indptr))
        norms = np.bincount(rows, weights=data.X.data.astype(np.float64) ** 2)
        np.testing.assert_allclose(norms, 1.0, rtol=1e-4)
    sides = {is_train(src) for src in owners.values()}
    assert sides == {True, False}
    assert stats["points_with_long_description"] == 18
    assert json.loads((out / "stats.json").read_text()) == stats
    again = tmp_path / "again"
    debian.build(str(again), str(tmp_path / "lists"), ARCH)
    for name in ("train.txt", "test.txt", "labels.txt", "features.txt", "stats.json"):
        assert (out / name).read_bytes() == (again / name).read_bytes()


def test_a_test_row_that_is_a_label_is_paired_with_it_to_filter(tmp_path):
    owners = write_lists(tmp_path / "lists")
    debian.build(str(tmp_path / "plain"), str(tmp_path / "lists"), ARCH)
    assert not (tmp_path / "plain" / FILTER_TEST).exists()  # no test row is a label
    test_names = sorted(p for p, s in owners.items() if not is_train(s))
    own = test_names[1]
    packages = tmp_path / "lists" / PACKAGES  # everything depends on a test package too
    packages.write_text(packages.read_text().replace("Depends: libc6", f"Depends: {own}, libc6"))
    out = tmp_path / "out"
    stats = debian.build(str(out), str(tmp_path / "lists"), ARCH)
    labels = (out / "labels.txt").read_text().split("\n")[:-1]
    lines = (out / FILTER_TEST).read_text().splitlines()
    assert lines == [f"1 {labels.index(own)}"] and stats["filter_labels_test"] == 1
    test = read_xc(str(out / "test.txt"))
    assert labels.index(own) not in test.Y.row(1)  # never its own label
    assert labels.index(own) in test.Y.row(0)  # a true label of the others


def test_split_keeps_the_binaries_of_a_source_together():
    records = [
        {"Package": f"{s}-{k}", "Source": s, "Description": "a tool", "Section": "x"}
        for s in sources(True, 5) + sources(False, 5)
        for k in ("bin", "data")
    ]
    points = debian.build_points(records, {})
    by_source: dict = {}
    for p in points:
        by_source.setdefault(p.source, set()).add(p.train)
    assert all(len(sides) == 1 for sides in by_source.values())
    assert sum(p.train for p in points) == 10


# -- Debian-files ------------------------------------------------------------------------------
def contents_lines(owners) -> list[str]:
    lines = ["FILE  LOCATION"]  # an old-style header
    for package in owners:
        lines += [
            f"usr/bin/{package}    utils/{package}",
            f"usr/share/doc/{package}/copyright    utils/{package}",
            f"usr/share/lintian/overrides/{package}    utils/{package}",
            f"usr/share/tool data/README.md    utils/{package}",  # a blank in the path
        ]
    lines.append("usr/lib/shared.so    libs/a,contrib/libs/b")
    return lines


def test_contents_lines_to_directories_and_file_names():
    groups = debian_files.read_contents(line.encode() + b"\n" for line in contents_lines(["a"]))
    files = debian_files.package_files(groups)
    assert files["a"] == (
        {"usr/bin", "usr/share/tool data", "usr/lib"},
        {"a", "README.md", "shared.so"},
    )
    assert files["b"] == ({"usr/lib"}, {"shared.so"})
    assert debian_files.file_labels(*files["b"]) == {"dir:/usr/lib", "file:shared.so"}


def test_debian_files_builder_end_to_end(tmp_path):
    owners = write_lists(tmp_path / "lists")
    lines = contents_lines(owners)
    big = next(iter(owners))  # a pathological package: more directories than max_dirs
    lines += [f"opt/big/d{i}/f    utils/{big}" for i in range(5)]
    test_only = [p for p in owners if not is_train(owners[p])][0]
    lines.append(f"usr/share/test-only/x    utils/{test_only}")
    with gzip.open(tmp_path / "lists" / CONTENTS, "wt") as f:
        f.write("\n".join(lines) + "\n")
    out = tmp_path / "out"
    stats = debian_files.build(str(out), str(tmp_path / "lists"), ARCH, max_dirs=3)
    labels = (out / "labels.txt").read_text().split("\n")[:-1]
    assert set(labels) == {"dir:/usr/bin", "dir:/usr/share/tool data", "file:README.md"}
    assert stats["source"]["packages_dropped_over_3_dirs"] == 1
    train, test = read_xc(str(out / "train.txt")), read_xc(str(out / "test.txt"))
    assert (train.n_points, test.n_points) == (11, 6)
    assert stats["labels_without_train_points"] == 0
    assert stats["test_label_occurrences_seen_in_train"] == 1.0


def test_debian_files_keeps_only_rare_labels_when_asked(tmp_path):
    owners = write_lists(tmp_path / "lists")
    train_side = [p for p in owners if is_train(owners[p])]
    test_side = [p for p in owners if not is_train(owners[p])]
    pair = [*train_side[:2], test_side[0]]  # two labels of 2 training points, one test point
    lines = contents_lines(owners) + [f"usr/lib/pair/twin.so    utils/{p}" for p in pair]
    with gzip.open(tmp_path / "lists" / CONTENTS, "wt") as f:
        f.write("\n".join(lines) + "\n")
    full = debian_files.build(str(tmp_path / "all"), str(tmp_path / "lists"), ARCH)
    stats = debian_files.build(
        str(tmp_path / "rare"), str(tmp_path / "lists"), ARCH, max_label_points=2
    )
    train = read_xc(str(tmp_path / "rare" / "train.txt"))
    counts = np.bincount(train.Y.indices, minlength=train.n_labels)
    assert full["labels"] == 5 and train.n_points == 2 and (counts == 2).all()
    labels = (tmp_path / "rare" / "labels.txt").read_text().split("\n")[:-1]
    assert sorted(labels) == ["dir:/usr/lib/pair", "file:twin.so"] and stats["labels"] == 2
    test = read_xc(str(tmp_path / "rare" / "test.txt"))
    assert test.n_points == 1 and test.Y.row(0).tolist() == [0, 1]
    assert stats["source"]["max_label_points"] == 2


def test_label_rows_are_each_labels_own_words(tmp_path):
    owners = write_lists(tmp_path / "lists")
    with gzip.open(tmp_path / "lists" / CONTENTS, "wt") as f:
        f.write("\n".join(contents_lines(owners)) + "\n")
    out = tmp_path / "out"
    args = ["datasets", "debian-files", str(out), "--lists", str(tmp_path / "lists")]
    assert main([*args, "--arch", ARCH, "--label-rows"]) == 0
    labels = (out / "labels.txt").read_text().split("\n")[:-1]
    feature_id = {f: i for i, f in enumerate((out / "features.txt").read_text().split("\n")[:-1])}
    rows = read_xc(str(out / LABEL_ROWS))
    named = {}  # label id -> the feature ids of its words
    for i, label in enumerate(labels):
        words = ngram_counts([debian_files.label_text(label)])
        if ids := sorted(feature_id[w] for w in words if w in feature_id):
            named[i] = ids
    assert 0 < len(named) < len(labels)  # README.md's words are no feature: no row
    assert [rows.Y.row(r).tolist() for r in range(rows.n_points)] == [[i] for i in named]
    for r, ids in enumerate(named.values()):
        assert rows.X.row(r).tolist() == ids
        assert np.linalg.norm(
            rows.X.data[rows.X.indptr[r] : rows.X.indptr[r + 1]]
        ) == pytest.approx(1)
    assert json.loads((out / "stats.json").read_text())["label_rows"] == rows.n_points
    both, _ = read_dataset(str(out / "train*.txt"))  # the documented way to train on them
    assert both.n_points == read_xc(str(out / "train.txt")).n_points + rows.n_points


def test_missing_lists_are_one_line_errors(tmp_path, capsys):
    assert main(["datasets", "debian", str(tmp_path / "o"), "--lists", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dslide: error: no *_binary-" in err
    assert apt_lists.FETCH_LISTS in err
    write_lists(tmp_path / "lists")
    args = ["datasets", "debian-files", str(tmp_path / "o"), "--lists", str(tmp_path / "lists")]
    assert main([*args, "--arch", ARCH]) == 2
    err = capsys.readouterr().err
    assert "Contents" in err and "apt-file" in err and err.count("\n") == 1


def test_label_rows_of_shipped_label_features(tmp_path, capsys):
    (tmp_path / "train.txt").write_text("3 6 4\n0,1 0:0.5 2:0.5\n2 1:1\n3 4:1 5:2\n")
    (tmp_path / "Yf.txt").write_text("4 6\n1:1 0:1\n\n5:3 2:4\n4:2\n")  # label 1: no features
    out = tmp_path / LABEL_ROWS
    args = ["datasets", "label-rows", str(tmp_path / "Yf.txt"), str(out)]
    assert main([*args, "--train", str(tmp_path / "train.txt")]) == 0
    rows = read_xc(str(out))
    assert [rows.Y.row(r).tolist() for r in range(rows.n_points)] == [[0], [2], [3]]
    assert [rows.X.row(r).tolist() for r in range(rows.n_points)] == [[0, 1], [2, 5], [4]]
    assert rows.X.data.tolist() == pytest.approx([0.5**0.5, 0.5**0.5, 0.8, 0.6, 1.0], 1e-5)
    both, _ = read_dataset(str(tmp_path / "train*.txt"))
    assert both.n_points == 6 and both.n_labels == 4
    capsys.readouterr()


@pytest.mark.parametrize(
    "text, problem",
    [
        (
            "4 6\n0:1\n\n5:3 9:4\n\n",
            "Yf.txt:4: expected 'column:value' with a column in [0, 6), got '9:4'",
        ),
        ("4 6\n0:1 0:2\n\n\n\n", "Yf.txt:2: column 0 given twice"),
        ("4 6\n0:nan\n\n\n\n", "Yf.txt:2: expected 'column:value'"),
        ("4 6 4\n", "Yf.txt:1: header must be 2 integers 'N_rows N_columns'"),
        ("4 6\n0:1\n", "Yf.txt: the file ends after 1 row(s) but its header says 4"),
        ("4 6\n\n\n\n\n1:1\n", "Yf.txt:6: more rows than the header's 4"),
        ("4 5\n\n\n\n\n", "Yf.txt: 4 labels x 5 features, but "),
        ("99999999999 6\n0:1\n", "Yf.txt: the file ends after 1 row(s) but its header says"),
    ],
)
def test_bad_label_features_are_one_line_errors(tmp_path, capsys, text, problem):
    (tmp_path / "train.txt").write_text("1 6 4\n0 0:1\n")
    (tmp_path / "Yf.txt").write_text(text)
    out = tmp_path / "rows.txt"
    args = ["datasets", "label-rows", str(tmp_path / "Yf.txt"), str(out)]
    assert main([*args, "--train", str(tmp_path / "train.txt")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and problem in err and not out.exists()
