"""``dslide train``: train on a Dask cluster (or in this process) and summarise the run.

Wiring only: a config file and flags become a :class:`SlideConfig`, a cluster and a
trainer from :mod:`dslide_dask`; this module starts them, shows progress, prints, and
keeps everything in a run folder (:mod:`dslide_workflows.run_folder`), from which
``--resume`` carries on. The flags are :mod:`dslide_workflows.run_flags`'s.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from dslide_dask.model.fused_size import NO_FUSED, FusedBytes
from dslide_workflows.report import curves_drawing
from dslide_workflows.run_flags import add_run_arguments
from dslide_workflows.run_schema import RunSettings

if TYPE_CHECKING:
    from dslide_dask.data.dataset import XCDataset

#: How long --scheduler-address --workers N waits for the workers to join.
WAIT_WORKERS_SECONDS = 1800


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train",
        help="train a SLIDE classifier on a Dask cluster and report P@1/3/5",
        description="Train on XC text data (any fsspec URL, read by the workers) or a "
        "synthetic preset, on a new LocalCluster (default), an existing scheduler "
        "(--scheduler-address or DASK_SCHEDULER_ADDRESS) or in this process "
        "(--in-process). Settings come from --config YAML and flags (flags win).",
    )
    add_run_arguments(p)
    p.add_argument(
        "--resume",
        metavar="RUN",
        help="carry on a run folder from its latest checkpoint, with its settings "
        "(cluster, epochs and checkpoint flags may change)",
    )
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    from dslide_dask import SlideConfig
    from dslide_workflows.endpoints import nul_setting
    from dslide_workflows.errors import sigterm_interrupts
    from dslide_workflows.run_settings import resolve

    run, model = resolve(args)
    if (name := nul_setting(run.to_dict())) is not None:  # a flag's or a YAML value
        raise ValueError(f"{name} holds a NUL byte: no file name or URL can")
    from dslide_dask.model.fused_build import FUSION_DEFAULTS, recipe_from

    fusion = {k: model.pop(k) for k in list(model) if k in FUSION_DEFAULTS}
    cfg = SlideConfig.from_dict(model)
    recipe = recipe_from(fusion, run.seed)  # None: the network alone (neighbours=0)
    run, folder = _run_folder(run, resume=bool(args.resume))
    # SIGTERM ends the run as Ctrl-C does: metrics kept, cluster closed, lock released
    with sigterm_interrupts(), folder.claimed(resume=bool(args.resume)):
        return _train(args, run, (cfg, recipe, fusion), folder)


def _train(args: argparse.Namespace, run: RunSettings, model, folder) -> int:
    """The run, in its folder (held: locked, checked for links); ``model``: the
    network's config, the fused parts' recipe (None: the network alone) and the fusion
    parameters given."""
    from dslide_dask.checkpoint.label_counts import parts_with_labels
    from dslide_dask.data.held import HeldRows
    from dslide_dask.data.stream import Stream
    from dslide_workflows.progress import Progress, performance_report, warm_kernels
    from dslide_workflows.secrets import mask
    from dslide_workflows.summary import summary

    cfg, recipe, fusion = model
    # everything is read and checked before the run folder is written or a cluster started
    restore = _restore_point(folder, run) if args.resume else None
    train, test, shape, test_total = _data(run)
    # a few rows are held out of the network's training to weigh the fused parts on
    n_held = recipe.n_held(train.n_points) if recipe is not None else 0
    held = HeldRows.of(n_held, train.n_points, run.seed)
    # the lr schedule spans the whole run (a resumed run keeps the one it started with)
    epoch_steps = -(-(train.n_points - n_held) // run.batch_size)
    base = cfg
    cfg = base.for_data(shape[1], run.epochs * epoch_steps, epoch_steps, fused=recipe is not None)
    _check_memory(run, cfg, shape)
    epoch, batch = _position(restore)
    if epoch >= run.epochs:
        raise ValueError(
            f"{folder.url} already trained {epoch} of --epochs {run.epochs}: "
            "ask for more --epochs to carry on"
        )
    settings = {**run.to_dict(), "model": {**cfg.to_dict(), **fusion}}
    if args.verbose:
        dump = yaml.safe_dump(mask(settings), sort_keys=False, default_flow_style=None)
        print("settings:", dump.strip().replace("\n", "\n  "))
    print(_header(run, cfg, shape, train.n_points, epoch_steps))
    warm_kernels(run.in_process or not run.scheduler_address)
    with _cluster(run) as client:
        t0 = time.perf_counter()
        fused_bytes = NO_FUSED
        if recipe is not None:  # which negatives, and the fused parts' bytes: by the counts
            from dslide_dask.fused_parts import row_stats

            stats = row_stats(client, train, run.skip_bad_lines)
            if restore is None:
                cfg = base.for_data(
                    shape[1], run.epochs * epoch_steps, epoch_steps, True, stats.mostly_rare
                )
                settings["model"] = {**cfg.to_dict(), **fusion}
            fused_bytes = recipe.nbytes(stats, cfg.hidden[-1])
        print("building the model", flush=True)
        trainer = _trainer(run, cfg, shape, client, folder, restore, fused_bytes)
        setup = time.perf_counter() - t0
        folder.write_config(settings)  # once the checkpoint to resume from has loaded
        print(
            f"run folder: {folder.url}"
            + (f" (resuming at step {restore.step})" if restore else "")
            + ("" if args.verbose else "; settings in its config.yaml")
        )
        report = performance_report(run, client)
        with trainer, report:
            steps_left = run.epochs * epoch_steps - (epoch * epoch_steps + batch)
            progress = Progress(
                run,
                trainer,
                test,
                args.no_progress or args.log_every > 0,
                args.log_every,
                folder,
                total=steps_left,
            )
            t1 = time.perf_counter()
            try:
                stream = Stream(
                    run.batch_size,
                    run.epochs,
                    run.seed,
                    skip_bad_lines=run.skip_bad_lines,
                    held=held,
                ).from_position(epoch, batch)
                trainer.train(train, stream, progress, run.storage_options)
            finally:
                progress.close()
                folder.flush()
            seconds = time.perf_counter() - t1
            fused = _fused_parts(trainer, train, recipe, held, run, client)
            done = stream.meta(run.epochs, 0)
            parts = None if fused is None else fused.parts(run.storage_options)
            parts = parts_with_labels(trainer, run.storage_options, parts)  # PSP@k once loaded
            model_url = trainer.save(folder.child_url("model"), run.storage_options, done, parts)
            scores = None
            if test is not None and fused is not None:  # the network's P@k beside, one pass
                scores = fused.metrics(test)
            if test is not None and (scores is None or "network P@1" not in scores):
                alone = trainer.evaluate(
                    test, max_points=run.eval_points, storage_options=run.storage_options
                )
                if scores is None:
                    scores = alone
                else:  # the fused answer did not ask the network: its own pass
                    scores.update({f"network {k}": v for k, v in alone.items() if k[:2] == "P@"})
            shards = trainer.shard_info()
        text, numbers = summary(
            trainer.history,
            seconds,
            setup,
            shape,
            cfg,
            shards,
            scores,
            progress.evaluations,
            trainer.recoveries,
            trainer.moves,
            test_rows=None if test is None else (len(test), test_total),
        )
        print(text)
        if scores is not None:
            progress.record_eval(scores)
        curves = curves_drawing(list(folder.records), folder.url)  # as the cluster closes
    _finish(folder, text, numbers, model_url, curves.result())
    return 0


def _fused_parts(trainer, train, recipe, held, run: RunSettings, client):
    """The model's fused parts (neighbours, centroids, label trees), built where the
    model is from the rows read there; None without them."""
    if recipe is None:
        return None
    from dslide_dask.fused_parts import build_fused_parts
    from dslide_dask.model.fused_build import FusedBuild

    where = "in this process" if client is None else "on a worker"
    print(f"building the neighbours, label centroids and trees {where}", flush=True)
    t0 = time.perf_counter()
    build = FusedBuild(recipe, held, run.skip_bad_lines)
    fused = build_fused_parts(trainer, train, build, client, report=lambda s: print(f"  {s}"))
    print(f"built in {time.perf_counter() - t0:.1f} s", flush=True)
    return fused


def _header(run: RunSettings, cfg, shape: tuple[int, int], points: int, epoch_steps: int) -> str:
    """What is trained on what, in two lines (every setting: --verbose, config.yaml)."""
    widths = [shape[0], *cfg.hidden, shape[1]]
    params = sum(a * b + b for a, b in zip(widths, widths[1:], strict=False))
    data = run.preset or run.train
    return (
        f"data: {data}: {points:,} points, {shape[0]:,} features, {shape[1]:,} labels\n"
        f"model: {' -> '.join(f'{w:,}' for w in widths)} ({params:,} parameters); "
        f"{run.epochs} epoch(s) of {epoch_steps:,} steps of {run.batch_size}"
    )


def _run_folder(run: RunSettings, resume: bool):
    """The run's settings with its folder, and the folder: given, or a new one under runs/;
    never someone else's run (a folder that a failed run left without a checkpoint or
    model may be used again)."""
    from dslide_workflows.run_folder import RunFolder

    if run.run_dir is None:
        data = run.preset or Path(str(run.train).rstrip("/")).name.split(".")[0]
        name = os.path.join("runs", time.strftime("%Y%m%d-%H%M%S-") + data)
        taken = 1
        while RunFolder(name + (f"-{taken}" if taken > 1 else "")).exists():
            taken += 1
        run = dataclasses.replace(run, run_dir=name + (f"-{taken}" if taken > 1 else ""))
    folder = RunFolder(run.run_dir, run.storage_options)
    if not resume and folder.exists() and folder.resumable():
        raise ValueError(
            f"{folder.url} already holds a run: --resume {folder.url} to carry "
            "it on, or choose another --run-dir"
        )
    return run, folder


def _check_memory(run: RunSettings, cfg, shape: tuple[int, int]) -> None:
    """A model sized by the data's header must fit this machine when it is built here (in
    process or on a LocalCluster), before anything is allocated."""
    from dslide_dask.memory import check_memory, model_bytes

    if run.in_process or not run.scheduler_address:
        what = f"a model of {shape[0]:,} features and {shape[1]:,} labels (hidden {cfg.hidden})"
        check_memory(model_bytes(cfg.hidden, *shape), what)


def _restore_point(folder, run: RunSettings):
    """The newest of a run folder's latest checkpoint and final model; its metrics are
    cut back to it."""
    from dslide_dask.checkpoint import CheckpointError, CheckpointStore

    found = [
        CheckpointStore(folder.child_url(name), run.storage_options).latest()
        for name in ("model", "checkpoints")  # on a tie, the final model (its epoch is done)
    ]
    ckpt = max((c for c in found if c is not None), key=lambda c: c.step, default=None)
    if ckpt is None:
        raise CheckpointError(
            f"{folder.url}: no checkpoint to resume from (was the run started with "
            "--checkpoint-every or --checkpoint-minutes, and did it finish?)"
        )
    folder.records = [r for r in folder.read_metrics() if r.get("step", 0) <= ckpt.step]
    return ckpt


def _position(restore) -> tuple[int, int]:
    if restore is None:
        return 0, 0
    pos = restore.meta["position"]
    return int(pos["epoch"]), int(pos["batch"])


def _finish(folder, text: str, numbers: dict, model_url: str, curves: bytes) -> None:
    folder.write_plot(curves)
    folder.write_summary({**numbers, "model": model_url}, text)
    print(f"model: {model_url}\ncurves: {folder.child_url('curves.png')}")


def _data(run: RunSettings):
    """Training source, test data (read and checked now, --eval-points rows of it),
    (n_features, n_labels) and the test file's rows (the summary says how many it scored)."""
    from dslide_dask.data import synthetic
    from dslide_dask.data.batches import shape
    from dslide_dask.data.inputs import check_fits
    from dslide_dask.data.source import open_source, read_dataset
    from dslide_workflows.settings import byte_count

    if run.preset:
        data, held = synthetic.make_synthetic(run.preset, seed=run.seed)
        return data, held.sample(run.eval_points), shape(data), len(held)
    # headers only: the training data itself is read by the workers
    limit = byte_count(run.max_decompressed)  # None: a share of each reader's free memory
    train = open_source(run.train, run.storage_options, max_decompressed=limit)
    test: XCDataset | None = None
    total = 0
    if run.test:
        so = run.storage_options
        check_fits(open_source(run.test, so), *shape(train), what=run.test)
        test, skipped = read_dataset(
            run.test, so, skip_bad_lines=run.skip_bad_lines, max_decompressed=limit
        )
        if skipped:
            print(f"test data: {skipped} bad line(s) skipped in {run.test}")
        if len(test) == 0:
            raise ValueError(f"{run.test}: no points to evaluate on")
        total = len(test)
        test = test.sample(run.eval_points)
    if train.n_points == 0:
        raise ValueError(f"{run.train}: no points to train on (the header says 0)")
    return train, test, shape(train), total


@contextlib.contextmanager
def _cluster(run: RunSettings):
    """None (in process), a client of the given scheduler, or of a new LocalCluster."""
    if run.in_process:
        yield None
        return
    from distributed import Client, LocalCluster

    from dslide_workflows.security import client_security, connect_client, local_cluster_options

    if run.scheduler_address:
        security = client_security(run, run.scheduler_address)
        with connect_client(run.scheduler_address, security, run.connect_timeout) as client:
            print(f"cluster: {run.scheduler_address}, dashboard {client.dashboard_link}")
            if run.workers:  # shards go to the workers there are when training starts
                print(f"waiting for {run.workers} workers...", flush=True)
                client.wait_for_workers(run.workers, timeout=WAIT_WORKERS_SECONDS)
            yield client
        return
    n = run.workers or os.cpu_count() or 1
    with (
        LocalCluster(
            n_workers=n,
            threads_per_worker=run.threads_per_worker,
            processes=True,
            **local_cluster_options(run),
        ) as cluster,
        Client(cluster) as client,
    ):
        print(
            f"cluster: LocalCluster of {n} worker processes at {cluster.scheduler_address}, "
            f"dashboard {client.dashboard_link}"
        )
        yield client


def _trainer(
    run: RunSettings,
    cfg,
    shape: tuple[int, int],
    client,
    folder,
    restore,
    fused_bytes: FusedBytes = NO_FUSED,
):
    from dslide_dask.checkpoint import CheckpointPolicy
    from dslide_dask.distributed import DistributedTrainer
    from dslide_dask.local_trainer import LocalTrainer

    policy = None
    if run.checkpoint_every or run.checkpoint_minutes or client is not None:
        # on a cluster always: a worker asked to leave hands its rows off through it
        policy = CheckpointPolicy(
            folder.child_url("checkpoints"),
            run.checkpoint_every or 0,
            60 * (run.checkpoint_minutes or 0),
            run.keep_checkpoints,
            run.storage_options,
        )
    if client is None:
        if run.threads:
            import numba

            numba.set_num_threads(run.threads)
        return LocalTrainer(cfg, *shape, checkpoint=policy, restore=restore)
    return DistributedTrainer(
        client,
        cfg,
        *shape,
        n_shards=run.n_shards,
        hidden_shards=run.hidden_shards,
        wire_dtype=run.wire_dtype,
        pipeline=run.pipeline,
        step_mode=run.step_mode,
        checkpoint=policy,
        restore=restore.url if restore is not None else None,
        storage_options=run.storage_options,
        name=Path(folder.url).name,
        fused_bytes=fused_bytes,
    )
