"""Django: ``INSTALLED_APPS += ["runner.contrib.django"]``.

Settings (all optional)::

    RUNNER = {
        "CONFIG": BASE_DIR / "runner.toml",   # RUNNER_CONFIG wins; default ./runner.toml
        "REDIS_URL": "redis://...",           # REDIS_URL wins; default runner.toml's
        "PREFIX": "shop",                     # RUNNER_REDIS_PREFIX wins; default runner.toml's
    }

Each is a default under the environment, as runner.toml's values are.

``manage.py check`` (apps.py; and so ``runserver`` and ``migrate``) then runs the file checks of
``runner check``: config, functions and schemas, each problem a check message
(runner.E001 error, runner.W001 warning). The Redis half of ``runner check`` stays with
the command: a system check must not need a server.

``enqueue_on_commit(type, payload, ...)`` validates now (a bad payload fails the
request, not a callback after the commit) and enqueues once the current transaction
commits; nothing is sent when it rolls back. Outside a transaction it enqueues at once,
as Django's ``on_commit`` does.

Under the pytest plugin's fixtures, a test inside Django's test transaction (``TestCase``,
pytest-django's ``django_db``) never commits, so Django would never send an
``enqueue_on_commit``. There the transaction the app opened stands for the commit: an
enqueue outside any transaction of the app's goes at once, and ``send_committed`` (which
the plugin runs before it looks at the jobs) sends those whose app transaction ended
without a rollback. A rolled-back one is dropped by Django itself, as in production.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connections, transaction

from runner.client import Client, Request
from runner.contrib.shared import pinned_client, shared_client


def runner_settings() -> dict[str, Any]:
    return dict(getattr(settings, "RUNNER", {}) or {})


# settings.RUNNER's keys and the environment variables that win over them.
_FROM_ENV = {"REDIS_URL": "REDIS_URL", "PREFIX": "RUNNER_REDIS_PREFIX"}


def settings_env() -> dict[str, str]:
    """The overrides ``settings.RUNNER`` gives, less those the environment sets: a
    setting is a default (a platform's REDIS_URL wins over a development URL in
    settings.py), as runner.toml's values are."""
    s = runner_settings()
    return {var: str(s[key]) for key, var in _FROM_ENV.items() if s.get(key) and var not in os.environ}


def config_path() -> str | None:
    """settings.RUNNER["CONFIG"], unless RUNNER_CONFIG names a file (it wins)."""
    named = runner_settings().get("CONFIG")
    return None if os.environ.get("RUNNER_CONFIG") or not named else str(named)


def in_transaction() -> bool:
    """Whether this thread is inside an atomic block of one of its database connections
    (a test's transaction under pytest-django's ``django_db`` or ``TestCase``): what it
    wrote there is seen by no other connection, a worker thread's included."""
    try:
        conns = connections.all(initialized_only=True)
    except TypeError:  # (Django before 4.1)
        conns = connections.all()
    return any(c.in_atomic_block for c in conns)


def client() -> Client:
    """The process's shared client, configured from ``settings.RUNNER`` and the
    environment (which wins)."""
    return shared_client(config_path(), settings_env())


@dataclass(slots=True)
class _Send:
    """One enqueue_on_commit's send; it sends once, whoever calls it first (Django at the
    commit, a test's capture of the callbacks, or send_committed)."""

    client: Client
    type: str
    payload: Any
    version: int | None
    delay: float | None
    idempotency_key: str | None
    sent: bool = False

    def __call__(self) -> None:
        if not self.sent:
            self.sent = True
            self.client.enqueue(self.type, self.payload, version=self.version, delay=self.delay,
                                idempotency_key=self.idempotency_key)


def enqueue_on_commit(type: str, payload: Any, *, using: str | None = None, version: int | None = None,
                      delay: float | None = None, idempotency_key: str | None = None) -> None:
    """Enqueue the job when the transaction on ``using`` commits; never when it rolls back."""
    c = client()
    c.prepare(Request(type, payload, version, delay, None, idempotency_key))  # raises ValidationFailed now
    send = _Send(c, type, payload, version, delay, idempotency_key)
    if pinned_client() is not None and _in_test_transaction_only(transaction.get_connection(using)):
        send()  # no transaction of the app's: production would send it now
        return
    transaction.on_commit(send, using=using)


def _in_test_transaction_only(connection: Any) -> bool:
    """Every open atomic block on ``connection`` is a test's own (Django's TestCase marks
    the blocks it wraps each test in, which never commit): the app has none open."""
    blocks = getattr(connection, "atomic_blocks", None)
    return bool(connection.in_atomic_block and blocks
                and all(getattr(b, "_from_testcase", False) for b in blocks))


def send_committed() -> None:
    """Send each pending enqueue_on_commit whose app transaction has ended (only a test's
    blocks are left open on its connection): a test's stand-in for the commit it will
    never see. Does nothing outside such a test."""
    for connection in connections.all(initialized_only=True):
        if _in_test_transaction_only(connection):
            for entry in list(connection.run_on_commit):  # (savepoint ids, callback, robust)
                if isinstance(entry[1], _Send):
                    entry[1]()
