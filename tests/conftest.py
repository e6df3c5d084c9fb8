import os

import pytest

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="run large, slow tests")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runslow"):
        return
    skip = pytest.mark.skip(reason="large run: opt in with --runslow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)
