"""Credentials hidden in texts that name URLs: error messages, log lines, tracebacks.

A data URL may carry its credentials: a password (``https://user:pa/ss@host``), a token
as the user name (``https://TOKEN@host``), a presigned query (``?X-Amz-Signature=...``,
Azure's ``&sig=...``), a connection string (``AccountKey=...;``). An error raised about
such a URL on a worker is logged there by Dask with its message, pickled to the client
and shown by the Python API: so the library masks them where it raises
(:func:`mask_text`, applied by :class:`dslide_dask.errors.DslideError` to its message),
not only where the command line prints. What is secret is decided by name
(:func:`is_secret_key`) or by shape; expiry, permissions and plain paths stay readable.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Iterator
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
#: A user name alone before the host (``https://TOKEN@host``): often a token.
_URL_USER = re.compile(r"(://)(?!\*\*\*@)[^/\s:@'\"?#]+@")
#: A connection string's SharedAccessSignature field: a whole query (sv=..&sig=..) to ``;``.
_SAS_FIELD = re.compile(r"(?i)((?:^|;)\s*SharedAccessSignature=)(?!\*\*\*)[^;\s'\"]+")
#: ``name=value`` after ``?``, ``&`` or ``;`` (URL queries, connection strings), or at
#: the start of a text (a connection string as an option's value). A value stops before
#: what a message puts after a URL: ``:12:`` (a line number) or ``:`` and a blank.
_NAMED_VALUE = re.compile(
    r"(^|[?&;])([A-Za-z][\w.-]*)=([^&;\s'\"#]*?)(?=:\d+:|:\s|:$|[&;\s'\"#]|$)"
)


def is_secret_key(key: Any) -> bool:
    """Whether an option (or query parameter) named ``key`` holds a credential."""
    k = str(key).lower()
    if k in SECRET_NAMES:
        return True
    return k not in NOT_SECRET and any(w in k for w in SECRET_WORDS)


def mask_text(text: str) -> str:
    """``text`` with URL passwords and user names and secret-named query parameters or
    connection-string fields (``X-Amz-Signature``, ``sig``, ``token``, ``AccountKey``,
    ``SharedAccessSignature``, ``Password``...) replaced by ``***``; other parameters
    (expiry, permissions) stay readable. Masking twice changes nothing more: a value
    masked already keeps what follows it (``?token=***:12: problem`` keeps its line)."""
    if "=" in text:
        text = _SAS_FIELD.sub(r"\1" + MASKED, text)
        text = _NAMED_VALUE.sub(_mask_named, text)
    if "@" in text:
        text = _URL_CREDENTIALS.sub(r"\1:" + MASKED + "@", text)
        text = _URL_USER.sub(r"\1" + MASKED + "@", text)
    return text


def _mask_named(match: re.Match) -> str:
    lead, name, value = match.groups()
    if not value or value.startswith(MASKED) or not is_secret_key(name):
        return match.group(0)
    return f"{lead}{name}={MASKED}"


def masked_error(err: BaseException) -> BaseException:
    """``err`` itself if its message shows no secret; else a copy of the same type whose
    arguments (and an OSError's file names) are masked, with its traceback; an error
    whose message a copy cannot clean (made from other attributes) becomes an OSError
    of the masked message."""
    text = str(err)
    if mask_text(text) == text:
        return err
    clean: BaseException
    try:
        clean = copy.copy(err)
        clean.args = tuple(mask_text(a) if isinstance(a, str) else a for a in err.args)
        if isinstance(clean, OSError):
            for name in ("filename", "filename2"):
                if isinstance(getattr(clean, name), str):
                    setattr(clean, name, mask_text(getattr(clean, name)))
        if mask_text(str(clean)) != str(clean):
            raise TypeError
    except Exception:  # noqa: BLE001 - any type that cannot be copied or re-argued
        clean = OSError(mask_text(text))
    return clean.with_traceback(err.__traceback__)


@contextlib.contextmanager
def masked_errors() -> Iterator[None]:
    """While inside, an exception whose message shows a URL's credentials (a storage
    library's ``FileNotFoundError('https://u:pw@host/...')``) is raised masked instead
    (:func:`masked_error`), without the unmasked one as its context."""
    try:
        yield
    except Exception as err:
        clean = masked_error(err)
        if clean is err:
            raise
        raise clean from None
