"""The CLI prints any record it is handed, whatever another writer put in it: a time no
date can show (1e300, the year 3,170,843, a string, NaN) prints as "?", never as a
traceback (OverflowError, ValueError) of `runner job` or `runner workers`."""

from __future__ import annotations

from runner.cli import jobs, workers
from runner.cli.root import utc


def test_a_time_out_of_range_prints_as_a_question_mark() -> None:
    for bad in (1e300, 10**14, -1.0, float("nan"), float("inf"), "soon", None, True):
        assert utc(bad) == "?", bad
    assert utc(0) == "1970-01-01 00:00:00"
    assert utc(253_402_300_799.5, "%Y-%m-%d %H:%M:%S.%f")[:23] == "9999-12-31 23:59:59.500"


def test_runner_job_prints_foreign_times() -> None:
    assert jobs._shown("lease_expires_at", 1e300).startswith("? UTC (1e+300)")
    assert jobs._shown("x_at", 10**14).startswith("? UTC")
    line = jobs._entry({"attempt": 1, "outcome": "failed", "at_ms": 10**17, "started_ms": 1_700_000_000_000})
    assert "at ?Z" in line and "started 2023-11-14T22:13:20.000Z" in line, line
    assert "until ? UTC" in jobs._step(1, {"name": "nap", "kind": "sleep", "status": "ok", "until": 1e300})


def test_runner_workers_prints_foreign_times() -> None:
    row = {"id": "w", "queues": ["fast"], "concurrency": 1, "isolation": "thread", "release": None, "version": "1",
           "started_at": 1e300, "last_seen": None, "running": [{"id": "j", "type": "t", "started": 1e300}]}
    text = workers._human([row])
    assert "? UTC" in text and "j t since ? UTC" in text, text
