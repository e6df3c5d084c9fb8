"""The notebooks run end to end on a real Jupyter kernel, headless, and leave no processes."""

import base64
import json
import re
import sys
from pathlib import Path

import psutil
import pytest

from dslide_dask.data.synthetic import make_synthetic
from dslide_dask.metrics import most_frequent_topk, precision_at_k

#: Slow: each notebook runs on a Jupyter kernel, with clusters (~1 min).
pytestmark = pytest.mark.slow

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
#: Seconds a cell may take: on a fresh install the first fit compiles the numba kernels.
CELL_TIMEOUT = 300


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """The kernel's working folder; a ``python3`` kernel running this interpreter (the one
    the package is installed in, whatever ``python`` is on the PATH), no IPython profile
    of the user's, a local cluster, and the notebooks' small settings."""
    kernels = tmp_path / "jupyter" / "kernels" / "python3"
    kernels.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (dslide-dask tests)",
        "language": "python",
    }
    (kernels / "kernel.json").write_text(json.dumps(spec))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    monkeypatch.setenv("DSLIDE_NOTEBOOK_SMALL", "1")
    monkeypatch.delenv("DASK_SCHEDULER_ADDRESS", raising=False)
    work = tmp_path / "work"
    work.mkdir()
    return work


def execute(name: str, workdir: Path):
    """Run every cell of ``notebooks/<name>`` (stopping at the first error, which is
    raised) and check that the kernel's processes (cluster workers...) are all gone once
    the kernel is shut down, even after a failure."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    spawned: dict[int, psutil.Process] = {}

    def record_processes(**_):
        pid = client.km.provisioner.pid
        assert pid is not None and pid != psutil.Process().pid
        kernel = psutil.Process(pid)
        spawned.update((p.pid, p) for p in kernel.children(recursive=True))

    client = nbclient.NotebookClient(
        nb,
        timeout=CELL_TIMEOUT,
        kernel_name="python3",
        resources={"metadata": {"path": str(workdir)}},
        coalesce_streams=True,
        on_cell_executed=record_processes,
    )
    try:
        client.execute()
        assert len(spawned) >= 2, "the cluster's worker processes were not seen"
    finally:
        _, alive = psutil.wait_procs(list(spawned.values()), timeout=30)
        for p in alive:
            p.kill()
        assert not alive, f"{name} left processes behind: {[p.pid for p in alive]}"
    return nb


def cell(nb, snippet: str):
    """The one code cell whose source contains ``snippet``."""
    found = [c for c in nb.cells if c.cell_type == "code" and snippet in c.source]
    assert len(found) == 1, (snippet, len(found))
    return found[0]


def text(cell) -> str:
    """Everything a cell printed or displayed as plain text."""
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif "data" in out:
            parts.append(out.data.get("text/plain", ""))
    return "\n".join(parts)


def assert_png(cell) -> None:
    images = [out.data["image/png"] for out in cell.outputs if "image/png" in out.get("data", {})]
    assert len(images) == 1, [out.get("data", {}).keys() for out in cell.outputs]
    assert base64.b64decode(images[0]).startswith(b"\x89PNG")


def test_notebooks_are_stored_without_outputs():
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
        for c in nb.cells:
            if c.cell_type == "code":
                assert not c.outputs and c.execution_count is None, (path.name, c.source[:60])


def test_quickstart(workdir):
    nb = execute("quickstart.ipynb", workdir)

    assert re.search(r"Dask dashboard: https?://\S+", text(cell(nb, "LocalCluster(")))
    # the last line is the finished bar as text, whether the bar itself was a widget
    # (ipywidgets installed: only its text fallback "0%" is in the output) or text
    progress = text(cell(nb, "clf.fit(")).strip().splitlines()[-1]
    assert "100%" in progress and "loss=" in progress, progress[-500:]

    # learned far above predicting the most frequent labels (computed here independently)
    train, test = make_synthetic("tiny", seed=0)
    top = most_frequent_topk(train.Y, test.n_points, 1)
    baseline = precision_at_k(top, test.Y, (1,))["P@1"]
    scores = text(cell(nb, "clf.evaluate("))
    found = re.search(r"test P@1: (\d\.\d+) +\(most frequent labels: (\d\.\d+)\)", scores)
    assert found, scores
    p1, printed_baseline = map(float, found.groups())
    assert printed_baseline == pytest.approx(baseline, abs=1e-3)
    assert p1 > max(0.3, 5 * baseline), (p1, baseline)

    assert_png(cell(nb, "plt.show()"))

    table = cell(nb, "predict_topk(sample.X")
    html = next(out.data["text/html"] for out in table.outputs if "data" in out)
    assert html.count("<tr>") == 1 + 6
    assert len(text(table).strip().splitlines()) == 1 + 6

    assert "identical top-5 predictions" in text(cell(nb, "SlideClassifier.load("))


def test_profiling(workdir):
    nb = execute("profiling.ipynb", workdir)

    report = workdir / "dslide-performance-report.html"
    assert report.stat().st_size > 10_000
    assert "<html" in report.read_text()[:2000].lower()

    steps = text(cell(nb, "coordinator_seconds"))
    for row in ("whole step", "coordinator compute", "waiting for shards", "kB sent"):
        assert row in steps, steps

    assert_png(cell(nb, "plt.show()"))

    shards = text(cell(nb, "shard_info()")).splitlines()
    rows = [line.split() for line in shards if re.match(r"\s+\d+\s", line)]
    assert [int(r[0]) for r in rows] == [0, 1]  # one shard per worker of the LocalCluster
    neurons = [int(r[1].replace(",", "")) for r in rows]
    assert sum(neurons) == 20_000
    assert all(float(r[3]) > 0 for r in rows)  # busy seconds

    streams = text(cell(nb, "graph_stream"))
    actor_part, graph_part = streams.split("graph steps: task")
    assert "wide-shard" in actor_part and "scatter" not in actor_part
    counts = dict(re.findall(r"^(\S+)\s+(\d+)\s+\d", graph_part, re.M))
    for phase in ("hash", "gather", "softmax", "scatter"):  # every step's phases, as tasks
        assert int(counts[phase]) >= 20, (phase, graph_part)
