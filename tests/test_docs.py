"""The documentation builds with no warning: the guides (docs/*.md), the API reference
(numpydoc docstrings through autosummary) and every cross-reference between them, as
``python -m sphinx -W --keep-going -b html docs docs/_build/html`` builds it."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: What docs/conf.py loads (the ``docs`` extra, also in ``test``).
NEEDS = ("sphinx", "numpydoc", "myst_parser", "pydata_sphinx_theme")


@pytest.mark.slow  # 20-30 s on 2 cores: every API page is generated and rendered
def test_the_docs_build_without_warnings(tmp_path):
    missing = [m for m in NEEDS if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed (pip install -e '.[docs]')")
    out = tmp_path / "html"
    sphinx = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    done = subprocess.run(
        [*sphinx, "-d", str(tmp_path / "doctrees"), "docs", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-5000:] or done.stdout[-5000:]
    assert (out / "index.html").is_file()
    api = (out / "generated" / "dslide_dask.estimator.SlideClassifier.html").read_text()
    for name in ("hash_family", "rebuild_every", "history_", "neighbour_weight_"):
        assert name in api, f"{name} is missing from SlideClassifier's API page"
