"""A group's hash written by another producer (a script, an older release, a hand-made
key) renders in every view: its counts and times out of range are shown as absent and
named in "damaged", never taken as they are. A 400-digit created_ms made GET /groups/{id}
answer 500, and total=3000000 was shown, and read as three million outcomes."""

from __future__ import annotations

import falcon.testing
import pytest

from runner.errors import RunnerError
from runner.web import create_app

from conftest import Project

THEN = '["", "gforeign.then", "merge"]'


def _plant(project: Project, group_id: str, **fields: str) -> None:
    key = project.runtime.keys["fast"].group(group_id)
    project.runtime.redis.hset(key, mapping={"then": THEN, "sealed": "1", **fields})


def test_a_foreign_groups_counts_and_times_are_bounded_and_marked_damaged(project: Project) -> None:
    _plant(project, "gforeign", created_ms="9" * 400, completed_ms="-5", total="3000000", done="1" * 30,
           dead="x", cancelled="2")
    client = falcon.testing.TestClient(create_app(project.runtime))
    r = client.simulate_get("/groups/gforeign")
    assert r.status_code == 200, r.text
    view = r.json
    assert sorted(view["damaged"]) == ["completed_ms", "created_ms", "dead", "done", "total"], view
    assert (view["total"], view["done"], view["dead"], view["cancelled"], view["pending"]) == (0, 0, 0, 2, 0)
    assert view["created_at"] is None and view["completed_at"] is None and view["complete"] is True
    assert view["then"]["id"] == "gforeign.then"
    with pytest.raises(RunnerError, match=r"gforeign.*damaged.*total"):
        project.client.group_outcomes("gforeign")
    waited = client.simulate_get("/groups/gforeign?wait=0.1")
    assert waited.status_code == 200 and waited.json["damaged"] == view["damaged"], waited.text


def test_a_foreign_groups_then_field_is_marked_damaged(project: Project) -> None:
    _plant(project, "gthen", total="2", done="1", created_ms="1700000000000")
    project.runtime.redis.hset(project.runtime.keys["fast"].group("gthen"), "then", '{"a": [')
    client = falcon.testing.TestClient(create_app(project.runtime))
    r = client.simulate_get("/groups/gthen")
    assert r.status_code == 200, r.text
    assert r.json["damaged"] == ["then"] and r.json["then"]["id"] == "" and r.json["pending"] == 1
    assert r.json["created_at"] == 1_700_000_000.0
    waited = client.simulate_get("/groups/gthen?wait=0.1")
    assert waited.status_code == 200 and waited.json["damaged"] == ["then"], waited.text
