"""What the pytest plugin's fixtures are made of: a project (runner.toml, functions/ and
schemas/) bound to a private server under a key prefix of its own, an in-process worker
that drains what is queued, and ``assert_enqueued``.

Jobs are found by walking the job records of the test's own prefix (a SCAN): fine for a
test's handful of jobs, and it sees every enqueue, whoever made it (the client, a
handler's follow-up, the app under test through its own ``Client.from_config()``).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from runner import config as config_mod
from runner.client import Client
from runner.config import Config
from runner.runtime import Runtime
from runner.store import census, codec, followups, records
from runner.worker.worker import Worker

FINAL = ("done", "dead")
WAITING = ("scheduled", "retrying", "deferred")


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """A job as ``drain`` left it: "done", "dead", or "retry" (due again after the drain)."""

    id: str
    type: str
    status: str
    payload: Any
    attempt: int
    result: Any = None
    error: Any = None
    reason: str | None = None


def project_env(url: str, prefix: str) -> dict[str, str]:
    """The environment that points a project (and the app under test) at the test server.
    That server has no replica: a project's ``wait_replicas`` (production's durability)
    would fail every write there NotReplicated, so it is 0 for the test."""
    return {"REDIS_URL": url, "RUNNER_REDIS_PREFIX": prefix, "RUNNER_REDIS_WAIT_REPLICAS": "0"}


def load_config(root: Path, env: Mapping[str, str]) -> Config:
    toml = root / "runner.toml"
    if toml.exists():
        return config_mod.load(toml, env=env)
    return config_mod.parse({}, root.resolve(), str(toml), env)


def fresh_prefix() -> str:
    return f"t{uuid.uuid4().hex[:12]}"


class Harness:
    """One test's project on the session's server, under a fresh key prefix, or under
    ``prefix`` emptied first (the plugin's: the prefix of the whole session, so that a
    client the app made before the test, pointed there, sees this test's jobs)."""

    def __init__(self, root: Path, url: str, env: Mapping[str, str],
                 before_look: Callable[[], None] | None = None, prefix: str | None = None,
                 after_drain: Callable[[list[JobOutcome]], None] | None = None) -> None:
        self.root = root
        # Run before every look at the jobs (the plugin's: send what the app's framework
        # holds back until a commit the test never makes).
        self.before_look = before_look
        # Run with each drain's outcomes (the plugin's: explain a failure the test's own
        # framework caused).
        self.after_drain = after_drain
        self.prefix = prefix or fresh_prefix()
        self.env = {**env, **project_env(url, self.prefix)}
        cfg = load_config(root, self.env)
        # Done jobs keep their payloads here, so assert_enqueued sees the jobs a drain ran.
        self.config = replace(cfg, retention=replace(cfg.retention, done_payload=True))
        self.runtime = Runtime.create(self.config)
        if prefix is not None:  # what an earlier test left there
            census.forget_prefix(self.runtime.redis, prefix)
        self.client = Client(self.runtime)
        self._worker: Worker | None = None
        self._reported: dict[str, tuple[str, int]] = {}

    def close(self) -> None:
        if self._worker is not None:
            self._worker.stop(grace_s=5.0)
            self._worker = None
        self.runtime.close()

    # --- looking jobs up ---------------------------------------------------------

    def jobs(self) -> Iterator[records.Job]:
        if self.before_look is not None:
            self.before_look()
        for job_id in sorted(self._ids()):
            try:
                yield self.client.get(job_id)
            except Exception:  # retention removed it between the scan and the read
                continue

    def _ids(self) -> set[str]:
        rt = self.runtime
        return {i for parts in rt.parts.values() for k in parts for i in census.every_id(rt.redis, k)}

    def _relaying(self) -> bool:
        """A follow-up for another queue waits on an outbox until the relay places it."""
        rt = self.runtime
        return any(followups.outbox_head(rt.redis, k, 1) for parts in rt.parts.values() for k in parts)

    def enqueued(self, type_: str, payload_subset: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        want = dict(payload_subset or {})
        out = []
        for job in self.jobs():
            view = job.as_dict()
            payload = view.get("payload")
            if view.get("type") != type_ or not isinstance(payload, dict):
                continue
            if all(k in payload and payload[k] == v for k, v in want.items()):
                out.append(view)
        return sorted(out, key=lambda v: str(v.get("created_at")))

    def assert_enqueued(self, type_: str, payload_subset: Mapping[str, Any] | None = None, *,
                        count: int | None = None) -> list[dict[str, Any]]:
        """The jobs of ``type_`` whose payload holds every key of ``payload_subset`` with
        that value; fails unless there is at least one (exactly ``count`` when given)."""
        found = self.enqueued(type_, payload_subset)
        if (count is None and not found) or (count is not None and len(found) != count):
            seen = sorted({str(j.as_dict().get("type")) for j in self.jobs()})
            want = "at least one" if count is None else str(count)
            raise AssertionError(
                f"expected {want} {type_} job(s) with payload ⊇ {codec.dumps(dict(payload_subset or {}))}, "
                f"found {len(found)}; job types present: {seen or 'none'}"
            )
        return found

    # --- running them ------------------------------------------------------------

    def start(self) -> None:
        """Start the in-process worker (once): from here it runs jobs as they arrive, so
        code that enqueues and waits for the result (``call``, ``acall``) gets it."""
        if self._worker is None:
            self._worker = Worker(self.runtime, list(self.config.queues))
            self._worker.start()

    def drain(self, timeout: float = 10.0) -> list[JobOutcome]:
        """Run every queued job (and the follow-ups they enqueue, and retries due within
        ``timeout``) until nothing is left to run; returns the outcome of each job that
        reached a new state since the last drain (run by it or before it, by the worker
        ``start`` began), oldest first. Jobs still running at the timeout fail it."""
        self.start()
        deadline = time.time() + timeout
        while True:
            # The ids are read before the statuses: a parent read as done may have written
            # its follow-ups after the ids were read. Nothing pending counts only when no id
            # came meanwhile and no follow-up waits on an outbox.
            before = self._ids()
            pending = [j for j in self.jobs() if not self._settled(j, deadline)]
            if not pending and not self._relaying() and self._ids() <= before:
                break
            if time.time() > deadline:
                raise AssertionError(f"drain: {len(pending)} job(s) still pending after {timeout:g} s: "
                                     + ", ".join(f"{j.id} ({j.status})" for j in pending[:5]))
            time.sleep(0.02)
        news = self._news()
        if self.after_drain is not None:
            self.after_drain(news)
        return news

    @staticmethod
    def _settled(job: records.Job, deadline: float) -> bool:
        if job.status in FINAL:
            return True
        if job.status in WAITING:
            due_ms = int(records.due_ms(job.fields) or 0)
            return due_ms > deadline * 1000  # not due before the drain would give up
        return False

    def _news(self) -> list[JobOutcome]:
        out = []
        for job in self.jobs():
            view = job.as_dict()
            mark = (str(job.status), int(view.get("attempt") or 0))
            if job.status not in FINAL + WAITING or self._reported.get(job.id) == mark:
                continue
            self._reported[job.id] = mark
            out.append((str(view.get("created_at")), JobOutcome(
                id=job.id, type=str(view.get("type")), status=job.status if job.status in FINAL else "retry",
                payload=view.get("payload"), attempt=mark[1], result=view.get("result"),
                error=view.get("last_error"), reason=view.get("reason"),
            )))
        return [o for _, o in sorted(out, key=lambda x: x[0])]
