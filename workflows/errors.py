"""Errors the command line reports in its own way."""

from __future__ import annotations

import contextlib
import signal
import threading

from dslide_dask.errors import DslideError


class JobFailed(DslideError, RuntimeError):
    """A job step failed after reporting why (e.g. a benchmark subprocess): exit 1."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised as an interrupt: ``dslide: terminated``, exit 143."""


@contextlib.contextmanager
def sigterm_interrupts():
    """While inside, SIGTERM raises :class:`Terminated` in the main thread as SIGINT
    raises KeyboardInterrupt: ``finally`` blocks run (metrics flushed, the run folder's
    lock released) and context managers close (a LocalCluster's workers stopped and their
    semaphores freed) instead of the process dying on the spot."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise Terminated()

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old if old is not None else signal.SIG_DFL)
