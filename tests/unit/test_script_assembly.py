"""Each script carries the helpers of _lib.lua it calls, and only those."""

from __future__ import annotations

import re

import pytest

from runner.store.sources import NAMES, _helpers, _source, assemble

LIB = _source("_lib")
HELPERS = dict(_helpers(LIB))


def defined(src: str) -> set[str]:
    return set(re.findall(r"^local (?:function )?([A-Za-z_]\w*)", src, re.M)) & set(HELPERS)


def test_the_library_splits_into_its_top_level_definitions() -> None:
    """Every column-0 ``local`` of the library is one helper, its comment included."""
    assert set(HELPERS) == set(re.findall(r"^local (?:function )?([A-Za-z_]\w*)", LIB, re.M))
    assert "Wake idle workers" in HELPERS["wake"]
    assert HELPERS["flush"].rstrip().endswith("end")
    # In order, the pieces hold every line of the library past its own header comment.
    lines = [ln for ln in "\n".join(HELPERS.values()).splitlines() if ln.strip()]
    lib_lines = [ln for ln in LIB.splitlines() if ln.strip()]
    assert lines == lib_lines[len(lib_lines) - len(lines):]
    assert all(ln.startswith("--") for ln in lib_lines[: len(lib_lines) - len(lines)])


@pytest.mark.parametrize("name", NAMES)
def test_a_script_defines_every_helper_it_or_its_helpers_name(name: str) -> None:
    have = defined(assemble(LIB, _source(name)))
    texts = [_source(name)] + [HELPERS[h] for h in have]
    named = {h for h in HELPERS for t in texts if re.search(rf"\b{h}\b", t)}
    assert named <= have


def test_a_script_leaves_out_what_it_never_names() -> None:
    """enqueue reads the clock, names idempotency keys, writes a record (through the
    job writer it shares with ack and relay), counts it in the census and wakes workers,
    nothing more (not the follow-ups' check by id);
    release_limits pulls in what waking a parked job needs; the clock needs nothing."""
    assert defined(assemble(LIB, _source("enqueue"))) == {"clock", "idem_key", "wake", "rec_encode", "now_text",
                                                          "fmt_now_n",
                                                          "census", "jobs_acc", "job_put", "job_fields",
                                                          "jobs_flush"}
    assert defined(assemble(LIB, "release_limits(a, b, c, d, e, f, g, h)")) == {
        "release_limits", "parse_limits", "LIMIT_LINE", "wake_parked", "purge_holders", "on_holders", "heal_limit",
        "RESERVE_MS",
        "wake", "to_ready"}
    assert defined(assemble(LIB, "tally('x') flush(k)")) == {"acc", "tally", "flush"}
    assert defined(assemble(LIB, "clock(ARGV[1])")) == {"clock"}
    assert defined(assemble(LIB, "return 1")) == set()


# remove, checkpoint, lookup, resume and watch write no time; tick, adopt and alive are given the server's time
# by the ticker (TIME read once per batch, plus the schedules' test offset: store/schedules.py).
TIMELESS = ("remove", "checkpoint", "lookup", "resume", "tick", "adopt", "alive", "watch")


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
