"""Calls to one actor run in the order their caller numbered them, whatever order they
arrive in.

Two actor calls sent back to back may travel on two connections, and the worker starts
them in the order it reads them. The pipelined step sends a shard ``backward(t)`` and then
``forward(t+1)`` without waiting for the first answer (a round trip a step saved), so the
shard must not start the forward first: :class:`Turns` holds a call until the calls
numbered before it have been handed to the actor's thread, which runs them in that order.

A caller that gives up on calls it numbered (an error, a cancelled step) starts a new
sequence; calls still waiting under the old one then fail instead of waiting for ever.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ticket:
    """Call ``number`` (from 0) of the caller's sequence ``sequence``."""

    sequence: int
    number: int


class TicketBook:
    """The caller's side: numbers each target's calls, one sequence at a time."""

    def __init__(self, n_targets: int) -> None:
        self._sequences = itertools.count(1)
        self._sequence = next(self._sequences)
        self._next = [0] * n_targets

    def ticket(self, target: int) -> Ticket:
        number = self._next[target]
        self._next[target] += 1
        return Ticket(self._sequence, number)

    def abandon(self) -> None:
        """Give up the calls numbered so far: the next tickets start a new sequence."""
        self._sequence = next(self._sequences)
        self._next = [0] * len(self._next)


class Turns:
    """The actor's side: starts numbered calls in number order."""

    def __init__(self) -> None:
        self._sequence = 0
        self._next = 0
        self._changed: asyncio.Condition | None = None  # made on the worker's event loop

    async def run(self, ticket: Ticket, start: Callable[[], asyncio.Future]) -> Any:
        """Wait for ``ticket``'s turn, ``start()`` the call (it must queue it on a
        first-in, first-out thread), then await its result."""
        if self._changed is None:
            self._changed = asyncio.Condition()
        changed = self._changed
        async with changed:
            if ticket.sequence > self._sequence:  # the caller started over
                self._sequence, self._next = ticket.sequence, 0
                changed.notify_all()
            await changed.wait_for(
                lambda: self._sequence != ticket.sequence or self._next == ticket.number
            )
            if self._sequence != ticket.sequence:
                raise RuntimeError(
                    f"call {ticket.number} of sequence {ticket.sequence} was given up: "
                    f"its caller started sequence {self._sequence}"
                )
            self._next += 1
            running = start()
            changed.notify_all()
        return await running
