"""Django: ``INSTALLED_APPS += ["runner.contrib.django"]``.

Settings (all optional)::

    RUNNER = {
        "CONFIG": BASE_DIR / "runner.toml",   # default: RUNNER_CONFIG or ./runner.toml
        "REDIS_URL": "redis://...",           # default: REDIS_URL or runner.toml
        "PREFIX": "shop",                     # default: RUNNER_REDIS_PREFIX or runner.toml
    }

``manage.py check`` (apps.py; and so ``runserver`` and ``migrate``) then runs the file checks of
``runner check``: config, functions and schemas, each problem a check message
(runner.E001 error, runner.W001 warning). The Redis half of ``runner check`` stays with
the command: a system check must not need a server.

``enqueue_on_commit(type, payload, ...)`` validates now (a bad payload fails the
request, not a callback after the commit) and enqueues once the current transaction
commits; nothing is sent when it rolls back. Outside a transaction it enqueues at once,
as Django's ``on_commit`` does.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import transaction

from runner.client import Client, Request
from runner.contrib.shared import shared_client


def runner_settings() -> dict[str, Any]:
    return dict(getattr(settings, "RUNNER", {}) or {})


def settings_env() -> dict[str, str]:
    s = runner_settings()
    env = {}
    if s.get("REDIS_URL"):
        env["REDIS_URL"] = str(s["REDIS_URL"])
    if s.get("PREFIX"):
        env["RUNNER_REDIS_PREFIX"] = str(s["PREFIX"])
    return env


def client() -> Client:
    """The process's shared client, configured from ``settings.RUNNER``."""
    return shared_client(runner_settings().get("CONFIG"), settings_env())


def enqueue_on_commit(type: str, payload: Any, *, using: str | None = None, version: int | None = None,
                      delay: float | None = None, idempotency_key: str | None = None) -> None:
    """Enqueue the job when the transaction on ``using`` commits; never when it rolls back."""
    c = client()
    c.prepare(Request(type, payload, version, delay, None, idempotency_key))  # raises ValidationFailed now

    def send() -> None:
        c.enqueue(type, payload, version=version, delay=delay, idempotency_key=idempotency_key)

    transaction.on_commit(send, using=using)
