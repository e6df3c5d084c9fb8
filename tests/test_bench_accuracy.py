"""``dslide bench accuracy``: a fast end-to-end run on tiny data, skipping, data, errors."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from dslide_dask.data.synthetic import make_synthetic
from dslide_dask.data.xc_text import write_xc
from dslide_dask.metrics import most_frequent_topk, precision_at_k
from dslide_workflows.bench import accuracy, trees

from .test_cli import assert_usage_error, run


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float]:
    """The tiny preset as XC text files, and the most-frequent-labels baseline's P@1."""
    folder = tmp_path_factory.mktemp("tiny")
    train, test = make_synthetic("tiny", seed=0)
    write_xc(str(folder / "train.txt"), train)
    write_xc(str(folder / "test.txt"), test)
    popular = most_frequent_topk(train.Y, test.n_points, 1)
    return folder / "train.txt", folder / "test.txt", precision_at_k(popular, test.Y, (1,))["P@1"]


@pytest.mark.slow
def test_bench_accuracy_end_to_end(capsys, tmp_path: Path, tiny_files) -> None:
    train, test, popular = tiny_files
    names = ["engine", "engine-share0", "engine-network", "engine-tree", "engine-ensemble"] + [
        name
        for name, module in (("omikuji", "omikuji"), ("dense", "torch"))
        if importlib.util.find_spec(module)
    ]
    out_json, out_png = tmp_path / "acc.json", tmp_path / "acc.png"
    argv = ["bench", "accuracy", "--train", str(train), "--test", str(test)]
    argv += ["--contenders", ",".join(names), "--epochs", "3", "--threads", "1"]
    argv += ["--members", "2", "--member-epochs", "3", "--json", str(out_json)]
    code, out, _ = run(capsys, *argv, "--plot", str(out_png))
    assert code == 0
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("contender"))
    assert header.split()[:3] == ["contender", "train", "s"]
    assert {"P@1", "PSP@1", "PSP@5", "nDCG@5"} <= set(header.split())
    for name in names:
        assert any(line.startswith(f"{name} ") for line in lines), name
    assert "engine P@1 by epoch:" in out
    by_epoch = next(line for line in lines if line.startswith("engine P@1 by epoch:"))
    assert by_epoch.endswith(" s, fitted)") and by_epoch.count("fitted") == 1
    results = {r["contender"]: r for r in json.loads(out_json.read_text())["results"]}
    assert list(results) == names
    engine = results["engine"]
    assert [p["epoch"] for p in engine["curve"]] == [1, 2, 3]
    seconds = [p["seconds"] for p in engine["curve"]]
    assert seconds == sorted(seconds) and engine["train_seconds"] == seconds[-1]
    assert engine["P@1"] > max(3 * popular, popular + 0.2), (engine["P@1"], popular)
    for r in results.values():
        assert 0 < r["PSP@1"] <= 1 and 0 < r["nDCG@5"] <= 1 and r["peak_rss_mb"] > 0
    # one command reports what the network adds: the same fit without its share, and alone
    share0, alone = results["engine-share0"], results["engine-network"]
    assert share0["params"]["neighbour_weight"] == [1.0, 0.0]
    assert share0["params"]["neighbours"] == engine["params"]["neighbours"] > 0
    assert alone["params"]["neighbours"] == 0 and engine["params"]["neighbour_weight"] is None
    assert alone["P@1"] > popular + 0.1 and share0["P@1"] > popular + 0.2
    assert "engine-network P@1 by epoch:" in out
    share = next(line for line in lines if line.startswith("the network's share"))
    assert f"P@1 {engine['P@1'] - share0['P@1']:+.4f}" in share
    tree = results["engine-tree"]  # the fit's trees alone: one point, the whole fit's seconds
    assert "curve" not in tree and tree["P@1"] > popular + 0.2 and tree["train_seconds"] > 0
    assert tree["params"]["label_tree"] == engine["params"]["label_tree"] > 0
    ensemble = results["engine-ensemble"]
    assert [p["members"] for p in ensemble["curve"]] == [1, 2]
    assert "engine-ensemble P@1 by member:" in out
    assert ensemble["P@1"] > max(3 * popular, popular + 0.2), (ensemble["P@1"], popular)
    if "omikuji" in results:
        assert results["omikuji"]["P@1"] > popular + 0.2 and "curve" not in results["omikuji"]
    if "dense" in results:
        assert len(results["dense"]["curve"]) == 3
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_missing_library_is_skipped_with_its_pip_command(
    capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(accuracy.REQUIRES, "napkinxc", ("no_such_module_here", "pip install x"))
    out_json = tmp_path / "acc.json"
    argv = ["bench", "accuracy", "--preset", "tiny", "--cache-dir", str(tmp_path)]
    code, out, _ = run(capsys, *argv, "--contenders", "napkinxc", "--json", str(out_json))
    assert code == 0
    assert "napkinxc: skipped, pip install x" in out and "running" not in out
    (result,) = json.loads(out_json.read_text())["results"]
    assert result == {"contender": "napkinxc", "skipped": "pip install x"}


PECOS_USABLE = importlib.util.find_spec("pecos") is not None and not trees.pecos_conflict()


@pytest.mark.skipif(not PECOS_USABLE, reason="needs libpecos, with numpy<2 and scipy<1.14")
def test_pecos_contender_end_to_end(capsys, tmp_path: Path, tiny_files) -> None:
    popular = tiny_files[2]
    out_json = tmp_path / "acc.json"
    argv = ["bench", "accuracy", "--preset", "tiny", "--cache-dir", str(tmp_path)]
    argv += ["--contenders", "pecos", "--threads", "1", "--json", str(out_json)]
    code, out, _ = run(capsys, *argv)
    assert code == 0
    assert any(line.startswith("pecos ") for line in out.splitlines())
    (result,) = json.loads(out_json.read_text())["results"]
    assert result["contender"] == "pecos" and "curve" not in result
    assert result["train_seconds"] > 0 and result["peak_rss_mb"] > 0
    assert result["P@1"] > max(3 * popular, popular + 0.2), (result["P@1"], popular)
    assert 0 < result["PSP@1"] <= 1 and 0 < result["nDCG@5"] <= 1


def test_pecos_is_skipped_where_numpy_or_scipy_is_too_new(
    capsys, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert trees.pecos_conflict({"numpy": "1.26.4", "scipy": "1.13.1"}) is None
    why = trees.pecos_conflict({"numpy": "2.4.6", "scipy": "1.13.1"})
    assert "not numpy 2.4.6: " in why and "[bench-pecos]" in why
    monkeypatch.setitem(accuracy.REQUIRES, "pecos", ("json", "pip install x"))  # "installed"
    monkeypatch.setattr(trees, "pecos_conflict", lambda: "too new")
    argv = ["bench", "accuracy", "--preset", "tiny", "--cache-dir", str(tmp_path)]
    code, out, _ = run(capsys, *argv, "--contenders", "pecos")
    assert code == 0 and "pecos: skipped, too new" in out and "running" not in out


def test_csr_topk_orders_each_rows_scores_and_pads() -> None:
    from scipy.sparse import csr_matrix

    scores = csr_matrix(
        (np.array([0.1, 0.9, 0.5, 0.3], np.float32), [4, 2, 7, 1], [0, 3, 3, 4]), shape=(3, 9)
    )
    np.testing.assert_array_equal(trees._csr_topk(scores, 2), [[2, 7], [-1, -1], [1, -1]])


def test_url_data_are_shuffled_before_the_prefix_is_taken(tmp_path: Path, tiny_files) -> None:
    from dslide_workflows.bench.data import load_datasets

    train, test, _ = tiny_files
    args = argparse.Namespace(
        preset=None,
        train=str(train),
        test=str(test),
        train_points=100,
        test_points=50,
        data_seed=0,
        storage_option=[],
    )
    path, info = accuracy.prepare_data(args, tmp_path)
    got, _ = load_datasets(path)
    first = make_synthetic("tiny", seed=0)[0].slice(0, 100)
    assert (info["train_points"], got.n_points) == (100, 100)
    assert not np.array_equal(got.Y.indptr, first.Y.indptr)  # not the file's first rows


def _first_labels(test: Path, path: Path) -> None:
    """A filter file leaving out each test row's smallest label id."""
    from dslide_dask.data.xc_text import read_xc

    Y = read_xc(str(test)).Y
    rows = [i for i in range(Y.n_rows) if len(Y.row(i))]
    path.write_text("".join(f"{i} {int(Y.row(i).min())}\n" for i in rows))


def test_the_filters_pairs_follow_their_rows_through_the_shuffle(tmp_path: Path, tiny_files):
    from dslide_workflows.bench.data import load_datasets, load_exclusions

    train, test, _ = tiny_files
    _first_labels(test, tmp_path / "filter.txt")
    args = argparse.Namespace(
        preset=None, train=str(train), test=str(test), train_points=100, test_points=50,
        data_seed=0, storage_option=[], filter_labels=str(tmp_path / "filter.txt"),
    )  # fmt: skip
    path, info = accuracy.prepare_data(args, tmp_path)
    _, got = load_datasets(path)
    excluded = load_exclusions(path)
    assert excluded.n_rows == got.n_points == 50 and info["excluded_pairs"] > 0
    for i in range(50):
        labels = got.Y.row(i)
        assert excluded.row(i).tolist() == ([int(labels.min())] if len(labels) else [])


def test_every_true_label_filtered_scores_zero(capsys, tmp_path: Path, tiny_files) -> None:
    train, test, _ = tiny_files
    pairs = tmp_path / "filter.txt"
    from dslide_dask.data.xc_text import read_xc

    Y = read_xc(str(test)).Y
    pairs.write_text("".join(f"{i} {label}\n" for i in range(Y.n_rows) for label in Y.row(i)))
    argv = ["bench", "accuracy", "--train", str(train), "--test", str(test)]
    argv += ["--contenders", "engine-network", "--epochs", "1", "--threads", "1"]
    code, out, _ = run(
        capsys, *argv, "--filter-labels", str(pairs), "--json", str(tmp_path / "a.json")
    )
    assert code == 0 and f", {Y.nnz} test pairs filtered;" in out
    (result,) = json.loads((tmp_path / "a.json").read_text())["results"]
    assert result["P@1"] == result["P@5"] == result["PSP@5"] == 0.0  # only wrong labels left


@pytest.mark.slow
def test_repeats_run_each_contender_with_the_next_seeds(capsys, tmp_path: Path, tiny_files) -> None:
    train, test, _ = tiny_files
    out_json = tmp_path / "acc.json"
    argv = ["bench", "accuracy", "--train", str(train), "--test", str(test), "--seed", "5"]
    argv += ["--contenders", "engine,engine-share0", "--epochs", "1", "--threads", "1"]
    code, out, _ = run(capsys, *argv, "--repeats", "2", "--json", str(out_json))
    assert code == 0
    results = json.loads(out_json.read_text())["results"]
    assert [(r["contender"], r["seed"]) for r in results] == [
        ("engine", 5), ("engine", 6), ("engine-share0", 5), ("engine-share0", 6)
    ]  # fmt: skip
    assert [r["params"]["random_state"] for r in results] == [5, 6, 5, 6]
    assert results[0]["P@1"] != results[1]["P@1"] or results[0]["curve"] != results[1]["curve"]
    assert "means of 2 runs a contender" in out
    row = next(line for line in out.splitlines() if line.startswith("engine "))
    assert f"{(results[0]['P@1'] + results[1]['P@1']) / 2:.4f}" in row.split()
    assert f"engine P@1 by run: {results[0]['P@1']:.4f} (seed 5)" in out
    gains = [results[i]["P@1"] - results[i + 2]["P@1"] for i in (0, 1)]
    assert f"P@1 by run: {gains[0]:+.4f}, {gains[1]:+.4f}" in out


def test_seedless_runs_are_numbered_and_the_share_pairs_runs() -> None:
    from dslide_workflows.bench.accuracy_report import format_report

    def result(name: str, run: int, p1: float) -> dict:
        return {"contender": name, "run": run, "seed": 3 + run, "P@1": p1, "P@5": p1 / 2,
                "PSP@5": p1 / 3, "train_seconds": 1.0, "epoch": 1, "curve": []}  # fmt: skip

    results = [result("engine", 0, 0.5), result("engine", 1, 0.7)]
    results += [result("engine-share0", 0, 0.4), result("engine-share0", 1, 0.5)]
    results += [{k: v for k, v in result("omikuji", r, p).items() if k != "curve"}
                for r, p in ((0, 0.30), (1, 0.34))]  # fmt: skip
    out = format_report(results)
    assert "omikuji P@1 by run: 0.3000 (run 1)  0.3400 (run 2)  (spread 0.0400)" in out
    assert "engine P@1 by run: 0.5000 (seed 3)  0.7000 (seed 4)  (spread 0.2000)" in out
    assert "P@1 +0.1500" in out and "P@1 by run: +0.1000, +0.2000" in out
    assert next(line for line in out.splitlines() if line.startswith("omikuji")).split()[3] == (
        "0.3200"
    )
    # the lead over the best tree that ran: the best by mean P@1, ours or a library's
    assert "the fused answer over the best tree (omikuji): P@1 +0.2800 (+87.5%), in 1.0 s" in out
    ours = [{**result("engine-tree", r, p), "train_seconds": 2.0} for r, p in ((0, 0.5), (1, 0.8))]
    assert "best tree (engine-tree): P@1 -0.0500 (-7.7%), in 1.0 s against 2.0 s" in (
        format_report(results + ours)
    )
    assert "best tree" not in format_report(results[:2])


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--train", "a.txt"], ["--train and --test"]),
        (["--preset", "tiny", "--repeats", "0"], ["--repeats"]),
        ([], ["--preset"]),
        (["--preset", "tiny", "--train", "a", "--test", "b"], ["--preset"]),
        (["--preset", "tiny", "--contenders", "engine,bogus"], ["bogus"]),
        (["--preset", "tiny", "--engine-opt", "K=0"], ["K"]),
        (["--preset", "tiny", "--filter-labels", "f.txt"], ["--filter-labels", "--test"]),
        (
            ["--preset", "tiny", "--contenders", "engine-tree", "--engine-opt", "label_tree=0"],
            ["engine-tree", "label_tree"],
        ),
    ],
)
def test_bench_accuracy_bad_parameter(capsys, flags: list[str], words: list[str]) -> None:
    assert_usage_error(capsys, ["bench", "accuracy", *flags], *words)


def test_the_module_runs_one_contender_and_names_the_command(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        accuracy.main(["--help"])
    assert exit_.value.code == 0 and "dslide bench accuracy" in capsys.readouterr().out


def test_synthetic_bench_data_is_the_presets_first_rows(tmp_path: Path) -> None:
    """Only the prefix is generated (amazon-3m's 1.7M rows never are), and it is exactly
    the rows the whole split starts with."""
    from dslide_workflows.bench.data import bench_data, load_datasets

    path, _ = bench_data("tiny", 300, 100, seed=3, cache_dir=tmp_path, log=lambda _: None)
    train, test = load_datasets(path)
    full_train, full_test = make_synthetic("tiny", seed=3)
    for got, full, n in ((train, full_train, 300), (test, full_test, 100)):
        want = full.slice(0, n)
        assert got.n_points == n
        np.testing.assert_array_equal(got.X.indptr, want.X.indptr)
        np.testing.assert_array_equal(got.X.indices, want.X.indices)
        np.testing.assert_array_equal(got.Y.indices, want.Y.indices)
