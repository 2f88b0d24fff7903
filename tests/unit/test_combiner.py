"""Group commit (runner/store/combiner.py): overlapping calls share one send, every caller gets
its own answer or its batch's error, and the lead always passes on (no caller is left
waiting)."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Sequence

import pytest

from runner.store.combiner import GATHER_TURNS, AsyncCombiner, Combiner, LoopCombiner


def _run_threads(n: int, target: object) -> None:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(n)]  # type: ignore[arg-type]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a caller was left waiting"


def _queue_behind_a_held_send(c: Combiner[int, int], call: Callable[[int], object], n: int,
                              gate: threading.Event) -> None:
    """n callers at once while the first send waits on ``gate``: release it only once
    the other n - 1 are queued, then wait for every caller to return."""
    threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 5
    while len(c._waiting) < n - 1 and time.monotonic() < deadline:
        time.sleep(0.001)
    gate.set()
    for t in threads:
        t.join(timeout=10)
        assert not t.is_alive(), "a caller was left waiting"


def test_a_lone_call_is_sent_alone_at_once() -> None:
    """No other caller: the item goes out in a batch of one, and nothing waits."""
    batches: list[list[int]] = []

    def send(items: Sequence[int]) -> list[int]:
        batches.append(list(items))
        return [i * 10 for i in items]

    c = Combiner(send)
    assert [c.submit(i) for i in range(3)] == [0, 10, 20]
    assert batches == [[0], [1], [2]]


def test_overlapping_calls_share_sends_and_each_gets_its_own_answer() -> None:
    """While one send is in flight the others queue up and go out together; 64 callers
    need far fewer than 64 sends, and nobody receives another caller's answer."""
    sizes: list[int] = []
    gate = threading.Event()

    def send(items: Sequence[int]) -> list[int]:
        sizes.append(len(items))
        gate.wait(5)  # the first send holds the lead until everyone has queued
        return [i * i for i in items]

    c = Combiner(send)
    got: dict[int, int] = {}

    def call(i: int) -> None:
        got[i] = c.submit(i)

    _queue_behind_a_held_send(c, call, 64, gate)
    assert got == {i: i * i for i in range(64)}
    assert sum(sizes) == 64 and len(sizes) <= 3, sizes


def test_max_batch_bounds_a_send() -> None:
    sizes: list[int] = []
    gate = threading.Event()

    def send(items: Sequence[int]) -> list[int]:
        sizes.append(len(items))
        gate.wait(5)
        return list(items)

    c = Combiner(send, max_batch=10)
    _queue_behind_a_held_send(c, c.submit, 40, gate)
    assert sum(sizes) == 40 and max(sizes) <= 10


def test_an_error_reaches_every_caller_of_its_batch_and_the_next_batch_works() -> None:
    """A send that raises fails exactly the callers whose items it held; later calls go
    through as usual."""
    fail = {"on": True}

    def send(items: Sequence[int]) -> list[int]:
        if fail["on"]:
            raise ConnectionError("Redis went away")
        return list(items)

    c = Combiner(send)
    errors: list[BaseException] = []

    def call(i: int) -> None:
        try:
            c.submit(i)
        except ConnectionError as exc:
            errors.append(exc)

    _run_threads(16, call)
    assert len(errors) == 16
    fail["on"] = False
    assert c.submit(7) == 7


def test_stress_random_delays_and_failures_answer_everyone_right() -> None:
    """Many threads, sends of random duration, some failing: every call returns its own
    answer or raises, none hangs, and each item is sent exactly once."""
    sent: list[int] = []
    lock = threading.Lock()
    rnd = random.Random(7)

    def send(items: Sequence[int]) -> list[int]:
        with lock:
            sent.extend(items)
        time.sleep(rnd.random() * 0.002)
        if rnd.random() < 0.1:
            raise TimeoutError("slow Redis")
        return [i + 1 for i in items]

    c = Combiner(send)
    outcomes: dict[int, object] = {}

    def call(t: int) -> None:
        for j in range(50):
            i = t * 1000 + j
            try:
                outcomes[i] = c.submit(i)
            except TimeoutError:
                outcomes[i] = "error"

    _run_threads(12, call)
    assert len(outcomes) == 600
    assert sorted(sent) == sorted(outcomes)  # each item went out once
    assert all(v == "error" or v == i + 1 for i, v in outcomes.items())
    assert "error" in outcomes.values() and any(v != "error" for v in outcomes.values())


def test_a_mismatched_reply_count_is_an_error_not_a_wrong_answer() -> None:
    c = Combiner(lambda items: [1, 2, 3])
    with pytest.raises(ValueError):
        c.submit(1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_wait_for_a_batch_of_its_parent() -> None:
    """A fork taken while the parent had a batch in flight: the child's first call must
    lead a batch of its own, not wait forever for a leader that exists only upstairs."""
    gate = threading.Event()
    c = Combiner(lambda items: (gate.wait(5), list(items))[1])
    parent = threading.Thread(target=c.submit, args=(1,))
    parent.start()
    deadline = time.monotonic() + 5
    while not c._busy and time.monotonic() < deadline:
        time.sleep(0.001)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 only if its call came back, within 2 s
        signal.alarm(2)
        gate.set()  # the child's own send must not block either
        os._exit(0 if c.submit(7) == 7 else 1)
    gate.set()
    parent.join(timeout=5)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


# --- AsyncCombiner: the same for coroutines, sent from a thread of its own -------------


def _held(sizes: list[int], gate: threading.Event, answer: Callable[[int], int] = lambda i: i * i,
          ) -> Callable[[Sequence[int]], list[int]]:
    def send(items: Sequence[int]) -> list[int]:
        sizes.append(len(items))
        gate.wait(5)
        return [answer(i) for i in items]
    return send


async def _queued(c: AsyncCombiner[int, int], n: int) -> None:
    """Until n items wait behind the send in flight (yielding to the loop meanwhile)."""
    deadline = time.monotonic() + 5
    while len(c._waiting) < n and time.monotonic() < deadline:
        await asyncio.sleep(0.001)


def test_async_lone_calls_go_out_alone() -> None:
    batches: list[list[int]] = []

    def send(items: Sequence[int]) -> list[int]:
        batches.append(list(items))
        return [i * 10 for i in items]

    c = AsyncCombiner(send)

    async def main() -> list[int]:
        return [await c.submit(i) for i in range(3)]

    assert asyncio.run(main()) == [0, 10, 20]
    assert batches == [[0], [1], [2]]
    c.close()


def test_async_overlapping_calls_share_sends_and_the_loop_keeps_running() -> None:
    """64 tasks while the first send is held: they go out in at most 3 sends, each task
    gets its own answer, and the loop went on running other work during the held send."""
    sizes: list[int] = []
    gate = threading.Event()
    c = AsyncCombiner(_held(sizes, gate))
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while not gate.is_set():
            ticks += 1
            await asyncio.sleep(0.001)

    async def main() -> list[int]:
        tick = asyncio.create_task(ticker())
        tasks = [asyncio.create_task(c.submit(i)) for i in range(64)]
        await _queued(c, 63)
        await asyncio.sleep(0.05)  # the send is still held: the ticker must keep ticking
        held_ticks = ticks
        gate.set()
        out = await asyncio.gather(*tasks)
        await tick
        assert held_ticks > 3
        return out

    assert asyncio.run(main()) == [i * i for i in range(64)]
    assert sum(sizes) == 64 and len(sizes) <= 3, sizes
    c.close()


def test_async_max_batch_bounds_a_send() -> None:
    sizes: list[int] = []
    gate = threading.Event()
    c = AsyncCombiner(_held(sizes, gate, lambda i: i), max_batch=10)

    async def main() -> list[int]:
        tasks = [asyncio.create_task(c.submit(i)) for i in range(40)]
        await _queued(c, 39)
        gate.set()
        return await asyncio.gather(*tasks)

    assert asyncio.run(main()) == list(range(40))
    assert sum(sizes) == 40 and max(sizes) <= 10
    c.close()


def test_async_an_error_reaches_every_caller_of_its_batch_and_the_next_batch_works() -> None:
    fail = {"on": True}

    def send(items: Sequence[int]) -> list[int]:
        if fail["on"]:
            raise ConnectionError("Redis went away")
        return list(items)

    c = AsyncCombiner(send)

    async def main() -> list[object]:
        return await asyncio.gather(*(c.submit(i) for i in range(16)), return_exceptions=True)

    got = asyncio.run(main())
    assert len(got) == 16 and all(isinstance(g, ConnectionError) for g in got)
    fail["on"] = False
    assert asyncio.run(main()) == list(range(16))
    with pytest.raises(ValueError):
        asyncio.run(AsyncCombiner(lambda items: [1, 2, 3]).submit(1))
    c.close()


def test_async_callers_on_two_loops_each_hear_on_their_own_loop() -> None:
    """Two threads, each with its event loop, share one combiner: every answer comes back
    to the loop that asked, and a caller that gave up does not hold up the rest."""
    sizes: list[int] = []
    gate = threading.Event()
    c = AsyncCombiner(_held(sizes, gate, lambda i: -i))
    results: dict[str, list[object]] = {}
    barrier = threading.Barrier(2)

    def run(name: str, base: int) -> None:
        async def main() -> list[object]:
            loop = asyncio.get_running_loop()
            tasks = [asyncio.create_task(c.submit(base + i)) for i in range(20)]
            quitter = asyncio.create_task(c.submit(base + 99))
            await asyncio.sleep(0.01)
            quitter.cancel()
            await asyncio.to_thread(barrier.wait, 5)
            gate.set()
            out = await asyncio.gather(*tasks)
            assert asyncio.get_running_loop() is loop
            return [*out, quitter.cancelled()]
        results[name] = asyncio.run(main())

    threads = [threading.Thread(target=run, args=(n, b)) for n, b in (("a", 0), ("b", 1000))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
        assert not t.is_alive()
    assert results["a"] == [-i for i in range(20)] + [True]
    assert results["b"] == [-(1000 + i) for i in range(20)] + [True]
    assert sum(sizes) == 42  # the cancelled calls were sent all the same
    c.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_async_a_forked_child_sends_its_own_batches() -> None:
    """A fork taken while a send is held: the child's sender thread did not survive the
    fork, so its first call must start a new one instead of waiting for it."""
    gate = threading.Event()
    c = AsyncCombiner(lambda items: (gate.wait(5), list(items))[1])
    parent = threading.Thread(target=lambda: asyncio.run(c.submit(1)))
    parent.start()
    deadline = time.monotonic() + 5
    while not c._busy and time.monotonic() < deadline:
        time.sleep(0.001)
    pid = os.fork()
    if pid == 0:
        signal.alarm(2)
        gate.set()
        os._exit(0 if asyncio.run(c.submit(7)) == 7 else 1)
    gate.set()
    parent.join(timeout=5)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    c.close()


# --- LoopCombiner: on the event loop itself --------------------------------------------


async def _ticking(turns: list[int]) -> None:
    """Counts the loop's turns until cancelled."""
    while True:
        turns[0] += 1
        await asyncio.sleep(0)


def test_loop_a_lone_call_goes_out_without_waiting_for_the_loop() -> None:
    """A caller alone (nothing else waiting, the last batch a lone one) is sent on the
    drain's first step: a quiet web process adds no loop turns to an enqueue."""
    sent: list[tuple[list[int], int]] = []

    async def main() -> list[int]:
        turns = [0]
        ticker = asyncio.create_task(_ticking(turns))

        async def send(items: Sequence[int]) -> list[int]:
            sent.append((list(items), turns[0]))
            return [i * 10 for i in items]

        c: LoopCombiner[int, int] = LoopCombiner(send)
        out = []
        for i in range(3):
            await asyncio.sleep(0)
            before = turns[0]
            out.append(await c.submit(i))
            assert sent[-1][1] - before <= 1, "a lone call waited for loop turns"
        ticker.cancel()
        return out

    assert asyncio.run(main()) == [0, 10, 20]
    assert [items for items, _ in sent] == [[0], [1], [2]]


def test_loop_under_load_the_next_turns_items_join_the_batch() -> None:
    """Two callers at once is load: the batch waits a few loop turns and takes in the
    items of callers that arrive in them, so one round trip carries all four. Each
    caller still gets its own answer."""
    sent: list[list[int]] = []

    async def send(items: Sequence[int]) -> list[int]:
        sent.append(list(items))
        return [-i for i in items]

    async def main() -> list[int]:
        c: LoopCombiner[int, int] = LoopCombiner(send)

        async def after(turns: int, item: int) -> int:
            for _ in range(turns):
                await asyncio.sleep(0)
            return await c.submit(item)

        return list(await asyncio.gather(c.submit(1), c.submit(2), after(1, 3), after(GATHER_TURNS - 1, 4)))

    assert asyncio.run(main()) == [-1, -2, -3, -4]
    assert sent == [[1, 2, 3, 4]]


def test_loop_gathering_keeps_to_max_batch_and_answers_everyone() -> None:
    """Under load a batch still holds at most max_batch items, and every caller of 50
    arriving over many turns is answered with its own result."""
    sent: list[list[int]] = []

    async def send(items: Sequence[int]) -> list[int]:
        sent.append(list(items))
        await asyncio.sleep(0)
        return [i + 1000 for i in items]

    async def main() -> list[int]:
        c: LoopCombiner[int, int] = LoopCombiner(send, max_batch=4)

        async def after(turns: int, item: int) -> int:
            for _ in range(turns):
                await asyncio.sleep(0)
            return await c.submit(item)

        return list(await asyncio.gather(*(after(i % 7, i) for i in range(50))))

    assert asyncio.run(main()) == [i + 1000 for i in range(50)]
    assert max(len(b) for b in sent) <= 4
    assert sorted(i for b in sent for i in b) == list(range(50))


def test_loop_batches_are_bounded_in_bytes_as_in_count() -> None:
    """With ``size`` and ``max_bytes``, a batch takes waiting items while their sizes sum
    to ``max_bytes`` at most (its first whatever its size): the web fast lane's merged
    request bodies, each up to [api] max_body_bytes, go out a bounded round trip at a time,
    every caller answered its own."""
    sent: list[list[int]] = []

    async def main() -> list[int]:
        async def send(items: Sequence[int]) -> list[int]:
            sent.append(list(items))
            await asyncio.sleep(0)
            return [i * 10 for i in items]

        c: LoopCombiner[int, int] = LoopCombiner(send, max_batch=100, size=lambda i: 4 if i else 20, max_bytes=10)
        return list(await asyncio.gather(*(c.submit(i) for i in range(12))))

    out = asyncio.run(main())
    assert out == [i * 10 for i in range(12)]
    assert [i for batch in sent for i in batch] == list(range(12))
    assert all(len(b) == 1 or sum(4 if i else 20 for i in b) <= 10 for b in sent), sent
    assert max(len(b) for b in sent) == 2, sent
