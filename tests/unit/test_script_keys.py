"""Each script's KEYS are named once (store/scriptkeys.py): the Lua binding and the key
tuple of a call come from that list, bodies read keys only by name, and the header
documents the same list."""

from __future__ import annotations

import re

import pytest
import sourcetrees

from runner.store import scriptkeys
from runner.store.keys import QueueKeys
from runner.store.sources import COMPOSED, LUA, NAMES, SOURCES, _source

HEADER = re.compile(r"^-- KEYS\[(\d+)\] (\w+)", re.M)


def code(text: str) -> str:
    return "\n".join(re.sub(r"--.*$", "", ln) for ln in text.splitlines())


def test_every_script_has_a_named_list() -> None:
    assert set(scriptkeys.KEYS) == set(NAMES)
    for name, names in scriptkeys.KEYS.items():
        assert len(set(names)) == len(names), name  # one name, one key


@pytest.mark.parametrize("path", sorted(LUA.glob("**/*.lua")), ids=lambda p: p.stem)
def test_no_script_body_reads_a_key_by_position(path: object) -> None:
    """Only the generated binding indexes KEYS: a body names each key (K.ready)."""
    text = path.read_text()  # type: ignore[attr-defined]
    assert not re.search(r"\bKEYS\b", code(text))


def test_no_script_is_written_inline() -> None:
    """Every Lua script is a file of lua/, sent through the script transport with its KEYS
    named here: a script written inline in Python went out as a plain EVAL around the
    transport (no routing to its master, no node-wait bound, no WAIT) with a binding
    written by hand. No string of the package calls redis.call."""
    import ast
    from pathlib import Path

    import runner

    found = []
    for path in sorted(Path(runner.__file__).parent.rglob("*.py")):
        text = sourcetrees.text(path)
        if "redis.call" not in text:
            continue
        for node in ast.walk(sourcetrees.parse(text)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and "redis.call" in code(node.value):
                found.append(f"{path.relative_to(path.parents[2])}:{node.lineno}")
    assert not found, f"Lua written inline (make it a file of runner/store/lua/): {found}"


@pytest.mark.parametrize("name", [n for n in NAMES if n != "tick"])
def test_the_header_documents_the_list_in_its_order(name: str) -> None:
    assert [(int(i), n) for i, n in HEADER.findall(_source(name))] == list(enumerate(scriptkeys.KEYS[name], 1))


def test_the_tick_header_documents_its_keys_after_the_enqueue_keys() -> None:
    """A tick is the enqueue script behind a guard: its keys are enqueue's, then its own."""
    enqueue = scriptkeys.KEYS["enqueue"]
    assert scriptkeys.KEYS["tick"][: len(enqueue)] == enqueue
    assert f"-- KEYS[1..{len(enqueue)}]  as enqueue.lua" in _source("tick")
    own = [(int(i), n) for i, n in HEADER.findall(_source("tick"))]
    assert own == list(enumerate(scriptkeys.KEYS["tick"], 1))[len(enqueue):]


@pytest.mark.parametrize("name", NAMES)
def test_a_script_is_sent_with_its_binding_and_uses_only_names_it_binds(name: str) -> None:
    """A K.<name> outside the list would be nil in Lua, not an error: none is."""
    src = SOURCES[name]
    assert src.splitlines()[0] == scriptkeys.binding(name)
    body = code("\n".join(_source(part) for part in COMPOSED.get(name, (name,))))
    used = set(re.findall(r"(?<![\w.])K\.(\w+)", body)) | set(re.findall(r"(?<![\w.])K\[\s*'(\w+)'", body))
    assert used <= set(scriptkeys.KEYS[name]), sorted(used - set(scriptkeys.KEYS[name]))
    assert "K[" not in body or name == "claim"  # claim checks three keys' types in a loop by name


def test_the_binding_names_each_key_by_its_place() -> None:
    assert scriptkeys.binding("renew") == (
        "local K = {leases = KEYS[1], job_prefix = KEYS[2], lim_prefix = KEYS[3], claims = KEYS[4]}")


def test_a_call_sends_the_queue_keys_the_list_names_in_its_order() -> None:
    k = QueueKeys("runner", "fast")
    for name, names in scriptkeys.KEYS.items():
        given = {n: f"given:{n}" for n in names if n in scriptkeys.GIVEN}
        got = scriptkeys.keys(name, k, **given)
        assert got == tuple(given[n] if n in given else getattr(k, n) for n in names)
        assert all(isinstance(v, str) and v for v in got), name
    assert scriptkeys.keys("hold", k) == (k.claims,)
    assert scriptkeys.keys("remove", k, job=k.job("a"))[1] == k.job("a")


def test_a_key_the_caller_must_give_is_asked_for_by_name() -> None:
    with pytest.raises(TypeError, match="lookup: the key 'job' must be given"):
        scriptkeys.keys("lookup", QueueKeys("runner", "fast"))
