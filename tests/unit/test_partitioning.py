"""What `runner check` says of partitioned queues: which function keys hold per partition
only, and what a change of count implies against the recorded tags (no Redis)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_registry import project

from runner.catalog import registry
from runner.catalog.partitioning import Change, changes, split_keys

CASES = [
    # (options, warned options): placed by the first key; a later one holds across
    # partitions only when it is a function of the first key's fields
    ('RESOURCE_KEY = "user:{user_id}"', []),
    ('IDEMPOTENCY_KEY = "{user_id}:{name}"\nRESOURCE_KEY = "user:{user_id}"', []),
    ('IDEMPOTENCY_KEY = "{name}"\nRESOURCE_KEY = "user:{user_id}"', ["IDEMPOTENCY_KEY"]),
    ('RESOURCE_KEY = "user:{user_id}"\nCONCURRENCY = {"key": "{user_id}:{name}", "limit": 2}', []),
    ('RESOURCE_KEY = "user:{user_id}"\nCONCURRENCY = {"key": "{name}", "limit": 2}', ["CONCURRENCY"]),
    ('RESOURCE_KEY = "user:{user_id}"\nCONCURRENCY = 3', ["CONCURRENCY"]),
    ('CONCURRENCY = 3\nRATE_LIMIT = {"limit": 5, "period": 1}', []),
    ('CONCURRENCY = 3\nIDEMPOTENCY_KEY = "{name}"', []),
    ('IDEMPOTENCY_KEY = "{name}"', []),
]


@pytest.mark.parametrize(("options", "warned"), CASES)
def test_split_keys_names_the_keys_that_hold_per_partition(tmp_path: Path, options: str, warned: list[str]) -> None:
    src = f'QUEUE = "fast"\n{options}\n\ndef handle(payload, ctx):\n    pass\n'
    reg = registry.load(project(tmp_path, {"fn": src}))
    fn = reg.get("fn")
    said = split_keys(fn, 4)
    assert [w.split(":")[0] for w in said] == warned
    assert all("on a queue of 4 partitions" in w for w in said)
    assert split_keys(fn, 1) == []


def test_a_change_names_its_new_and_draining_tags() -> None:
    own = {"fast": ("fast", "fast:2", "fast:3", "fast:4"), "slow": ("slow",)}
    recorded = {"fast": ["fast", "fast:2", "fast:29", "fast:30"], "slow": ["slow"]}
    (c,) = changes({"fast": 4, "slow": 1}, own, recorded, {"fast|fast:29": 5, "fast|fast:30": 2},
                   {"fast": [4, 6], "slow": [1]})
    assert (c.queue, c.added, c.draining, c.draining_jobs) == ("fast", ("fast:3", "fast:4"), ("fast:29", "fast:30"), 7)
    assert c.counts == (6,)
    msg = c.message()
    assert msg is not None and "{fast:29}, {fast:30}" in msg and "7 job(s)" in msg
    # The keys the old count placed are looked up where it put them: said, with its cost.
    assert "placed by partitions = 6" in msg and "look-up" in msg
    # Every key kind a job is routed by is named, a DEBOUNCE burst's key among them.
    assert all(kind in msg for kind in ("idempotency", "RESOURCE_KEY", "CONCURRENCY", "RATE_LIMIT", "DEBOUNCE"))
    # Nothing recorded yet (a first deploy): nothing is new, nothing drains.
    (first,) = changes({"fast": 4}, {"fast": own["fast"]}, {}, {})
    assert first.added == first.draining == () and first.message() is None
    assert Change("q", 1, (), ("q:1",), 0).message().endswith("hold nothing for a retention")  # type: ignore[union-attr]
