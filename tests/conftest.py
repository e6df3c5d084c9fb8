import logging
import os

import fsspec
import pytest

# kernels in the test process wait passively between parallel regions, as under the CLI
# and in trainers (dslide_dask.omp): LocalCluster workers share the cores with it
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


BUCKET = "dslide-test"


@pytest.fixture(scope="session")
def s3():
    """A real S3 endpoint on 127.0.0.1 (moto's server mode) with an empty bucket; yields
    the storage options that reach it."""
    pytest.importorskip("s3fs")
    server_mod = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    dummies = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
               "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}  # fmt: skip
    saved = {k: os.environ.get(k) for k in dummies}
    os.environ.update(dummies)
    server = server_mod.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        so = {"key": "testing", "secret": "testing",
              "client_kwargs": {"endpoint_url": f"http://{host}:{port}"}}  # fmt: skip
        fsspec.filesystem("s3", **so).mkdir(BUCKET)
        yield so
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
