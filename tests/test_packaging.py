"""The distributions: a complete sdist whose own tests run from the unpacked tree, the
license, and environment.yml naming every dependency pyproject.toml installs."""

import os
import re
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _tracked(*folders: str) -> set[str]:
    """Files git tracks under ``folders`` (a clone's view; skipped outside a checkout)."""
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (e.g. an unpacked sdist)")
    out = subprocess.run(
        ["git", "ls-files", *folders], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return set(out.split())


@pytest.fixture(scope="module")
def sdist(tmp_path_factory) -> Path:
    """The sdist built from this tree (PEP 517, in an isolated build environment)."""
    pytest.importorskip("build")
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("dslide_dask-*.tar.gz")
    return path


@pytest.mark.slow
def test_sdist_holds_every_tracked_test_notebook_and_package_file(sdist):
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    wanted = _tracked("tests", "notebooks", "dslide_dask", "workflows", "docs")
    wanted |= {"LICENSE", "README.md", "environment.yml", "pyproject.toml"}
    assert not wanted - names, sorted(wanted - names)


def test_every_package_is_listed_in_pyproject():
    listed = set(PYPROJECT["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts) for p in ROOT.glob("dslide_dask/**/__init__.py")
    }
    found |= {
        "dslide_workflows" + ".".join(("",) + p.parent.relative_to(ROOT / "workflows").parts)
        for p in (ROOT / "workflows").glob("**/__init__.py")
    }
    assert found == listed, found ^ listed


@pytest.mark.slow
def test_sdist_tests_run_from_the_unpacked_tree(sdist, tmp_path):
    """A quick part of the suite, run by pytest from the unpacked sdist: its conftest and
    helpers are there, and its own sources are the ones imported."""
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp_path, filter="data")
    (tree,) = tmp_path.glob("dslide_dask-*")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    probe = "import dslide_dask, sys; print(dslide_dask.__file__)"
    where = subprocess.run(
        [sys.executable, "-c", probe], cwd=tree, env=env, capture_output=True, text=True, check=True
    ).stdout
    assert where.startswith(str(tree)), where
    pytest_argv = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"]
    license_test = "tests/test_packaging.py::test_license_is_bsd_3_clause"
    run = subprocess.run(
        [*pytest_argv, "tests/test_config.py", "tests/test_layout.py", license_test],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert re.search(r"\d+ passed", run.stdout)


def test_license_is_bsd_3_clause():
    assert PYPROJECT["project"]["license"] == "BSD-3-Clause"
    assert (ROOT / "LICENSE").read_text().startswith("BSD 3-Clause License")


def _names(requirements) -> set[str]:
    """Distribution names, normalised (``moto[server]>=5`` -> ``moto``)."""
    return {
        re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower().replace("_", "-") for r in requirements
    }


def test_environment_yml_has_what_pyproject_installs():
    """environment.yml is core + test + s3 + zstd + notebook, as it says: nothing of those
    may be missing (a missing test dependency silently skips tests under conda)."""
    yaml = pytest.importorskip("yaml")
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    conda = _names(d for d in env["dependencies"] if isinstance(d, str))
    extras = PYPROJECT["project"]["optional-dependencies"]
    wanted = _names(PYPROJECT["project"]["dependencies"])
    for extra in ("test", "s3", "zstd", "notebook"):
        wanted |= _names(extras[extra])
    conda_names = {"prometheus-client": "prometheus_client", "build": "python-build"}
    missing = {w for w in wanted if conda_names.get(w, w) not in conda and w not in conda}
    assert not missing, sorted(missing)
