"""A new user's first day (issue 53): what the command line and the API say and do when
used as the README and the docs show them."""

from __future__ import annotations

import json
from pathlib import Path

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
