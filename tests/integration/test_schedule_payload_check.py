"""A SCHEDULE payload is held at load to what any producer's payload is held to: the
nesting limit, no NaN or infinity, integers within 64 bits. It loaded, and then every
tick wrote a job no reader could take (130 levels: unparseable) or a null in place of
NaN; now `runner check`, a worker's start and a hot reload refuse the function file,
naming it, the option's line and the path of the bad value."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from runner.cli import cli

from conftest import Project

HANDLE = "\n\ndef handle(payload, ctx):\n    return None\n"
DEEP = 'D = {"k": 1}\nfor _ in range(130):\n    D = {"k": D}\n'


@pytest.mark.parametrize("src, line, needle", [
    (DEEP + 'SCHEDULE = [{"cron": "* * * * *", "payload": {"d": D}}]', 5,
     "SCHEDULE[0] payload cannot be a job's payload: the nesting depth is over the limit of 120 levels "
     "of arrays and objects (at $.d.k.k."),
    ('SCHEDULE = "* * * * *"\nSCHEDULE_PAYLOAD = {"x": [1, float("nan")]}', 3,
     "SCHEDULE_PAYLOAD cannot be a job's payload: the value at $.x[1] is nan"),
    ('SCHEDULE = [{"cron": "* * * * *", "payload": {"n": -2**63 - 1}}]', 2,
     "SCHEDULE[0] payload cannot be a job's payload: integer at $.n does not fit in 64 bits"),
])
def test_a_schedule_payload_no_job_may_carry_fails_at_load(project: Project, src: str, line: int,
                                                          needle: str) -> None:
    path = str(project.root / "functions" / "ticker.py")
    project.add_function("ticker", "x = 1\n" + src + HANDLE)
    # runner check
    r = CliRunner().invoke(cli, ["--config", str(project.root / "runner.toml"), "check", "--offline", "--json"],
                           env=project.env, catch_exceptions=False)
    assert r.exit_code != 0
    found = [p for p in json.loads(r.stdout)["problems"] if "ticker.py" in p["where"]]
    assert [p["where"] for p in found] == [f"{path}:{line}"], r.stdout
    assert needle in found[0]["message"], found[0]["message"]
    # a worker's start
    rt = project.runtime
    assert "ticker" not in rt.registry.functions and needle in rt.registry.errors[path].message
    # a hot reload refuses it too, keeping the last good version
    project.add_function("ticker", 'SCHEDULE = "* * * * *"' + HANDLE)
    assert "ticker" in rt.reload().functions
    project.add_function("ticker", "x = 1\n" + src + HANDLE)
    reg = rt.reload()
    assert "ticker" in reg.functions and needle in reg.errors[path].message
