"""The README is the front page: its code runs as written, and its links lead somewhere.

Each Python block is saved as a file and run as a script in a fresh folder, as a
newcomer would paste it (so a cluster example without a ``__main__`` guard fails here);
the command-line block runs in bash.
"""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PYTHON_BLOCKS = re.findall(r"```python\n(.*?)```", README, re.S)
#: bash blocks but the set-up one (it installs the package and runs this suite)
SHELL_BLOCKS = [b for b in re.findall(r"```bash\n(.*?)```", README, re.S) if "pip " not in b]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _run(argv, cwd):
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600)
    tail = f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert done.returncode == 0, f"exit {done.returncode}\n{tail}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stdout


def _params(blocks, heavy_from):
    return [
        pytest.param(b, id=f"block{i}", marks=[pytest.mark.slow] if i >= heavy_from else [])
        for i, b in enumerate(blocks)
    ]


def test_the_readme_has_the_examples_it_promises():
    assert len(PYTHON_BLOCKS) >= 2, "a quickstart and a cluster example"
    assert any("LocalCluster" in b for b in PYTHON_BLOCKS)
    assert SHELL_BLOCKS, "a command-line example"


@pytest.mark.parametrize("code", _params(PYTHON_BLOCKS, heavy_from=1))
def test_python_blocks_run_as_scripts(code, tmp_path):
    (tmp_path / "example.py").write_text(code)
    out = _run([sys.executable, "example.py"], tmp_path)
    assert "'P@1'" in out, out  # each example prints what it measured


@pytest.mark.slow
@pytest.mark.parametrize("code", SHELL_BLOCKS)
def test_shell_blocks_run(code, tmp_path):
    out = _run(["bash", "-euo", "pipefail", "-c", code], tmp_path)
    assert "P@1" in out, out


def test_the_readme_stays_a_front_page():
    assert len(README.splitlines()) <= 250


PAGES = ["README.md", "CHANGELOG.md", *(f"docs/{p.name}" for p in sorted(ROOT.glob("docs/*.md")))]


@pytest.mark.parametrize("page", PAGES)
def test_links_lead_to_files_inside_the_repository(page):
    text = (ROOT / page).read_text()
    for target in LINK.findall(text):
        if "://" in target or target.startswith("mailto:"):
            continue
        path = (ROOT / page).parent / target
        assert path.resolve().is_relative_to(ROOT), f"{page}: {target} is outside the repository"
        assert path.exists(), f"{page}: {target} does not exist"
    assert "../shared" not in text, f"{page} points outside the repository"
