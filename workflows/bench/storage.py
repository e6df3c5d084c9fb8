"""``dslide bench storage``: reading training data from a local S3 server with Dask workers.

Generates (once; cached) a synthetic preset's training text and its converted layout,
uploads both to an S3 server on 127.0.0.1 (moto's server mode, in this process), then
with a ``LocalCluster`` of ``--workers`` single-threaded worker processes (their malloc
thresholds raised, as the training actors raise them on their workers):

- text: every byte-range partition of the single text file read and parsed into CSR on
  the workers (the arrays stay there, as in training); MB/s is text bytes over wall time;
- converted: the same for every chunk of the converted layout; the ratio is text time
  over converted time; "worker CPU s" is the CPU the worker processes spent meanwhile
  (the cost that competes with training), summed over the partitions of one run;
- local disk: both again from the cached files on this machine's disk (page cache), as
  later epochs read them through ``simplecache::``;
- shuffled: one epoch of shuffled batches (:func:`iter_batches`) in this process, from
  each layout.

Each figure is the best of ``--repeat`` runs. The S3 server shares the machine's cores
with the workers (moto reads a whole object for every ranged GET: a real S3 does not),
so figures are conservative; the 1-minute load average is printed to judge how busy the
machine was.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from dslide_workflows.args import positive_int
from dslide_workflows.bench.data import default_cache_dir
from dslide_workflows.bench.flags import add_batch_size, add_preset

SUMMARY = "read training data from a local S3 server with Dask workers: MB/s, text vs converted"
BUCKET = "dslide-bench"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_preset(p)
    p.add_argument("--seed", type=int, default=0, help="data seed (default: 0)")
    p.add_argument("--workers", type=positive_int, default=2, help="(default: 2)")
    p.add_argument(
        "--partition-mb", type=positive_int, default=64, help="text byte-range size (default: 64)"
    )
    p.add_argument("--chunk-points", type=positive_int, default=65536, help="converted chunk size")
    add_batch_size(p)
    p.add_argument("--repeat", type=positive_int, default=2, help="best of N (default: 2)")
    p.add_argument("--skip-shuffle", action="store_true", help="skip the shuffled epochs")
    p.add_argument("--cache-dir", type=Path, default=None, help="where data are kept")
    p.add_argument("--refresh-data", action="store_true", help="regenerate even if cached")
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="write results")


def bench_files(
    preset: str, seed: int, cache_dir: Path | None, refresh: bool, chunk_points: int
) -> tuple[Path, Path]:
    """The cached training text of ``preset`` and its converted folder (made if missing)."""
    from dslide_dask.data import binary, synthetic
    from dslide_dask.data.convert import convert

    spec = synthetic.resolve_spec(preset, n_test=0)  # the train split does not depend on it
    key = json.dumps([dataclasses.asdict(spec), synthetic.CHUNK_POINTS, seed, chunk_points])
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    root = Path(cache_dir or default_cache_dir()) / "bench" / f"storage-{preset}-{digest}"
    text, conv = root / "train.txt", root / "converted"
    if refresh or not text.exists():
        t0 = time.perf_counter()
        tmp = root / "tmp"
        synthetic.generate(spec, str(tmp), seed=seed)
        os.replace(tmp / "train.txt", text)
        print(f"data: generated {text} in {time.perf_counter() - t0:.1f} s")
    manifest = conv / "manifest.json"
    stale = not manifest.exists() or json.loads(manifest.read_text())["version"] != binary.VERSION
    if refresh or stale:
        s = convert(str(text), str(conv), chunk_points=chunk_points)
        print(f"data: converted in {s.seconds:.1f} s: {s.n_chunks} chunks")
    return text, conv


def read_sizes(part) -> tuple[int, int, float]:
    """Worker task: read one partition (the data stay on the worker); returns
    ``(points, nnz, CPU seconds of the worker process meanwhile)``."""
    from dslide_dask.data.source import read_partition

    cpu = time.process_time()
    data, _ = read_partition(part)
    return data.n_points, data.X.nnz, time.process_time() - cpu


def warm_up() -> None:
    """Worker setup: load the compiled kernels of every reading path (numba cache)."""
    import fsspec

    from dslide_dask.data.source import open_source, read_partition

    with fsspec.open("memory://dslide-warm-up/t.txt", "wb") as f:
        f.write(b"2 4 4\n1 1:1\n2,3 2:0.5 3:1\n")
    for part in open_source("memory://dslide-warm-up/t.txt", partition_bytes=8).partitions:
        read_partition(part)


def _best(repeat: int, fn) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run(args: argparse.Namespace) -> int:
    import fsspec
    from distributed import Client, LocalCluster
    from moto.server import ThreadedMotoServer

    from dslide_dask.data.shuffle import iter_batches
    from dslide_dask.data.source import open_source
    from dslide_dask.malloc import raise_malloc_thresholds

    text, conv = bench_files(
        args.preset, args.seed, args.cache_dir, args.refresh_data, args.chunk_points
    )
    text_bytes = text.stat().st_size
    conv_bytes = sum(f.stat().st_size for f in conv.iterdir())
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(k, "bench")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    results: dict[str, Any] = {"preset": args.preset, "workers": args.workers}
    try:
        host, port = server.get_host_and_port()
        so = {
            "key": "bench",
            "secret": "bench",
            "client_kwargs": {"endpoint_url": f"http://{host}:{port}"},
        }
        s3 = fsspec.filesystem("s3", **so)
        s3.mkdir(BUCKET)
        t0 = time.perf_counter()
        s3.put(str(text), f"{BUCKET}/train.txt")
        s3.put(str(conv), f"{BUCKET}/converted", recursive=True)
        print(
            f"uploaded {(text_bytes + conv_bytes) / 1e6:.0f} MB to the local S3 server "
            f"in {time.perf_counter() - t0:.1f} s"
        )
        text_src = open_source(
            f"s3://{BUCKET}/train.txt", so, partition_bytes=args.partition_mb << 20
        )
        conv_src = open_source(f"s3://{BUCKET}/converted", so)
        with (
            LocalCluster(
                n_workers=args.workers,
                threads_per_worker=1,
                processes=True,
                dashboard_address=":0",
                silence_logs=logging.ERROR,
            ) as cluster,
            Client(cluster) as client,
        ):

            def read_all(src) -> list:
                return client.gather(client.map(read_sizes, list(src.partitions), pure=False))

            client.run(warm_up)
            client.run(raise_malloc_thresholds)  # as the training actors do on their workers
            client.gather(
                client.map(read_sizes, [conv_src.partitions[0]] * args.workers, pure=False)
            )
            load = os.getloadavg()[0]
            t_text, sizes = _best(args.repeat, lambda: read_all(text_src))
            t_conv, sizes2 = _best(args.repeat, lambda: read_all(conv_src))
            # the same files on local disk: what later epochs read through simplecache::
            local_text = open_source(str(text), partition_bytes=args.partition_mb << 20)
            t_text_local, _ = _best(args.repeat, lambda: read_all(local_text))
            t_conv_local, _ = _best(args.repeat, lambda: read_all(open_source(str(conv))))
        totals = [tuple(sum(s[i] for s in out) for i in (0, 1)) for out in (sizes, sizes2)]
        if totals[0] != totals[1]:
            raise RuntimeError(f"text and converted layouts differ: (points, nnz) {totals}")
        n_points = sum(s[0] for s in sizes)
        cpu_text, cpu_conv = (sum(s[2] for s in out) for out in (sizes, sizes2))
        results.update(
            n_points=n_points,
            text_mb=text_bytes / 1e6,
            converted_mb=conv_bytes / 1e6,
            text_partitions=len(text_src.partitions),
            converted_chunks=len(conv_src.partitions),
            text_seconds=t_text,
            text_mb_per_s=text_bytes / 1e6 / t_text,
            converted_seconds=t_conv,
            speedup=t_text / t_conv,
            text_worker_cpu_seconds=cpu_text,
            converted_worker_cpu_seconds=cpu_conv,
            load_before=load,
            local_text_seconds=t_text_local,
            local_converted_seconds=t_conv_local,
            local_speedup=t_text_local / t_conv_local,
        )
        print(f"\n{args.preset}: {n_points} points; load average {load:.2f} before the runs")
        print(f"{'':34}{'seconds':>9}{'MB/s':>9}{'worker CPU s':>14}")
        rows = (
            (f"text, {len(text_src.partitions)} byte ranges", t_text, text_bytes, cpu_text, ""),
            (
                f"converted, {len(conv_src.partitions)} chunks",
                t_conv,
                conv_bytes,
                cpu_conv,
                f"   {t_text / t_conv:.1f}x faster, {cpu_text / cpu_conv:.1f}x less worker CPU",
            ),
        )
        for name, t, nbytes, cpu, note in rows:
            print(f"{name:34}{t:9.2f}{nbytes / 1e6 / t:9.1f}{cpu:14.2f}{note}")
        for name, t, nbytes, note in (
            ("text, local disk", t_text_local, text_bytes, ""),
            (
                "converted, local disk",
                t_conv_local,
                conv_bytes,
                f"{'':14}   {t_text_local / t_conv_local:.1f}x faster",
            ),
        ):
            print(f"{name:34}{t:9.2f}{nbytes / 1e6 / t:9.1f}{note}")
        if not args.skip_shuffle:
            for name, src in (("text", text_src), ("converted", conv_src)):

                def epoch(src=src) -> int:
                    return sum(1 for _ in iter_batches(src.partitions, args.batch_size, 0, 0))

                t, _ = _best(1, epoch)
                results[f"shuffled_epoch_{name}_seconds"] = t
                print(f"{'shuffled epoch, 1 process, ' + name:34}{t:9.2f}")
    finally:
        server.stop()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0
