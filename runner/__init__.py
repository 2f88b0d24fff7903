"""runner: a serverless-style function runner on Redis.

The public API: handlers raise ``Retry`` or ``PermanentFailure`` and receive a
``Context``; Python apps enqueue through ``Client``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runner.errors import (
    Cancelled,
    ConfigError,
    EventConflict,
    EventRejected,
    FieldError,
    FunctionLoadError,
    GroupNotFound,
    IdempotencyConflict,
    InvalidGroup,
    JobEnded,
    JobFailed,
    JobNotFound,
    JobTimeout,
    NonDeterministicReplay,
    NotWaiting,
    PermanentFailure,
    RateLimited,
    RedisUnavailable,
    Retry,
    RunnerError,
    SignalPending,
    SignalsFull,
    SignalTimeout,
    StaleLease,
    StepTooLarge,
    StillRunning,
    UnknownFunction,
    UnknownQueue,
    UnknownVersion,
    ValidationFailed,
)

if TYPE_CHECKING:
    from runner.client import Client, Enqueued, Request
    from runner.groups import Group
    from runner.worker.context import Context

# Loaded on first use (PEP 562): `import runner` (every CLI call, every handler's
# `raise runner.Retry`) must not pay for the client's Redis, catalog and codec imports.
_LAZY = {"Client": "runner.client", "Enqueued": "runner.client", "Request": "runner.client",
         "Context": "runner.worker.context", "Group": "runner.groups"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'runner' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = [
    "Cancelled",
    "Client",
    "ConfigError",
    "Context",
    "Enqueued",
    "EventConflict",
    "EventRejected",
    "FieldError",
    "FunctionLoadError",
    "Group",
    "GroupNotFound",
    "IdempotencyConflict",
    "InvalidGroup",
    "JobEnded",
    "JobFailed",
    "JobNotFound",
    "JobTimeout",
    "NonDeterministicReplay",
    "NotWaiting",
    "PermanentFailure",
    "RateLimited",
    "RedisUnavailable",
    "Request",
    "Retry",
    "RunnerError",
    "SignalPending",
    "SignalTimeout",
    "SignalsFull",
    "StaleLease",
    "StepTooLarge",
    "StillRunning",
    "UnknownFunction",
    "UnknownQueue",
    "UnknownVersion",
    "ValidationFailed",
]
