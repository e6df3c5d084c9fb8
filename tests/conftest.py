import contextlib
import logging
import os
import socket

import fsspec
import pytest

# kernels in the test process wait passively between parallel regions, as under the CLI
# and in trainers (dslide_dask.omp): LocalCluster workers share the cores with it
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# the helper modules shared by test modules hold assertions: pytest explains them as it
# does those in test modules (registered before any test module imports them)
pytest.register_assert_rewrite("tests.hostile", "tests.k8s", "tests.storage")


BUCKET = "dslide-test"

# -- the slow marker: `python -m pytest` is the quick check, `--slow` the full suite ------------
LEFT_OUT = pytest.StashKey[int]()


def pytest_addoption(parser):
    parser.addoption(
        "--slow",
        action="store_true",
        default=False,
        help="also run the tests marked slow: the full suite, as CI runs it",
    )


def _named(config) -> list[str]:
    """The node ids given on the command line (``tests/test_x.py::test_y``), relative to
    the root as items' node ids are: a test asked for by name runs, slow or not."""
    ids = []
    for arg in config.args:
        if "::" in arg:
            path, rest = arg.split("::", 1)
            full = (config.invocation_params.dir / path).resolve()
            try:
                ids.append(f"{full.relative_to(config.rootpath).as_posix()}::{rest}")
            except ValueError:
                continue
    return ids


def pytest_collection_modifyitems(config, items):
    """Without ``--slow`` (or a ``-m`` expression, which then decides), the tests marked
    slow are deselected, but for those named on the command line."""
    if config.getoption("--slow") or config.getoption("markexpr"):
        return
    named = _named(config)

    def asked(item) -> bool:
        return any(item.nodeid == n or item.nodeid.startswith((f"{n}::", f"{n}[")) for n in named)

    slow = [i for i in items if i.get_closest_marker("slow") and not asked(i)]
    if slow:
        left_out = set(slow)
        config.hook.pytest_deselected(items=slow)
        items[:] = [i for i in items if i not in left_out]
    config.stash[LEFT_OUT] = len(slow)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    left_out = config.stash.get(LEFT_OUT, 0)
    if left_out:
        tests = "test" if left_out == 1 else "tests"
        terminalreporter.write_line(
            f"{left_out} slow {tests} left out: `python -m pytest --slow` runs the full suite"
        )


def no_pairs(n_rows: int, n_labels: int):
    """A filter of ``n_rows`` test rows that leaves no label out (``evaluate(exclude=)``)."""
    import numpy as np

    from dslide_dask.data.csr import CSR

    return CSR(np.zeros(n_rows + 1, np.int64), np.zeros(0, np.int32), None, n_labels)


# -- shared fixtures ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    """The ``tiny`` synthetic preset, seed 0: ``(train, test)``, 5,000 and 1,000 rows of
    2,000 features and 1,000 labels."""
    from dslide_dask.data.synthetic import make_synthetic

    return make_synthetic("tiny", seed=0)


@pytest.fixture(scope="module")
def client():
    """A client of a LocalCluster of 2 worker processes of one thread each (a 2-core
    machine's), for the tests of a module; closed with its workers after them."""
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2)
        yield client


#: Dask's default ports: the scheduler's and the dashboard's.
DASK_DEFAULT_PORTS = (8786, 8787)


@pytest.fixture
def dask_ports_taken():
    """Dask's default ports on 127.0.0.1 held by this process for the test (as where a
    JupyterLab Dask cluster is open); a port something else holds already stays so."""
    with contextlib.ExitStack() as stack:
        for port in DASK_DEFAULT_PORTS:
            sock = stack.enter_context(socket.socket())
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken already
            sock.listen(1)
        yield DASK_DEFAULT_PORTS


@pytest.fixture(scope="session")
def crds():
    """``(apiVersion, kind) -> JSON-schema validator`` for the CRDs that the installed
    dask-kubernetes operator ships (``tests.k8s.crd_validators``), for the Kubernetes
    manifest tests; they are skipped without jsonschema and dask-kubernetes."""
    from tests.k8s import DASK_KINDS, crd_validators

    validators = crd_validators()
    assert {kind for _, kind in validators} >= DASK_KINDS
    return validators


@pytest.fixture(scope="session")
def s3():
    """A real S3 endpoint on 127.0.0.1 (moto's server mode) with an empty bucket; yields
    the storage options that reach it."""
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    dummies = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    saved = {k: os.environ.get(k) for k in dummies}
    os.environ.update(dummies)
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        so = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": f"http://{host}:{port}"},
        }
        fsspec.filesystem("s3", **so).mkdir(BUCKET)
        yield so
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
