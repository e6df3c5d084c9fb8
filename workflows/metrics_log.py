"""The records of a run folder's ``metrics.jsonl``, checked as they are read.

``dslide train --resume`` and ``dslide report`` read a file anyone may have edited: a
line nested 100,000 deep, a bare number, a step that is text or a missing loss would
surface as a RecursionError, an AttributeError or a KeyError deep in plotting. Here each
line is read and its shape checked once, and a bad one is named by file and line.
"""

from __future__ import annotations

import json
import numbers
from typing import TypeGuard

#: The kinds of record ``RunFolder.add`` writes.
KINDS = ("step", "eval")
#: Score keys of an eval record (P@1, nDCG@3, PSP@5...): numbers.
SCORE_PREFIXES = ("P@", "nDCG@", "PSP@", "PSnDCG@")


def parse_metrics(text: str, where: str) -> list[dict]:
    """The records of ``text`` (one JSON object a line; blank lines skipped); a
    ValueError naming ``where:line`` for the first that is not one we write."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            out.append(_record(line, f"{where}:{number}"))
    return out


def _record(line: str, where: str) -> dict:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"{where}: not JSON ({err})") from None
    except RecursionError:
        raise ValueError(f"{where}: not a metrics record (nested too deeply)") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    kind = record.get("kind", "step")
    if kind not in KINDS:
        raise ValueError(f"{where}: kind must be one of {list(KINDS)}, got {kind!r:.40}")
    step = record.get("step")
    if not _is_int(step) or step < 0:
        raise ValueError(f"{where}: step must be a non-negative integer, got {step!r:.40}")
    needed = ["loss"] if kind == "step" else []
    numbers_ = needed + [k for k in record if k.startswith(SCORE_PREFIXES)]
    for key in numbers_:
        value = record.get(key)
        if not _is_number(value):
            raise ValueError(f"{where}: {key} must be a number, got {value!r:.40}")
    return record


def _is_int(v: object) -> TypeGuard[numbers.Integral]:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_number(v) -> bool:
    """A real number (NaN too: a diverged loss is still a record)."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool)
