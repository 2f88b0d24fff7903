"""The client's shape holds: ``Client`` is a thin facade, its modules issue no Redis
command (the store does), and Redis going away becomes RedisUnavailable in one place
(store/connection.py), read off the source with ``ast``."""

from __future__ import annotations

import ast
from pathlib import Path

import sourcetrees

PACKAGE = Path(__file__).parents[2] / "runner" / "client"
MAX_FACADE_LINES = 300


def redis_calls(source: str) -> list[str]:
    """Each call made on a Redis client or a pipeline: ``<x>.redis.<cmd>(...)``,
    ``redis.<cmd>(...)`` and ``<x>.pipeline(...)``, as text."""
    found = []
    for node in ast.walk(sourcetrees.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        owner = node.func.value
        on_redis = (isinstance(owner, ast.Attribute) and owner.attr == "redis") or (
            isinstance(owner, ast.Name) and owner.id in ("redis", "pipe"))
        if on_redis or node.func.attr == "pipeline":
            found.append(ast.unparse(node.func))
    return found


def built_unavailable(source: str) -> list[str]:
    """Each RedisUnavailable(...) built by hand instead of by connection.unreachable."""
    return [ast.unparse(n) for n in ast.walk(sourcetrees.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "RedisUnavailable"]


def test_the_facade_is_thin() -> None:
    """runner/client/__init__.py stays a facade over the modules that do the work."""
    lines = len((PACKAGE / "__init__.py").read_text(encoding="utf-8").splitlines())
    assert lines < MAX_FACADE_LINES, f"runner/client/__init__.py has {lines} lines"


def test_the_client_issues_no_redis_command_and_maps_outages_in_one_place() -> None:
    """No module of runner/client/ calls Redis (store functions and scripts do), and none
    builds its own RedisUnavailable (connection.unreachable says it once)."""
    files = sorted(PACKAGE.glob("*.py"))
    assert len(files) >= 5
    calls = {f.name: redis_calls(f.read_text(encoding="utf-8")) for f in files}
    assert {f: c for f, c in calls.items() if c} == {}
    built = {f.name: built_unavailable(f.read_text(encoding="utf-8")) for f in files}
    assert {f: b for f, b in built.items() if b} == {}


def test_the_walk_sees_a_redis_call() -> None:
    """The check itself can fail: a command on the runtime's client, a pipeline and a
    hand-built RedisUnavailable are found."""
    bad = ("def f(rt):\n    rt.redis.hget('k', 'f')\n    p = rt.redis.pipeline(transaction=False)\n"
           "    raise RedisUnavailable('x')\n")
    assert redis_calls(bad) == ["rt.redis.hget", "rt.redis.pipeline"]
    assert built_unavailable(bad) == ["RedisUnavailable('x')"]


def test_every_outage_outside_the_store_is_worded_by_the_one_helper() -> None:
    """No module outside runner/store/ builds its own RedisUnavailable (a group cut
    part-way had its own wording and no next step): connection.unreachable words each."""
    root = PACKAGE.parent
    built = {p.relative_to(root).as_posix(): built_unavailable(p.read_text(encoding="utf-8"))
             for p in sorted(root.rglob("*.py"))
             if p.relative_to(root).parts[0] != "store" and p.name != "errors.py"}
    assert {f: b for f, b in built.items() if b} == {}


def test_waiting_has_one_verb_and_the_old_names_are_its_aliases() -> None:
    """"settle" is the worker's write of an outcome (docs/glossary.md); a caller's wait is
    "wait": ``wait``, ``await_job`` and ``wait_group``, with ``settle``, ``asettle`` and
    ``settle_group`` kept as the same functions under the names of earlier releases. The
    package itself (web, CLI, the client's own waits) waits by the one verb, and the
    glossary's wait names it."""
    import re

    from runner.client import Client

    assert Client.settle is Client.wait and Client.asettle is Client.await_job
    assert Client.settle_group is Client.wait_group
    root = PACKAGE.parent
    by_old = {f"{p.relative_to(root).as_posix()}:{i}": ln.strip()
              for p in sorted(root.rglob("*.py")) for i, ln in enumerate(p.read_text().splitlines(), 1)
              if re.search(r"\b(a?settle|settle_group)\((client|job|then|name)", ln)
              or re.search(r"client\.(a?settle|settle_group)\(", ln)}
    assert by_old == {}
    glossary = (root.parent / "docs" / "glossary.md").read_text()
    wait = re.search(r"^- \*\*wait\*\*: (.*)$", glossary, re.M)
    assert wait is not None and "Client.wait" in wait.group(1) and "Client.settle(" not in wait.group(1)
