"""The producer side of every benchmarked system, run in that system's environment.

    python drive.py SYSTEM enqueue --n N --mode single|batch|fast [--stamp]
    python drive.py SYSTEM rate --n N --rate R
    python drive.py bullmq worker            (BullMQ's port has no worker command)

``enqueue`` sends N no-op jobs from one producer, one call per job (single) or through
the system's bulk API (batch; "fast" is batch where there is one, else single), and
prints {"n", "seconds"} as JSON. ``rate`` offers N jobs at R jobs/s, open loop (the
schedule never waits for a slow call), each carrying its enqueue time for the latency
probe, and prints {"n", "seconds", "late_max_ms"}. Every loop is bounded by --n and
--max-seconds.

Environment: BENCH_REDIS_URL; for runner also RUNNER_CONFIG (the project's runner.toml),
BENCH_RUNNER_TYPE (the function, default noop) and BENCH_RUNNER_KEYS (the payload's key).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
BATCH = 500

SyncSend = Callable[[float], None]
SyncBatch = Callable[[list[float]], None]
AsyncSend = Callable[[float], Awaitable[None]]
AsyncBatch = Callable[[list[float]], Awaitable[None]]


# --- sync producers ------------------------------------------------------------------

def runner_producer() -> tuple[SyncSend, SyncBatch | None]:
    from runner.client import Client, Request

    client = Client.from_config(os.environ["RUNNER_CONFIG"])
    job_type = os.environ.get("BENCH_RUNNER_TYPE", "noop")
    # The payload's "k": "unique" (one per job), "none", or a number N (N keys in turn,
    # so jobs spread evenly over them). A type other than the no-op defaults to unique.
    keys = os.environ.get("BENCH_RUNNER_KEYS", "none" if job_type == "noop" else "unique")
    spread = int(keys) if keys.isdigit() else 0
    seq = [0]

    def payload(t: float) -> dict[str, Any]:
        if keys == "none":
            return {"t": t}
        seq[0] += 1
        if spread:
            return {"t": t, "k": f"t{seq[0] % spread}"}
        return {"t": t, "k": f"{os.getpid()}-{seq[0]}"}

    def send(t: float) -> None:
        client.enqueue(job_type, payload(t))

    def batch(ts: list[float]) -> None:
        out = client.enqueue_many([Request(job_type, payload(t)) for t in ts], batch=BATCH)
        bad = [r for r in out if isinstance(r, Exception)]
        if bad:
            raise bad[0]

    return send, batch


def huey_producer() -> tuple[SyncSend, SyncBatch | None]:
    from huey_app import noop

    return (lambda t: noop(t)), None


def dramatiq_producer() -> tuple[SyncSend, SyncBatch | None]:
    from dramatiq_app import noop

    return (lambda t: noop.send(t)), None


def celery_producer() -> tuple[SyncSend, SyncBatch | None]:
    from celery_app import noop

    return (lambda t: noop.delay(t)), None


def rq_producer() -> tuple[SyncSend, SyncBatch | None]:
    from redis import Redis
    from rq import Queue
    from rq_app import noop

    q = Queue("bench", connection=Redis.from_url(URL))

    def send(t: float) -> None:
        q.enqueue(noop, t)

    def batch(ts: list[float]) -> None:
        q.enqueue_many([Queue.prepare_data(noop, (t,)) for t in ts])

    return send, batch


SYNC: dict[str, Callable[[], tuple[SyncSend, SyncBatch | None]]] = {
    "runner": runner_producer, "huey": huey_producer, "dramatiq": dramatiq_producer,
    "celery": celery_producer, "rq": rq_producer,
}


# --- async producers -----------------------------------------------------------------

async def bullmq_producer() -> tuple[AsyncSend, AsyncBatch | None]:
    from bullmq import Queue
    from bullmq_app import QUEUE

    q = Queue(QUEUE, {"connection": URL})

    async def send(t: float) -> None:
        await q.add("noop", {"t": t})

    async def batch(ts: list[float]) -> None:
        await q.addBulk([{"name": "noop", "data": {"t": t}} for t in ts])

    return send, batch


async def taskiq_producer() -> tuple[AsyncSend, AsyncBatch | None]:
    from taskiq_app import broker, noop

    await broker.startup()

    async def send(t: float) -> None:
        await noop.kiq(t)

    return send, None


async def saq_producer() -> tuple[AsyncSend, AsyncBatch | None]:
    from saq_app import queue

    await queue.connect()

    async def send(t: float) -> None:
        await queue.enqueue("noop", t=t)

    return send, None


async def arq_producer() -> tuple[AsyncSend, AsyncBatch | None]:
    from arq import create_pool
    from arq_app import WorkerSettings

    pool = await create_pool(WorkerSettings.redis_settings)

    async def send(t: float) -> None:
        await pool.enqueue_job("noop", t)

    return send, None


ASYNC: dict[str, Callable[[], Awaitable[tuple[AsyncSend, AsyncBatch | None]]]] = {
    "bullmq": bullmq_producer, "taskiq": taskiq_producer, "saq": saq_producer,
    "arq": arq_producer,
}


# --- loops ---------------------------------------------------------------------------

def _chunks(n: int, size: int) -> list[int]:
    return [min(size, n - i) for i in range(0, n, size)]


def enqueue_sync(system: str, n: int, mode: str, stamp: bool, max_s: float) -> dict[str, Any]:
    send, batch = SYNC[system]()
    if mode == "batch" and batch is None:
        return {"n": 0, "seconds": 0.0, "unsupported": True}
    use_batch = batch is not None and mode in ("batch", "fast")
    done = 0
    start = time.perf_counter()
    deadline = start + max_s
    if use_batch:
        assert batch is not None
        for size in _chunks(n, BATCH):
            batch([time.time() if stamp else 0.0] * size)
            done += size
            if time.perf_counter() > deadline:
                break
    else:
        for _ in range(n):
            send(time.time() if stamp else 0.0)
            done += 1
            if not done % 256 and time.perf_counter() > deadline:
                break
    return {"n": done, "seconds": time.perf_counter() - start, "batch": use_batch}


async def enqueue_async(system: str, n: int, mode: str, stamp: bool, max_s: float) -> dict[str, Any]:
    send, batch = await ASYNC[system]()
    if mode == "batch" and batch is None:
        return {"n": 0, "seconds": 0.0, "unsupported": True}
    use_batch = batch is not None and mode in ("batch", "fast")
    done = 0
    start = time.perf_counter()
    deadline = start + max_s
    if use_batch:
        assert batch is not None
        for size in _chunks(n, BATCH):
            await batch([time.time() if stamp else 0.0] * size)
            done += size
            if time.perf_counter() > deadline:
                break
    else:
        for _ in range(n):
            await send(time.time() if stamp else 0.0)
            done += 1
            if not done % 256 and time.perf_counter() > deadline:
                break
    return {"n": done, "seconds": time.perf_counter() - start, "batch": use_batch}


def rate_sync(system: str, n: int, rate: float, max_s: float) -> dict[str, Any]:
    send, _ = SYNC[system]()
    start = time.perf_counter()
    late = 0.0
    done = 0
    for i in range(n):
        due = start + i / rate
        now = time.perf_counter()
        if due > now:
            time.sleep(due - now)
        else:
            late = max(late, now - due)
        send(time.time())
        done += 1
        if now - start > max_s:
            break
    return {"n": done, "seconds": time.perf_counter() - start, "late_max_ms": late * 1000}


async def rate_async(system: str, n: int, rate: float, max_s: float) -> dict[str, Any]:
    send, _ = await ASYNC[system]()
    start = time.perf_counter()
    late = 0.0
    done = 0
    for i in range(n):
        due = start + i / rate
        now = time.perf_counter()
        if due > now:
            await asyncio.sleep(due - now)
        else:
            late = max(late, now - due)
        await send(time.time())
        done += 1
        if now - start > max_s:
            break
    return {"n": done, "seconds": time.perf_counter() - start, "late_max_ms": late * 1000}


# --- BullMQ worker -------------------------------------------------------------------

async def bullmq_worker() -> None:
    from bullmq import Worker
    from bullmq_app import CONCURRENCY, QUEUE, URL, process

    worker = Worker(QUEUE, process, {"connection": URL, "concurrency": CONCURRENCY})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await worker.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("system")
    ap.add_argument("action", choices=["enqueue", "rate", "worker"])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--mode", choices=["single", "batch", "fast"], default="single")
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--stamp", action="store_true", help="carry the enqueue time (latency probe)")
    ap.add_argument("--max-seconds", type=float, default=60.0)
    a = ap.parse_args()
    if a.action == "worker":
        if a.system != "bullmq":
            sys.exit("only bullmq has its worker here; the others use their own commands")
        asyncio.run(bullmq_worker())
        return
    is_async = a.system in ASYNC
    if a.action == "enqueue":
        if is_async:
            out = asyncio.run(enqueue_async(a.system, a.n, a.mode, a.stamp, a.max_seconds))
        else:
            out = enqueue_sync(a.system, a.n, a.mode, a.stamp, a.max_seconds)
    elif is_async:
        out = asyncio.run(rate_async(a.system, a.n, a.rate, a.max_seconds))
    else:
        out = rate_sync(a.system, a.n, a.rate, a.max_seconds)
    print(json.dumps(out), flush=True)
    # Some clients keep threads or loops alive; the figures are out, so leave now.
    os._exit(0)


if __name__ == "__main__":
    main()
