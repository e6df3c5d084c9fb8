"""The one schema of a ``dslide train`` run's settings: :class:`RunSettings`.

Each field says once what a setting is: its type and allowed range, its default, its
flag and help, and whether a resumed run may change it. The rest derives from it: the
flags of ``dslide train`` and ``dslide plan`` (:func:`add_setting_flags`, also used by
the commands that share the cluster flags), the keys a ``--config`` YAML file and a run
folder's ``config.yaml`` may hold (:data:`RUN_DEFAULTS`), the checks that name a bad
value with where it came from (:func:`check_run`), and what ``--resume`` accepts
(:data:`RESUMABLE`). The model's parameters are ``SlideClassifier``'s, not these.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from dslide_workflows.args import byte_size, positive_int

#: Where the CLI's LocalCluster serves its dashboard unless told otherwise: loopback only.
LOCAL_DASHBOARD = "127.0.0.1:8787"
#: Seconds to reach a scheduler (connect, handshake, first reply) unless told otherwise:
#: Dask's 30 s, less the start-up, so a command at a dead address ends within 30 s.
CONNECT_TIMEOUT = 15.0
#: The certificate settings, which go together.
TLS_FILES = ("tls_ca_file", "tls_cert", "tls_key")

_I = 1 << 62
#: How a flag's text becomes a setting of each kind (bools are switches, mappings
#: come from ``--storage-option``).
_FLAG_TYPES: dict[str, Callable[[str], Any]] = {
    "int": int,
    "float": float,
    "str": str,
    "bytes": byte_size,
    "choice": str,
}


@dataclass(frozen=True)
class Setting:
    """What one run setting may be, and its flag.

    ``section`` groups the flags (``data``, ``cluster``, ``security``, ``training``,
    ``run``); None: the flag is not a setting's own (``storage_options`` comes from the
    repeatable ``--storage-option K=V`` of :func:`dslide_workflows.args.add_storage_arguments`).
    A setting whose default is None may be left unset. A bool's flag switches it on, or off
    when ``flag`` starts with ``--no-``.
    """

    kind: str
    section: str | None
    help: str | None = None
    low: float = -math.inf
    high: float = math.inf
    choices: tuple[str, ...] = ()
    metavar: str | None = None
    flag: str | None = None  #: None: ``--`` and the name with dashes
    parse: Callable[[str], Any] | None = None  #: the flag's text to a value (None: by kind)
    resumable: bool = True  #: a resumed run may change it

    def problem(self, value: Any) -> str | None:
        """What ``value`` must be, if it is not allowed (None: it is)."""
        kind, low, high = self.kind, self.low, self.high
        if kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
            return None if ok else f"an integer in [{low}, {high}]"
        if kind == "float":
            ok = (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and math.isfinite(value)
                and low <= value <= high
            )
            return None if ok else f"a number in [{low:g}, {high:g}]"
        if kind == "bool":
            return None if isinstance(value, bool) else "true or false"
        if kind == "str":
            return None if isinstance(value, str) and value.strip() else "a non-empty text (a URL)"
        if kind == "dict":
            return None if isinstance(value, dict) else "a mapping of options"
        if kind == "bytes":
            from dslide_workflows.settings import byte_count

            n = byte_count(value)
            ok = n is not None and low <= n <= high
            return None if ok else f"a number of bytes (e.g. 500000000 or 2GiB) in [{low}, {high}]"
        if kind == "choice":
            return None if value in self.choices else f"one of {list(self.choices)}"
        raise AssertionError(kind)  # pragma: no cover


def _setting(default: Any, kind: str, section: str | None, help: str | None = None, **spec) -> Any:
    """A field of :class:`RunSettings` with its :class:`Setting` (a dict default is copied)."""
    meta = {"setting": Setting(kind, section, help, **spec)}
    if isinstance(default, dict):
        return field(default_factory=dict, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class RunSettings:
    """How one ``dslide train`` run reads its data, where it runs and what it keeps."""

    # -- data ---------------------------------------------------------------------------
    train: str | None = _setting(
        None, "str", "data", "training data (XC text format)", metavar="URL", resumable=False
    )
    test: str | None = _setting(
        None, "str", "data", "test data, for evaluation", metavar="URL", resumable=False
    )
    preset: str | None = _setting(
        None, "str", "data", "generate this synthetic preset in memory instead", resumable=False
    )
    skip_bad_lines: bool = _setting(
        False, "bool", "data", "drop malformed lines and count them, instead of stopping"
    )
    max_decompressed: int | str | None = _setting(
        None,
        "bytes",
        "data",
        "refuse a compressed file that decompresses to more, e.g. 2GiB "
        "(default: a quarter of the reader's free memory)",
        low=1,
        high=_I,
        metavar="BYTES",
    )
    storage_options: dict = _setting({}, "dict", None)
    # -- cluster ------------------------------------------------------------------------
    scheduler_address: str | None = _setting(
        None, "str", "cluster", "connect to this scheduler", metavar="ADDR"
    )
    tls: bool = _setting(
        False, "bool", "security", "the LocalCluster talks TLS with throwaway certificates"
    )
    tls_ca_file: str | None = _setting(
        None, "str", "security", "CA certificate(s) of the cluster", metavar="PEM"
    )
    tls_cert: str | None = _setting(
        None, "str", "security", "this client's certificate", metavar="PEM"
    )
    tls_key: str | None = _setting(
        None, "str", "security", "this client's private key", metavar="PEM"
    )
    dashboard_address: str | None = _setting(
        None,
        "str",
        "security",
        f"the LocalCluster's dashboard (default: {LOCAL_DASHBOARD}, this machine only; "
        "':8787' for every interface)",
        metavar="HOST:PORT",
    )
    connect_timeout: float | None = _setting(
        None,
        "float",
        "security",
        f"give up reaching --scheduler-address after this long (default: {CONNECT_TIMEOUT:g})",
        low=0.001,
        high=86400.0,
        metavar="SECONDS",
    )
    workers: int | None = _setting(
        None,
        "int",
        "cluster",
        "LocalCluster workers (default: cores); with a scheduler address, "
        "wait until N workers have joined",
        low=1,
        high=1 << 16,
        metavar="N",
    )
    threads_per_worker: int = _setting(
        1, "int", "cluster", "(default: 1)", low=1, high=1 << 12, metavar="T"
    )
    in_process: bool = _setting(False, "bool", "cluster", "no Dask at all")
    n_shards: int | None = _setting(
        None, "int", "cluster", "(default: one per worker)", low=1, high=1 << 16, metavar="S"
    )
    hidden_shards: int | None = _setting(
        None,
        "int",
        "cluster",
        "split the hidden layer's units over the first S workers (default: "
        "only when it would crowd the coordinator's worker)",
        low=1,
        high=1 << 16,
        metavar="S",
    )
    wire_dtype: str = _setting(
        "float16", "choice", "cluster", "(default: float16)", choices=("float16", "float32")
    )
    pipeline: bool = _setting(
        True,
        "bool",
        "cluster",
        "one phase at a time, no stale hidden activations",
        flag="--no-pipeline",
    )
    step_mode: str = _setting(
        "actor",
        "choice",
        "cluster",
        "graph: each step as tasks named by phase (hash, gather, softmax, scatter) for the "
        "dashboard and --performance-report; slower (default: actor)",
        choices=("actor", "graph"),
    )
    # -- training -----------------------------------------------------------------------
    epochs: int = _setting(
        1, "int", "training", "(default: 1)", low=1, high=1 << 20, metavar="N", parse=positive_int
    )
    batch_size: int = _setting(
        256,
        "int",
        "training",
        "examples a step (default: 256)",
        low=1,
        high=1 << 20,
        metavar="N",
        parse=positive_int,
        resumable=False,
    )

    threads: int | None = _setting(
        None,
        "int",
        "training",
        "numba threads with --in-process (default: cores)",
        low=1,
        high=1 << 12,
        metavar="T",
        parse=positive_int,
    )
    eval_every: int = _setting(
        0, "int", "training", "(default: 0, at the end)", low=0, high=_I, metavar="STEPS"
    )
    eval_points: int = _setting(
        2000,
        "int",
        "training",
        "test rows, spread over the file (default: 2000)",
        low=1,
        high=_I,
        metavar="N",
    )
    seed: int = _setting(
        0,
        "int",
        "training",
        "drives the model's initialisation and the data's order (default: 0)",
        low=0,
        high=(1 << 63) - 1,
        resumable=False,
    )
    performance_report: str | None = _setting(
        None, "str", "training", "Dask performance report", metavar="HTML"
    )
    # -- run folder and checkpoints -----------------------------------------------------
    run_dir: str | None = _setting(
        None,
        "str",
        "run",
        "where config, metrics, curves, checkpoints and the model go "
        "(default: runs/DATE-TIME-DATA)",
        metavar="URL",
        resumable=False,
    )
    checkpoint_every: int = _setting(
        0,
        "int",
        "run",
        "checkpoint every STEPS steps (default: 0, off)",
        low=0,
        high=_I,
        metavar="STEPS",
    )
    checkpoint_minutes: float = _setting(
        0.0,
        "float",
        "run",
        "checkpoint every MIN minutes (default: 0, off)",
        low=0.0,
        high=1e9,
        metavar="MIN",
    )
    keep_checkpoints: int = _setting(
        3,
        "int",
        "run",
        "newest checkpoints kept (default: 3; 0: all)",
        low=0,
        high=1 << 20,
        metavar="N",
    )

    def to_dict(self) -> dict[str, Any]:
        """The settings as the run folder's config.yaml holds them."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: Each setting's :class:`Setting`, in the schema's order.
SCHEMA: dict[str, Setting] = {f.name: f.metadata["setting"] for f in fields(RunSettings)}
#: The defaults, by name: also the keys a config file may hold (besides ``model``).
RUN_DEFAULTS: dict[str, Any] = RunSettings().to_dict()
#: Settings a resumed run may change (where and how it runs, and for how long).
RESUMABLE = frozenset(name for name, s in SCHEMA.items() if s.resumable)


def flag(name: str) -> str:
    """The flag of a setting: ``--name-with-dashes``, or its own (``--no-pipeline``)."""
    return SCHEMA[name].flag or "--" + name.replace("_", "-")


def check_run(run: dict[str, Any], origin: dict[str, str]) -> None:
    """Raise ValueError for the first setting of ``run`` that is not allowed;
    ``origin[key]`` says where a value came from (e.g. ``"run.yaml"``; flags otherwise)."""
    for key, spec in SCHEMA.items():
        value = run[key]
        if value is None and RUN_DEFAULTS[key] is None:
            continue
        where = origin.get(key)
        name = f"{where}: {key}" if where else flag(key)
        problem = spec.problem(value)
        if problem:
            raise ValueError(f"{name} must be {problem}, got {value!r}")


def add_setting_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    section: str | None = None,
    names: tuple[str, ...] = (),
) -> None:
    """The flags of the settings of ``section`` (or those ``names``), in the schema's
    order. Each flag's default is None, so a flag not given leaves a config file's value
    (or a resumed run's) alone."""
    for name, spec in SCHEMA.items():
        if spec.section is None or not (spec.section == section or name in names):
            continue
        if spec.kind == "bool":
            off = (spec.flag or "").startswith("--no-")
            action = "store_false" if off else "store_true"
            parser.add_argument(flag(name), dest=name, action=action, default=None, help=spec.help)
            continue
        parser.add_argument(
            flag(name),
            dest=name,
            type=spec.parse or _FLAG_TYPES[spec.kind],
            choices=spec.choices or None,
            metavar=spec.metavar,
            help=spec.help,
        )
