"""How a training call draws its batches: one typed spec for every trainer.

A :class:`Stream` is frozen and picklable: the distributed trainer sends it to the
coordinator's worker, the local trainer reads it in process, and both draw exactly the
same batches from it. Checkpoints record where in it training stands
(:meth:`Stream.meta`), so a resumed run draws the rest of the same batches.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace

from dslide_dask.data.batches import Source, epoch_batches
from dslide_dask.data.dataset import XCDataset
from dslide_dask.data.held import HeldRows
from dslide_dask.data.shuffle import ReadStats


@dataclass(frozen=True)
class Stream:
    """``epochs`` passes over a source in batches of ``batch_size``, rows ordered by
    ``(seed, epoch)``, starting at batch ``first_batch`` of epoch ``first_epoch``."""

    batch_size: int
    epochs: int = 1
    seed: int = 0
    shuffle: bool = True
    first_epoch: int = 0
    first_batch: int = 0
    skip_bad_lines: bool = False  #: skip (and count) malformed lines of a text source
    held: HeldRows | None = None  #: rows held out of training (the fusion chooses on them)

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")

    @property
    def last_epoch(self) -> int:
        """The epoch after the last one drawn."""
        return self.first_epoch + self.epochs

    def from_position(self, epoch: int, batch: int) -> Stream:
        """The rest of this stream from batch ``batch`` of epoch ``epoch`` (after a
        restore)."""
        return replace(self, first_epoch=epoch, first_batch=batch, epochs=self.last_epoch - epoch)

    def batches(
        self, source: Source, stats: ReadStats | None = None
    ) -> Iterator[tuple[int, int, XCDataset]]:
        """``(epoch, index in the epoch, batch)`` of every batch, in training order."""
        for epoch in range(self.first_epoch, self.last_epoch):
            batches = epoch_batches(
                source,
                self.batch_size,
                epoch,
                self.seed,
                self.shuffle,
                skip_bad_lines=self.skip_bad_lines,
                stats=stats,
                held=self.held,
            )
            start = self.first_batch if epoch == self.first_epoch else 0
            for index, batch in enumerate(itertools.islice(batches, start, None), start):
                yield epoch, index, batch

    def meta(self, epoch: int, batch: int) -> dict:
        """Checkpoint metadata: where training stands (the next batch to train) and how
        the batches are drawn."""
        return {
            "position": {"epoch": epoch, "batch": batch},
            "data": {"batch_size": self.batch_size, "seed": self.seed, "shuffle": self.shuffle},
        }
