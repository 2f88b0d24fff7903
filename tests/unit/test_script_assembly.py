"""Each script declares the includes it calls (``--- @include "topic"``), and is sent with
exactly those and theirs, each helper defined before its first use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from runner.store import sources
from runner.store.sources import COMPOSED, INCLUDE, NAMES, _include, _source, assemble, includes

TOPICS = sorted(p.stem for p in (sources.LUA / "includes").glob("*.lua"))
DEFINITION = re.compile(r"^local (?:function )?([A-Za-z_]\w*)", re.M)


def code(text: str) -> str:
    """Lua text without its comments (a helper named in a comment is no call)."""
    return "\n".join(re.sub(r"--.*$", "", ln) for ln in text.splitlines())


def defined(text: str) -> list[str]:
    return DEFINITION.findall(text)


OWNER = {h: t for t in TOPICS for h in defined(_include(t))}


def called(text: str) -> set[str]:
    """The helpers ``text`` uses: a function where it is called, a constant where it is read
    (a field of a table, ``c.waited``, is neither)."""
    body = code(text)
    return {h for h in OWNER
            if re.search(rf"(?<![.:\w]){h}\s*\(" if h.islower() else rf"(?<![.\w]){h}\b", body)}


def body_of(name: str) -> str:
    return "\n".join(_source(part) for part in COMPOSED.get(name, (name,)))


def test_every_helper_is_defined_in_one_include() -> None:
    """No helper has two definitions, so a script's includes never shadow one another."""
    seen = [h for t in TOPICS for h in defined(_include(t))]
    assert sorted(seen) == sorted(set(seen))
    assert {"clock", "rec_load", "wake", "done_gen", "group_settle"} <= set(OWNER)


@pytest.mark.parametrize("name", NAMES)
def test_a_script_declares_every_include_it_calls_and_no_other(name: str) -> None:
    """What a script's body calls lives in its includes (declared, or declared by them),
    and every include it declares is one it calls."""
    body = body_of(name)
    have = {h for t in includes(body) for h in defined(_include(t))}
    assert called(body) <= have, sorted(called(body) - have)
    for part in COMPOSED.get(name, (name,)):
        text = _source(part)
        assert set(INCLUDE.findall(text)) == {OWNER[h] for h in called(text) - set(defined(text))}, part


@pytest.mark.parametrize("topic", TOPICS)
def test_an_include_declares_what_it_calls(topic: str) -> None:
    """An include names the includes its helpers call (none of its own), and nothing more."""
    text = _include(topic)
    own = set(defined(text))
    assert set(INCLUDE.findall(text)) == {OWNER[h] for h in called(text) - own}
    # Declared at the top, before any definition.
    first = DEFINITION.search(text)
    assert first is not None
    assert all(m.start() < first.start() for m in INCLUDE.finditer(text))


@pytest.mark.parametrize("name", NAMES)
def test_a_helper_is_defined_before_the_script_uses_it(name: str) -> None:
    """The includes go dependencies first: a Lua local exists only below its definition,
    so one used above it would be a nil global at run time."""
    text = code(assemble(body_of(name)))
    for h in OWNER:  # over the whole text at once, each match within one line as a line's would be
        use = re.compile(rf"(?<![.:\w]){h}[^\S\n]*\(" if h.islower() else rf"(?<![.\w]){h}\b")
        at = [text.count("\n", 0, m.start()) for m in re.finditer(rf"^local (?:function )?{h}\b", text, re.M)]
        first = use.search(text)
        if first:
            assert len(at) == 1 and at[0] <= text.count("\n", 0, first.start()), (name, h)


def test_a_script_is_sent_with_only_the_includes_it_declares() -> None:
    """enqueue takes the clock and the batch writer (with the job writer and what that
    writes through: records, idempotency keys, waking, the stats hash's bounded count), not
    the follow-ups' check by id;
    emit the same batch writer; hold only claims; lookup nothing."""
    assert includes(_source("enqueue")) == ["clock", "idem", "ready", "records", "stats", "jobs", "batch"]
    assert includes(_source("emit")) == ["clock", "idem", "ready", "records", "stats", "jobs", "batch"]
    assert includes(_source("hold")) == ["calls", "claims"]
    assert includes(_source("lookup")) == []
    assert assemble("return 1") == "return 1"


def test_an_include_cycle_is_refused_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "includes").mkdir()
    (tmp_path / "includes" / "a.lua").write_text('--- @include "b"\nlocal x = 1\n')
    (tmp_path / "includes" / "b.lua").write_text('--- @include "a"\nlocal y = 1\n')
    monkeypatch.setattr(sources, "LUA", tmp_path)
    sources._include.cache_clear()
    try:
        with pytest.raises(ValueError, match="a -> b -> a includes itself"):
            includes('--- @include "a"\n')
    finally:
        sources._include.cache_clear()


# remove, checkpoint, hold, lookup, resume, watch, seek, seek_list, seek_trail, prune, index_delayed, steps, unstage
# unroster, aside, weigh, statuses and member_page write no time; tick, adopt and alive are given the server's time
# by the ticker (TIME read once per batch, plus the schedules' test offset: store/schedules.py); joblog's, unlisten's
# and stage's expiries are relative (the server sets them); emit_named rewrites a record in place, keeping its time.
TIMELESS = ("remove", "checkpoint", "hold", "lookup", "resume", "tick", "adopt", "alive", "watch", "seek", "seek_list",
            "seek_trail", "prune", "index_delayed", "steps", "joblog", "unlisten", "emit_named", "stage", "unstage",
            "unroster", "aside", "count", "weigh", "statuses", "member_page")


@pytest.mark.parametrize("name", [n for n in NAMES if n not in TIMELESS])
def test_every_script_with_a_time_reads_it_through_the_clock(name: str) -> None:
    """A script that writes a deadline, due time or retention takes it from clock() (the
    server's TIME unless a test passes its own), and its header says so."""
    body = _source(name)
    assert re.search(r"\bclock\(ARGV\[1\]\)", body), name
    assert re.search(r"^-- ARGV\[1\] now, ms \(''", body, re.M), name


def test_each_sha_is_the_sha1_of_the_text_sent() -> None:
    """sources.SHAS (the interpreter's own SHA1 where it has one) is hashlib's SHA1 of each
    script as sent, so EVALSHA finds what SCRIPT LOAD stored."""
    import hashlib

    from runner.store.sources import SHAS, SOURCES

    assert {n: SHAS[n] for n in NAMES} == {n: hashlib.sha1(SOURCES[n].encode()).hexdigest() for n in NAMES}


LONGEST = 60  # lines a Lua function may take, its first and last line included


def _lua_lines(text: str) -> list[str]:
    """Lua lines with strings and comments blanked, so block words are only code."""
    text = re.sub(r"--\[(=*)\[.*?\]\1\]", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"\[(=*)\[.*?\]\1\]", lambda m: '""' + "\n" * m.group(0).count("\n"), text, flags=re.S)
    return [re.sub(r"--.*$", "", re.sub(r"'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"", '""', ln))
            for ln in text.splitlines()]


def functions(text: str) -> list[tuple[str, int, int]]:
    """Every function of a Lua text: (name, first line, lines), by its block words
    (function, if, do and repeat open a block; end and until close one)."""
    stack: list[tuple[str, str, int]] = []
    found: list[tuple[str, int, int]] = []
    for no, ln in enumerate(_lua_lines(text), 1):
        for m in re.finditer(r"\b(function|if|do|repeat|end|until)\b", ln):
            word = m.group(1)
            if word == "function":
                named = re.match(r"function\s+([\w.:]+)", ln[m.start():])
                stack.append((word, named.group(1) if named else "(anonymous)", no))
            elif word in ("if", "do", "repeat"):
                stack.append((word, "", no))
            else:
                kind, name, start = stack.pop()
                if kind == "function":
                    found.append((name, start, no - start + 1))
    assert not stack
    return found


def test_the_function_scanner_measures_a_function_with_nested_blocks() -> None:
    text = "local function f(x)\n  if x then\n    for i = 1, 2 do y('end') end\n  end\n  -- end\nend\n"
    assert functions(text) == [("f", 1, 6)]


@pytest.mark.parametrize("path", sorted(sources.LUA.glob("**/*.lua")), ids=lambda p: p.stem)
def test_no_lua_function_is_longer_than_a_screen(path: Path) -> None:
    """A long function is split into named steps (claim's gates), each readable alone."""
    long = [(name, start, n) for name, start, n in functions(path.read_text()) if n > LONGEST]
    assert long == []
