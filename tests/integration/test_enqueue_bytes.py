"""Every path that writes many jobs in one script call splits its calls so that no call
carries more than records.SCRIPT_BYTES of payloads (the first job of a call whatever its
size): one call is a partition's atomic step, during which Redis answers nobody. Seen on
the server itself (MONITOR): each script call's bytes, 20 jobs of about 1 MiB a path."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from runner.client import Enqueued, Request
from runner.client.enqueuing import prepare
from runner.errors import JobNotFound
from runner.store import records

from conftest import Project, wait_for

N = 20
PAD = "x" * (1_048_576 - 200)  # a payload within [api] max_body_bytes
# A call's own fields (ids, types, keys, numbers) beside its payloads.
SLACK = 64 * 1024


@contextmanager
def script_calls(project: Project) -> Iterator[list[int]]:
    """The size of each script call of this project's keys (its MONITOR line), as run."""
    conn = project.runtime.redis.connection_pool.make_connection()
    conn.connect()
    conn.send_command("MONITOR")
    assert conn.read_response() in (b"OK", "OK")
    sizes: list[int] = []
    stop = threading.Event()
    last = [time.monotonic()]  # when the reader last had a line

    def read() -> None:
        while not stop.is_set():
            if not conn.can_read(timeout=0.05):
                continue
            line = conn.read_response()
            last[0] = time.monotonic()
            text = line if isinstance(line, bytes) else str(line).encode()
            if (b'"EVALSHA"' in text or b'"EVAL"' in text or b'"FCALL"' in text) and project.prefix.encode() in text:
                sizes.append(len(text))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    try:
        yield sizes
    finally:
        # The last lines in flight: MONITOR's copy of 20 MiB is read for a while on a
        # busy machine, so until it has been quiet for half a second (a fixed 0.3 s missed
        # calls under load).
        end = time.monotonic() + 20
        while time.monotonic() < end and time.monotonic() - last[0] < 0.5:
            time.sleep(0.05)
        stop.set()
        t.join(5)
        conn.disconnect()


def _bounded(sizes: list[int]) -> None:
    assert sizes, "no script call seen"
    assert max(sizes) <= records.SCRIPT_BYTES + SLACK, (
        f"a script call of {max(sizes):,} bytes (bound {records.SCRIPT_BYTES:,}); calls: {sorted(sizes)[-5:]}")


BIG = '''
QUEUE = "fast"

def handle(payload, ctx):
    return None
'''


def _big(project: Project) -> None:
    project.add_function("big", BIG)


def _requests(n: int = N) -> list[Request]:
    return [Request("big", {"pad": PAD, "i": i}) for i in range(n)]


def _all_written(project: Project, out: list[Any]) -> None:
    assert len(out) == N and all(isinstance(o, Enqueued) for o in out), out[:3]
    c = project.client
    for i, o in enumerate(out):
        assert f'"i":{i}}}' in c.get(o.id).fields["payload"], i


def test_enqueue_many_splits_its_calls_by_bytes(project: Project) -> None:
    """20 x 1 MiB from enqueue_many (and `runner enqueue --jsonl`, which sends by it): each
    call at most SCRIPT_BYTES, the answers in order."""
    _big(project)
    with script_calls(project) as sizes:
        out = project.client.enqueue_many(_requests())
    _bounded(sizes)
    assert len(sizes) >= 3
    _all_written(project, out)


def test_the_combined_round_trip_splits_its_calls(project: Project) -> None:
    """The round trip concurrent enqueue calls share (Sender.send), and the event loop's
    (the HTTP fast lane's merged bodies): 20 x 1 MiB in one send, each call bounded."""
    _big(project)
    c = project.client
    preps = [prepare(c, r) for r in _requests()]
    with script_calls(project) as sizes:
        out = c.sender.send(preps)
    _bounded(sizes)
    _all_written(project, out)
    preps = [prepare(c, r) for r in _requests()]

    async def on_loop() -> list[Any]:
        try:
            return await c.sender._send_on_loop(preps)
        finally:
            c.sender.close()

    c.sender.aiolink = c.sender._make_aiolink()
    with script_calls(project) as sizes:
        out = asyncio.run(on_loop())
    _bounded(sizes)
    _all_written(project, out)


def test_a_group_splits_its_members_by_bytes(project: Project) -> None:
    _big(project)
    with script_calls(project) as sizes:
        g = project.client.group(_requests(), Request("big", {}))
    _bounded(sizes)
    assert len(g.members) == N


FAN = '''
QUEUE = "fast"

def handle(payload, ctx):
    for i in range(20):
        ctx.enqueue("big", {"pad": "x" * (1048576 - 200), "i": i})
    return None
'''


def _known(c: Any, job_id: str) -> bool:
    try:
        c.get(job_id)
    except JobNotFound:
        return False
    return True


def test_the_followups_of_one_ack_are_bounded_by_bytes(project: Project) -> None:
    """A handler's 20 ctx.enqueue of 1 MiB: its ack (and the stage and relay that place
    them) write at most SCRIPT_BYTES of them a call, and every one is placed once."""
    _big(project)
    project.add_function("fan", FAN)
    c = project.client
    with script_calls(project) as sizes:
        job = c.enqueue("fan", {})
        project.spawn_worker("fast")
        wait_for(lambda: c.get(job.id).status == "done", 60, what="the fan job done")
        # (placed: queued, or already run by the worker, whose done no-op keeps no record)
        wait_for(lambda: all(_known(c, f"{job.id}.{i}") for i in range(N)), 60, what="every follow-up")
        # The worker stopped: its idle polls (script calls of this prefix) never let MONITOR
        # go quiet, so the read of the last lines in flight waited out its 20 s cap.
        project.stop_all()
    _bounded(sizes)


def test_the_fast_lane_merges_requests_up_to_the_bound(project: Project) -> None:
    """20 concurrent 1 MiB enqueues on the event loop (POST /jobs/{type}'s fast lane)
    are merged into round trips of at most SCRIPT_BYTES of payloads each, every caller
    answered its own job."""
    _big(project)
    c = project.client
    preps = [prepare(c, r) for r in _requests()]
    combiner = c.sender._loop_combiner
    trips: list[int] = []
    send = combiner._send

    async def observed(items: Any) -> Any:
        trips.append(sum(len(p.job.payload) for p in items))
        return await send(items)

    combiner._send = observed

    c.enqueue("big", {})  # (this producer's partition tags recorded: the loop's path is taken)

    async def many() -> list[Any]:
        try:
            await c.sender.asend(prepare(c, Request("big", {})))  # the loop takes its link
            trips.clear()
            return list(await asyncio.gather(*(c.sender.asend(p) for p in preps)))
        finally:
            c.sender.close()

    with script_calls(project) as sizes:
        out = asyncio.run(many())
    _bounded(sizes)
    assert len(trips) >= 3 and max(trips) <= records.SCRIPT_BYTES, trips
    _all_written(project, out)
