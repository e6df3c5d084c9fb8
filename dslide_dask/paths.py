"""Every local path a run, a report, a conversion or a prediction may touch, decided here.

A ``LATEST`` file or a run's ``config.yaml`` is data from storage: edited (or hostile),
it could name ``../../elsewhere`` and make a resume read or overwrite files outside the
folder. Every reference read from such a file goes through :func:`inside`.

A folder is data too: copied with ``cp -a`` or handed over, it may hold symbolic links
(``summary.json -> ~/notes``, ``checkpoints -> /data``) or a FIFO or ``/dev/zero`` where a
small file should be. The project never makes a link, so on a local disk:

- a file it writes or deletes (:func:`guard_write`, :func:`write_file`) has no link
  anywhere below the folder it belongs to: nothing is written or removed through one;
- a file it reads (:func:`guard_read`, :func:`read_small`) resolves inside that folder,
  is a regular file (:func:`open_regular`: a FIFO is refused before anything waits on
  it), and a small metadata file is read up to a bound, never to the end of ``/dev/zero``;
- :func:`check_tree` refuses a folder about to be written that holds a link anywhere.

Remote fsspec file systems have no links: there only the size bound applies.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat

from dslide_dask.errors import OutsideError


def inside(root: str, ref: str, where: str) -> str:
    """``root/ref`` if ``ref`` is a relative path that stays under ``root``; else
    :class:`OutsideError` naming ``where`` (the file that holds ``ref``)."""
    if not isinstance(ref, str) or not ref.strip():
        raise OutsideError(f"{where}: expected a name inside the folder, got {ref!r}")
    if "://" in ref or "::" in ref or ref.startswith(("/", "~", "\\")) or "\\" in ref:
        raise OutsideError(f"{where}: {ref!r} is not a relative name inside {root}")
    norm = posixpath.normpath(ref)
    if norm == ".." or norm.startswith("../") or norm == ".":
        raise OutsideError(f"{where}: {ref!r} points outside {root}")
    return posixpath.join(root.rstrip("/"), norm)


def is_local(fs) -> bool:
    """Whether ``fs`` is this machine's disk (where links exist)."""
    protocol = fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,)
    return "file" in protocol or "local" in protocol


def guard_write(fs, root: str, path: str) -> str:
    """``path`` if writing or removing it stays in the folder ``root``: below ``root`` no
    part of it is a link (the folder itself may be one: the user named it) or a special
    file. Else :class:`OutsideError` naming the link."""
    if not is_local(fs):
        return path
    root = root.rstrip("/") or "/"
    rel = posixpath.relpath(path, root)
    if rel == ".." or rel.startswith("../"):
        raise OutsideError(f"{path}: not inside the folder {root}")
    current = root
    for part in [] if rel == "." else rel.split("/"):
        current = posixpath.join(current, part)
        try:
            mode = os.lstat(current).st_mode
        except (FileNotFoundError, NotADirectoryError):
            break  # created by the write
        if stat.S_ISLNK(mode):
            raise OutsideError(
                f"{current}: a symbolic link: dslide writes and deletes "
                "nothing through a link in its folders"
            )
        if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
            raise OutsideError(f"{current}: not a regular file or folder")
    return path


def guard_read(fs, root: str, path: str) -> str:
    """``path`` if it resolves (links followed) to a place inside the folder ``root``;
    else :class:`OutsideError` naming it."""
    if not is_local(fs):
        return path
    base = os.path.realpath(root)
    real = os.path.realpath(path)
    if real != base and not real.startswith(base.rstrip("/") + "/"):
        raise OutsideError(f"{path}: a symbolic link out of the folder {root} (refused)")
    return path


def open_regular(fs, path: str):
    """``path`` opened for reading as a binary file object, once it is known to be a
    regular file: on a local disk a FIFO or a device is refused by name (it is opened
    without waiting for a writer, then checked), as is a folder (IsADirectoryError).
    FileNotFoundError as for any open."""
    if not is_local(fs):
        return fs.open(path, "rb")
    # O_NONBLOCK: opening a FIFO must not wait for a writer; fstat then refuses it
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(mode):
            where = fs.unstrip_protocol(path)
            raise OutsideError(f"{where}: not a regular file (a FIFO or device?)")
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_small(fs, root: str, path: str, limit: int, what: str = "this file") -> bytes:
    """The bytes of the small file ``path`` of folder ``root`` (its at most ``limit``
    bytes): a link out of the folder, a FIFO or device, or a longer file is refused by
    name. FileNotFoundError / IsADirectoryError as for any read."""
    guard_read(fs, root, path)
    with open_regular(fs, path) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        where = fs.unstrip_protocol(path)
        raise ValueError(f"{where}: more than {limit} bytes, too big for {what}")
    return data


def write_file(fs, root: str, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` in folder ``root`` whole or not at all: on a local disk
    into a new file (never through a link) renamed over ``path`` (which replaces a link
    rather than following it); elsewhere one PUT."""
    guard_write(fs, root, path)
    if not is_local(fs):
        fs.pipe_file(path, data)
        return
    tmp = f"{path}.{os.getpid()}-{os.urandom(4).hex()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(tmp, flags, 0o666)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as err:
        if os.path.lexists(tmp):
            os.unlink(tmp)
        raise OSError(err.errno, err.strerror, path) from None


def check_tree(fs, root: str) -> None:
    """No link and no special file anywhere under the local folder ``root`` (one about to
    be written: a link there could send a write or a removal anywhere)."""
    if not is_local(fs) or not os.path.isdir(root):
        return
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            guard_write(fs, root, posixpath.join(dirpath, name))
