"""Group commit: concurrent enqueues from many threads share one Redis round trip.

A web process serves many requests at once, and each used to pay a whole round trip (two
loopback syscalls on each side and one script call in Redis) for one job. Here the first
caller to arrive becomes the leader: it sends every job waiting at that moment, its own
included, as one batch, hands each caller its own answer, and passes the lead to the
next waiter if more arrived meanwhile. A caller alone pays one uncontended lock; nothing
ever waits for a timer, so a lone request is not delayed at all.

Each caller still gets its answer only after Redis has run the script that holds its
job, so a 202 keeps meaning "the job is in Redis".

``AsyncCombiner`` does the same for coroutines (the web process's event loop): one
thread of its own sends a batch while the loop goes on taking requests, then takes
everything that queued meanwhile as the next batch. ``LoopCombiner`` does it on the
event loop itself, for a send that is a coroutine (the loop's own connection,
aiolink.py): no thread, no hand-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class _Slot(Generic[T, R]):
    __slots__ = ("error", "item", "lead", "result", "wake")

    def __init__(self, item: T) -> None:
        self.item = item
        self.result: R | None = None
        self.error: BaseException | None = None
        self.lead = False
        self.wake = threading.Lock()
        self.wake.acquire()  # released by whoever answers this slot or hands it the lead


class Combiner(Generic[T, R]):
    """Runs ``send(items) -> results`` (one result per item, in order) for batches of
    items submitted concurrently; ``submit`` returns this caller's result or raises the
    error that the batch raised."""

    def __init__(self, send: Callable[[Sequence[T]], Sequence[R]], max_batch: int = 256) -> None:
        self._send = send
        self._max = max_batch
        self._lock = threading.Lock()
        self._waiting: list[_Slot[T, R]] = []
        self._busy = False
        self._pid = os.getpid()

    def submit(self, item: T) -> R:
        if self._pid != os.getpid():
            # A fork: a batch in flight in the parent has no leader here to finish it.
            self._lock, self._waiting, self._busy, self._pid = threading.Lock(), [], False, os.getpid()
        slot: _Slot[T, R] = _Slot(item)
        with self._lock:
            self._waiting.append(slot)
            lead = not self._busy
            self._busy = True
        if not lead:
            slot.wake.acquire()
        if lead or slot.lead:
            self._run_batch()
        if slot.error is not None:
            raise slot.error
        return slot.result  # type: ignore[return-value]

    def _run_batch(self) -> None:
        with self._lock:
            batch = self._waiting[: self._max]
            del self._waiting[: self._max]
        try:
            results = self._send([s.item for s in batch])
            for s, r in zip(batch, results, strict=True):
                s.result = r
        except BaseException as exc:  # every caller of the batch hears of it
            for s in batch:
                s.error = exc
        with self._lock:
            if self._waiting:
                nxt = self._waiting[0]
                nxt.lead = True
                nxt.wake.release()
            else:
                self._busy = False
        for s in batch[1:]:  # the first is this thread (it led) or was woken to lead
            if not s.lead:
                s.wake.release()


class AsyncCombiner(Generic[T, R]):
    """``await submit(item)`` from any event loop: items that queue while a batch is in
    flight go out together as the next one. The sends run on one thread of the
    combiner's own, so a slow or unreachable Redis holds up enqueues but never the loop
    (other requests, /healthz). Answers go back to each caller's loop in one wake-up per
    loop and batch, not one per caller."""

    def __init__(self, send: Callable[[Sequence[T]], Sequence[R]], max_batch: int = 256,
                 name: str = "runner-commit") -> None:
        self._send = send
        self._max = max_batch
        self._name = name
        self._lock = threading.Lock()
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._busy = False
        self._pool: ThreadPoolExecutor | None = None
        self._pid = os.getpid()

    async def submit(self, item: T) -> R:
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._pid != os.getpid():  # a fork: the parent's sender thread is not here
                self._waiting, self._busy, self._pool, self._pid = [], False, None, os.getpid()
            self._waiting.append((item, fut))
            start = not self._busy
            self._busy = True
            if start and self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix=self._name)
            pool = self._pool
        if start:
            assert pool is not None
            pool.submit(self._drain)
        return await fut

    def _drain(self) -> None:
        """On the sender thread: send batches until nothing waits."""
        while True:
            with self._lock:
                batch = self._waiting[: self._max]
                del self._waiting[: self._max]
                if not batch:
                    self._busy = False
                    return
            error: BaseException | None = None
            results: Sequence[R] = ()
            try:
                results = self._send([item for item, _ in batch])
                if len(results) != len(batch):
                    raise ValueError(f"send answered {len(results)} results for {len(batch)} items")
            except BaseException as exc:  # every caller of the batch hears of it
                error = exc
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[R], R | None]]] = {}
            for n, (_, fut) in enumerate(batch):
                by_loop.setdefault(fut.get_loop(), []).append((fut, None if error else results[n]))
            for loop, answers in by_loop.items():
                # A closed loop raises RuntimeError: nobody waits for those answers any more.
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(_answer, answers, error)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


def _answer(answers: list[tuple[asyncio.Future[R], R | None]], error: BaseException | None) -> None:
    for fut, result in answers:
        if fut.cancelled():  # the caller went away (a client hung up); the batch ran all the same
            continue
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)  # type: ignore[arg-type]


# Loop turns a LoopCombiner under load lets pass before it sends (see _drain).
GATHER_TURNS = 3


class LoopCombiner(Generic[T, R]):
    """``await submit(item)`` on one event loop, for a coroutine ``send(items) ->
    results``: a lone caller's item goes out at once, and items that queue while a
    batch is in flight go out together as the next. Under load (the last batch, or the
    items waiting now, more than one), the next batch waits GATHER_TURNS turns of the
    loop first, taking in the items of the requests that those turns read. The batches
    run on a task of the combiner's own, so a caller that goes away (a client hung up)
    cancels only its own wait, never a batch that holds other callers' items."""

    def __init__(self, send: Callable[[Sequence[T]], Awaitable[Sequence[R]]], max_batch: int = 256,
                 gather_turns: int = GATHER_TURNS, size: Callable[[T], int] | None = None,
                 max_bytes: int = 0) -> None:
        self._send = send
        self._max = max_batch
        # With ``size``: a batch also holds at most ``max_bytes`` by it (its first item
        # whatever its size), so merged request bodies make a bounded round trip.
        self._size = size
        self._max_bytes = max_bytes
        self._gather = gather_turns
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._task: asyncio.Task[None] | None = None
        self._pid = os.getpid()
        self._loaded = False  # the last batch held more than one item

    async def submit(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        if self._task is not None and self._task.get_loop() is not loop:
            if self._pid == os.getpid():
                # One loop only (its callers make sure, see aiolink.AsyncLink.usable): another
                # loop's items are never dropped here, nor sent from a loop not theirs.
                raise RuntimeError("a LoopCombiner serves the one event loop that first used it")
            self._task, self._waiting, self._pid = None, [], os.getpid()  # a fork: the parent's batch
        self._waiting.append((item, fut))
        if self._task is None:
            self._task = loop.create_task(self._drain())
        return await fut

    def _cut(self) -> int:
        """How many of the waiting items the next batch takes: max_batch at most, and
        max_bytes of them by ``size`` (at least one)."""
        n = min(len(self._waiting), self._max)
        if self._size is None or n <= 1:
            return n
        total = 0
        for i in range(n):
            total += self._size(self._waiting[i][0])
            if i and total > self._max_bytes:
                return i
        return n

    async def _drain(self) -> None:
        try:
            while self._waiting:
                if self._loaded or len(self._waiting) > 1:
                    # Each round trip wakes Redis and then this process, and on a virtual
                    # machine a wake-up costs more CPU than many jobs' share of the script:
                    # under load, fewer and fuller batches (measured: 13 jobs a round trip
                    # instead of 7 at 16 connections a web process) serve more requests
                    # on the same cores. A few turns of a busy loop are tens of
                    # microseconds; a lone caller never waits for them.
                    for _ in range(self._gather):
                        if len(self._waiting) >= self._max or self._cut() < len(self._waiting):
                            break
                        await asyncio.sleep(0)
                n = self._cut()
                batch = self._waiting[:n]
                del self._waiting[:n]
                self._loaded = len(batch) > 1
                try:
                    results = await self._send([item for item, _ in batch])
                    if len(results) != len(batch):
                        raise ValueError(f"send answered {len(results)} results for {len(batch)} items")
                except Exception as exc:  # every caller of the batch hears of it
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(exc)
                    continue
                except BaseException:  # the loop is going down: nobody is answered
                    for _, fut in batch:
                        fut.cancel()
                    raise
                for (_, fut), result in zip(batch, results, strict=True):
                    if not fut.done():  # the caller went away; its item was sent all the same
                        fut.set_result(result)
        finally:
            self._task = None
            waiting, self._waiting = self._waiting, []  # empty, unless the drain was cancelled
            for _, fut in waiting:
                fut.cancel()
