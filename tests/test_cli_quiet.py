"""A CLI user's terminal shows dslide's lines, not Dask's: with Dask's default ports taken
(a JupyterLab Dask cluster open), ``dslide train`` on its own LocalCluster moves its
dashboard to a free port and prints it, with no Dask warning or log line below ERROR;
``--debug`` lets them through (issue 53)."""

import re
import subprocess
import sys

import pytest

#: What Dask's warnings and log lines look like in a terminal.
DASK_NOISE = re.compile(r"UserWarning|warnings\.warn\(| - (INFO|WARNING) - ")


def _train(tmp_path, name: str, *flags: str) -> subprocess.CompletedProcess:
    argv = [*flags, "train", "--preset", "tiny", "--workers", "1", "--epochs", "1"]
    argv += ["--eval-points", "200", "--no-progress", "--run-dir", str(tmp_path / name)]
    return subprocess.run(
        [sys.executable, "-m", "dslide_workflows", *argv],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_train_where_the_dask_ports_are_taken_prints_no_dask_noise(dask_ports_taken, tmp_path):
    quiet = _train(tmp_path, "quiet")
    assert quiet.returncode == 0, quiet.stderr
    dashboard = re.search(r"dashboard http://127\.0\.0\.1:(\d+)/", quiet.stdout)
    assert dashboard and int(dashboard[1]) not in dask_ports_taken, quiet.stdout
    noise = [line for line in (quiet.stdout + quiet.stderr).splitlines() if DASK_NOISE.search(line)]
    assert noise == [], noise
    assert "P@1" in quiet.stdout
    # the same run with --debug: Dask's warning about the taken port gets through (so the
    # ports were taken indeed, and the quiet run had something to keep out)
    debug = _train(tmp_path, "debug", "--debug")
    assert debug.returncode == 0, debug.stderr
    assert "UserWarning: Port 8787 is already in use" in debug.stderr
