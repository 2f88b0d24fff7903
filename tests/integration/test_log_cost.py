"""A job's log and its stream cost Redis what a write appends, not what the key keeps: a
write at the bounds (10,000 chunks and 1 MiB of stream, 500 lines and 256 KiB of log)
costs about what one to a short log or stream does, and the bounds stay exact.

Each test reads what Redis itself saw (SLOWLOG with every command logged), not wall
time: the hosts these run on are shared and loaded."""

from __future__ import annotations

import json
import statistics
from typing import Any

import pytest
from test_big_records import every_command_logged, script_calls

from runner.store import scriptkeys
from runner.worker.joblog import STREAM_BYTES, STREAM_CHUNKS, line, marker

from conftest import Project

KEEP_MS = 600_000
LOG_LINES, LOG_BYTES = 500, 262_144  # the default [retention] logs bounds


@pytest.fixture
def project(any_project: Project) -> Project:
    """On the embedded Valkey and on Debian's redis-server 7.0 (where the cost was measured)."""
    return any_project


def _chunk(a: int, i: int, data: str) -> str:
    return json.dumps({"a": a, "i": i, "ts": 1, "data": data})


def _usec(project: Project, k: Any, key: str, job: str) -> list[int]:
    return [c["usec"] for c in script_calls(project, scriptkeys.keys("joblog", k, log=key, job=k.job(job)))]


def _ratio(full: list[int], short: list[int]) -> float:
    return statistics.median(full) / max(1, statistics.median(short))


def test_a_stream_write_at_its_bounds_costs_what_a_short_streams_does(project: Project) -> None:
    """A stream at its bounds (10,000 chunks of about 100 bytes: 1 MiB) and one of 10
    chunks, written a chunk a call (as a worker writes once a second), interleaved, 60
    times each: Redis's own time per call at the bounds is within a small factor of the
    short one's (each write read the whole kept stream into Lua to total its bytes: 5-6 ms
    a write against 0.3 ms), and the stream stays within both bounds, its newest chunks
    kept in order."""
    sc, r, k = project.runtime.scripts, project.runtime.redis, project.keys()
    full, short = "full", "short"
    pad = "x" * 60
    sc.append_log(k, full, [_chunk(1, i, pad) for i in range(STREAM_CHUNKS)], STREAM_CHUNKS, STREAM_BYTES, KEEP_MS,
                  key=k.stream(full))
    sc.append_log(k, short, [_chunk(1, i, pad) for i in range(10)], STREAM_CHUNKS, STREAM_BYTES, KEEP_MS,
                  key=k.stream(short))
    held = r.llen(k.stream(full))
    assert held > 9_000 and sum(len(c) for c in r.lrange(k.stream(full), 0, -1)) <= STREAM_BYTES
    with every_command_logged(r):
        for n in range(60):
            for job, first in ((full, STREAM_CHUNKS), (short, 10)):
                sc.append_log(k, job, [_chunk(1, first + n, pad)], STREAM_CHUNKS, STREAM_BYTES, KEEP_MS,
                              key=k.stream(job))
        at_bound, small = _usec(project, k, k.stream(full), full), _usec(project, k, k.stream(short), short)
    assert len(at_bound) == len(small) == 60
    print(f"stream write median: at the bounds {statistics.median(at_bound)} us, short {statistics.median(small)} us")
    assert _ratio(at_bound, small) < 3, (sorted(at_bound)[:5], sorted(small)[:5])
    kept = r.lrange(k.stream(full), 0, -1)
    assert len(kept) <= STREAM_CHUNKS and sum(len(c) for c in kept) <= STREAM_BYTES
    numbers = [json.loads(c)["i"] for c in kept]
    assert numbers == list(range(STREAM_CHUNKS + 60 - len(kept), STREAM_CHUNKS + 60))
    assert r.llen(k.stream(short)) == 70


def test_a_log_write_at_its_bounds_costs_what_a_short_logs_does(project: Project) -> None:
    """A log at its default bounds (500 lines of about 520 bytes: 256 KiB, under its
    marker) and one of 10 lines, written a line a call, interleaved, 60 times each: the
    write at the bounds costs within a small factor of the short one's (each read the
    newest 500 lines whole), and the log keeps its bounds, its marker counting every line
    it lost."""
    sc, r, k = project.runtime.scripts, project.runtime.redis, project.keys()
    mark = marker(LOG_LINES, LOG_BYTES)
    text = "y" * 450

    def write(job: str, lines: list[str]) -> None:
        sc.append_log(k, job, lines, LOG_LINES, LOG_BYTES, KEEP_MS, marker=mark)

    write("full", [line("INFO", f"{i} {text}") for i in range(LOG_LINES)])
    write("short", [line("INFO", f"{i} {text}") for i in range(10)])
    assert sum(len(x) for x in r.lrange(k.log("full"), 0, -1)) > LOG_BYTES - 2_000
    with every_command_logged(r):
        for n in range(60):
            for job in ("full", "short"):
                write(job, [line("INFO", f"{n} {text}")])
        at_bound, small = _usec(project, k, k.log("full"), "full"), _usec(project, k, k.log("short"), "short")
    assert len(at_bound) == len(small) == 60
    print(f"log write median: at the bounds {statistics.median(at_bound)} us, short {statistics.median(small)} us")
    assert _ratio(at_bound, small) < 3, (sorted(at_bound)[:5], sorted(small)[:5])
    kept = [json.loads(x) for x in r.lrange(k.log("full"), 0, -1)]
    assert len(kept) <= LOG_LINES and sum(len(x) for x in r.lrange(k.log("full"), 0, -1)) <= LOG_BYTES
    lost = int(kept[0]["msg"].split(" ", 1)[0].strip("[").replace(",", ""))
    assert lost + len(kept) - 1 == LOG_LINES + 60, (lost, len(kept))  # every line: kept or counted
    assert [x["n"] for x in kept[1:]] == list(range(lost, LOG_LINES + 60))
