"""Compact encodings for the activations and gradients that cross the network."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

WIRE_DTYPES = ("float16", "float32")


@dataclass
class Packed:
    """A float32 matrix as ``values * scale[:, None]`` (``scale`` None: values as is)."""

    values: np.ndarray
    scale: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + (0 if self.scale is None else self.scale.nbytes)


def pack(a: np.ndarray, dtype: str = "float16") -> Packed:
    """Encode rows of ``a``; float16 keeps ~3 significant digits of each row relative to
    its largest entry (a per-row scale avoids float16's overflow and underflow)."""
    if dtype == "float32":
        return Packed(np.ascontiguousarray(a, np.float32))
    if dtype != "float16":
        raise ValueError(f"wire dtype must be one of {list(WIRE_DTYPES)}, got {dtype!r}")
    scale = np.abs(a).max(axis=1).astype(np.float32)
    safe = np.where(scale > 0, scale, 1.0).astype(np.float32)
    return Packed((a / safe[:, None]).astype(np.float16), scale)


def unpack(p: Packed) -> np.ndarray:
    if p.scale is None:
        return p.values
    return p.values.astype(np.float32) * p.scale[:, None]


def payload_bytes(obj) -> int:
    """Bytes of the arrays in a message (arrays, dataclasses, tuples, lists, dicts)."""
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, list | tuple):
        return sum(payload_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(payload_bytes(o) for o in obj.values())
    if hasattr(obj, "__dataclass_fields__"):
        return sum(payload_bytes(getattr(obj, f)) for f in obj.__dataclass_fields__)
    return 0


def sum_unpacked(parts: list[Packed]) -> np.ndarray:
    """The sum of several packed matrices, as float32."""
    total = unpack(parts[0]).copy()
    for p in parts[1:]:
        total += unpack(p)
    return total
