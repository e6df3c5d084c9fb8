"""Storage-option secrets: masked wherever settings are shown or written down.

One function decides what is secret (:func:`is_secret_key`) and one walks any nesting of
mappings and lists (:func:`mask`): the settings printed at the start of a run, the run
folder's ``config.yaml`` and summary, and error lines (:func:`scrub`) all go through them,
so ``client_kwargs.aws_secret_access_key`` is hidden as surely as a top-level ``secret``.

Secrets also travel inside values whose names say nothing: a presigned URL
(``?X-Amz-Signature=...``, Azure's ``&sig=...``), a password in a URL (``/`` and all), a
connection string (``AccountKey=...;``). :func:`mask` hides those by their shape, in any
text (:func:`dslide_dask.masking.mask_text`, which the library's own errors use too);
:func:`masked_output` puts everything the CLI prints through it.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

from dslide_dask.masking import (  # noqa: F401 (the names this module has always had)
    MASKED,
    NOT_SECRET,
    SECRET_NAMES,
    SECRET_WORDS,
    is_secret_key,
    mask_text,
)


def mask(value: Any) -> Any:
    """``value`` with every secret-named entry, at any depth, replaced by ``"***"``
    (an unset one stays unset: None is no secret), and secrets inside texts hidden
    (:func:`mask_text`)."""
    if isinstance(value, dict):
        return {k: _masked_entry(v) if is_secret_key(k) else mask(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(mask(v) for v in value)
    if isinstance(value, str):
        return mask_text(value)
    return value


def _masked_entry(value: Any) -> Any:
    return value if value is None or value == "" else MASKED


def unmasked(value: Any) -> Any:
    """A masked mapping without its masked entries, nor texts with a masked part (what
    can be taken back from a ``config.yaml``: the secrets themselves must be given
    again)."""
    if isinstance(value, dict):
        return {
            k: unmasked(v) for k, v in value.items() if not (isinstance(v, str) and MASKED in v)
        }
    return value


def merge(base: dict, extra: dict) -> dict:
    """``base`` updated by ``extra``, nested mappings merged key by key."""
    out = dict(base)
    for k, v in extra.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def secret_values(options: Any) -> list[str]:
    """Every secret value in ``options`` (any depth), as text."""
    out: list[str] = []
    if isinstance(options, dict):
        for k, v in options.items():
            out.extend(_leaves(v) if is_secret_key(k) else secret_values(v))
    elif isinstance(options, list | tuple):
        for v in options:
            out.extend(secret_values(v))
    return out


def _leaves(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [x for v in value.values() for x in _leaves(v)]
    if isinstance(value, list | tuple):
        return [x for v in value for x in _leaves(v)]
    return [] if value is None or str(value) == "" else [str(value)]


def scrub(text: str, options: Any) -> str:
    """``text`` (e.g. an error message) with the secret values of ``options`` masked."""
    for secret in sorted(secret_values(options), key=len, reverse=True):
        if len(secret) >= 3:
            text = text.replace(secret, MASKED)
    return mask_text(text)


class _MaskedStream:
    """A text stream whose writes go through :func:`mask_text` (everything else is the
    stream's own), so that no print of the CLI, ours or a library's, shows a secret."""

    def __init__(self, stream) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(mask_text(text) if isinstance(text, str) else text)
        return len(text)

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def masked_output():
    """While inside, stdout and stderr show no secret that :func:`mask_text` can see."""
    with (
        contextlib.redirect_stdout(_MaskedStream(sys.stdout)),
        contextlib.redirect_stderr(_MaskedStream(sys.stderr)),
    ):
        yield


def mask_tracebacks(options: Any) -> None:
    """From now on, the traceback Python prints for an error that ends the program (what
    ``--debug`` shows, for a bug report) shows no secret: its messages and those of the
    errors chained to it, masked by shape and ``options``' secret values (:func:`scrub`)."""
    import traceback

    def show(kind, err, tb) -> None:
        text = "".join(traceback.format_exception(kind, err, tb))
        sys.stderr.write(scrub(text, options))

    sys.excepthook = show
