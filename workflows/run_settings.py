"""The settings of a ``dslide train`` run: defaults, a config file and flags merged and
checked, or a resumed run's saved settings with the flags it may change. What each setting
may be is the schema's (:mod:`dslide_workflows.run_schema`)."""

from __future__ import annotations

import argparse
import os
from typing import Any

from dslide_workflows.args import storage_options
from dslide_workflows.run_flags import MODEL_FLAGS
from dslide_workflows.run_schema import RESUMABLE, RUN_DEFAULTS, RunSettings, check_run, flag


def resolve(args: argparse.Namespace) -> tuple[RunSettings, dict[str, Any]]:
    """Run settings and model parameters from defaults < config file < flags, all checked
    (:func:`~dslide_workflows.run_schema.check_run`, the model by ``SlideConfig``) before
    anything starts."""
    from dslide_workflows.secrets import merge
    from dslide_workflows.settings import check_model, parse_yaml, read_config

    run = dict(RUN_DEFAULTS)
    model: dict[str, Any] = {}
    origin: dict[str, str] = {}
    if getattr(args, "resume", None):
        return _resumed(args, run)
    model_where = "--opt"
    if args.config:
        loaded = parse_yaml(read_config(str(args.config)), str(args.config))
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
    for name in MODEL_FLAGS:
        if getattr(args, name, None) is not None:
            model[name] = getattr(args, name)
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
    from dslide_workflows.settings import check_model

    options = storage_options(args.storage_option)
    args.secret_options = options
    folder = RunFolder(args.resume, options)
    saved = folder.read_config()
    where = folder.child_url("config.yaml")
    model = check_model(saved.pop("model", {}), f"{where}: model")
    run.update({k: v for k, v in saved.items() if k in RUN_DEFAULTS})
    asked = {k for k in RUN_DEFAULTS if getattr(args, k, None) is not None}
    if args.config or args.opt or any(getattr(args, f, None) is not None for f in MODEL_FLAGS):
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
        flags = ", ".join(flag(k) for k in fixed)
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
