"""A new user's first day (issue 53): what the command line and the API say and do when
used as the README and the docs show them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dslide_workflows.cli import main


@pytest.fixture(autouse=True)
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run folders that dslide train writes by default (./runs/...) land in tmp_path."""
    monkeypatch.chdir(tmp_path)


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one error line of a command that must fail with exit 2."""
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("dslide: error: ")
    return lines[0]


# -- --opt: a misspelt parameter ---------------------------------------------------------------
def test_unknown_opt_names_close_matches_whole_and_points_to_help(capsys) -> None:
    line = _error(capsys, ["train", "--preset", "tiny", "--opt", "rebuild_grow=2"])
    assert "--opt" in line and "'rebuild_grow'" in line
    assert "rebuild_growth" in line  # the closest known name, whole
    assert " ... " not in line  # nothing cut mid-name
    assert "--help" in line or "SlideClassifier" in line


def test_unknown_model_key_in_a_config_names_the_file(capsys, tmp_path: Path) -> None:
    (tmp_path / "run.yaml").write_text("model: {hiden: [64]}\n")
    line = _error(capsys, ["train", "--preset", "tiny", "--config", str(tmp_path / "run.yaml")])
    assert "run.yaml" in line and "'hiden'" in line and "'hidden'" in line
    assert " ... " not in line


# -- the README says what the code does --------------------------------------------------------
README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_the_readme_demo_line_says_what_dslide_demo_runs() -> None:
    from dslide_dask.data.synthetic import resolve_spec
    from dslide_workflows.cli import DEMO_PRESET

    spec = resolve_spec(DEMO_PRESET)
    line = next(x for x in README.splitlines() if x.startswith("dslide demo "))
    assert "tiny" not in line
    assert f"{spec.n_labels // 1000}K labels" in line and f"{spec.n_train // 1000}K" in line


def test_the_quickstart_imports_what_it_names() -> None:
    import re

    quickstart = re.findall(r"```python\n(.*?)```", README, re.S)[0]
    assert "read_xc(" in quickstart
    assert re.search(r"^from dslide_dask\.data import .*\bread_xc\b", quickstart, re.M)
    assert "test.X[:3]" in quickstart  # rows sliced as a scipy user slices them


# -- a run of dslide train: what its summary scored, what its model gives the API ------------
@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A tiny in-process run on XC text files (300 test rows, 120 of them scored): its
    data, run folder and printed output."""
    import contextlib
    import io

    root = tmp_path_factory.mktemp("first-day")
    assert main(["generate", "tiny", "--out", str(root / "d"), "--n-train", "1500"]) == 0
    out = io.StringIO()
    argv = ["train", "--train", str(root / "d" / "train.txt"), "--test"]
    argv += [str(root / "d" / "test.txt"), "--in-process", "--epochs", "2", "--no-progress"]
    argv += ["--eval-points", "120", "--run-dir", str(root / "run"), "--opt", "hidden=[32]"]
    with contextlib.redirect_stdout(out):
        assert main(argv) == 0
    return {"data": root / "d", "run": root / "run", "out": out.getvalue()}


def test_the_train_summary_names_the_rows_it_scored(trained) -> None:
    from dslide_dask.data import read_xc

    total = len(read_xc(str(trained["data"] / "test.txt")))
    (line,) = [x for x in trained["out"].splitlines() if x.strip().startswith("test ")]
    assert f"(120 of {total:,} rows" in line and "--eval-points" in line, line
    numbers = json.loads((trained["run"] / "summary.json").read_text())
    assert (numbers["test_rows"], numbers["test_rows_total"]) == (120, total)


def test_a_summary_of_every_row_says_all() -> None:
    from dslide_workflows.summary import summary

    text, _ = summary([], 1.0, 0.0, (10, 20), None, [], {"P@1": 0.5}, [], test_rows=(7, 7))
    assert text.splitlines()[-1].endswith("(all 7 rows)")


def test_a_cli_model_evaluated_by_the_api_gives_psp(trained) -> None:
    from dslide_dask import SlideClassifier
    from dslide_dask.data import read_xc

    test = read_xc(str(trained["data"] / "test.txt"))
    clf = SlideClassifier.load(str(trained["run"] / "model"))
    scores = clf.evaluate(test.X, test.Y)
    assert {"P@1", "nDCG@5", "PSP@1", "PSP@5", "PSnDCG@5"} <= set(scores), scores
    assert 0.0 < scores["PSP@5"] <= 1.0


# -- dslide evaluate ---------------------------------------------------------------------------
def _out(capsys, argv: list[str]) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


def test_evaluate_prints_what_the_api_gives_with_the_rows(trained, capsys, tmp_path) -> None:
    from dslide_dask import SlideClassifier
    from dslide_dask.data import read_xc

    test_url = str(trained["data"] / "test.txt")
    test = read_xc(test_url)
    want = SlideClassifier.load(str(trained["run"] / "model")).evaluate(test.X, test.Y)
    out = _out(
        capsys, ["evaluate", str(trained["run"]), test_url, "--json", str(tmp_path / "m.json")]
    )
    assert f"scored all {len(test):,} rows" in out
    for name in ("P@1", "P@3", "P@5", "nDCG@5", "PSP@1", "PSP@5"):
        assert f"{name} {want[name]:.4f}" in out, (name, out)
    saved = json.loads((tmp_path / "m.json").read_text())
    assert saved["rows"] == saved["rows_total"] == len(test)
    assert saved["metrics"] == pytest.approx(want)


def test_evaluate_k_and_max_rows(trained, capsys) -> None:
    test_url = str(trained["data"] / "test.txt")
    out = _out(capsys, ["evaluate", str(trained["run"] / "model"), test_url, "--k", "2,10"])
    assert "P@2 " in out and "P@10 " in out and "PSP@10 " in out and "P@1 " not in out
    out = _out(capsys, ["evaluate", str(trained["run"]), test_url, "--max-rows", "50"])
    assert "scored 50 of " in out


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--k", "0"], "--k"),
        (["--k", "a,b"], "--k"),
        (["--max-rows", "0"], "--max-rows"),
        (["--k", "1001"], "--k"),
        (["--json", "/nonexistent-folder/m.json"], "--json"),
    ],
    ids=["k0", "k-text", "rows0", "k-big", "json-folder"],
)
def test_evaluate_bad_parameters(trained, capsys, extra, words) -> None:
    line = _error(
        capsys, ["evaluate", str(trained["run"]), str(trained["data"] / "test.txt")] + extra
    )
    assert words in line


def test_evaluate_bad_files_are_named(trained, capsys, tmp_path) -> None:
    other = tmp_path / "other.txt"
    other.write_text("1 7 9\n0 1:1.0\n")  # a header of other data
    line = _error(capsys, ["evaluate", str(trained["run"]), str(other)])
    assert "other.txt" in line and "features" in line
    line = _error(capsys, ["evaluate", str(tmp_path / "no-model"), str(other)])
    assert "no-model" in line
    bad = tmp_path / "bad.txt"
    text = (trained["data"] / "test.txt").read_text().splitlines()
    bad.write_text("\n".join([text[0], text[1], "x:y nonsense", *text[3:]]) + "\n")
    line = _error(capsys, ["evaluate", str(trained["run"]), str(bad)])
    assert "bad.txt:3" in line


# -- dslide predict --format xc ------------------------------------------------------------------
def test_predict_writes_xc_text_lines_of_label_score(trained, capsys, tmp_path) -> None:
    from dslide_dask.inference import read_predictions

    out = tmp_path / "pred"
    argv = ["predict", str(trained["run"]), str(trained["data"] / "test.txt"), str(out)]
    printed = _out(capsys, [*argv, "--k", "3", "--format", "xc", "--workers", "1", "--no-progress"])
    assert "predictions.txt" in printed
    ids, scores = read_predictions(str(out))
    lines = (out / "predictions.txt").read_text().splitlines()
    assert len(lines) == len(ids)
    for line, row_ids, row_scores in zip(lines[:50], ids, scores, strict=False):
        pairs = [p.split(":") for p in line.split()]
        assert [int(i) for i, _ in pairs] == [int(i) for i in row_ids if i >= 0]
        np.testing.assert_allclose([float(s) for _, s in pairs], row_scores[row_ids >= 0], 1e-5)


def test_xc_text_streams_part_by_part(tmp_path) -> None:
    from dslide_dask.inference.output import iter_predictions, write_manifest, write_part
    from dslide_dask.inference.xc_output import write_xc_predictions

    url = str(tmp_path / "p")
    parts = [
        write_part(url, 0, ([[4, 2], [7, -1]], [[0.5, 0.25], [1.0, -np.inf]]), {}),
        write_part(url, 1, (np.zeros((0, 2)), np.zeros((0, 2))), {}),
        write_part(url, 2, ([[-1, -1]], [[-np.inf, -np.inf]]), {}),
    ]
    write_manifest(url, parts, {"k": 2}, {})
    assert [len(ids) for ids, _ in iter_predictions(url)] == [2, 0, 1]
    text, rows = write_xc_predictions(url)
    assert rows == 3 and text.endswith("predictions.txt")
    assert (tmp_path / "p" / "predictions.txt").read_text() == "4:0.5 2:0.25\n7:1\n\n"
    (tmp_path / "p" / "part-000001.npz").write_bytes(b"not an npz")
    with pytest.raises(ValueError, match="part-000001.npz: not a prediction part"):
        write_xc_predictions(url)


# -- the first run compiles the kernels: what, and how far ------------------------------------
def test_compile_progress_names_each_module_once_with_how_far(tmp_path) -> None:
    """The listener reports a module of ours at its first compilation only (a cold cache
    of its own, in a subprocess), and nothing of other code."""
    code = (
        "import numba, numpy as np\n"
        "from dslide_dask.compiling import reporting_compiles\n"
        "from dslide_dask.metrics import precision_at_k\n"
        "from dslide_dask.data import CSR\n"
        "calls = []\n"
        "with reporting_compiles(lambda *a: calls.append(a), ['dslide_dask.metrics']):\n"
        "    numba.njit(lambda x: x + 1)(1)\n"
        "    Y = CSR.from_lists([[1], [2]], 3)\n"
        "    for _ in range(2):\n"
        "        precision_at_k(np.array([[1], [0]]), Y, (1,))\n"
        "print(calls)\n"
    )
    assert _cold(code, tmp_path / "cache").strip() == "[(1, 1, 'metrics')]"


def test_the_library_is_silent_and_a_warm_cache_runs_nothing(capsys) -> None:
    from dslide_dask.compiling import uncached, warm_up

    if uncached():  # this machine's first run: warm it (what the CLI does)
        warm_up()
    assert warm_up() == set()
    assert capsys.readouterr() == ("", "")


def _cold(code: str, cache: Path) -> str:
    import os
    import subprocess
    import sys

    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_a_cold_first_run_says_what_compiles_and_how_far(tmp_path) -> None:
    """A cold numba cache (its own folder): the warm-up reports every module it was
    expected to, counting up to the total, and leaves nothing for the next run."""
    code = (
        "from dslide_dask.compiling import WARM_MODULES, uncached, warm_up\n"
        "assert uncached() == list(WARM_MODULES)\n"
        "seen = warm_up(lambda d, t, m: print(f'{d}/{t} {m}', flush=True))\n"
        "assert seen == set(WARM_MODULES), sorted(set(WARM_MODULES) ^ seen)\n"
        "assert uncached() == [] and warm_up() == set()\n"
    )
    lines = _cold(code, tmp_path / "cache").splitlines()
    total = len(lines)
    assert [line.split()[0] for line in lines] == [f"{i}/{total}" for i in range(1, total + 1)]
    assert any(line.endswith(" wide_layer") for line in lines)


def test_the_cli_prints_the_compile_progress(capsys, monkeypatch) -> None:
    import dslide_dask.compiling as compiling

    def cold(callback=None):
        for done, module in enumerate(("xc_text", "wide_layer"), 1):
            callback(done, 2, module)
        return {"dslide_dask.kernels.xc_text", "dslide_dask.kernels.wide_layer"}

    monkeypatch.setattr(compiling, "warm_up", cold)
    argv = ["train", "--preset", "tiny", "--in-process", "--epochs", "1", "--no-progress"]
    assert main([*argv, "--opt", "hidden=[16]"]) == 0
    out = capsys.readouterr().out
    assert "compiling kernels: 1/2 (xc_text" in out and "compiling kernels: 2/2 (wide_layer" in out
    assert "a few seconds" not in out
