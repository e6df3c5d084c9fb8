"""Storage-option secrets: masked wherever settings are shown or written down.

One function decides what is secret (:func:`is_secret_key`) and one walks any nesting of
mappings and lists (:func:`mask`): the settings printed at the start of a run, the run
folder's ``config.yaml`` and summary, and error lines (:func:`scrub`) all go through them,
so ``client_kwargs.aws_secret_access_key`` is hidden as surely as a top-level ``secret``.

Secrets also travel inside values whose names say nothing: a presigned URL
(``?X-Amz-Signature=...``, Azure's ``&sig=...``), a password in a URL (``/`` and all), a
connection string (``AccountKey=...;``). :func:`mask` hides those by their shape, in any
text; :func:`masked_output` puts everything the CLI prints through it.
"""

from __future__ import annotations

import contextlib
import re
import sys
from typing import Any

MASKED = "***"
#: Parts of option names whose values are never shown (matched case-insensitively).
SECRET_WORDS = (
    "key",
    "secret",
    "token",
    "password",
    "passwd",
    "credential",
    "auth",
    "session",
    "signature",
    "private",
    "cookie",
    "sas",
)
#: Whole names (of options, URL query parameters, connection-string fields) that are
#: secret though too short to be searched for inside other names.
SECRET_NAMES = frozenset({"sig", "pwd", "code"})
#: Option names that contain a secret word but hold nothing secret.
NOT_SECRET = frozenset({"key_prefix", "anon", "use_ssl"})
#: URLs with credentials in them (``scheme://user:password@host``): the password runs to
#: the last ``@`` before a blank or quote, ``/`` included (unencoded, as people type it).
_URL_CREDENTIALS = re.compile(r"(://[^/\s:@'\"]*):[^\s@'\"]+@")
#: A connection string's SharedAccessSignature field: a whole query (sv=..&sig=..) to ``;``.
_SAS_FIELD = re.compile(r"(?i)((?:^|;)\s*SharedAccessSignature=)(?!\*\*\*)[^;\s'\"]+")
#: ``name=value`` after ``?``, ``&`` or ``;`` (URL queries, connection strings), or at
#: the start of a text (a connection string as an option's value).
_NAMED_VALUE = re.compile(r"(^|[?&;])([A-Za-z][\w.-]*)=([^&;\s'\"#]*)")


def is_secret_key(key: Any) -> bool:
    """Whether an option named ``key`` holds a credential."""
    k = str(key).lower()
    if k in SECRET_NAMES:
        return True
    return k not in NOT_SECRET and any(w in k for w in SECRET_WORDS)


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


def mask_text(text: str) -> str:
    """``text`` with URL passwords and secret-named query parameters or connection-string
    fields (``X-Amz-Signature``, ``sig``, ``AccountKey``, ``SharedAccessSignature``,
    ``Password``...) hidden; other parameters (expiry, permissions) stay readable."""
    if "=" in text:
        text = _SAS_FIELD.sub(r"\1" + MASKED, text)
        text = _NAMED_VALUE.sub(_mask_named, text)
    if "@" in text:
        text = _URL_CREDENTIALS.sub(r"\1:" + MASKED + "@", text)
    return text


def _mask_named(match: re.Match) -> str:
    lead, name, value = match.groups()
    if not value or value == MASKED or not is_secret_key(name):
        return match.group(0)
    return f"{lead}{name}={MASKED}"


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
