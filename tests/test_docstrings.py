"""The estimators' docstrings say what their signatures take, in the spirit of
scikit-learn's ``test_docstring_parameters``: every ``__init__`` parameter in the class's
numpydoc Parameters section, in order and nothing else; every fitted attribute in its
Attributes section; every public method's Parameters matching its signature; the
hyperparameters keyword-only; and the Examples run.
"""

import ast
import doctest
import inspect
import textwrap
import warnings

import pytest

from dslide_dask.ensemble import SlideEnsemble
from dslide_dask.estimator import SlideClassifier

docscrape = pytest.importorskip(
    "numpydoc.docscrape", reason="numpydoc is not installed (pip install -e '.[test]')"
)

ESTIMATORS = [SlideClassifier, SlideEnsemble]
#: Parameters that may be passed positionally (scikit-learn's meta-estimators take their
#: estimator so); every other one is keyword-only.
POSITIONAL = {SlideClassifier: (), SlideEnsemble: ("estimator",)}


def parse(obj) -> "docscrape.NumpyDocString":
    """``obj``'s docstring, parsed; numpydoc's warnings (an unknown section, a malformed
    one) are failures."""
    doc = inspect.getdoc(obj)
    assert doc, f"{obj.__qualname__} has no docstring"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return docscrape.NumpyDocString(doc)


def documented(doc, section: str) -> list[str]:
    """The names a section documents, in order (``a, b : int`` is two; ``**params`` is
    ``params``)."""
    return [n.strip().lstrip("*") for item in doc[section] for n in item.name.split(",")]


def signature_names(signature: inspect.Signature) -> list[str]:
    return [p.name for p in signature.parameters.values() if p.name not in ("self", "cls")]


def mismatch(signature: inspect.Signature, doc) -> str:
    """What differs between a signature and a Parameters section ('' if nothing)."""
    want, have = signature_names(signature), documented(doc, "Parameters")
    if want == have:
        return ""
    missing = [n for n in want if n not in have]
    extra = [n for n in have if n not in want]
    if missing or extra:
        return f"undocumented: {missing}; documented but not taken: {extra}"
    return f"documented in another order: {have} (the signature: {want})"


def public_methods(cls) -> list[str]:
    """Public methods the project defines on ``cls`` or its mixins (not scikit-learn's,
    nor properties)."""
    names = []
    for name in dir(cls):
        if name.startswith("_") or isinstance(inspect.getattr_static(cls, name), property):
            continue
        member = getattr(cls, name)
        if callable(member) and getattr(member, "__module__", "").startswith("dslide_dask"):
            names.append(name)
    return names


def fitted_attributes(cls) -> set[str]:
    """Public names ending in ``_``: the class's properties, and every attribute the
    project's classes in its MRO assign (``self.x_ = ...``, ``clf.x_ = ...``)."""
    names = {
        n
        for n in dir(cls)
        if n.endswith("_")
        and not n.startswith("_")
        and isinstance(inspect.getattr_static(cls, n), property)
    }
    for klass in cls.__mro__:
        if not klass.__module__.startswith("dslide_dask"):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            targets = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            for target in targets:
                for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if (
                        isinstance(t, ast.Attribute)
                        and t.attr.endswith("_")
                        and not t.attr.startswith("_")
                    ):
                        names.add(t.attr)
    return names


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_every_parameter_is_documented_in_order(cls):
    problem = mismatch(inspect.signature(cls), parse(cls))
    assert not problem, f"{cls.__name__}: {problem}"


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_every_parameter_has_a_type_and_a_description(cls):
    for p in parse(cls)["Parameters"]:
        assert p.type, f"{cls.__name__}.{p.name}: no type"
        assert "".join(p.desc).strip(), f"{cls.__name__}.{p.name}: no description"


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_defaults_in_the_docs_are_the_signatures(cls):
    """``default=...`` in a parameter's type is the default the signature has."""
    defaults = {n: p.default for n, p in inspect.signature(cls).parameters.items()}
    for p in parse(cls)["Parameters"]:
        written = p.type.rpartition("default=")[2]
        assert p.type != written, f"{cls.__name__}.{p.name}: no default= in {p.type!r}"
        value = defaults[p.name]
        said = _value(written)
        assert said == pytest.approx(value) if isinstance(value, float) else said == value, (
            f"{cls.__name__}.{p.name}: documented {said!r}, is {value!r}"
        )


def _value(text: str):
    """A default as written: a Python literal, or a fraction (``1/3``)."""
    numerator, slash, denominator = text.partition("/")
    if slash:
        return int(numerator) / int(denominator)
    return ast.literal_eval(text)


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_parameters_are_keyword_only(cls):
    positional = [
        p.name for p in inspect.signature(cls).parameters.values() if p.kind is not p.KEYWORD_ONLY
    ]
    assert positional == list(POSITIONAL[cls])


@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda c: c.__name__)
def test_every_fitted_attribute_is_documented(cls):
    found = fitted_attributes(cls)
    assert found, "the search for fitted attributes found none"
    assert set(documented(parse(cls), "Attributes")) == found


def _methods():
    return [
        pytest.param(cls, name, id=f"{cls.__name__}.{name}")
        for cls in ESTIMATORS
        for name in public_methods(cls)
    ]


@pytest.mark.parametrize(("cls", "name"), _methods())
def test_public_methods_document_their_parameters(cls, name):
    method = getattr(cls, name)
    doc = parse(method)
    assert doc["Summary"], f"{cls.__name__}.{name}: no summary line"
    problem = mismatch(inspect.signature(method), doc)
    assert not problem, f"{cls.__name__}.{name}: {problem}"
    returns = inspect.signature(method).return_annotation
    if returns not in ("None", None):
        assert doc["Returns"], f"{cls.__name__}.{name}: no Returns section"


def test_the_methods_checked_include_the_estimator_api():
    for cls in ESTIMATORS:
        assert {"fit", "predict", "predict_topk", "evaluate", "score"} <= set(public_methods(cls))
    assert {"partial_fit", "save", "load"} <= set(public_methods(SlideClassifier))


def test_a_new_undocumented_parameter_fails():
    """The check itself: a parameter added to the signature and not to the docstring is
    reported, and so is one documented out of order."""
    signature = inspect.signature(SlideClassifier)
    params = list(signature.parameters.values())
    added = signature.replace(
        parameters=[*params, inspect.Parameter("shiny", inspect.Parameter.KEYWORD_ONLY)]
    )
    doc = parse(SlideClassifier)
    assert "undocumented: ['shiny']" in mismatch(added, doc)
    swapped = signature.replace(parameters=[params[1], params[0], *params[2:]])
    assert "another order" in mismatch(swapped, doc)


@pytest.mark.parametrize(
    "cls",
    [SlideClassifier, pytest.param(SlideEnsemble, marks=pytest.mark.slow)],  # two fits
    ids=lambda c: c.__name__,
)
def test_the_examples_run(cls):
    """Each class's Examples section runs as a doctest (on the ``tiny`` preset)."""
    tests = doctest.DocTestFinder(recurse=False).find(cls, cls.__name__, globs={})
    assert tests and tests[0].examples, f"{cls.__name__} has no Examples"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    report = []
    for test in tests:
        runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)
