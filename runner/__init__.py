"""runner: a serverless-style function runner on Redis.

The public API: handlers raise ``Retry`` or ``PermanentFailure`` and receive a
``Context``; Python apps enqueue through ``Client``.
"""

from __future__ import annotations

from runner.client import Client, Enqueued, Request
from runner.errors import (
    ConfigError,
    FieldError,
    FunctionLoadError,
    IdempotencyConflict,
    JobNotFound,
    JobTimeout,
    PermanentFailure,
    RedisUnavailable,
    Retry,
    RunnerError,
    StaleLease,
    UnknownFunction,
    UnknownVersion,
    ValidationFailed,
)
from runner.worker.context import Context

__version__ = "0.1.0"

__all__ = [
    "Client",
    "ConfigError",
    "Context",
    "Enqueued",
    "FieldError",
    "FunctionLoadError",
    "IdempotencyConflict",
    "JobNotFound",
    "JobTimeout",
    "PermanentFailure",
    "RedisUnavailable",
    "Request",
    "Retry",
    "RunnerError",
    "StaleLease",
    "UnknownFunction",
    "UnknownVersion",
    "ValidationFailed",
]
