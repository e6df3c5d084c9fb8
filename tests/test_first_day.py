"""A new user's first day (issue 53): what the command line and the API say and do when
used as the README and the docs show them."""

from __future__ import annotations

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
