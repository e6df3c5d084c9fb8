"""Numbered calls start in number order whatever order they arrive in (the pipelined step's
``backward(t)`` then ``forward(t+1)``), and a caller that starts over fails the calls it
gave up instead of leaving them waiting."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest

from dslide_dask.distributed.turns import Ticket, TicketBook, Turns


def test_a_book_numbers_each_target_and_starts_over_on_abandon():
    book = TicketBook(2)
    assert [book.ticket(0), book.ticket(1), book.ticket(0)] == [
        Ticket(1, 0),
        Ticket(1, 0),
        Ticket(1, 1),
    ]
    book.abandon()
    assert [book.ticket(1), book.ticket(1)] == [Ticket(2, 0), Ticket(2, 1)]


def _run(turns: Turns, thread: ThreadPoolExecutor, ticket: Ticket, log: list, name: str):
    loop = asyncio.get_running_loop()
    return turns.run(ticket, lambda: loop.run_in_executor(thread, log.append, name))


def test_calls_arriving_out_of_order_run_in_ticket_order():
    async def main():
        turns, log = Turns(), []
        with ThreadPoolExecutor(1) as thread:
            calls = [
                asyncio.ensure_future(_run(turns, thread, Ticket(1, n), log, f"call {n}"))
                for n in (2, 0, 3, 1)  # as they arrive
            ]
            await asyncio.gather(*calls)
        return log

    assert asyncio.run(main()) == ["call 0", "call 1", "call 2", "call 3"]


def test_a_new_sequence_fails_the_calls_given_up_and_runs_its_own():
    async def main():
        turns, log = Turns(), []
        with ThreadPoolExecutor(1) as thread:
            await _run(turns, thread, Ticket(1, 0), log, "old 0")
            lost = asyncio.ensure_future(_run(turns, thread, Ticket(1, 2), log, "old 2"))
            await asyncio.sleep(0.01)  # waits for call 1, which its caller never sent
            await _run(turns, thread, Ticket(2, 0), log, "new 0")
            with pytest.raises(RuntimeError, match="call 2 of sequence 1 was given up"):
                await lost
            late = _run(turns, thread, Ticket(1, 1), log, "old 1")
            with pytest.raises(RuntimeError, match="its caller started sequence 2"):
                await late
            await _run(turns, thread, Ticket(2, 1), log, "new 1")
        return log

    assert asyncio.run(main()) == ["old 0", "new 0", "new 1"]
