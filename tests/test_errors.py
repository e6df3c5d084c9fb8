"""One error base: every exception dslide-dask defines derives from DslideError."""

import ast
import pickle
from pathlib import Path

import pytest
from sklearn.exceptions import NotFittedError as SklearnNotFitted

import dslide_dask
from dslide_dask import errors
from dslide_dask.ensemble import SlideEnsemble

ROOT = Path(__file__).resolve().parents[1]


def _exception_classes():
    """(file, class name) of every top-level class deriving from an exception, by name."""
    for path in sorted([*ROOT.glob("dslide_dask/**/*.py"), *ROOT.glob("workflows/**/*.py")]):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                continue
            bases = [ast.unparse(b) for b in node.bases]
            if any(b.endswith(("Error", "Exception", "Failed")) for b in bases):
                yield path.relative_to(ROOT).as_posix(), node.name


def test_every_public_exception_class_lives_under_the_one_base():
    found = list(_exception_classes())
    assert len(found) >= 10, found  # the scan sees the classes
    for path, name in found:
        module = path.removesuffix(".py").replace("/", ".")
        module = module.replace("workflows", "dslide_workflows", 1)
        cls = getattr(__import__(module, fromlist=[name]), name)
        if issubclass(cls, KeyboardInterrupt):  # SIGTERM's Terminated is an interrupt
            continue
        assert issubclass(cls, errors.DslideError), f"{path}: {name}"


def test_errors_are_also_the_builtin_kinds_handlers_expect():
    assert issubclass(errors.XCFormatError, ValueError)
    assert issubclass(errors.CheckpointError, ValueError)
    assert issubclass(errors.ShardLostError, RuntimeError)
    assert issubclass(dslide_dask.NotFittedError, SklearnNotFitted)
    assert dslide_dask.DslideError is errors.DslideError


def test_a_format_error_survives_pickling_with_its_fields():
    err = pickle.loads(pickle.dumps(errors.XCFormatError("t.txt", 3, "bad label")))
    assert str(err) == "t.txt:3: bad label"
    assert (err.source, err.line, err.problem) == ("t.txt", 3, "bad label")


@pytest.mark.parametrize("estimator", [dslide_dask.SlideClassifier(), SlideEnsemble()])
def test_unfitted_estimators_raise_the_one_not_fitted_error(estimator):
    import numpy as np

    with pytest.raises(dslide_dask.NotFittedError, match="not fitted"):
        estimator.predict_topk(np.zeros((1, 3), dtype=np.float32))
