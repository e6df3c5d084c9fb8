"""Settings files read safely: YAML as plain data (no anchors, no aliases, one line per
error), byte counts such as ``2GiB``, and the model parameters of a config file checked
by the model's own schema, naming the file.

What each run setting may be is :mod:`dslide_workflows.run_schema`'s.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Any

import yaml

#: The largest config file read (a config of every setting is a few kB).
MAX_CONFIG_BYTES = 1 << 20


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
    """The model parameters, checked by the model's own schema (``SlideConfig``, whose
    fields the estimator's parameters are) before anything starts, with ``where`` they
    came from in the error."""
    from dslide_dask.model.config import SlideConfig

    if not isinstance(model, dict):
        raise ValueError(f"{where}: model must be a mapping of parameters, got {model!r}")
    from dslide_dask.model.fused_build import FUSION_DEFAULTS, recipe_from

    if unknown := sorted(set(model) - set(model_parameters()), key=str):
        raise ValueError(f"{where}: {unknown_parameters(unknown)}")
    try:
        SlideConfig.from_dict({k: v for k, v in model.items() if k not in FUSION_DEFAULTS})
        recipe_from({k: v for k, v in model.items() if k in FUSION_DEFAULTS})
    except (ValueError, TypeError) as err:
        raise ValueError(f"{where}: {err}") from None
    return model


def model_parameters() -> list[str]:
    """The names a config's ``model`` or ``--opt`` may set: the network's schema's fields
    and the fused parts' parameters (``neighbours``, ``label_tree``...)."""
    from dataclasses import fields

    from dslide_dask.model.config import SlideConfig
    from dslide_dask.model.fused_build import FUSION_DEFAULTS

    return sorted([*(f.name for f in fields(SlideConfig)), *FUSION_DEFAULTS])


def unknown_parameters(unknown: list) -> str:
    """``unknown parameter(s) ['x'] (did you mean 'y'?)``: the misspelt names with their
    closest known ones, whole (all of them would not fit the one error line: they are in
    ``dslide train --help``, under --opt)."""
    import difflib

    known = model_parameters()
    names = [str(name)[:60] for name in unknown[:5]]
    hints = []
    for name in names:
        if close := difflib.get_close_matches(name, known, n=3, cutoff=0.6):
            guess = " or ".join(repr(c) for c in close)
            hints.append(f"did you mean {guess}?" if len(names) == 1 else f"{name!r}: {guess}?")
    hint = f" ({'; '.join(hints)})" if hints else ""
    return f"unknown parameter(s) {names}{hint}; every known one: dslide train --help (--opt)"


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


def read_config(path: str) -> bytes:
    """The bytes of the config file ``path``, at most :data:`MAX_CONFIG_BYTES`: a FIFO,
    a device (``/dev/zero`` would be read without end) or a longer file is refused,
    naming it, before any of it is parsed."""
    # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):  # as for any read: "PATH: is a directory"
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(mode):
            raise ValueError(f"--config {path}: not a regular file (a FIFO or device?)")
        with os.fdopen(os.dup(fd), "rb") as f:
            raw = f.read(MAX_CONFIG_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_CONFIG_BYTES:
        raise ValueError(
            f"--config {path}: more than {MAX_CONFIG_BYTES:,} bytes, too big for a config file"
        )
    return raw
