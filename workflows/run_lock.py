"""One run at a time in a run folder: ``RUN/run.lock``.

Two ``dslide train`` on one folder would interleave their checkpoints, prune each
other's and leave a mix of both. The lock is a file created atomically (``O_CREAT |
O_EXCL``), naming its holder (pid, host, start), and removed when the run ends. The
holder also keeps an ``flock`` on it, which the kernel drops when the process dies
however it dies: a lock file left by a killed run is then recognised as stale for sure
(no guessing from a pid that may have been reused) and taken over.

Local disks only: object stores have no atomic create-if-absent that fsspec offers, and
a run there is one job of a scheduler that does not start it twice.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time

from dslide_dask.paths import OutsideError, guard_write

try:
    import fcntl
except ImportError:  # no flock (Windows): the O_EXCL file and the holder's pid alone
    fcntl = None  # type: ignore[assignment]  # mypy cannot model an optional module

LOCK = "run.lock"
_FLAGS = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


class RunLock:
    """The lock of the local run folder ``root`` (``url`` names it in messages)."""

    def __init__(self, fs, root: str, url: str) -> None:
        self.fs, self.root, self.url = fs, root.rstrip("/"), url
        self.path = f"{self.root}/{LOCK}"
        self.fd: int | None = None

    def acquire(self) -> None:
        guard_write(self.fs, self.root, self.path)
        for _ in range(10):  # a race with another run taking over a stale lock: again
            try:
                fd = os.open(self.path, _FLAGS | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                self._take_stale()
                continue
            if self._hold(fd):
                text = f"pid {os.getpid()} on {socket.gethostname()} since {time.ctime()}\n"
                os.write(fd, text.encode())
                self.fd = fd
                return
        raise OSError(f"{self.path}: could not take the run folder's lock")

    def release(self) -> None:
        """Remove the lock file (if it is still this run's) and let go of it."""
        if self.fd is None:
            return
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == os.fstat(self.fd).st_ino:
                os.unlink(self.path)
        os.close(self.fd)
        self.fd = None

    def _hold(self, fd: int) -> bool:
        """flock ``fd`` and check that the lock file is still that file (another run may
        have removed it as stale in between); closes ``fd`` when not."""
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        except OSError:  # a file system without flock: the O_EXCL file alone
            pass
        try:
            same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
        return same

    def _take_stale(self) -> None:
        """Remove the lock file if its holder is gone; else say who holds the folder."""
        try:
            fd = os.open(self.path, _FLAGS | os.O_NONBLOCK)
        except FileNotFoundError:
            return  # released meanwhile
        except OSError as err:  # ELOOP: a link where the lock goes
            raise OutsideError(f"{self.path}: not a lock file ({err.strerror})") from None
        holder = os.read(fd, 200).decode("utf-8", "replace").strip()
        if not (holder.startswith("pid ") and holder.isprintable()):
            holder = "holder unknown"  # not ours to print: the lock file says no pid
        try:
            if fcntl is None:
                raise OSError("no flock")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = False
        except BlockingIOError:
            held = True
        except OSError:  # no flock here: a pid on this host that still runs holds it
            held = _alive(holder)
        if held:
            os.close(fd)
            raise OSError(
                f"{self.url}: in use by another dslide run ({holder[:120]}; "
                f"{LOCK}): wait for it to end, or choose another folder"
            )
        with contextlib.suppress(FileNotFoundError):
            if os.fstat(fd).st_ino == os.stat(self.path).st_ino:
                os.unlink(self.path)  # stale: its holder died without removing it
        os.close(fd)


def _alive(holder: str) -> bool:
    """Whether the holder a lock file names may still run (without flock to tell)."""
    words = holder.split()
    if len(words) < 4 or words[0] != "pid":
        return False  # not written by a holder: stale
    if words[3] != socket.gethostname():
        return True  # another host's process: cannot tell, so it may
    try:
        os.kill(int(words[1]), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True
