"""Named numpy arrays as ``.npy`` files on any fsspec file system, checksummed.

No pickle anywhere: object arrays are refused on write and on read. Each write returns
an *entry* (file, bytes, CRC32, dtype, shape) that the checkpoint's ``meta.json`` keeps;
a read checks the file against its entry, so a truncated, swapped or bit-flipped file is
caught with its name, never loaded as garbage; nor is a FIFO waited on, nor a NaN or an
infinity loaded (a file whose checksums were rewritten to match its damage).
"""

from __future__ import annotations

import io
import zlib

import numpy as np

from dslide_dask.errors import CheckpointError, OutsideError
from dslide_dask.paths import open_regular

#: Read and checksum in pieces of this size.
_CHUNK = 16 << 20


class _ChecksumWriter:
    """A write-only file object that passes bytes through and keeps size and CRC32."""

    def __init__(self, target) -> None:
        self.target = target
        self.crc = 0
        self.size = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.crc = zlib.crc32(view, self.crc)
        self.size += len(view)
        self.target.write(view)
        return len(view)


def write_array(fs, path: str, array: np.ndarray) -> dict:
    """Write ``array`` as ``.npy`` to ``path``; its entry for the checkpoint's metadata."""
    array = np.asarray(array)
    if array.dtype.hasobject:
        raise TypeError(f"{path}: object arrays are not checkpointed (no pickle)")
    with fs.open(path, "wb") as f:
        out = _ChecksumWriter(f)
        np.lib.format.write_array(out, np.ascontiguousarray(array), allow_pickle=False)
    return {
        "bytes": out.size,
        "crc32": out.crc,
        "dtype": array.dtype.str,
        "shape": list(array.shape),
    }


def read_array(fs, path: str, entry: dict) -> np.ndarray:
    """Read the ``.npy`` file at ``path`` and check it against its ``entry``: a writable
    array, or :class:`CheckpointError` naming the file and what is wrong (a FIFO or a
    device is refused before it is read, a float array holding a NaN or an infinity
    once it is)."""
    size = int(entry["bytes"])
    where = fs.unstrip_protocol(path)
    try:
        with open_regular(fs, path) as f:
            real = fs.size(path)
            if real is not None and real != size:  # before allocating: the entry is untrusted
                raise CheckpointError(
                    f"{path}: expected {size} bytes, found {real} bytes (truncated?)"
                )
            buf, got, crc = _read_into(f, size)
            extra = f.read(1)
    except FileNotFoundError:
        raise CheckpointError(f"{path}: file missing from the checkpoint") from None
    except IsADirectoryError:
        raise CheckpointError(f"{where}: a folder, not an array file") from None
    except OutsideError as err:
        raise CheckpointError(str(err)) from None
    if got < size or extra:
        what = f"{got} bytes" if got < size else "more bytes"
        raise CheckpointError(f"{path}: expected {size} bytes, found {what} (truncated?)")
    if crc != int(entry["crc32"]):
        raise CheckpointError(f"{path}: checksum mismatch (the file is corrupted)")
    array = _parse_npy(buf, path, entry)
    if not all_finite(array):
        raise CheckpointError(
            f"{path}: holds a NaN or an infinity (a model that diverged, or a damaged file)"
        )
    return array


def _read_into(f, size: int) -> tuple[bytearray, int, int]:
    """Up to ``size`` bytes of ``f``: ``(buffer, bytes read, their CRC32)``."""
    buf = bytearray(size)
    view = memoryview(buf)
    crc, got = 0, 0
    while got < size:
        n = f.readinto(view[got : min(size, got + _CHUNK)])
        if not n:
            break
        crc = zlib.crc32(view[got : got + n], crc)
        got += n
    return buf, got, crc


def all_finite(array: np.ndarray) -> bool:
    """Whether a float (or complex) array holds no NaN and no infinity (any other dtype:
    True); checked in pieces, so the check allocates little."""
    if array.dtype.kind not in "fc":
        return True
    flat = array.reshape(-1)
    step = _CHUNK // max(array.dtype.itemsize, 1)
    return all(np.isfinite(flat[i : i + step]).all() for i in range(0, len(flat), step))


def _parse_npy(buf: bytearray, path: str, entry: dict) -> np.ndarray:
    header = io.BytesIO(bytes(buf[: min(len(buf), 1 << 16)]))
    try:
        version = np.lib.format.read_magic(header)
        read_header = {
            (1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0,
        }[version]
        shape, fortran, dtype = read_header(header)
    except MemoryError:
        raise
    except Exception as err:  # numpy parses the header as Python: TokenError, SyntaxError...
        raise CheckpointError(f"{path}: not a .npy array file ({type(err).__name__})") from None
    if dtype.hasobject or fortran:
        raise CheckpointError(f"{path}: unsupported array layout (object or Fortran order)")
    if dtype.str != entry["dtype"] or list(shape) != list(entry["shape"]):
        raise CheckpointError(
            f"{path}: holds {dtype.str}{list(shape)}, the metadata says "
            f"{entry['dtype']}{entry['shape']}"
        )
    count = int(np.prod(shape))
    return np.frombuffer(buf, dtype, count, offset=header.tell()).reshape(shape)
