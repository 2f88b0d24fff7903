"""The benchmark's light-load table (issue 53) reads the latency scenario's figures of
every system and sets runner's beside Huey's; a full run takes fifty minutes, so a
table that lost a column or a ratio would only show then. These check it at once."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _report() -> Any:
    sys.path.insert(0, str(BENCH))
    try:
        from harness import report
    finally:
        sys.path.remove(str(BENCH))
    return report


def _one(v: float) -> dict[str, float]:
    return {"median": v, "min": v, "max": v}


def _system(label: str, worker: float, redis: float, cmds: float, scripts: float) -> dict[str, Any]:
    return {"label": label, "note": "", "latency": {"p50_ms": _one(0.6), "p99_ms": _one(1.2)},
            "light": {"worker_cpu_ms_per_job": _one(worker), "redis_cpu_ms_per_job": _one(redis),
                      "commands_per_job": _one(cmds), "script_calls_per_job": _one(scripts)}}


def test_the_light_load_table_sets_each_system_beside_huey() -> None:
    report = _report()
    res = {"config": {"rate": 500.0}, "systems": {
        "runner": _system("runner 2", 0.5, 0.2, 20.0, 2.5),
        "runner-1": _system("runner 1", 0.25, 0.1, 14.0, 2.0),
        "huey": _system("huey", 0.5, 0.2, 5.0, 0.0),
        "celery": {"label": "celery", "note": "", "light": None},  # its latency run failed
    }}
    lines = report.light_table(res)
    rows = [ln for ln in lines if ln.startswith("| runner") or ln.startswith("| huey")]
    assert len(rows) == 3
    assert "500 jobs/s offered" in lines[0]
    assert rows[0].split(" | ")[2:8] == ["0.500", "1.00x", "0.200", "1.00x", "20.0 (2.50)", "0.60 / 1.20 |"]
    assert rows[1].split(" | ")[2:6] == ["0.250", "0.50x", "0.100", "0.50x"]
    assert rows[2].split(" | ")[3] == ""  # Huey over itself: no ratio
    machine = {"cpus": 2, "python": "3", "redis": "r"}
    assert "**Light load**" in report.markdown({**res, "date": "d", "machine": machine,
                                                "config": {"mode": "quick", "reps": 1}})
