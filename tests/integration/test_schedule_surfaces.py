"""What a user sees of schedules: `runner schedules` (table and --json), `runner schedules
trigger`, GET /schedules (auth as every other GET, and in the OpenAPI document),
/metrics, `runner check` on a broken schedule, and the dashboard's schedules panel in
headless Chromium."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result
from schedulekit import TEST_ENV, add_function, at, log_has, ms, set_clock, ticks
from test_dashboard import browser, press, read, until, visit  # noqa: F401  (the browser fixture)
from test_web_support import gunicorn

from runner.cli import cli

from conftest import Project, wait_for

B = "2030-01-01T00:00"
TOKEN = "schedules-token"


def run(project: Project, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--config", str(project.root / "runner.toml"), *args],
                              env={**project.env, **TEST_ENV}, catch_exceptions=False)


def fired_once(project: Project) -> None:
    """A worker, and the clock moved to just before +30: the tick at +30 fires and its job runs."""
    add_function(project, "report", 'SCHEDULE = "*/30 * * * * *"\nSCHEDULE_PAYLOAD = {"kind": "daily"}')
    set_clock(project, ms(B) + 20_000)
    project.spawn_worker("fast", env=TEST_ENV, log_name="worker.log")
    wait_for(lambda: log_has(project, "schedules: 1 active"), timeout=30, what="the worker to adopt")
    set_clock(project, ms(B) + 29_700)
    wait_for(lambda: ticks(project, "report") == [at("2030-01-01T00:00:30")], timeout=15, what="the tick")


def listing(project: Project) -> dict[str, Any]:
    result = run(project, "schedules", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["schedules"]
    return row  # type: ignore[no-any-return]


def test_runner_schedules_lists_and_triggers(project: Project) -> None:
    """--json has id, function, cron, tz, next, last and last_job {id, status}; the table
    shows the same; trigger runs one tick now (a job with "trigger": "manual"), the
    schedule's own ticks unchanged; an unknown id is refused with what to do."""
    fired_once(project)
    wait_for(lambda: listing(project)["last_job"]["status"] == "done", timeout=15, what="the tick's job")
    row = listing(project)
    assert row["id"] == "report" and row["function"] == "report" and row["cron"] == "*/30 * * * * *"
    assert row["tz"] == "UTC" and row["last"] == at("2030-01-01T00:00:30")
    assert row["next"] == at("2030-01-01T00:01:00") and row["state"] == "active"
    assert row["payload"] == {"kind": "daily"} and row["counts"]["fired"] == 1
    tick_job = row["last_job"]["id"]

    table = run(project, "schedules")
    assert table.exit_code == 0
    header, line = table.stdout.splitlines()
    assert header.split()[:6] == ["id", "function", "cron", "tz", "next", "last"]
    assert line.startswith("report") and at("2030-01-01T00:00:30") in line and f"{tick_job} done" in line

    trig = run(project, "schedules", "trigger", "report", "--json")
    assert trig.exit_code == 0, trig.output
    job = json.loads(trig.stdout)
    assert job["type"] == "report" and job["status"] == "queued"
    done = project.client.wait(job["id"], timeout_s=15).as_dict()
    assert done["status"] == "done" and done["schedule"] == "report" and done["trigger"] == "manual"
    assert done["result"] == {"kind": "daily"}  # the handler returns its payload (a done job keeps none)
    row = listing(project)
    assert row["last_job"]["id"] == job["id"] and row["last"] == at("2030-01-01T00:00:30")
    assert row["counts"]["manual"] == 1 and row["counts"]["fired"] == 1

    nope = run(project, "schedules", "trigger", "nope")
    assert nope.exit_code == 1 and "no schedule 'nope' (have: report)" in nope.output


def test_get_schedules_and_metrics_over_http(project: Project) -> None:
    """GET /schedules answers the same view, behind the token like other GETs, and is
    in the OpenAPI document; /metrics counts the fired tick and its lateness."""
    fired_once(project)
    with gunicorn(project, token=TOKEN, env=TEST_ENV) as web:
        assert web.session.get(web.url + "/schedules", timeout=5).status_code == 401
        r = web.get("/schedules")
        assert r.status_code == 200, r.text
        (row,) = r.json()["schedules"]
        assert row["id"] == "report" and row["last"] == at("2030-01-01T00:00:30")
        assert set(row["last_job"]) == {"id", "status"}
        assert web.get("/schedules?x=1").status_code == 400
        doc = web.get("/openapi.json").json()
        assert "/schedules" in doc["paths"] and "Schedule" in doc["components"]["schemas"]
        text = web.get("/metrics").text
        assert 'runner_schedule_ticks_fired_total{function="report",schedule="report"} 1.0' in text
        assert 'runner_schedule_ticks_skipped_total{function="report",reason="missed",schedule="report"} 0.0' in text
        assert "runner_schedule_late_seconds_total" in text
        job = web.get(f"/jobs/{row['last_job']['id']}").json()
        assert job["schedule"] == "report" and job["tick"] == at("2030-01-01T00:00:30")


def test_runner_check_fails_on_a_broken_schedule(project: Project) -> None:
    add_function(project, "nightly", 'SCHEDULE = "0 25 * * *"')
    result = CliRunner().invoke(cli, ["--config", str(project.root / "runner.toml"), "check", "--offline"],
                                env=project.env, catch_exceptions=False)
    assert result.exit_code == 1
    assert "nightly.py:5: SCHEDULE: bad cron expression '0 25 * * *': Bad hour" in result.output


def test_dashboard_shows_the_schedules(project: Project, browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """The panel lists each schedule with its next and last tick and its last job's status."""
    from selenium.webdriver.common.by import By

    fired_once(project)
    with gunicorn(project, token=TOKEN, env=TEST_ENV) as web:
        d = browser
        d.get(web.url + "/")
        until("the page", lambda: d.find_element(By.ID, "token"))
        d.find_element(By.ID, "token").send_keys(TOKEN)
        press(d, "#login-submit")
        until("the prompt to close", lambda: not d.find_element(By.ID, "login").is_displayed())
        visit(d, "#schedules")
        row_css = '#schedule-table tr[data-schedule="report"]'

        def field(name: str) -> str:
            return read(d, f'{row_css} td[data-field="{name}"]')

        until("the job's status", lambda: field("last_job").endswith("done"), timeout=20)
        assert field("cron") == "*/30 * * * * *" and field("tz") == "UTC"
        # As every time on the dashboard: UTC, one format.
        assert field("last") == "2030-01-01 00:00:30" and field("next") == "2030-01-01 00:01:00"
        assert field("state") == "active" and field("counts") == "1 / 0 / 0"
        d.find_element(By.CSS_SELECTOR, "#schedules").location_once_scrolled_into_view  # noqa: B018
        d.save_screenshot(str(tmp_path / "schedules.png"))




def test_a_tick_of_a_function_with_priority_waits_in_the_priority_set(project: Project) -> None:
    """A schedule's jobs carry their function's PRIORITY, like any other enqueue of it: the
    tick's job waits ahead of plain ones and shows its priority."""
    add_function(project, "urgent_report", 'SCHEDULE = "0 0 1 1 *"\nPRIORITY = 6')
    plain = project.client.enqueue("record", {"n": 1}).id
    job = project.client.trigger("urgent_report")
    assert project.client.get(job.id).as_dict()["priority"] == 6
    assert project.client.get(plain).as_dict()["priority"] == 0
    queued = [j.id for j in project.client.jobs("queued", queue="fast").jobs]
    assert queued == [job.id, plain], queued


def test_runner_schedules_names_a_function_that_did_not_load(project: Project) -> None:
    """A schedule with a mistake in it (a minute of 61) keeps its function from loading:
    `runner schedules` says which file and why, rather than just not listing it."""
    add_function(project, "broken_report", 'SCHEDULE = "61 * * * *"')
    shown = run(project, "schedules")
    assert shown.exit_code == 0
    assert "not loaded, so no schedule of it is listed: " in shown.output
    assert "broken_report.py:" in shown.output and "SCHEDULE" in shown.output
    as_json = json.loads(run(project, "schedules", "--json").stdout)
    assert as_json["schedules"] == [] and any("broken_report.py" in e for e in as_json["errors"])
