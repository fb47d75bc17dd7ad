"""A bounded queue with a batch being written, and a batched write that, once started, is
seen through.

Owns: `BatchQueue`, `to_the_end` and `flush_soon`.

`BatchQueue` holds the records a ledger has not yet written, at most `max_pending` of them;
past that the oldest is dropped and counted (`dropped`), never blocking the caller. A write
takes every queued record out of the queue as its batch (`batch`): records queued while it
is written wait in the (now shorter) queue, and only they count against the bound — a
record is dropped only when `max_pending` records wait that no write has taken, so a record
being written never makes room for, or is pushed out by, a new one. The batch in flight is
not counted: it is at most `max_pending` records itself, so a ledger holds at most twice
`max_pending` records while its one write is under way. A write that fails, or is cancelled
before its commit, puts its batch back in front of the queue (in its order), the oldest
dropped and counted past the bound; a batch marked written is never queued again.

`to_the_end`: cancelled while it waits for the database (a stop cancels the flush task;
the COMMIT may already have reached the server, and a SQLite writer thread goes on
regardless), a write would not know whether its batch was committed: putting it back would
have the next flush write it again (usage counted twice), letting it go could lose it. So
the write and its marking run to their end together, and the caller's cancellation is
delivered after them.
Must not: swallow a cancellation (it is raised once the work has ended); take a second batch
while one is out (a ledger's flush lock makes its writes one at a time).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from gateway.obs import logging as log

T = TypeVar("T")


class Batch(Generic[T]):
    """The records one write takes (`items`, oldest first); `written()` once the database
    has committed them."""

    __slots__ = ("items", "committed")

    def __init__(self, items: list[T]) -> None:
        self.items = items
        self.committed = False

    def written(self) -> None:
        self.committed = True


class BatchQueue(Generic[T]):
    """Records not yet written, oldest first, at most `max_pending` (see the module
    docstring); `on_drop` is told the running drop count after each drop."""

    def __init__(self, max_pending: int, *, on_drop: Callable[[int], None] | None = None) -> None:
        self.max_pending = max_pending
        self.dropped = 0
        self._queue: deque[T] = deque()
        self._on_drop = on_drop
        self._out: Batch[T] | None = None

    def __len__(self) -> int:
        """Records waiting for a write (the batch being written is not among them)."""
        return len(self._queue)

    def __iter__(self) -> Iterator[T]:
        return iter(self._queue)

    @property
    def writing(self) -> int:
        """Records in the batch being written."""
        return len(self._out.items) if self._out is not None else 0

    def put(self, item: T) -> None:
        """Queue `item`; when `max_pending` records already wait, the oldest is dropped."""
        if self._queue and len(self._queue) >= self.max_pending:
            self._queue.popleft()
            self._count_drops(1)
        self._queue.append(item)

    @contextmanager
    def batch(self) -> Iterator[Batch[T]]:
        """Take every queued record as one batch, for the write the block makes; the block
        calls `written()` once the database has committed it. Left without that (an error, a
        cancellation before the commit), the batch goes back in front of the queue."""
        if self._out is not None:
            raise RuntimeError("a batch is already being written")
        taken: Batch[T] = Batch(list(self._queue))
        self._queue.clear()
        self._out = taken
        try:
            yield taken
        finally:
            self._out = None
            if not taken.committed:
                self._requeue(taken.items)

    def drop_all(self) -> None:
        """Give up on every queued record (the last write before a stop failed): counted as
        dropped, never lost without a count."""
        if self._queue:
            n = len(self._queue)
            self._queue.clear()
            self._count_drops(n)

    def _requeue(self, items: list[T]) -> None:
        self._queue.extendleft(reversed(items))
        excess = len(self._queue) - self.max_pending
        if excess > 0:
            for _ in range(excess):
                self._queue.popleft()
            self._count_drops(excess)

    def _count_drops(self, n: int) -> None:
        self.dropped += n
        if self._on_drop is not None:
            self._on_drop(self.dropped)


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


async def flush_soon(
    after_s: float, flush: Callable[[], Awaitable[None]], waiting: Callable[[], int], failed: str
) -> None:
    """A ledger's background write: `after_s` after the record that started it, then again
    while records wait that were queued during a write (their `add` saw this task running
    and started none). A failed write logs `failed` (its class and how many records wait,
    nothing of them) and ends: they stay queued, and the next add or a stop retries."""
    while True:
        await asyncio.sleep(after_s)
        try:
            await flush()
        except Exception as exc:
            log.error(failed, error_class=type(exc).__name__, count=waiting())
            return
        if not waiting():
            return
