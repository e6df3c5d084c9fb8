"""Storage-option secrets: masked wherever settings are shown or written down.

One function decides what is secret (:func:`is_secret_key`) and one walks any nesting of
mappings and lists (:func:`mask`): the settings printed at the start of a run, the run
folder's ``config.yaml`` and summary, and error lines (:func:`scrub`) all go through them,
so ``client_kwargs.aws_secret_access_key`` is hidden as surely as a top-level ``secret``.
"""

from __future__ import annotations

import re
from typing import Any

MASKED = "***"
#: Parts of option names whose values are never shown (matched case-insensitively).
SECRET_WORDS = ("key", "secret", "token", "password", "passwd", "credential", "auth",
                "session", "signature", "private", "cookie")  # fmt: skip
#: Option names that contain a secret word but hold nothing secret.
NOT_SECRET = frozenset({"key_prefix", "anon", "use_ssl"})
#: URLs with credentials in them (``scheme://user:password@host``).
_URL_CREDENTIALS = re.compile(r"(://[^/\s:@]+):[^/\s@]+@")


def is_secret_key(key: Any) -> bool:
    """Whether an option named ``key`` holds a credential."""
    k = str(key).lower()
    return k not in NOT_SECRET and any(w in k for w in SECRET_WORDS)


def mask(value: Any) -> Any:
    """``value`` with every secret-named entry, at any depth, replaced by ``"***"``, and
    passwords in URLs hidden."""
    if isinstance(value, dict):
        return {k: MASKED if is_secret_key(k) else mask(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(mask(v) for v in value)
    if isinstance(value, str):
        return _URL_CREDENTIALS.sub(r"\1:" + MASKED + "@", value)
    return value


def unmasked(value: Any) -> Any:
    """A masked mapping without its masked entries (what can be taken back from a
    ``config.yaml``: the secrets themselves must be given again)."""
    if isinstance(value, dict):
        return {k: unmasked(v) for k, v in value.items() if v != MASKED}
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
    return mask(text)
