"""``dslide train``: train on a Dask cluster (or in this process) and summarise the run.

Wiring only: a config file and flags become a :class:`SlideConfig`, a cluster and a
trainer from :mod:`dslide_dask`; this module starts them, shows progress, prints, and
keeps everything in a run folder (:mod:`dslide_workflows.run_folder`), from which
``--resume`` carries on.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path
from typing import Any

import yaml

from dslide_workflows.args import storage_options

#: Flags that may also come from the config file, with their defaults.
RUN_DEFAULTS: dict[str, Any] = {
    "train": None,
    "test": None,
    "preset": None,
    "storage_options": {},
    "scheduler_address": None,
    "workers": None,
    "threads_per_worker": 1,
    "in_process": False,
    "n_shards": None,
    "wire_dtype": "float16",
    "pipeline": True,
    "epochs": 1,
    "batch_size": 256,
    "eval_every": 0,
    "eval_points": 2000,
    "performance_report": None,
    "seed": 0,
    "threads": None,
    "skip_bad_lines": False,
    "run_dir": None,
    "checkpoint_every": 0,
    "checkpoint_minutes": 0.0,
    "keep_checkpoints": 3,
}
#: How long --scheduler-address --workers N waits for the workers to join.
WAIT_WORKERS_SECONDS = 1800
#: Settings a resumed run may change (where and how it runs, and for how long).
RESUMABLE = {"scheduler_address", "workers", "threads_per_worker", "in_process", "n_shards",
             "wire_dtype", "pipeline", "epochs", "eval_every", "eval_points", "threads",
             "performance_report", "checkpoint_every", "checkpoint_minutes", "keep_checkpoints",
             "skip_bad_lines", "storage_options"}  # fmt: skip


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    from dslide_workflows.args import add_storage_arguments, hidden_sizes, key_value, positive_int

    p = sub.add_parser(
        "train",
        help="train a SLIDE classifier on a Dask cluster and report P@1/3/5",
        description="Train on XC text data (any fsspec URL, read by the workers) or a "
        "synthetic preset, on a new LocalCluster (default), an existing scheduler "
        "(--scheduler-address or DASK_SCHEDULER_ADDRESS) or in this process "
        "(--in-process). Settings come from --config YAML and flags (flags win).",
    )
    p.add_argument("--config", type=Path, metavar="YAML", help="run settings (see README)")
    src = p.add_argument_group("data")
    src.add_argument("--train", metavar="URL", help="training data (XC text format)")
    src.add_argument("--test", metavar="URL", help="test data, for evaluation")
    src.add_argument("--preset", help="generate this synthetic preset in memory instead")
    src.add_argument("--skip-bad-lines", action="store_true", default=None,
                     help="drop malformed lines and count them, instead of stopping")  # fmt: skip
    add_storage_arguments(src)
    c = p.add_argument_group("cluster")
    c.add_argument("--scheduler-address", metavar="ADDR", help="connect to this scheduler")
    c.add_argument("--workers", type=int, metavar="N",
                   help="LocalCluster workers (default: cores); with a scheduler address, "
                   "wait until N workers have joined")  # fmt: skip
    c.add_argument("--threads-per-worker", type=int, metavar="T", help="(default: 1)")
    c.add_argument("--in-process", action="store_true", default=None, help="no Dask at all")
    c.add_argument("--n-shards", type=int, metavar="S", help="(default: one per worker)")
    c.add_argument("--wire-dtype", choices=("float16", "float32"), help="(default: float16)")
    c.add_argument("--no-pipeline", dest="pipeline", action="store_false", default=None,
                   help="one phase at a time, no stale hidden activations")  # fmt: skip
    m = p.add_argument_group("model (also --opt K=V for any SlideClassifier parameter)")
    m.add_argument("--hidden", type=hidden_sizes, metavar="W[,W...]", help="(default: 128)")
    m.add_argument(
        "--lr", type=float, help="Adam learning rate (default: 1e-2, or 2e-2 from 100K labels)"
    )
    m.add_argument("--hash-family", help="dwta or simhash (default: dwta)")
    m.add_argument("--K", type=int, help="hash codes per table (default: 6)")
    m.add_argument("--L", type=int, help="hash tables (default: 50)")
    t = p.add_argument_group("training")
    t.add_argument("--epochs", type=positive_int)
    t.add_argument("--batch-size", type=positive_int)
    t.add_argument("--threads", type=positive_int, help="numba threads with --in-process")
    t.add_argument("--eval-every", type=int, metavar="STEPS", help="(default: 0, at the end)")
    t.add_argument("--eval-points", type=int, metavar="N", help="test rows (default: 2000)")
    t.add_argument("--seed", type=int)
    t.add_argument("--opt", type=key_value, action="append", default=[], metavar="K=V",
                   help="model parameter, e.g. lr=1e-2 hidden=[256] L=50 (repeatable)")  # fmt: skip
    t.add_argument("--performance-report", metavar="HTML", help="Dask performance report")
    t.add_argument("--no-progress", action="store_true", help="no progress bar")
    t.add_argument("--log-every", type=int, default=0, metavar="STEPS",
                   help="print a progress line every STEPS steps instead of a bar")  # fmt: skip
    r = p.add_argument_group("run folder and checkpoints")
    r.add_argument("--run-dir", metavar="URL",
                   help="where config, metrics, curves, checkpoints and the model go "
                   "(default: runs/DATE-TIME-DATA)")  # fmt: skip
    r.add_argument("--checkpoint-every", type=int, metavar="STEPS",
                   help="checkpoint every STEPS steps (default: 0, off)")  # fmt: skip
    r.add_argument("--checkpoint-minutes", type=float, metavar="MIN",
                   help="checkpoint every MIN minutes (default: 0, off)")  # fmt: skip
    r.add_argument("--keep-checkpoints", type=int, metavar="N",
                   help="newest checkpoints kept (default: 3; 0: all)")  # fmt: skip
    r.add_argument("--resume", metavar="RUN",
                   help="carry on a run folder from its latest checkpoint, with its settings "
                   "(cluster, epochs and checkpoint flags may change)")  # fmt: skip
    p.set_defaults(func=cmd_train)


def resolve(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run settings and model parameters from defaults < config file < flags, all checked
    (:mod:`dslide_workflows.settings`) before anything starts."""
    from dslide_workflows.secrets import merge
    from dslide_workflows.settings import check_model, check_run, parse_yaml

    run = dict(RUN_DEFAULTS)
    model: dict[str, Any] = {}
    origin: dict[str, str] = {}
    if getattr(args, "resume", None):
        return _resumed(args, run)
    model_where = "--opt"
    if args.config:
        loaded = parse_yaml(Path(args.config).read_bytes(), str(args.config))
        if not isinstance(loaded, dict):
            raise ValueError(f"{args.config}: expected a mapping of settings")
        model.update(check_model(loaded.pop("model", None) or {}, f"{args.config}: model"))
        model_where = f"{args.config} model / --opt"
        unknown = sorted(set(loaded) - set(RUN_DEFAULTS), key=str)
        if unknown:
            raise ValueError(f"{args.config}: unknown setting(s) {unknown}; "
                             f"known: {sorted(RUN_DEFAULTS)} and 'model'")  # fmt: skip
        run.update(loaded)
        origin.update({k: str(args.config) for k in loaded})
    for key in RUN_DEFAULTS:
        value = getattr(args, key, None)
        if value is not None:
            run[key] = value
            origin.pop(key, None)
    if run["storage_options"] is None:
        run["storage_options"] = {}
    if args.storage_option:
        if not isinstance(run["storage_options"], dict):
            raise ValueError(f"{args.config}: storage_options must be a mapping")
        run["storage_options"] = merge(run["storage_options"], storage_options(args.storage_option))
    args.secret_options = run["storage_options"]  # for the CLI to scrub from error lines
    if run["scheduler_address"] is None:
        run["scheduler_address"] = os.environ.get("DASK_SCHEDULER_ADDRESS")
    for flag in ("hidden", "lr", "hash_family", "K", "L"):
        if getattr(args, flag, None) is not None:
            model[flag] = getattr(args, flag)
    model.update(dict(args.opt))
    check_model(model, model_where)
    check_run(run, origin)
    if "seed" in model:  # one seed drives the model and the data order
        if (args.seed is not None or "seed" in origin) and model["seed"] != run["seed"]:
            raise ValueError(f"the seed is given twice ({model_where} seed={model['seed']!r}, "
                             f"--seed {run['seed']}): give it once")  # fmt: skip
        run["seed"] = model["seed"]
        check_run(run, origin)
    model["seed"] = run["seed"]
    if args.log_every < 0:
        raise ValueError(f"--log-every must be >= 0, got {args.log_every}")
    if bool(run["train"]) == bool(run["preset"]):
        raise ValueError("give exactly one of --train URL or --preset NAME")
    if run["preset"] and run["test"]:
        raise ValueError("--test goes with --train, not with --preset")
    if run["performance_report"] and run["in_process"]:
        raise ValueError("--performance-report needs a Dask cluster (not --in-process)")
    return run, model


def _resumed(args: argparse.Namespace, run: dict) -> tuple[dict[str, Any], dict[str, Any]]:
    """Settings of a resumed run: the run folder's, with the flags of RESUMABLE."""
    from dslide_workflows.run_folder import RunFolder
    from dslide_workflows.secrets import merge, unmasked
    from dslide_workflows.settings import check_model, check_run

    options = storage_options(args.storage_option)
    args.secret_options = options
    folder = RunFolder(args.resume, options)
    saved = folder.read_config()
    where = folder.child_url("config.yaml")
    model = check_model(saved.pop("model", {}), f"{where}: model")
    run.update({k: v for k, v in saved.items() if k in RUN_DEFAULTS})
    asked = {k for k in RUN_DEFAULTS if getattr(args, k, None) is not None}
    if (
        args.config
        or args.opt
        or any(
            getattr(args, f, None) is not None for f in ("hidden", "lr", "hash_family", "K", "L")
        )
    ):
        raise ValueError("--resume takes the model from the checkpoint: no --config, "
                         "--opt or model flags")  # fmt: skip
    fixed = sorted(asked - RESUMABLE)
    if fixed:
        flags = ", ".join("--" + k.replace("_", "-") for k in fixed)
        raise ValueError(f"--resume keeps the run's data and batches: {flags} cannot change")
    for key in asked:
        run[key] = getattr(args, key)
    kept = saved.get("storage_options") or {}
    if not isinstance(kept, dict):
        raise ValueError(f"{where}: storage_options must be a mapping, got {kept!r}")
    kept = unmasked(kept)
    run["storage_options"] = merge(kept, options)  # secrets were never written: pass them again
    run["run_dir"] = args.resume
    if "scheduler_address" not in asked:  # the old run's cluster is likely gone
        run["scheduler_address"] = os.environ.get("DASK_SCHEDULER_ADDRESS")
    check_run(run, {k: where for k in saved if k not in asked})
    if "performance_report" not in asked and run["performance_report"]:
        run["performance_report"] = folder.own_file(run["performance_report"], where)
    return run, model


def cmd_train(args: argparse.Namespace) -> int:
    from dslide_dask import SlideConfig
    from dslide_dask.local_trainer import position_meta
    from dslide_workflows.secrets import mask

    run, model = resolve(args)
    cfg = SlideConfig.from_dict({k: tuple(v) if k == "hidden" else v for k, v in model.items()})
    # everything is read and checked before the run folder is written or a cluster started
    folder = _run_folder(run, resume=bool(args.resume))
    restore = _restore_point(folder, run) if args.resume else None
    train, test, shape = _data(run)
    # the lr schedule spans the whole run (a resumed run keeps the one it started with)
    epoch_steps = -(-train.n_points // run["batch_size"])
    cfg = cfg.for_data(shape[1], run["epochs"] * epoch_steps, epoch_steps)
    _check_memory(run, cfg, shape)
    epoch, batch = _position(restore)
    if epoch >= run["epochs"]:
        raise ValueError(f"{folder.url} already trained {epoch} of --epochs {run['epochs']}: "
                         "ask for more --epochs to carry on")  # fmt: skip
    settings = {**run, "model": cfg.to_dict()}
    print(
        "settings:",
        yaml.safe_dump(mask(settings), sort_keys=False, default_flow_style=None)
        .strip()
        .replace("\n", "\n  "),
    )
    with _cluster(run) as client:
        t0 = time.perf_counter()
        trainer = _trainer(run, cfg, shape, client, folder, restore)
        setup = time.perf_counter() - t0
        folder.write_config(settings)  # once the checkpoint to resume from has loaded
        print(f"run folder: {folder.url}"
              + (f" (resuming at step {restore.step})" if restore else ""))  # fmt: skip
        report = _report(run, client)
        with trainer, report:
            progress = Progress(run, trainer, test, args.no_progress or args.log_every > 0,
                                args.log_every, folder)  # fmt: skip
            t1 = time.perf_counter()
            try:
                trainer.train(
                    train, run["batch_size"], run["epochs"] - epoch, run["seed"],
                    callback=progress, storage_options=run["storage_options"],
                    skip_bad_lines=run["skip_bad_lines"], first_epoch=epoch, first_batch=batch,
                )  # fmt: skip
            finally:
                progress.close()
                folder.flush()
            seconds = time.perf_counter() - t1
            done = position_meta(run["epochs"], 0, run["batch_size"], run["seed"], True)
            model_url = trainer.save(folder.child_url("model"), run["storage_options"], done)
            scores = None
            if test is not None:
                scores = trainer.evaluate(test, max_points=run["eval_points"],
                                          storage_options=run["storage_options"])  # fmt: skip
            shards = trainer.shard_info() if client is not None else []
        recoveries = getattr(trainer, "recoveries", [])
        text, numbers = summary(trainer.history, seconds, setup, shape, cfg, shards, scores,
                                progress.evaluations, recoveries)  # fmt: skip
        print(text)
        if scores is not None:
            progress.record_eval(scores)
    _finish(folder, text, numbers, model_url)
    return 0


def _run_folder(run: dict, resume: bool):
    """The run's folder: given, or a new one under runs/; never someone else's run (a
    folder that a failed run left without a checkpoint or model may be used again)."""
    from dslide_workflows.run_folder import RunFolder

    if run["run_dir"] is None:
        data = run["preset"] or Path(str(run["train"]).rstrip("/")).name.split(".")[0]
        name = os.path.join("runs", time.strftime("%Y%m%d-%H%M%S-") + data)
        taken = 1
        while RunFolder(name + (f"-{taken}" if taken > 1 else "")).exists():
            taken += 1
        run["run_dir"] = name + (f"-{taken}" if taken > 1 else "")
    folder = RunFolder(run["run_dir"], run["storage_options"])
    if not resume and folder.exists() and folder.resumable():
        raise ValueError(f"{folder.url} already holds a run: --resume {folder.url} to carry "
                         "it on, or choose another --run-dir")  # fmt: skip
    return folder


def _check_memory(run: dict, cfg, shape: tuple[int, int]) -> None:
    """A model sized by the data's header must fit this machine when it is built here (in
    process or on a LocalCluster), before anything is allocated."""
    from dslide_dask.memory import check_memory, model_bytes

    if run["in_process"] or not run["scheduler_address"]:
        what = f"a model of {shape[0]:,} features and {shape[1]:,} labels (hidden {cfg.hidden})"
        check_memory(model_bytes(cfg.hidden, *shape), what)


def _restore_point(folder, run: dict):
    """The newest of a run folder's latest checkpoint and final model; its metrics are
    cut back to it."""
    from dslide_dask.checkpoint import CheckpointError, CheckpointStore

    found = [
        CheckpointStore(folder.child_url(name), run["storage_options"]).latest()
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


def _finish(folder, text: str, numbers: dict, model_url: str) -> None:
    from dslide_workflows.report import plot_curves

    folder.write_plot(plot_curves(folder.records, folder.url))
    folder.write_summary({**numbers, "model": model_url}, text)
    print(f"model: {model_url}\ncurves: {folder.child_url('curves.png')}")


def _data(run: dict):
    """Training source, test data (read and checked now, cut to --eval-points) and
    (n_features, n_labels)."""
    from dslide_dask.data import synthetic
    from dslide_dask.data.batches import plan, shape
    from dslide_dask.data.inputs import check_fits
    from dslide_dask.data.source import open_source, read_dataset

    if run["preset"]:
        train, test = synthetic.make_synthetic(run["preset"], seed=run["seed"])
        return train, test.slice(0, run["eval_points"]), shape(train)
    # headers only: the training data itself is read by the workers
    train = plan(run["train"], run["storage_options"])
    test = None
    if run["test"]:
        so = run["storage_options"]
        check_fits(open_source(run["test"], so), *shape(train), what=run["test"])
        test, skipped = read_dataset(run["test"], so, skip_bad_lines=run["skip_bad_lines"])
        if skipped:
            print(f"test data: {skipped} bad line(s) skipped in {run['test']}")
        if len(test) == 0:
            raise ValueError(f"{run['test']}: no points to evaluate on")
        test = test.slice(0, run["eval_points"])
    if train.n_points == 0:
        raise ValueError(f"{run['train']}: no points to train on (the header says 0)")
    return train, test, shape(train)


@contextlib.contextmanager
def _cluster(run: dict):
    """None (in process), a client of the given scheduler, or of a new LocalCluster."""
    if run["in_process"]:
        yield None
        return
    from distributed import Client, LocalCluster

    if run["scheduler_address"]:
        with Client(run["scheduler_address"]) as client:
            print(f"cluster: {run['scheduler_address']}, dashboard {client.dashboard_link}")
            if run["workers"]:  # shards go to the workers there are when training starts
                print(f"waiting for {run['workers']} workers...", flush=True)
                client.wait_for_workers(run["workers"], timeout=WAIT_WORKERS_SECONDS)
            yield client
        return
    n = run["workers"] or os.cpu_count() or 1
    with (
        LocalCluster(n_workers=n, threads_per_worker=run["threads_per_worker"],
                     processes=True) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        print(f"cluster: LocalCluster of {n} worker processes, dashboard {client.dashboard_link}")
        yield client


def _trainer(run: dict, cfg, shape: tuple[int, int], client, folder, restore):
    from dslide_dask.checkpoint import CheckpointPolicy
    from dslide_dask.distributed import DistributedTrainer
    from dslide_dask.local_trainer import LocalTrainer

    policy = None
    if run["checkpoint_every"] or run["checkpoint_minutes"]:
        policy = CheckpointPolicy(
            folder.child_url("checkpoints"), run["checkpoint_every"],
            60 * run["checkpoint_minutes"], run["keep_checkpoints"], run["storage_options"],
        )  # fmt: skip
    if client is None:
        if run["threads"]:
            import numba

            numba.set_num_threads(run["threads"])
        return LocalTrainer(cfg, *shape, checkpoint=policy, restore=restore)
    return DistributedTrainer(
        client, cfg, *shape, n_shards=run["n_shards"], wire_dtype=run["wire_dtype"],
        pipeline=run["pipeline"], checkpoint=policy,
        restore=restore.url if restore is not None else None,
        storage_options=run["storage_options"], name=Path(folder.url).name,
    )  # fmt: skip


def _report(run: dict, client):
    if run["performance_report"] and client is not None:
        from distributed import performance_report

        return performance_report(filename=run["performance_report"])
    if run["performance_report"]:
        raise ValueError("--performance-report needs a Dask cluster (not --in-process)")
    return contextlib.nullcontext()


class Progress:
    """A progress bar over steps, with periodic evaluation on the test set."""

    def __init__(
        self, run: dict, trainer, test, quiet: bool, log_every: int = 0, folder=None
    ) -> None:
        self.folder = folder
        self.log_every = log_every
        self.quiet = quiet
        self.run = run
        self.trainer = trainer
        self.test = test
        self.evaluations: list[dict] = []
        self.bar = None
        self.samples = 0
        self.t0 = time.perf_counter()

    def __call__(self, stats: dict) -> None:
        if self.bar is None:  # made at the first step: an early error leaves no bar behind
            from tqdm.auto import tqdm

            self.bar = tqdm(unit="step", disable=self.quiet, dynamic_ncols=True)
        if self.folder is not None:
            self.folder.add("step", stats)
        self.samples += stats["samples"]
        rate = self.samples / (time.perf_counter() - self.t0)
        self.bar.update(1)
        self.bar.set_postfix(loss=f"{stats['loss']:.3f}", samples_s=f"{rate:.0f}",
                             refresh=False)  # fmt: skip
        if self.log_every and stats["step"] % self.log_every == 0:
            print(f"  step {stats['step']:>6}  samples {self.samples:>9}  "
                  f"loss {stats['loss']:8.4f}  active/example {stats['active']:8.1f}  "
                  f"{rate:8.0f} samples/s", flush=True)  # fmt: skip
        every = self.run["eval_every"]
        if every and self.test is not None and stats["step"] % every == 0:
            scores = self.trainer.evaluate(
                self.test, max_points=self.run["eval_points"],
                storage_options=self.run["storage_options"],
            )  # fmt: skip
            self.record_eval(scores)
            self.bar.write(f"step {stats['step']}: " + _scores(scores))

    def record_eval(self, scores: dict) -> None:
        """Keep P@k at the current step (once a step)."""
        step = self.trainer.step
        if self.evaluations and self.evaluations[-1]["step"] == step:
            return
        self.evaluations.append({"step": step, **scores})
        if self.folder is not None:
            self.folder.add("eval", {"step": step, **scores})

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _scores(scores: dict) -> str:
    return "  ".join(f"{k} {v:.4f}" for k, v in scores.items())


def summary(
    history, seconds, setup, shape, cfg, shards, scores, evaluations, recoveries=()
) -> tuple[str, dict]:
    """The run summary, as printed and as numbers: speed, traffic, sparsity, quality."""
    n_features, n_labels = shape
    samples = sum(h["samples"] for h in history)
    steps = len(history)
    numbers: dict[str, Any] = {
        "steps": steps,
        "last_step": history[-1]["step"] if history else None,
        "samples": samples,
        "samples_per_second": samples / max(seconds, 1e-9),
        "train_seconds": seconds,
        "setup_seconds": setup,
        "skipped_lines": history[-1].get("skipped_lines", 0) if history else 0,
        "active_per_example": sum(h["active"] for h in history) / max(1, steps),
        "n_features": n_features,
        "n_labels": n_labels,
        "evaluations": list(evaluations),
        "test": scores,
        "recoveries": [{**vars(r), "redone": r.redone} for r in recoveries],
    }
    lines = ["run summary"]
    skipped = numbers["skipped_lines"]
    lines.append(f"  samples         {samples:,} in {steps:,} steps"
                 + (f"; {skipped:,} bad lines skipped" if skipped else ""))  # fmt: skip
    lines.append(f"  samples/s       {numbers['samples_per_second']:,.0f} "
                 f"(training {seconds:.1f} s, setup {setup:.1f} s)")  # fmt: skip
    active = numbers["active_per_example"]
    lines.append(f"  active/example  {active:,.0f} of {n_labels:,} labels "
                 f"({100 * active / n_labels:.2f}%)")  # fmt: skip
    if shards:
        sizes = " / ".join(f"{s['neurons']:,}" for s in shards)
        busy = " / ".join(f"{1e3 * s['busy_seconds'] / max(1, steps):.0f}" for s in shards)
        lines.append(f"  shards          {len(shards)}: neurons {sizes}; busy ms/step {busy}")
        traffic = sum(h["bytes_sent"] + h["bytes_received"] for h in history) / max(1, steps)
        allreduce = cfg.allreduce_bytes(n_features, n_labels)
        numbers.update(shards=len(shards), bytes_per_step=traffic, allreduce_bytes=allreduce)
        lines.append(f"  bytes/step      {traffic / 1e3:,.0f} KB sent+received "
                     f"({100 * traffic / allreduce:.3f}% of a {allreduce / 1e6:,.0f} MB "
                     f"data-parallel all-reduce)")  # fmt: skip
    for r in recoveries:
        lines.append(f"  recovered       lost {r.lost} at step {r.at_step}; back to step "
                     f"{r.restored_step} on {r.workers} workers, {r.redone} steps redone "
                     f"({r.seconds:.1f} s)")  # fmt: skip
    for ev in evaluations:
        lines.append(f"  eval step {ev['step']:<5} " + _scores(
            {k: v for k, v in ev.items() if k != "step"}))  # fmt: skip
    if scores is not None:
        lines.append("  test            " + _scores(scores))
    return "\n".join(lines), numbers
