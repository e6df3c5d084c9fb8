"""Every run setting checked, whatever it came from, before anything starts.

Settings come from defaults, a ``--config`` YAML file (any types a careless hand types:
``workers: abc``, ``epochs: two``, ``model: [1, 2]``) and flags; a resumed run's come
from its ``config.yaml``. :func:`check_run` and :func:`check_model` give one line naming
the setting, where it came from and what it may be, before a cluster is started or a
file is written.
"""

from __future__ import annotations

import math
from typing import Any

import yaml

_I = 1 << 62
#: setting -> (kind, low, high, may be None); kinds: int, float, bool, str, dict, choice
RUN_SCHEMA: dict[str, tuple] = {
    "train": ("str", None, None, True),
    "test": ("str", None, None, True),
    "preset": ("str", None, None, True),
    "storage_options": ("dict", None, None, False),
    "scheduler_address": ("str", None, None, True),
    "tls": ("bool", None, None, False),
    "tls_ca_file": ("str", None, None, True),
    "tls_cert": ("str", None, None, True),
    "tls_key": ("str", None, None, True),
    "dashboard_address": ("str", None, None, True),
    "connect_timeout": ("float", 0.001, 86400.0, True),
    "workers": ("int", 1, 1 << 16, True),
    "threads_per_worker": ("int", 1, 1 << 12, False),
    "in_process": ("bool", None, None, False),
    "n_shards": ("int", 1, 1 << 16, True),
    "hidden_shards": ("int", 1, 1 << 16, True),
    "wire_dtype": ("choice", ("float16", "float32"), None, False),
    "pipeline": ("bool", None, None, False),
    "step_mode": ("choice", ("actor", "graph"), None, False),
    "epochs": ("int", 1, 1 << 20, False),
    "batch_size": ("int", 1, 1 << 20, False),
    "eval_every": ("int", 0, _I, False),
    "eval_points": ("int", 1, _I, False),
    "performance_report": ("str", None, None, True),
    "seed": ("int", 0, (1 << 63) - 1, False),
    "threads": ("int", 1, 1 << 12, True),
    "skip_bad_lines": ("bool", None, None, False),
    "max_decompressed": ("bytes", 1, _I, True),
    "run_dir": ("str", None, None, True),
    "checkpoint_every": ("int", 0, _I, False),
    "checkpoint_minutes": ("float", 0.0, 1e9, False),
    "keep_checkpoints": ("int", 0, 1 << 20, False),
}


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def check_run(run: dict[str, Any], origin: dict[str, str]) -> None:
    """Raise ValueError for the first setting of ``run`` that is not allowed;
    ``origin[key]`` says where a value came from (e.g. ``"run.yaml"``; flags otherwise)."""
    for key, (kind, low, high, optional) in RUN_SCHEMA.items():
        value = run[key]
        if value is None and optional:
            continue
        where = origin.get(key)
        name = f"{where}: {key}" if where else flag(key)
        problem = _problem(kind, value, low, high)
        if problem:
            raise ValueError(f"{name} must be {problem}, got {value!r}")


def _problem(kind: str, value: Any, low, high) -> str | None:
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
        ok = byte_count(value) is not None and low <= byte_count(value) <= high
        return None if ok else f"a number of bytes (e.g. 500000000 or 2GiB) in [{low}, {high}]"
    if kind == "choice":
        return None if value in low else f"one of {list(low)}"
    raise AssertionError(kind)  # pragma: no cover


def byte_count(value: Any) -> int | None:
    """Bytes from an integer or a text such as ``2GiB`` or ``500MB`` (None: neither)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        from dask.utils import parse_bytes

        try:
            return int(parse_bytes(value))
        except (ValueError, TypeError, OverflowError):
            return None
    return None


def check_model(model: Any, where: str) -> dict[str, Any]:
    """The model parameters, with the type mistakes SlideConfig would let through (it
    truncates ``hidden: [1.9]`` to 1) refused."""
    if not isinstance(model, dict):
        raise ValueError(f"{where}: model must be a mapping of parameters, got {model!r}")
    hidden = model.get("hidden", [128])
    widths = hidden if isinstance(hidden, list | tuple) else [hidden]
    if not widths or not all(isinstance(w, int) and not isinstance(w, bool) for w in widths):
        raise ValueError(
            f"{where}: hidden must be a width or a list of widths (positive integers), "
            f"got {hidden!r}"
        )
    return model


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader without anchors and aliases: a few lines of ``&a``/``*a`` nested nine
    deep stand for billions of nodes, which masking and saving the settings would expand
    (a "billion laughs"); settings never need them."""

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise yaml.composer.ComposerError(
                None,
                None,
                "anchors and aliases (&name, *name) are not allowed",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def load_yaml(text: str) -> Any:
    """``text`` as YAML: plain data only (SafeLoader), no anchors or aliases."""
    return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 (a SafeLoader)


def yaml_problem(err: yaml.YAMLError) -> tuple[str, str]:
    """``(":LINE" or "", problem)`` of a YAML error, on one line (PyYAML's text spans
    several, with a caret under the spot)."""
    mark = getattr(err, "problem_mark", None)
    line = f":{mark.line + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return line, " ".join(str(problem).split())


def parse_yaml(raw: bytes, where: str) -> Any:
    """The YAML document in ``raw`` (a file's bytes); a file that is not YAML text is
    named with its line and problem."""
    try:
        return load_yaml(raw.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"{where}: not a YAML text file (byte {err.start} is not UTF-8)") from None
    except yaml.YAMLError as err:
        line, problem = yaml_problem(err)
        raise ValueError(f"{where}{line}: not valid YAML ({problem})") from None
    except RecursionError:
        raise ValueError(f"{where}: not valid YAML (nested too deeply)") from None
