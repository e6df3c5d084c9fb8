"""The settings of a ``dslide train`` run (:class:`RunSettings`): defaults, a config file
and flags merged and checked, or a resumed run's saved settings with the flags it may
change."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from dslide_workflows.args import storage_options


@dataclass(frozen=True)
class RunSettings:
    """How one ``dslide train`` run reads its data, where it runs and what it keeps: the
    flags that may also come from the config file, with their defaults."""

    train: str | None = None
    test: str | None = None
    preset: str | None = None
    storage_options: dict = field(default_factory=dict)
    scheduler_address: str | None = None
    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    dashboard_address: str | None = None
    connect_timeout: float | None = None  #: None: security.CONNECT_TIMEOUT
    workers: int | None = None
    threads_per_worker: int = 1
    in_process: bool = False
    n_shards: int | None = None
    hidden_shards: int | None = None
    wire_dtype: str = "float16"
    pipeline: bool = True
    step_mode: str = "actor"
    epochs: int = 1
    batch_size: int = 256
    eval_every: int = 0
    eval_points: int = 2000
    performance_report: str | None = None
    seed: int = 0
    threads: int | None = None
    skip_bad_lines: bool = False
    max_decompressed: int | str | None = None  #: bytes, or "2GiB"; None: a share of free memory
    run_dir: str | None = None
    checkpoint_every: int = 0
    checkpoint_minutes: float = 0.0
    keep_checkpoints: int = 3

    def to_dict(self) -> dict[str, Any]:
        """The settings as the run folder's config.yaml holds them."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: The defaults, by name.
RUN_DEFAULTS: dict[str, Any] = RunSettings().to_dict()
#: Settings a resumed run may change (where and how it runs, and for how long).
RESUMABLE = frozenset(
    {
        "scheduler_address",
        "tls",
        "tls_ca_file",
        "tls_cert",
        "tls_key",
        "dashboard_address",
        "workers",
        "threads_per_worker",
        "in_process",
        "n_shards",
        "hidden_shards",
        "wire_dtype",
        "pipeline",
        "step_mode",
        "epochs",
        "eval_every",
        "eval_points",
        "threads",
        "performance_report",
        "checkpoint_every",
        "checkpoint_minutes",
        "keep_checkpoints",
        "skip_bad_lines",
        "storage_options",
        "connect_timeout",
        "max_decompressed",
    }
)


def resolve(args: argparse.Namespace) -> tuple[RunSettings, dict[str, Any]]:
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
            raise ValueError(
                f"{args.config}: unknown setting(s) {unknown}; "
                f"known: {sorted(RUN_DEFAULTS)} and 'model'"
            )
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
            raise ValueError(
                f"the seed is given twice ({model_where} seed={model['seed']!r}, "
                f"--seed {run['seed']}): give it once"
            )
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
    return RunSettings(**run), model


def _resumed(args: argparse.Namespace, run: dict) -> tuple[RunSettings, dict[str, Any]]:
    """Settings of a resumed run: the run folder's, with the flags of RESUMABLE."""
    from dslide_workflows.run_folder import RunFolder
    from dslide_workflows.secrets import MASKED, mask_text, merge, unmasked
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
        raise ValueError(
            "--resume takes the model from the checkpoint: no --config, --opt or model flags"
        )
    # a URL saved with a secret masked (a presigned URL) is given again, the same but for it
    again = {
        k
        for k in ("train", "test")
        if k in asked and MASKED in str(saved.get(k)) and mask_text(getattr(args, k)) == saved[k]
    }
    fixed = sorted(asked - RESUMABLE - again)
    for key in ("train", "test"):
        if MASKED in str(saved.get(key)) and key not in again:
            raise ValueError(
                f"{where}: {key} was saved with its secrets masked "
                f"({saved[key]}): give it again, whole, with --{key}"
            )
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
    return RunSettings(**run), model
