"""A batched write that, once started, is seen through.

Owns: `to_the_end`. A ledger writes its queued records in one transaction and then drops
them from its queue. Cancelled while it waits for the database (a stop cancels the flush
task; the COMMIT may already have reached the server, and a SQLite writer thread goes on
regardless), it would leave the written batch queued, and the next flush would write it
again: usage counted twice. So the write and the dropping run to their end together, and
the caller's cancellation is delivered after them.
Must not: swallow a cancellation (it is raised once the work has ended).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


async def to_the_end(work: Awaitable[T]) -> T:
    """`await work`, finished even if the caller is cancelled meanwhile; the caller's
    cancellation (if any) is raised after it, in place of its result or its error."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():  # the work itself was cancelled (its database was closed under it)
                raise
            cancelled = True  # ours: wait for the work all the same
            continue
        except BaseException:
            if cancelled:
                raise asyncio.CancelledError from None  # the caller asked to stop; the error is the next flush's
            raise
        if cancelled:
            raise asyncio.CancelledError
        return result
