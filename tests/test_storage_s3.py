"""Training data from object storage, end to end: read in byte ranges, indexed,
decompressed and validated by real Dask worker processes from a local S3 server (moto),
errors travelling back with the URL and the line; a folder of parts converted on S3 and
read through a chained ``simplecache::`` URL; ``memory://`` read by an in-process cluster;
the ``dslide convert`` command and the storage benchmark against S3.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import os

import numpy as np
import pytest

from dslide_dask.data import XCDataset, XCFormatError, read_xc, write_xc
from dslide_dask.data.convert import convert
from dslide_dask.data.partitions import concat
from dslide_dask.data.shuffle import iter_batches
from dslide_dask.data.source import index_partitions, open_source, read_partition
from tests.conftest import BUCKET
from tests.storage import assert_same, numbered, put, read_all, row_ids, text_of


@pytest.fixture(scope="module")
def data() -> XCDataset:
    """600 numbered rows (tests.storage.numbered), seed 1."""
    return numbered(600, seed=1)


# -- local servers and clusters ----------------------------------------------------------------
@contextlib.contextmanager
def cluster(processes: bool):
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2 if processes else 1,
            threads_per_worker=1 if processes else 2,
            processes=processes,
            dashboard_address=":0",
            silence_logs=logging.ERROR,
        ) as c,
        Client(c) as client,
    ):
        client.wait_for_workers(len(c.workers))
        yield client


def pid_and_read(part):
    return os.getpid(), *read_partition(part)


# -- object storage with real workers ----------------------------------------------------------
@pytest.mark.slow
def test_s3_byte_ranges_read_by_worker_processes(s3, data: XCDataset) -> None:
    url = f"s3://{BUCKET}/one/train.txt"
    write_xc(url, data, storage_options=s3)
    gz = put(f"s3://{BUCKET}/one/train.txt.gz", gzip.compress(text_of(data)), **s3)
    put(f"s3://{BUCKET}/bad/train.txt", b"3 10 5\n1 1:1\n2 2:1\n3 12:1\n", **s3)
    src = open_source(url, storage_options=s3, partition_bytes=4000)
    assert len(src.partitions) > 4 and src.partitions[0].storage_options == s3
    with cluster(processes=True) as client:
        workers = sorted(client.scheduler_info()["workers"])
        futures = [
            client.submit(pid_and_read, p, workers=[workers[i % 2]], pure=False)
            for i, p in enumerate(src.partitions)
        ]
        pids, parts, skipped = zip(*client.gather(futures), strict=True)
        assert os.getpid() not in pids and len(set(pids)) == 2  # two real worker processes
        assert sum(skipped) == 0
        assert_same(concat(parts, src.n_features, src.n_labels), read_xc(url, s3))
        # an exact index, counted on the workers
        indexed = index_partitions(src.partitions, lambda f, xs: client.gather(client.map(f, xs)))
        lines = [p.first_line for p in indexed]
        assert lines[0] == 1 and lines == sorted(set(lines))
        assert indexed[0].file_lines == data.n_points + 1
        assert sum(len(d) for d, _ in map(read_partition, indexed)) == data.n_points
        # compressed: one partition
        (part,) = open_source(gz, storage_options=s3).partitions
        assert_same(client.submit(read_partition, part).result()[0], data)
        # errors travel back with the URL and the line
        bad = open_source(f"s3://{BUCKET}/bad/train.txt", storage_options=s3).partitions
        with pytest.raises(XCFormatError, match=rf"^s3://{BUCKET}/bad/train.txt:4: feature id 12"):
            client.submit(read_partition, bad[0]).result()


def test_s3_folder_convert_and_simplecache(s3, data: XCDataset, tmp_path) -> None:
    folder = f"s3://{BUCKET}/parts"
    for k, lo in enumerate(range(0, data.n_points, 250)):
        write_xc(f"{folder}/part-{k:02d}.txt", data.slice(lo, lo + 250), storage_options=s3)
    put(f"{folder}/_SUCCESS", b"", **s3)
    src = open_source(folder + "/", storage_options=s3)
    assert [p.url for p in src.partitions] == [f"{folder}/part-{k:02d}.txt" for k in range(3)]
    assert_same(read_all(src)[0], data)
    summary = convert(folder, f"s3://{BUCKET}/bin", chunk_points=256, storage_options=s3)
    assert summary.n_chunks == 3 and summary.n_points == data.n_points
    binary = open_source(f"s3://{BUCKET}/bin", storage_options=s3)
    assert binary.format == "npz" and binary.n_points == data.n_points
    assert_same(read_all(binary)[0], data)
    # chained URL: plain options go to s3, not to the cache
    cached = open_source(f"simplecache::{folder}/part-*.txt", storage_options=s3)
    assert cached.partitions[0].url == f"simplecache::{folder}/part-00.txt"
    batches = list(iter_batches(cached.partitions, 64, epoch=0, seed=1))
    assert sorted(np.concatenate([row_ids(b) for b in batches])) == list(range(data.n_points))


def test_memory_in_process_cluster(data: XCDataset) -> None:
    url = "memory://inproc/train.txt"
    write_xc(url, data)
    src = open_source(url, partition_bytes=3000)
    with cluster(processes=False) as client:  # memory:// is per process: threads only
        outs = client.gather(client.map(read_partition, list(src.partitions)))
    assert_same(concat([d for d, _ in outs], src.n_features, src.n_labels), data)


# -- command line ------------------------------------------------------------------------------
def test_convert_command(s3, data: XCDataset, capsys) -> None:
    import argparse

    from dslide_workflows.args import storage_options
    from dslide_workflows.convert import add_convert_parser

    assert storage_options([("a.b", 1), ("a.c", "x"), ("d", True)]) == {
        "a": {"b": 1, "c": "x"},
        "d": True,
    }
    with pytest.raises(ValueError, match="nests under a non-mapping"):
        storage_options([("a", 1), ("a.b", 2)])
    lines = text_of(data).split(b"\n")
    lines[7] = b"1 2:x"
    put(f"s3://{BUCKET}/cli/train.txt", b"\n".join(lines), **s3)
    parser = argparse.ArgumentParser()
    add_convert_parser(parser.add_subparsers())
    endpoint = s3["client_kwargs"]["endpoint_url"]
    argv = ["convert", f"s3://{BUCKET}/cli/train.txt", f"s3://{BUCKET}/cli/bin"]
    argv += ["--chunk-points", "100", "--skip-bad-lines"]
    argv += ["--storage-option", "key=testing", "--storage-option", "secret=testing"]
    argv += ["--storage-option", f"client_kwargs.endpoint_url={endpoint}"]
    args = parser.parse_args(argv)
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert f"-> s3://{BUCKET}/cli/bin/manifest.json: 599 points in 6 chunks" in out
    assert "skipped 1 bad line(s)" in out
    src = open_source(f"s3://{BUCKET}/cli/bin", storage_options=s3)
    assert_same(read_all(src)[0], data.take(np.r_[0:6, 7:600]))


@pytest.mark.slow
def test_storage_benchmark_smoke(tmp_path, capsys) -> None:
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    from dslide_workflows.cli import main

    out = tmp_path / "result.json"
    argv = ["bench", "storage", "--preset", "tiny", "--workers", "1", "--repeat", "1"]
    argv += ["--partition-mb", "1", "--cache-dir", str(tmp_path), "--json", str(out)]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["n_points"] == 5000 and result["speedup"] > 0
    assert "shuffled epoch, 1 process, converted" in capsys.readouterr().out
