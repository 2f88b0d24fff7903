"""SCHEDULE options checked at load (each error names the file and the option's line),
and the tick arithmetic: daylight saving time in Europe/Madrid and America/New_York on
both transitions, and what each MISSED policy does after a downtime."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from runner import config
from runner.catalog import registry
from runner.catalog.schedules import Timeline, iso, plan

TOML = "[queues.fast]\nvisibility_timeout = 30\n"
SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
          "properties": {"team": {"type": "string"}}, "additionalProperties": False}
HANDLE = "\ndef handle(payload, ctx):\n    return None\n"


def load(tmp_path: Path, src: str) -> registry.Registry:
    (tmp_path / "functions").mkdir(parents=True, exist_ok=True)
    (tmp_path / "runner.toml").write_text(TOML)
    (tmp_path / "functions" / "job.py").write_text(src + HANDLE)
    (tmp_path / "schemas" / "job").mkdir(parents=True, exist_ok=True)
    (tmp_path / "schemas" / "job" / "v1.json").write_text(json.dumps(SCHEMA))
    return registry.load(config.load(tmp_path / "runner.toml", env={}))


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def test_a_string_schedule_loads_with_its_defaults(tmp_path: Path) -> None:
    """A string SCHEDULE is one schedule named after the function, in UTC, payload {}."""
    reg = load(tmp_path, 'SCHEDULE = "*/15 * * * *"\n')
    (s,) = reg.schedules()
    assert (s.id, s.function, s.queue, s.cron, s.tz, s.payload) == ("job", "job", "fast", "*/15 * * * *", "UTC", {})
    assert (s.missed, s.overlap) == ("latest", "allow")
    assert reg.get("job").describe()["schedules"][0]["cron"] == "*/15 * * * *"


def test_a_list_of_entries_each_with_its_id_tz_and_payload(tmp_path: Path) -> None:
    reg = load(tmp_path, 'SCHEDULE_TZ = "Europe/Madrid"\nMISSED = "all"\nOVERLAP = "skip"\nSCHEDULE = [\n'
                         '  {"cron": "0 9 * * 1-5", "payload": {"team": "ops"}, "id": "morning"},\n'
                         '  {"cron": "0 18 * * *", "tz": "America/New_York", "id": "evening"},\n]\n')
    by_id = {s.id: s for s in reg.schedules()}
    assert set(by_id) == {"job:morning", "job:evening"}
    assert by_id["job:morning"].tz == "Europe/Madrid" and by_id["job:morning"].payload == {"team": "ops"}
    assert by_id["job:evening"].tz == "America/New_York" and by_id["job:evening"].payload == {}
    assert by_id["job:evening"].missed == "all" and by_id["job:evening"].overlap == "skip"


def test_the_digest_changes_with_the_definition(tmp_path: Path) -> None:
    """A worker tells an older definition from its own by the digest."""
    a = load(tmp_path / "a", 'SCHEDULE = "*/15 * * * *"\n').schedules()[0]
    b = load(tmp_path / "b", 'SCHEDULE = "*/15 * * * *"\n').schedules()[0]
    c = load(tmp_path / "c", 'SCHEDULE = "*/15 * * * *"\nSCHEDULE_PAYLOAD = {"team": "x"}\n').schedules()[0]
    assert a.digest == b.digest != c.digest


@pytest.mark.parametrize("src,needle,line", [
    ('SCHEDULE = "61 * * * *"\n', "bad cron expression '61 * * * *': Bad minute", 1),
    ('x = 1\nSCHEDULE = "* * *"\n', "has 3 field(s); expected 5: minute hour day-of-month month day-of-week", 2),
    ('SCHEDULE = "0 0 30 2 *"\n', "bad cron expression '0 0 30 2 *'", 1),
    ('SCHEDULE = "*/5 * * * * *"\n', "has 6 field(s); expected 5", 1),
    ('SCHEDULE = "* * * * *"\nSCHEDULE_TZ = "Europe/Madird"\n', "unknown time zone 'Europe/Madird'; "
     "did you mean 'Europe/Madrid'?", 2),
    ('SCHEDULE = [{"cron": "* * * * *", "tz": "Mars/Olympus"}]\n', "unknown time zone 'Mars/Olympus'", 1),
    ('SCHEDULE = "* * * * *"\nSCHEDULE_PAYLOAD = {"team": 7}\n',
     "SCHEDULE_PAYLOAD does not validate against the v1 schema: $.team: 7 is not of type \"string\"", 2),
    ('SCHEDULE = [{"cron": "* * * * *", "payload": {"oops": 1}}]\n',
     "SCHEDULE[0] payload does not validate against the v1 schema: $: Additional properties", 1),
    ('SCHEDULE = "* * * * *"\nMISSED = "never"\n', "MISSED must be one of 'skip', 'latest', 'all'", 2),
    ('SCHEDULE = "* * * * *"\nOVERLAP = True\n', "OVERLAP must be one of 'skip', 'allow'", 2),
    ('SCHEDULE = [{"cron": "* * * * *"}, {"cron": "0 * * * *", "id": "b"}]\n', "SCHEDULE[0] needs an 'id'", 1),
    ('SCHEDULE = [{"cron": "* * * * *", "id": "a"}, {"cron": "0 * * * *", "id": "a"}]\n', "used twice", 1),
    ('SCHEDULE = [{"cron": "* * * * *", "every": 5}]\n', "unknown key(s) every", 1),
    ('SCHEDULE = 15\n', "SCHEDULE must be a cron string", 1),
    ('SCHEDULEE = "* * * * *"\n', "SCHEDULEE is not an option; did you mean SCHEDULE?", 1),
    # Held to what any producer's payload may carry ([api] max_body_bytes, 1 MiB by default).
    ('SCHEDULE = "* * * * *"\nSCHEDULE_PAYLOAD = {"team": "a" * 2_000_000}\n',
     "SCHEDULE_PAYLOAD is 2,000,011 bytes of JSON, over [api] max_body_bytes = 1,048,576", 2),
    ('SCHEDULE = [{"cron": "* * * * *", "id": "big", "payload": {"team": "a" * 2_000_000}}]\n',
     "SCHEDULE[0] payload is 2,000,011 bytes of JSON, over [api] max_body_bytes", 1),
])
def test_a_bad_schedule_is_an_error_at_load_with_file_and_line(tmp_path: Path, src: str, needle: str,
                                                              line: int) -> None:
    """Each mistake is reported at load with the file, the line of the option and what to
    fix; the function is not loaded (a reload keeps its last good version)."""
    reg = load(tmp_path, src)
    (err,) = reg.errors.values()
    assert needle in err.message, err.message
    assert err.path.endswith("job.py") and err.line == line
    assert "job" not in reg.functions


def test_a_seconds_field_is_for_tests_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNNER_TEST_SCHEDULES", "1")
    (s,) = load(tmp_path, 'SCHEDULE = "*/2 * * * * *"\n').schedules()
    assert s.timeline.next_after(ms("2026-01-01T00:00:00")) == ms("2026-01-01T00:00:02")


def test_options_without_schedule_are_a_warning(tmp_path: Path) -> None:
    reg = load(tmp_path, 'MISSED = "all"\n')
    assert not reg.errors and any("MISSED set without SCHEDULE" in w for w in reg.warnings)


def ticks(cron: str, tz: str, start: str, end: str) -> list[str]:
    """Every tick in (start, end], as ISO 8601 UTC."""
    line, out, t = Timeline(cron, tz), [], ms(start)
    while (t := line.next_after(t)) <= ms(end):
        out.append(iso(t))
    return out


def test_dst_madrid_spring_forward_runs_a_skipped_time_once() -> None:
    """02:30 does not exist on 2026-03-29 in Madrid (02:00 -> 03:00): it runs once, at
    the jump (03:00 CEST = 01:00Z), and the days around it at 02:30 local."""
    assert ticks("30 2 * * *", "Europe/Madrid", "2026-03-27T12:00", "2026-03-30T12:00") == [
        "2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]


def test_dst_madrid_fall_back_runs_a_repeated_time_once() -> None:
    """02:30 happens twice on 2026-10-25 in Madrid (03:00 -> 02:00): it runs once."""
    assert ticks("30 2 * * *", "Europe/Madrid", "2026-10-24T12:00", "2026-10-26T12:00") == [
        "2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]


def test_dst_madrid_an_hourly_schedule_follows_the_real_hours() -> None:
    """Hourly runs every real hour: 23 ticks on the short day, 25 on the long one."""
    assert len(ticks("0 * * * *", "Europe/Madrid", "2026-03-28T23:00", "2026-03-29T22:00")) == 23
    assert len(ticks("0 * * * *", "Europe/Madrid", "2026-10-24T22:00", "2026-10-25T23:00")) == 25


def test_dst_new_york_both_transitions() -> None:
    """New York: 02:30 on 2026-03-08 (02:00 -> 03:00) runs once at 03:00 EDT; 01:30 on
    2026-11-01 (02:00 -> 01:00) runs once, not twice."""
    assert ticks("30 2 * * *", "America/New_York", "2026-03-07T12:00", "2026-03-09T12:00") == [
        "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]
    assert ticks("30 1 * * *", "America/New_York", "2026-10-31T12:00", "2026-11-02T12:00") == [
        "2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]


def test_a_tick_asked_for_inside_a_repeated_hour_is_never_in_the_past() -> None:
    """cronsim can answer a time before its start in the repeated hour; the timeline never does."""
    line = Timeline("30 2 * * *", "Europe/Madrid")
    assert iso(line.next_after(ms("2026-10-25T01:15"))) == "2026-10-26T01:30:00Z"


MINUTE = Timeline("* * * * *", "UTC")


def test_on_time_tick_fires_under_every_policy() -> None:
    for policy in ("skip", "latest", "all"):
        (step,) = plan(MINUTE, policy, ms("2026-01-01T00:00"), ms("2026-01-01T00:01:00.200"))
        assert (iso(step.tick_ms), step.fire, step.missed, step.late_ms) == ("2026-01-01T00:01:00Z", True, 0, 200)


def test_missed_policies_after_a_downtime_of_three_ticks() -> None:
    """Down from 00:00:30 to 00:03:40: the ticks 00:01, 00:02 and 00:03 were missed
    (00:03 is 40 s late, past its 30 s grace). skip drops all three; latest fires 00:03
    once; all fires each, oldest first."""
    floor, now = ms("2026-01-01T00:00"), ms("2026-01-01T00:03:40")
    (skip,) = plan(MINUTE, "skip", floor, now)
    assert (iso(skip.tick_ms), skip.fire, skip.missed) == ("2026-01-01T00:03:00Z", False, 3)
    (latest,) = plan(MINUTE, "latest", floor, now)
    assert (iso(latest.tick_ms), latest.fire, latest.missed) == ("2026-01-01T00:03:00Z", True, 2)
    every = plan(MINUTE, "all", floor, now)
    assert [(iso(s.tick_ms), s.fire) for s in every] == [
        ("2026-01-01T00:01:00Z", True), ("2026-01-01T00:02:00Z", True), ("2026-01-01T00:03:00Z", True)]


def test_skip_still_fires_the_current_tick_after_a_downtime() -> None:
    """Back within the newest tick's grace: that tick is on time and fires; the older ones
    are dropped."""
    (step,) = plan(MINUTE, "skip", ms("2026-01-01T00:00"), ms("2026-01-01T00:03:10"))
    assert (iso(step.tick_ms), step.fire, step.missed) == ("2026-01-01T00:03:00Z", True, 2)


def test_all_is_bounded() -> None:
    """A day down runs the newest 100 missed ticks, not 1,440."""
    steps = plan(MINUTE, "all", ms("2026-01-01T00:00"), ms("2026-01-02T00:00:30"))
    assert len(steps) == 100 and iso(steps[-1].tick_ms) == "2026-01-02T00:00:00Z"
    assert steps[0].missed == 1440 - 100 and all(s.fire for s in steps)


def test_nothing_due_plans_nothing() -> None:
    assert plan(MINUTE, "all", ms("2026-01-01T00:01"), ms("2026-01-01T00:01:59")) == []
