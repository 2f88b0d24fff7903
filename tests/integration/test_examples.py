"""The shipped examples (functions/ and schemas/ of the repository) load as they are and
behave as their docstrings say, through the CLI and a real worker: a sent email, a
report, and a charge that succeeds, one that is retried, and one that fails for good."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner import config as config_mod
from runner.catalog import registry
from runner.store.embedded import Server

from conftest import REPO, Project, make_project


@pytest.fixture
def examples(tmp_path: Path, server: Server) -> Iterator[Project]:
    """A project with the repository's functions/ and schemas/; its workers stopped after."""
    p = make_project(tmp_path / "app", server, examples=True)
    yield p
    p.stop_all()
    if p._runtime is not None:
        p._runtime.close()


def cli(p: Project, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "runner.cli", "--config", str(p.root / "runner.toml"), *args],
                          cwd=p.root, env=p.env, capture_output=True, text=True, timeout=60)


def enqueue(p: Project, type_: str, payload: dict[str, Any]) -> str:
    out = cli(p, "enqueue", type_, json.dumps(payload), "--json")
    assert out.returncode == 0, out.stderr
    return str(json.loads(out.stdout)["id"])


def test_every_shipped_example_loads_with_the_shipped_config() -> None:
    """Nothing in functions/ or schemas/ fails or warns with the shipped runner.toml."""
    reg = registry.load(config_mod.load(REPO / "runner.toml", env={}))
    assert reg.errors == {}
    assert reg.warnings == ()
    assert {"send_email", "refresh_report", "charge_card"} <= set(reg.functions)


def test_charge_card_succeeds_retries_and_fails_for_good(examples: Project) -> None:
    """The three test cards of charge_card: one charged at once, one the provider turns
    away twice (runner.Retry) before it goes through, one declined (runner.PermanentFailure:
    straight to the dead-letter list, one attempt); an invalid card number never enqueues."""
    ok = enqueue(examples, "charge_card", {"order_id": "o-1", "amount_cents": 1250, "card": "4242424242424242"})
    busy = enqueue(examples, "charge_card", {"order_id": "o-2", "amount_cents": 990, "card": "4000000000000119"})
    declined = enqueue(examples, "charge_card", {"order_id": "o-3", "amount_cents": 500, "card": "4000000000000002"})
    examples.spawn_worker("fast")
    c = examples.client
    done = c.wait(ok, timeout_s=15).as_dict()
    assert done["status"] == "done" and done["attempt"] == 1 and done["result"]["amount_cents"] == 1250
    retried = c.wait(busy, timeout_s=20).as_dict()
    assert retried["status"] == "done" and retried["attempt"] == 3
    assert [h["outcome"] for h in retried["history"]] == ["retry", "retry", "done"]
    dead = c.wait(declined, timeout_s=15).as_dict()
    assert dead["status"] == "dead" and dead["attempt"] == 1
    assert dead["last_error"]["type"] == "PermanentFailure" and "declined" in dead["last_error"]["message"]
    listed = cli(examples, "dead", "ls", "--json")
    assert [j["id"] for j in json.loads(listed.stdout)["fast"]["jobs"]] == [declined]
    refused = cli(examples, "enqueue", "charge_card", '{"order_id": "o-4", "amount_cents": 1, "card": "42"}')
    assert refused.returncode == 1 and "$.card" in refused.stderr


def test_send_email_and_refresh_report_run_as_documented(examples: Project) -> None:
    """send_email writes its message to the outbox under its idempotency key; the report
    is written whole to the reports folder."""
    mail = enqueue(examples, "send_email", {"user_id": 7, "to": ["ann@example.com"], "name": "Ann",
                                            "template": "welcome"})
    report = enqueue(examples, "refresh_report", {"report_id": "weekly", "chunks": 3, "chunk_seconds": 0.01})
    examples.spawn_worker("fast")
    examples.spawn_worker("slow")
    assert examples.client.wait(mail, timeout_s=15).as_dict()["result"] == {"sent_to": ["ann@example.com"],
                                                                              "via": "outbox"}
    assert json.loads((examples.root / "outbox" / "7_welcome.json").read_text())["body"] == "Welcome aboard, Ann!"
    assert examples.client.wait(report, timeout_s=30).as_dict()["status"] == "done"
    assert (examples.root / "reports" / "weekly.json").exists()
