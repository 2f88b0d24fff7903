"""ops/alerts.yml: every metric it names is one /metrics exports, promtool accepts the
file, and each alert's expression fires on the situation it is named for and stays quiet
on a healthy one (promtool's rule unit tests over synthetic series)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import falcon.testing
import pytest
import yaml

from runner.web import create_app

from conftest import REPO, Project

ALERTS = REPO / "ops" / "alerts.yml"


def alert_exprs() -> dict[str, str]:
    doc = yaml.safe_load(ALERTS.read_text())
    return {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"]}


def test_alerts_name_only_exported_metrics(project: Project) -> None:
    """A renamed metric must not leave an alert that can never fire."""
    client = falcon.testing.TestClient(create_app(project.runtime))
    exported = set(re.findall(r"^# TYPE (\S+) (\S+)", client.simulate_get("/metrics").text, re.M))
    names = set()
    for name, kind in exported:
        names.add(name)
        if kind == "counter":
            names.add(name + "_total")
        if kind == "histogram":
            names.update(name + s for s in ("_bucket", "_sum", "_count"))
    used = {m for expr in alert_exprs().values() for m in re.findall(r"\brunner_[a-z_]+", expr)}
    assert used and used <= names, used - names


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    body = ",".join(f'{k}="{v}"' for k, v in {"instance": "web-1", **labels}.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def _settled(succeeded: str, dead: str = "0x60") -> list[dict[str, str]]:
    out = [_series("runner_jobs_succeeded_total", succeeded, queue="fast", function="f")]
    for c in ("retried", "duplicates"):
        out.append(_series(f"runner_jobs_{c}_total", "0x60", queue="fast", function="f"))
    out.append(_series("runner_jobs_dead_total", dead, queue="fast", function="f"))
    return out


def _case(alert: str, at: str, series: list[dict[str, str]], fires: bool) -> dict[str, Any]:
    """One promtool test: count(expr) is 1 when the alert's condition holds, absent if not
    (counting keeps the check independent of the expression's value and annotations)."""
    expr = f"count({alert_exprs()[alert]})"
    return {"interval": "1m", "input_series": series, "promql_expr_test": [
        {"expr": expr, "eval_time": at, "exp_samples": [{"labels": "{}", "value": 1}] if fires else []}]}


def _latency(bucket_30s: str, bucket_60s: str) -> list[dict[str, str]]:
    lv = {"queue": "fast", "function": "f"}
    return [_series("runner_job_latency_seconds_bucket", bucket_30s, le="30.0", **lv),
            _series("runner_job_latency_seconds_bucket", bucket_60s, le="60.0", **lv),
            _series("runner_job_latency_seconds_bucket", bucket_60s, le="+Inf", **lv)]


def test_alert_rules_fire_on_what_they_name(tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed here (Debian, Ubuntu: apt-get install prometheus runs this check)")
    check = subprocess.run([promtool, "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    growing = [_series("runner_queue_ready_jobs", "0+10x60", queue="fast"),
               _series("runner_queue_oldest_ready_age_seconds", "0+60x60", queue="fast")]
    tests = [
        _case("RunnerQueueGrowingWithoutConsumers", "20m", growing + _settled("5x60"), True),
        _case("RunnerQueueGrowingWithoutConsumers", "20m", growing + _settled("5+1x60"), False),
        # The same figures scraped from two web processes count once.
        _case("RunnerQueueGrowingWithoutConsumers", "20m", growing + _settled("5x60") + [
            {**s, "series": s["series"].replace("web-1", "web-2")} for s in growing + _settled("5x60")], True),
        _case("RunnerInFlightGrowing", "45m", [_series("runner_queue_in_flight_jobs", "1+1x60", queue="fast")], True),
        _case("RunnerInFlightGrowing", "45m", [_series("runner_queue_in_flight_jobs", "3x60", queue="fast")], False),
        _case("RunnerLeasesNotReclaimed", "10m", [_series("runner_queue_lease_expired_jobs", "2x60", queue="fast")],
              True),
        _case("RunnerLeasesNotReclaimed", "10m",
              [_series("runner_queue_lease_expired_jobs", "2 0 " * 30, queue="fast")], False),
        _case("RunnerScheduledNotPromoted", "10m",
              [_series("runner_queue_scheduled_due_jobs", "1x60", queue="fast")], True),
        _case("RunnerDeadLettersGrowing", "20m", _settled("0x60", dead="0+1x60"), True),
        _case("RunnerDeadLettersGrowing", "20m", _settled("0x60", dead="3x60"), False),
        _case("RunnerEnqueueToStartLatencyHigh", "20m", _latency("0x60", "0+10x60"), True),
        _case("RunnerEnqueueToStartLatencyHigh", "20m", _latency("0+10x60", "0+10x60"), False),
        _case("RunnerRedisUnreachable", "5m", [_series("runner_redis_up", "0x10")], True),
        _case("RunnerRedisUnreachable", "5m", [_series("runner_redis_up", "1x10")], False),
        # (a master of a Redis Cluster stalled: Redis answers, one partition does not)
        _case("RunnerPartitionUnreachable", "5m",
              [_series("runner_partition_unreachable", "1x10", queue="fast", partition="2", tag="fast:2")], True),
        _case("RunnerPartitionUnreachable", "5m",
              [_series("runner_partition_unreachable", "0x10", queue="fast", partition="2", tag="fast:2")], False),
    ]
    spec = tmp_path / "alerts_test.yml"
    spec.write_text(json.dumps({"rule_files": [str(ALERTS)], "evaluation_interval": "1m", "tests": tests}))
    run = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
