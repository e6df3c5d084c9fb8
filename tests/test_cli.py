"""The ``dslide`` command line: fast end-to-end runs on tiny data, help, parameter errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dslide_workflows.cli import main

TINY_BENCH = [
    "bench",
    "engine",
    "--preset",
    "tiny",
    "--train-points",
    "600",
    "--test-points",
    "200",
    "--threads",
    "1",
    "--log-every",
    "0",
]


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run folders that dslide train writes by default (./runs/...) land in tmp_path."""
    monkeypatch.chdir(tmp_path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_usage_error(capsys: pytest.CaptureFixture[str], argv: list[str], *words: str) -> None:
    """Bad parameters exit 2 with one ``dslide: error:`` line naming them, no traceback."""
    code = None
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse-level errors
        code = exit_.code
    _, err = capsys.readouterr()
    assert code == 2, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    assert "error:" in last
    for word in words:
        assert word in last, (word, last)


# -- help -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv",
    [[], ["generate"], ["train"], ["demo"], ["bench"], ["bench", "engine"]],
    ids=lambda a: " ".join(a) or "dslide",
)
def test_help(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: dslide")


@pytest.mark.slow
def test_python_dash_m_and_no_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dslide_workflows", "--help"], capture_output=True, text=True
    )
    assert proc.returncode == 0 and "generate" in proc.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "dslide_workflows"], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "COMMAND" in proc.stderr


# -- generate ---------------------------------------------------------------------------------
def test_generate_tiny_and_read_back(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from dslide_dask.data.synthetic import make_synthetic, resolve_spec
    from dslide_dask.data.xc_text import read_xc

    code, out, _ = run(
        capsys,
        "generate",
        "tiny",
        "--out",
        str(tmp_path / "d"),
        "--n-train",
        "300",
        "--n-test",
        "100",
        "--seed",
        "3",
    )
    assert code == 0
    assert "train.txt" in out and "300 points" in out
    train = read_xc(str(tmp_path / "d" / "train.txt"))
    test = read_xc(str(tmp_path / "d" / "test.txt"))
    assert (train.n_points, test.n_points) == (300, 100)
    want, _ = make_synthetic(resolve_spec("tiny", n_train=300, n_test=100), seed=3)
    np.testing.assert_array_equal(train.Y.indices, want.Y.indices)
    np.testing.assert_array_equal(train.X.indices, want.X.indices)


def test_generate_with_storage_option_to_memory(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "generate",
        "tiny",
        "--out",
        "memory://dslide-cli",
        "--n-train",
        "50",
        "--n-test",
        "10",
        "--storage-option",
        "skip_instance_cache=true",
    )
    assert code == 0 and "memory://dslide-cli/train.txt" in out


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--avg-labels", "0"], ["avg_labels"]),
        (["--n-train", "0"], ["n_train"]),
        (["--spec-opt", "bogus=1"], ["bogus"]),
        (["--n-labels", "many"], ["--n-labels"]),
        (["--storage-option", "novalue"], ["--storage-option", "key=value"]),
    ],
)
def test_generate_bad_parameter(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str], words: list[str]
) -> None:
    assert_usage_error(capsys, ["generate", "tiny", "--out", str(tmp_path), *flags], *words)


def test_generate_unknown_preset(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert_usage_error(capsys, ["generate", "huge-1b", "--out", str(tmp_path)], "huge-1b")


# -- train ------------------------------------------------------------------------------------
def test_train_from_files(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert (
        main(["generate", "tiny", "--out", str(tmp_path), "--n-train", "600", "--n-test", "200"])
        == 0
    )
    capsys.readouterr()
    code, out, _ = run(
        capsys,
        "train",
        "--in-process",
        "--train",
        str(tmp_path / "train.txt"),
        "--test",
        str(tmp_path / "test.txt"),
        "--threads",
        "1",
        "--batch-size",
        "64",
        "--log-every",
        "5",
    )
    assert code == 0
    assert "step      5" in out
    assert "samples/s" in out
    (scores,) = [line for line in out.splitlines() if line.strip().startswith("test ")]
    assert "P@1" in scores and "P@3" in scores and "P@5" in scores


def test_train_preset_in_memory(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "train",
        "--in-process",
        "--preset",
        "tiny",
        "--threads",
        "1",
        "--K",
        "4",
        "--L",
        "10",
        "--opt",
        "rebuild_every=25",
        "--log-every",
        "0",
    )
    assert code == 0 and "P@1" in out


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--K", "0"], ["K"]),
        (["--lr", "-1"], ["lr"]),
        (["--hash-family", "nope"], ["hash_family", "nope"]),
        (["--opt", "bogus=3"], ["bogus"]),
        (["--batch-size", "0"], ["--batch-size"]),
        (["--hidden", "128,x"], ["--hidden"]),
        (["--test", "t.txt"], ["--test"]),
    ],
)
def test_train_bad_parameter(
    capsys: pytest.CaptureFixture[str], flags: list[str], words: list[str]
) -> None:
    assert_usage_error(capsys, ["train", "--in-process", "--preset", "tiny", *flags], *words)


def test_train_bad_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("2 10 5\n1,2 3:1.0\n7 1:0.5\n")  # label 7 >= 5 labels
    assert_usage_error(capsys, ["train", "--in-process", "--train", str(bad)], str(bad))
    missing = str(tmp_path / "missing.txt")
    assert_usage_error(capsys, ["train", "--in-process", "--train", missing], "missing")


# -- demo -------------------------------------------------------------------------------------
def test_demo(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "demo", "--preset", "tiny", "--epochs", "2")
    assert code == 0
    share = re.search(r"([\d,]+) of 1,000 output neurons a sample \(([\d.]+)%\)", out)
    assert share, out  # the sparsity is shown (on 'tiny' a step computes nearly every label)
    assert float(share[2]) == pytest.approx(float(share[1].replace(",", "")) / 10, abs=0.05)
    lines = out.strip().splitlines()
    assert lines[-2].startswith("SLIDE") and lines[-1].startswith("most frequent labels")
    slide_p1 = float(lines[-2].split()[2])
    baseline_p1 = float(lines[-1].split()[4])
    assert 0.0 < baseline_p1 < slide_p1 <= 1.0


# -- bench engine -----------------------------------------------------------------------------
@pytest.mark.slow
def test_bench_engine_skip_dense(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = [
        *TINY_BENCH,
        "--skip-dense",
        "--cache-dir",
        str(tmp_path),
        "--json",
        str(tmp_path / "out.json"),
        "--engine-opt",
        "L=10",
    ]
    code, out, _ = run(capsys, *argv)
    assert code == 0
    assert "data: generated tiny" in out
    header = next(line for line in out.splitlines() if line.startswith("contender"))
    assert header.split()[:3] == ["contender", "samples/s", "train"]
    assert any(line.startswith("engine ") for line in out.splitlines())
    report = json.loads((tmp_path / "out.json").read_text())
    (engine,) = report["results"]
    assert engine["contender"] == "engine" and engine["params"]["L"] == 10
    assert (engine["params"]["beta1"], engine["params"]["min_active"]) == (0.0, 1500)
    assert 0.0 <= engine["P@1"] <= 1.0 and engine["samples_per_s"] > 0
    assert engine["peak_rss_mb"] > 0
    steps_seconds = engine["train_seconds"] - engine["fit_end_seconds"]  # the fit's end apart
    assert 0 < engine["first_batch_seconds"] <= steps_seconds <= engine["train_seconds"]
    assert len(list((tmp_path / "bench").glob("*.npz"))) == 1
    code, out, _ = run(capsys, *argv)  # the second run reuses the cached data
    assert code == 0 and "data: cached" in out


def test_bench_engine_with_dense(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    argv = [*TINY_BENCH, "--cache-dir", str(tmp_path), "--json", str(tmp_path / "out.json")]
    code, out, _ = run(capsys, *argv)
    assert code == 0
    assert "torch-dense" in out and "engine/dense speed" in out
    report = json.loads((tmp_path / "out.json").read_text())
    assert [r["contender"].split()[0] for r in report["results"]] == ["engine", "torch-dense"]
    assert report["speedup"] > 0


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--skip-engine", "--skip-dense"], ["--skip-engine"]),
        (["--train-points", "1000000000"], ["--train-points"]),
        (["--engine-opt", "K=0"], ["K"]),
        (["--engine-opt", "bogus=1"], ["bogus"]),
        (["--threads", "0"], ["--threads"]),
        (["--preset", "nope"], ["nope"]),
    ],
)
def test_bench_engine_bad_parameter(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, flags: list[str], words: list[str]
) -> None:
    assert_usage_error(capsys, [*TINY_BENCH, "--cache-dir", str(tmp_path), *flags], *words)


# -- the dense baseline -------------------------------------------------------------------------
@pytest.mark.parametrize("input_layer", ["embedding_bag", "csr"])
def test_dense_baseline_matches_autograd(input_layer: str) -> None:
    """The fused softmax cross-entropy gives the loss and gradients of the textbook one."""
    torch = pytest.importorskip("torch")
    from dslide_dask.data import CSR
    from dslide_workflows.bench import torch_dense as td

    rng = np.random.default_rng(0)
    X = CSR(
        np.array([0, 3, 5, 9, 10, 12, 15]),
        rng.integers(0, 50, 15),
        rng.random(15).astype(np.float32),
        50,
    )
    Y = CSR(np.array([0, 2, 3, 3, 6, 7, 8]), rng.integers(0, 40, 8), None, 40)  # row 2: none
    torch.manual_seed(0)
    model = td.build_model(torch, 50, (16, 8), 40, input_layer)
    for p in model.parameters():
        torch.nn.init.normal_(p, 0.0, 0.5)
    loss = model.loss(X, Y)
    loss.backward()
    fused = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    target = torch.zeros(6, 40)
    for i, labels in enumerate(Y.to_lists()):
        for label in labels:
            target[i, label] += 1.0 / len(labels)
    logp = torch.log_softmax(model(*td._inputs(torch, X)), dim=1)
    ref = -(logp * target).sum() / 6
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5)
    for got, want in zip(fused, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)


def test_dense_baseline_learns() -> None:
    pytest.importorskip("torch")
    from dslide_dask import precision_at_k
    from dslide_dask.data.synthetic import make_synthetic, resolve_spec
    from dslide_dask.metrics import most_frequent_topk
    from dslide_workflows.bench.torch_dense import train_dense

    train, test = make_synthetic(resolve_spec("tiny", n_test=300), seed=1)
    out = train_dense(train, test, threads=1, epochs=3, lr=1e-2)
    popular = precision_at_k(most_frequent_topk(train.Y, test.n_points, 5), test.Y, (1,))["P@1"]
    assert out["P@1"] > 2 * popular
    assert out["samples_per_s"] > 0 and out["peak_rss_mb"] > 0
    assert set(out) >= {"P@1", "P@3", "P@5", "train_seconds", "first_batch_seconds"}
