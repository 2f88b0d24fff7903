"""CONCURRENCY is checked at load with errors naming file and line, and every producer
compiles RESOURCE_KEY and CONCURRENCY into the same limits lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.catalog import limits, registry, templates
from tests.unit.test_registry import GOOD, error_of, load_one, project


@pytest.mark.parametrize("value,needle", [
    ("0", "the limit must be an integer from 1"),
    ("True", "must be an integer N or"),
    ('"3"', "must be an integer N or"),
    ('{"limit": 2}', 'exactly the keys "key" and "limit"'),
    ('{"key": "t:{user_id}", "limit": 2, "x": 1}', 'exactly the keys "key" and "limit"'),
    ('{"key": "t:{nope}", "limit": 2}', "names field 'nope'"),
    ('{"key": "plain", "limit": 2}', "names no payload field"),
    ('{"key": "t:{user_id}", "limit": 2.5}', "the limit must be an integer"),
])
def test_a_bad_concurrency_is_a_load_error(tmp_path: Path, value: str, needle: str) -> None:
    reg = load_one(tmp_path, f"\nCONCURRENCY = {value}\n" + GOOD)
    msg = error_of(reg)
    assert needle in msg and "CONCURRENCY" in msg
    assert "fn.py:2:" in msg


def test_concurrency_and_resource_compile_into_limits(tmp_path: Path) -> None:
    reg = load_one(tmp_path, 'RESOURCE_KEY = "u{user_id}"\nCONCURRENCY = {"key": "n{name}", "limit": 2}\n' + GOOD)
    fn = reg.get("fn")
    assert fn.render_limits({"user_id": 7, "name": "a"}) == ("u7", "1 r:u7\n2 ck:na")
    assert fn.describe()["concurrency"] == {"limit": 2, "key": "n{name}"}
    assert reg.get("ok").render_limits({"user_id": 1}) == ("", "")


def test_a_global_concurrency_is_one_key_per_function() -> None:
    flow = limits.Flow(concurrency=limits.Concurrency(limit=3))
    assert flow.render("send", {"x": 1}) == ("", "3 c:send")
    keyed = limits.Flow(concurrency=limits.Concurrency(limit=2, key=templates.parse("{t}")))
    with pytest.raises(templates.TemplateError):
        keyed.render("send", {})


def test_a_schedule_carries_the_limits_of_its_payload(tmp_path: Path) -> None:
    reg = load_one(tmp_path, 'CONCURRENCY = 1\nSCHEDULE = "* * * * *"\nSCHEDULE_PAYLOAD = {"user_id": 1}\n' + GOOD)
    assert isinstance(reg, registry.Registry)
    (s,) = reg.get("fn").schedules
    assert s.limits == "1 c:fn"


@pytest.mark.parametrize("value,needle", [
    ("5", 'must be a dict with "limit" and "period"'),
    ('{"limit": 5}', 'must be a dict with "limit" and "period"'),
    ('{"limit": 0, "period": 1}', "the limit must be an integer from 1"),
    ('{"limit": 5, "period": 0}', "period must be a number of seconds"),
    ('{"limit": 5, "period": 1, "key": "a:{nope}"}', "names field 'nope'"),
])
def test_a_bad_rate_limit_is_a_load_error(tmp_path: Path, value: str, needle: str) -> None:
    msg = error_of(load_one(tmp_path, f"\nRATE_LIMIT = {value}\n" + GOOD))
    assert needle in msg and "RATE_LIMIT" in msg and "fn.py:2:" in msg


def test_a_rate_limit_compiles_into_a_bucket_line(tmp_path: Path) -> None:
    reg = load_one(tmp_path, 'RATE_LIMIT = {"limit": 5, "period": 1.5, "key": "u{user_id}"}\nCONCURRENCY = 2\n' + GOOD)
    assert reg.get("fn").render_limits({"user_id": 3}) == ("", "2 c:fn\n5/1500 qk:u3")
    assert reg.get("fn").describe()["rate_limit"] == {"limit": 5, "period": 1.5, "key": "u{user_id}"}


@pytest.mark.parametrize("value", ["10", "-1", "True", '"5"'])
def test_a_bad_priority_is_a_load_error(tmp_path: Path, value: str) -> None:
    msg = error_of(load_one(tmp_path, f"\nPRIORITY = {value}\n" + GOOD))
    assert "PRIORITY must be an integer from 0 to 9" in msg and "fn.py:2:" in msg


def test_priority_is_a_function_default(tmp_path: Path) -> None:
    reg = load_one(tmp_path, "PRIORITY = 4\n" + GOOD)
    assert reg.get("fn").priority == 4 and reg.get("fn").describe()["priority"] == 4
    assert reg.get("ok").priority == 0


def test_a_rendered_key_is_one_budget_for_every_function(tmp_path: Path) -> None:
    """Two functions that render one CONCURRENCY or RATE_LIMIT key take from one budget (as
    a RESOURCE_KEY is one lock): the key names no function."""
    both = ('CONCURRENCY = {"key": "api:{user_id}", "limit": 1}\n'
            'RATE_LIMIT = {"key": "api:{user_id}", "limit": 5, "period": 1}\n')
    reg = registry.load(project(tmp_path, {"a": both + GOOD, "b": both + GOOD}))
    assert not reg.errors
    assert reg.get("a").render_limits({"user_id": 3}) == reg.get("b").render_limits({"user_id": 3})


@pytest.mark.parametrize(("a", "b", "option"), [
    ('CONCURRENCY = {"key": "api:{user_id}", "limit": 1}', 'CONCURRENCY = {"key": "api:{user_id}", "limit": 2}',
     "CONCURRENCY"),
    ('RATE_LIMIT = {"key": "api:{user_id}", "limit": 5, "period": 1}',
     'RATE_LIMIT = {"key": "api:{user_id}", "limit": 5, "period": 2}', "RATE_LIMIT"),
])
def test_two_limits_for_one_key_template_are_a_load_error(tmp_path: Path, a: str, b: str, option: str) -> None:
    """One key template with two different limits would be one budget with two sizes:
    both functions are refused at load, each naming the other and what to change."""
    reg = registry.load(project(tmp_path, {"a": a + "\n" + GOOD, "b": b + "\n" + GOOD, "ok": GOOD}))
    assert set(reg.functions) == {"ok"}
    msgs = {Path(p).stem: str(e) for p, e in reg.errors.items()}
    assert set(msgs) == {"a", "b"}
    assert option in msgs["a"] and "'api:{user_id}'" in msgs["a"] and "function b" in msgs["a"]
    assert "one budget" in msgs["b"] and "function a" in msgs["b"]


def test_two_templates_of_one_shape_sized_apart_are_a_load_error(tmp_path: Path) -> None:
    """``api:{user_id}`` limit 1 and ``api:{name}`` limit 3 render the same keys (their
    literal parts are the same; only the field names differ): one budget with two sizes,
    refused at load in both, each naming the other's template."""
    a = 'CONCURRENCY = {"key": "api:{user_id}", "limit": 1}\n'
    b = 'CONCURRENCY = {"key": "api:{name}", "limit": 3}\n'
    reg = registry.load(project(tmp_path, {"a": a + GOOD, "b": b + GOOD, "ok": GOOD}))
    assert set(reg.functions) == {"ok"}
    msgs = {Path(p).stem: str(e) for p, e in reg.errors.items()}
    assert "'api:{name}'" in msgs["a"] and "function b" in msgs["a"]
    assert "'api:{user_id}'" in msgs["b"] and "function a" in msgs["b"]


def test_one_limit_key_on_two_queues_is_a_load_error(tmp_path: Path) -> None:
    """A rendered CONCURRENCY key is one budget for every function, but a queue's limits
    live in its own partitions: two functions of different queues rendering one key would
    take from two budgets. Refused at load, saying to put them on one queue."""
    a = 'CONCURRENCY = {"key": "api:{user_id}", "limit": 1}\n' + GOOD
    b = a.replace('QUEUE = "fast"', 'QUEUE = "slow"')
    reg = registry.load(project(tmp_path, {"a": a, "b": b, "ok": GOOD}))
    assert set(reg.functions) == {"ok"}
    msgs = {Path(p).stem: str(e) for p, e in reg.errors.items()}
    assert "queue" in msgs["a"] and "function b" in msgs["a"] and "one queue" in msgs["a"]


def test_one_resource_key_on_two_queues_is_a_load_error(tmp_path: Path) -> None:
    """A RESOURCE_KEY is one lock for every function that renders it, but a queue keeps
    its locks in its own partitions: a thread function on one queue and a process function
    on another, both ``user:{user_id}``, ran one user's jobs at the same time. Refused at
    load in both, each error naming the other function, both queues and what to do;
    templates compared by what they render (``user:{user_id}`` and ``user:{name}``)."""
    a = 'RESOURCE_KEY = "user:{user_id}"\n' + GOOD
    b = 'RESOURCE_KEY = "user:{name}"\n' + GOOD.replace('QUEUE = "fast"', 'QUEUE = "slow"')
    same_queue = 'RESOURCE_KEY = "user:{user_id}"\n' + GOOD
    reg = registry.load(project(tmp_path, {"a": a, "b": b, "c": same_queue, "ok": GOOD}))
    assert set(reg.functions) == {"ok"}
    msgs = {Path(p).stem: str(e) for p, e in reg.errors.items()}
    assert set(msgs) == {"a", "b", "c"}
    for name, other in (("a", "b"), ("b", "a"), ("c", "b")):
        msg = msgs[name]
        assert "RESOURCE_KEY" in msg and f"function {other}" in msg, msg
        assert "'fast'" in msg and "'slow'" in msg and "one queue" in msg and "own key" in msg, msg
    assert "function c" not in msgs["a"]  # (one queue's functions share the lock: no clash)


def test_one_resource_key_on_one_queue_loads(tmp_path: Path) -> None:
    """Functions of one queue rendering one RESOURCE_KEY share its lock: they load."""
    a = 'RESOURCE_KEY = "user:{user_id}"\n' + GOOD
    reg = registry.load(project(tmp_path, {"a": a, "b": a, "ok": GOOD}))
    assert set(reg.functions) == {"a", "b", "ok"} and not reg.errors
