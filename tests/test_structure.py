"""The shape of the code base, kept: no import cycles, no huge modules without a reason,
a light ``import dslide_dask``, and typed actor boundaries."""

import ast
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: package name -> its folder
PACKAGES = {"dslide_dask": ROOT / "dslide_dask", "dslide_workflows": ROOT / "workflows"}
MAX_LINES = 400


def modules() -> dict[str, Path]:
    out = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((package, *parts))] = path
    return out


def _type_checking_only(node: ast.AST, parents: dict) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports, at module level or inside functions."""
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Import | ast.ImportFrom) or _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names]
            targets = [t if t in known else base for t in targets]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    """Function-level imports count too: they hide a cycle, they do not remove it. A
    package's ``__init__`` importing its own modules is not a cycle of theirs."""
    known = modules()
    graph = {name: imports(name, path, set(known)) for name, path in known.items()}
    for name in graph:  # a module importing its own package's __init__
        graph[name] = {t for t in graph[name] if not name.startswith(t + ".")}
    assert cycles(graph) == []


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_long_modules_say_why():
    """A module over 400 lines states in its docstring why it is one module."""
    long = []
    for name, path in modules().items():
        text = path.read_text()
        if text.count("\n") > MAX_LINES:
            doc = ast.get_docstring(ast.parse(text)) or ""
            if f"over {MAX_LINES} lines" not in doc.lower():
                long.append(f"{name}: {text.count(chr(10))} lines")
    assert long == []


def test_no_test_module_is_over_400_lines():
    """A test module over 400 lines is split by topic, as the package's modules are
    (tests/test_k8s_*.py, tests/test_storage_*.py ...), with no exemption: helpers shared
    by the parts go to a module of their own (tests/k8s.py), fixtures to conftest.py."""
    long = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > MAX_LINES:
            long.append(f"{path.relative_to(ROOT)}: {text.count(chr(10))} lines")
    assert long == []


def test_importing_the_package_is_light_and_changes_no_environment():
    """Users who train in one process pay for no Dask, and their environment is theirs."""
    script = (
        "import json, os, sys\n"
        "import sklearn\n"  # it sets KMP_* variables of its own when imported
        "before = dict(os.environ)\n"
        "import dslide_dask\n"
        "heavy = sorted(m for m in ('distributed', 'tornado') if m in sys.modules)\n"
        "print(json.dumps({'heavy': heavy, 'env': dict(os.environ) == before}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    assert json.loads(out.stdout) == {"heavy": [], "env": True}


def test_the_cli_and_what_its_workers_import_again_need_no_scikit_learn():
    """A LocalCluster's workers import the ``dslide`` script again as they start: the
    estimator (and scikit-learn, 0.75 s) comes only where it is named."""
    script = (
        "import json, sys\n"
        "import dslide_workflows.cli, dslide_dask\n"
        "lazy = 'sklearn' not in sys.modules\n"
        "dslide_dask.SlideClassifier, dslide_dask.NotFittedError\n"
        "print(json.dumps([lazy, 'sklearn' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [True, True]


def test_actor_calls_take_at_most_four_positional_arguments():
    """Every call into an actor crosses a process boundary: more than four positional
    arguments is a spec (``dslide_dask.distributed.specs``) or keyword-only arguments."""
    from dslide_dask.distributed.coordinator import Coordinator
    from dslide_dask.distributed.shard_actor import ShardActor

    too_many = []
    for actor in (Coordinator, ShardActor):
        for name, method in inspect.getmembers(actor, inspect.isfunction):
            if name.startswith("_") and name != "__init__":
                continue
            positional = [
                p
                for p in inspect.signature(method).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
            ]
            if len(positional) > 4:
                too_many.append(f"{actor.__name__}.{name}: {len(positional)}")
    assert too_many == []


@pytest.mark.parametrize("spec", ["ShardSpec", "CoordinatorSpec"])
def test_specs_are_frozen(spec):
    import dataclasses

    from dslide_dask.distributed import specs

    cls = getattr(specs, spec)
    assert dataclasses.is_dataclass(cls) and cls.__dataclass_params__.frozen


def test_ruff_finds_nothing():
    """The project's ruff rules (pyproject.toml), e.g. positional arguments into actors."""
    ruff = pytest.importorskip("ruff")
    binary = Path(ruff.find_ruff_bin())
    for command in (["check"], ["format", "--check"]):
        out = subprocess.run(
            [binary, *command, "dslide_dask", "workflows", "tests"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stdout + out.stderr
