"""The errors dslide-dask raises on purpose, under one base.

``except DslideError`` catches every one of them; each also derives from the built-in
exception code written before this hierarchy expects (``ValueError`` for bad input,
``RuntimeError`` for a cluster that failed), so existing handlers keep working.
:class:`~dslide_dask.not_fitted.NotFittedError` derives from scikit-learn's too, so its
own checks recognise it; it has a module of its own, as scikit-learn takes 0.75 s to
import and the CLI, the workers and the actors never need it.
"""

from __future__ import annotations

from dslide_dask.masking import mask_text

__all__ = [
    "CheckpointError",
    "ClusterError",
    "DataError",
    "DslideError",
    "MemoryBudgetError",
    "MemoryPlanError",
    "MirrorFailed",
    "NetworkAloneWarning",
    "OutsideError",
    "ShardLostError",
    "XCFormatError",
]


class DslideError(Exception):
    """Base of every error dslide-dask raises on purpose; a URL's credentials in its
    message are masked (:func:`dslide_dask.masking.mask_text`): it may be logged on a
    worker, pickled to the client and shown anywhere."""

    def __init__(self, *args) -> None:
        super().__init__(*(mask_text(a) if isinstance(a, str) else a for a in args))


class DataError(DslideError, ValueError):
    """Input data that cannot be used as given."""


class XCFormatError(DataError):
    """A file that is not valid Extreme Classification text: ``source:line: problem``
    (``source: problem`` when no line applies, e.g. a corrupt compressed stream)."""

    def __init__(self, source: str, line: int | None, problem: str) -> None:
        source, problem = mask_text(str(source)), mask_text(problem)  # before the line
        super().__init__(f"{source}:{line}: {problem}" if line else f"{source}: {problem}")
        self.source = source
        self.line = line
        self.problem = problem

    def __reduce__(self):  # picklable (e.g. raised in a Dask worker)
        return type(self), (self.source, self.line, self.problem)


class OutsideError(DslideError, ValueError):
    """A reference or a link in a folder that points outside the folder."""


class CheckpointError(DslideError, ValueError):
    """A checkpoint that cannot be loaded: missing, corrupted or incompatible."""


class MemoryBudgetError(DslideError, ValueError):
    """A size from a file needs more memory than there is."""


class MemoryPlanError(MemoryBudgetError):
    """The model does not fit the workers; the message has the plan and what would fit."""


class ClusterError(DslideError, RuntimeError):
    """The cluster could not do what the model needed of it."""


class ShardLostError(ClusterError):
    """A worker holding part of the model is gone (its actors died with it)."""


class MirrorFailed(ClusterError):
    """A new shard could not take the rows streamed to it, or did not catch up."""


class NetworkAloneWarning(UserWarning):
    """A call trains the network alone where the model has fused parts, which need every
    row at once (``partial_fit``): said once, in a line, not silently."""
