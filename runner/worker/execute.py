"""One claimed job -> one Outcome: decode, check the type and version, validate and
upgrade the payload, run the handler under its timeout, and classify what happened.

Nothing here talks to Redis; the worker settles the Outcome in batches.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner.catalog.registry import Function, Registry
from runner.catalog.schemas import UpgradeFailed
from runner.errors import (
    PermanentFailure,
    Retry,
    UnknownVersion,
    ValidationFailed,
    describe,
)
from runner.store import codec
from runner.worker import backoff
from runner.worker.context import Context

log = logging.getLogger("runner.job")


class JobTimeout(Exception):
    """The handler ran past its TIMEOUT."""


@dataclass(slots=True)
class Claimed:
    id: str
    token: str
    attempt: int
    type: str
    version_raw: str
    payload_raw: str
    max_attempts: int
    idem_key: str
    resource_key: str
    ready_ms: int
    created_ms: int
    checkpoint_raw: str
    queue: str
    claimed_ms: int


@dataclass(frozen=True, slots=True)
class Done:
    result: str


@dataclass(frozen=True, slots=True)
class RetryLater:
    delay_s: float
    error: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Dead:
    reason: str
    error: dict[str, Any] | None
    refund: bool  # the payload never reached a handler: give the attempt back


Outcome = Done | RetryLater | Dead


def _dead_input(reason: str, message: str, **extra: Any) -> Dead:
    return Dead(reason=reason, error={"type": "InvalidJob", "message": message, **extra}, refund=True)


def resolve(job: Claimed, registry: Registry) -> tuple[Function, dict[str, Any], int] | Dead:
    """Turn a claimed record into (function, payload at the newest version, version) or a
    Dead outcome that never reaches a handler and spends no attempt."""
    fn = registry.functions.get(job.type)
    if fn is None:
        return _dead_input("unknown type", f"no function {job.type!r} is loaded")
    try:
        version = int(job.version_raw)
    except ValueError:
        return _dead_input("malformed record", f"version {job.version_raw!r} is not an integer")
    try:
        payload = codec.loads(job.payload_raw)
    except codec.DecodeError as exc:
        return _dead_input("malformed record", f"payload is not JSON: {exc}")
    try:
        lifted = fn.versions.lift(payload, version)
    except UnknownVersion as exc:
        return _dead_input("unknown version", str(exc))
    except ValidationFailed as exc:
        return _dead_input(
            "invalid payload", str(exc), errors=[e.as_dict() for e in exc.errors],
            version=exc.version,
        )
    except UpgradeFailed as exc:
        return _dead_input("upgrade failed", str(exc))
    return fn, lifted, fn.versions.newest


def failure(fn: Function, job: Claimed, exc: BaseException) -> Outcome:
    """Classify a handler's exception."""
    err = describe(exc)
    if isinstance(exc, PermanentFailure):
        return Dead(reason="permanent failure", error=err, refund=False)
    if job.attempt >= job.max_attempts:
        return Dead(reason="max attempts reached", error=err, refund=False)
    if isinstance(exc, Retry) and exc.delay is not None:
        return RetryLater(delay_s=max(0.0, float(exc.delay)), error=err)
    return RetryLater(delay_s=backoff.delay_s(fn.backoff, job.attempt, _rnd), error=err)


_rnd = random.Random()


def call(
    fn: Function, payload: dict[str, Any], ctx: Context, loop: asyncio.AbstractEventLoop | None
) -> Any:
    """Run the handler; async handlers run on the worker's event loop under wait_for."""
    if fn.is_async:
        if loop is None:
            return asyncio.run(asyncio.wait_for(fn.handle(payload, ctx), ctx.remaining_s))
        fut = asyncio.run_coroutine_threadsafe(
            asyncio.wait_for(fn.handle(payload, ctx), ctx.remaining_s), loop
        )
        try:
            return fut.result()
        except TimeoutError:
            raise JobTimeout(f"ran past TIMEOUT {fn.timeout_s:g} s") from None
    return fn.handle(payload, ctx)


def run(
    fn: Function, payload: dict[str, Any], job: Claimed, ctx: Context,
    loop: asyncio.AbstractEventLoop | None, guard: Callable[[Callable[[], Any]], Any],
) -> tuple[Outcome, float]:
    """Run the handler (inside ``guard``, which arms the timeout) -> (outcome, run seconds)."""
    started = time.perf_counter()
    try:
        result = guard(lambda: call(fn, payload, ctx, loop))
    except JobTimeout as exc:
        return failure(fn, job, exc), time.perf_counter() - started
    except Exception as exc:
        return failure(fn, job, exc), time.perf_counter() - started
    elapsed = time.perf_counter() - started
    try:
        body = codec.dumps(result) if result is not None else ""
    except TypeError as exc:
        bad = TypeError(f"the handler's return value is not JSON: {exc}")
        return failure(fn, job, bad), elapsed
    return Done(result=body), elapsed
