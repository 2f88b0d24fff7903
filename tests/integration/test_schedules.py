"""Schedules through real worker processes and a real server: ticks after a downtime
under each MISSED policy, OVERLAP with a long job, daylight saving time in Madrid and New
York, and deploys where an older function file runs beside a newer one. The clock every
scheduler reads is the server's, shifted by the test (see schedulekit.set_clock)."""

from __future__ import annotations

import json
import shutil
import signal
import time
from pathlib import Path

import pytest
from schedulekit import (
    LONG,
    TEST_ENV,
    add_function,
    at,
    jobs_of,
    log_has,
    ms,
    server_ms,
    set_clock,
    sibling,
    ticks,
)

from runner.store.keys import clock_offset

from conftest import SCAN_COUNT, Project, wait_for

B = "2030-01-01T00:00"  # a base time: ticks below are B + seconds
STANDBY_ENV = {**TEST_ENV, "RUNNER_TEST_STANDBY": "0.5,2"}  # heartbeat 0.5 s; quiet 2 s to take over


def t(seconds: int) -> str:
    return at(f"2030-01-01T00:{seconds // 60:02d}:{seconds % 60:02d}")


def start(project: Project, n_schedules: int, name: str = "worker.log") -> None:
    project.spawn_worker("fast", env=TEST_ENV, log_name=name)
    wait_for(lambda: log_has(project, f"schedules: {n_schedules} active", name), timeout=30,
             what="the worker to adopt its schedules")


def stop(project: Project) -> None:
    for p in project.procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            p.wait(timeout=30)


def test_missed_ticks_after_a_downtime_of_three_ticks(project: Project) -> None:
    """Every 30 s; the only worker is down while the ticks at +60, +90 and +120 pass and
    comes back at +138 (the +120 tick is 18 s late, past its 15 s grace). skip drops the
    three; latest runs +120 once; all runs each, oldest first. Then +150 runs on time."""
    for policy in ("skip", "latest", "all"):
        add_function(project, f"m_{policy}", f'SCHEDULE = "*/30 * * * * *"\nMISSED = "{policy}"')
    set_clock(project, ms(B) + 20_000)
    start(project, 3)
    set_clock(project, ms(B) + 29_700)
    wait_for(lambda: all(ticks(project, f"m_{p}") == [t(30)] for p in ("skip", "latest", "all")),
             timeout=15, what="the first tick of each")
    stop(project)
    set_clock(project, ms(B) + 138_000)
    start(project, 3, "worker-2.log")
    wait_for(lambda: ticks(project, "m_all") == [t(30), t(60), t(90), t(120)], timeout=15,
             what="all to run each missed tick")
    wait_for(lambda: ticks(project, "m_latest") == [t(30), t(120)], timeout=5, what="latest to run +120")
    set_clock(project, ms(B) + 149_700)
    wait_for(lambda: all(t(150) in ticks(project, f"m_{p}") for p in ("skip", "latest", "all")),
             timeout=15, what="the next tick on time")
    assert ticks(project, "m_skip") == [t(30), t(150)]
    assert ticks(project, "m_latest") == [t(30), t(120), t(150)]
    assert ticks(project, "m_all") == [t(30), t(60), t(90), t(120), t(150)]
    r, k = project.runtime.redis, project.keys()
    assert r.hget(k.schedule("m_skip"), "n_missed") == "3"
    assert r.hget(k.schedule("m_latest"), "n_missed") == "2"


def test_overlap_skip_skips_a_tick_while_the_last_job_runs(project: Project) -> None:
    """OVERLAP = "skip": the +60 tick finds the +30 job still running and is skipped;
    once it finished, +90 runs. OVERLAP = "allow" runs both ticks side by side."""
    add_function(project, "long_skip", 'SCHEDULE = "*/30 * * * * *"\nOVERLAP = "skip"', LONG)
    add_function(project, "long_allow", 'SCHEDULE = "*/30 * * * * *"\nOVERLAP = "allow"', LONG)
    set_clock(project, ms(B) + 20_000)
    start(project, 2)
    set_clock(project, ms(B) + 29_700)
    wait_for(lambda: {j["status"] for j in jobs_of(project)} == {"processing"} and len(jobs_of(project)) == 2,
             timeout=15, what="both +30 jobs to be running")
    set_clock(project, ms(B) + 59_700)
    wait_for(lambda: ticks(project, "long_allow") == [t(30), t(60)], timeout=15, what="allow to run +60")
    r, k = project.runtime.redis, project.keys()
    wait_for(lambda: r.hget(k.schedule("long_skip"), "n_overlap") == "1", timeout=5, what="the overlap skip")
    assert ticks(project, "long_skip") == [t(30)]
    (project.records / "release").write_text("")
    wait_for(lambda: all(j["status"] == "done" for j in jobs_of(project)), timeout=30, what="the jobs to finish")
    set_clock(project, ms(B) + 89_700)
    wait_for(lambda: ticks(project, "long_skip") == [t(30), t(90)], timeout=15, what="skip to run +90")


def test_a_deploy_that_changes_only_the_payload_keeps_its_missed_ticks(project: Project) -> None:
    """MISSED = "all" across a deploy: the only worker stops after the +30 tick, the +60
    and +90 ticks pass while it restarts, and the new release changes the schedule's
    payload but not its timing: it runs both missed ticks, with the new payload, then +120
    on time. A release that changes the timing (cron) starts a new timeline instead: the
    old ticks it passed over are not the new schedule's to catch up."""
    add_function(project, "beat", 'SCHEDULE = "*/30 * * * * *"\nSCHEDULE_PAYLOAD = {"v": 1}\nMISSED = "all"')
    add_function(project, "moved", 'SCHEDULE = "*/30 * * * * *"\nMISSED = "all"')
    set_clock(project, ms(B) + 20_000)
    start(project, 2)
    set_clock(project, ms(B) + 29_700)
    wait_for(lambda: ticks(project, "beat") == [t(30)] and ticks(project, "moved") == [t(30)], timeout=15,
             what="the first tick of each")
    stop(project)
    add_function(project, "beat", 'SCHEDULE = "*/30 * * * * *"\nSCHEDULE_PAYLOAD = {"v": 2}\nMISSED = "all"')
    add_function(project, "moved", 'SCHEDULE = "15,45 * * * * *"\nMISSED = "all"')
    set_clock(project, ms(B) + 100_000)
    start(project, 2, "worker-2.log")
    wait_for(lambda: ticks(project, "beat") == [t(30), t(60), t(90)], timeout=15, what="the missed ticks")
    assert {j["tick"]: j["payload"] for j in jobs_of(project) if j["schedule"] == "beat"} == {
        t(30): {"v": 1}, t(60): {"v": 2}, t(90): {"v": 2}}
    set_clock(project, ms(B) + 104_700)
    wait_for(lambda: t(105) in ticks(project, "moved"), timeout=15, what="the moved schedule's first tick")
    set_clock(project, ms(B) + 119_700)
    wait_for(lambda: t(120) in ticks(project, "beat"), timeout=15, what="the next tick on time")
    assert ticks(project, "moved") == [t(30), t(105)]
    assert ticks(project, "beat") == [t(30), t(60), t(90), t(120)]


def test_dst_transitions_in_madrid_and_new_york(project: Project) -> None:
    """Through a real worker, the clock jumped over each transition (MISSED = "all" runs
    every tick in between): 02:30 in Madrid and New York runs once on the spring-forward
    day (at the jump) and once on the fall-back day, and 01:30 in New York once too."""
    add_function(project, "madrid", 'SCHEDULE = [{"cron": "30 2 * * *", "tz": "Europe/Madrid"}]\nMISSED = "all"')
    add_function(project, "new_york", 'SCHEDULE = "30 1 * * *"\nSCHEDULE_TZ = "America/New_York"\nMISSED = "all"')
    set_clock(project, ms("2026-03-06T12:00"))
    start(project, 2)
    set_clock(project, ms("2026-03-31T12:00"))
    wait_for(lambda: at("2026-03-31T00:30") in ticks(project, "madrid"), timeout=15, what="spring ticks")

    def window(schedule: str, a: str, b: str) -> list[str]:
        return [x for x in ticks(project, schedule) if at(a) <= x <= at(b)]

    assert window("madrid", "2026-03-28T12:00", "2026-03-30T12:00") == [at("2026-03-29T01:00"),
                                                                       at("2026-03-30T00:30")]
    assert window("new_york", "2026-03-07T12:00", "2026-03-09T12:00") == [at("2026-03-08T06:30"),
                                                                         at("2026-03-09T05:30")]
    set_clock(project, ms("2026-11-03T12:00"))
    wait_for(lambda: at("2026-11-03T06:30") in ticks(project, "new_york"), timeout=15, what="autumn ticks")
    assert window("madrid", "2026-10-24T12:00", "2026-10-26T12:00") == [at("2026-10-25T00:30"),
                                                                       at("2026-10-26T01:30")]
    assert window("new_york", "2026-10-31T12:00", "2026-11-02T12:00") == [at("2026-11-01T05:30"),
                                                                         at("2026-11-02T06:30")]
    for schedule in ("madrid", "new_york"):
        all_ticks = ticks(project, schedule)
        assert len(all_ticks) == len(set(all_ticks)), "a tick ran twice"


def test_an_older_function_file_never_fires_a_changed_or_removed_schedule(project: Project,
                                                                           tmp_path: Path) -> None:
    """Three releases of one app share Redis: v1 fires every second with payload v=1; v2,
    started later, changes the payload, and from its start every tick carries v=2 although
    v1 still runs; v3 removes SCHEDULE: once the workers that define it are gone (and quiet
    for the takeover time), v3 retires it, and no tick fires after."""
    add_function(project, "beat", 'SCHEDULE = "* * * * * *"\nSCHEDULE_PAYLOAD = {"v": 1}')
    v2 = sibling(project, tmp_path / "v2")
    add_function(v2, "beat", 'SCHEDULE = "* * * * * *"\nSCHEDULE_PAYLOAD = {"v": 2}')
    v3 = sibling(project, tmp_path / "v3")
    add_function(v3, "beat", "")
    try:
        project.spawn_worker("fast", env=STANDBY_ENV, log_name="worker.log")
        wait_for(lambda: log_has(project, "schedules: 1 active", "worker.log"), timeout=30, what="v1")
        wait_for(lambda: len(ticks(project, "beat")) >= 2, timeout=15, what="v1's ticks")
        v2.spawn_worker("fast", env=STANDBY_ENV, log_name="worker.log")
        wait_for(lambda: log_has(v2, "schedules: 1 active"), timeout=30, what="v2 to take over")
        wait_for(lambda: log_has(project, "a newer deploy holds its definition"), timeout=15,
                 what="v1 to be refused")
        state = project.runtime.redis.hgetall(project.keys().schedule("beat"))
        since = int(state["def_at"])
        wait_for(lambda: sum(1 for j in jobs_of(project) if j["payload"] == {"v": 2}) >= 2, timeout=15,
                 what="v2's ticks")
        for j in jobs_of(project):
            if ms(j["tick"][:-1]) > since:
                assert j["payload"] == {"v": 2}, j
        v3.spawn_worker("fast", env=STANDBY_ENV, log_name="worker.log")
        wait_for(lambda: log_has(v3, "1 not defined here kept"), timeout=30, what="v3 to start")
        stop(project)
        v2.stop_all()
        stopped = server_ms(project)
        wait_for(lambda: log_has(v3, "no worker defining it has been seen"), timeout=30,
                 what="v3 to retire the schedule")
        retired = project.runtime.redis.hgetall(project.keys().schedule("beat"))
        assert retired["def"] == "" and project.runtime.redis.hgetall(project.keys().schedules) == {}
        time.sleep(1.5)  # a tick a second: none may fire after the retirement
        assert ms(max(ticks(project, "beat"))[:-1]) <= stopped
        all_ticks = ticks(project, "beat")
        assert len(all_ticks) == len(set(all_ticks)), "a tick ran twice"
    finally:
        v2.stop_all()
        v3.stop_all()


def test_a_withdrawn_canary_hands_its_schedules_back(project: Project, tmp_path: Path) -> None:
    """v1 (two workers) fires every 30 s; a canary v2 (a new payload) starts later and
    takes the schedule over, and v1 stands by. While the canary lives, v1 never takes
    over, not even when the server's clock jumps 90 s at once (what every worker sees
    after a Redis outage: the canary's last stamp looks old). Once the canary is withdrawn
    and quiet, one v1 worker takes the schedule back, the other rejoins it (same
    definition), and the gap's ticks run with v1's payload (MISSED = "all")."""
    add_function(project, "beat", 'SCHEDULE = "*/30 * * * * *"\nSCHEDULE_PAYLOAD = {"v": 1}\nMISSED = "all"')
    v2 = sibling(project, tmp_path / "v2")
    add_function(v2, "beat", 'SCHEDULE = "*/30 * * * * *"\nSCHEDULE_PAYLOAD = {"v": 2}\nMISSED = "all"')
    r, k = project.runtime.redis, project.keys()

    def payloads() -> dict[str, object]:
        return {j["tick"]: j["payload"]["v"] for j in jobs_of(project) if j["schedule"] == "beat"}

    def seen_since(at_ms: int) -> bool:
        return int(r.hget(k.schedules_seen, "beat") or 0) >= at_ms

    try:
        set_clock(project, ms(B) + 20_000)
        for name in ("worker-a.log", "worker-b.log"):
            project.spawn_worker("fast", env=STANDBY_ENV, log_name=name)
            wait_for(lambda n=name: log_has(project, "schedules: 1 active", n), timeout=30, what="v1 to start")
        set_clock(project, ms(B) + 29_700)
        wait_for(lambda: payloads() == {t(30): 1}, timeout=15, what="v1's tick")
        v2.spawn_worker("fast", env=STANDBY_ENV, log_name="worker.log")
        wait_for(lambda: log_has(v2, "schedules: 1 active"), timeout=30, what="the canary to take over")
        for second in (59_700, 149_700):  # the canary lives through a 90 s jump: it fires and says so
            set_clock(project, ms(B) + second)
            wait_for(lambda s=second: t(s // 1000 + 1) in payloads() and seen_since(ms(B) + s), timeout=15,
                     what="the canary's tick and heartbeat")
        time.sleep(3)  # longer than a standby must see the canary quiet: it must not take over
        assert log_has(project, "stands by") and not log_has(project, "takes it back")
        assert payloads() == {t(30): 1, t(60): 2, t(90): 2, t(120): 2, t(150): 2}
        v2.stop_all()
        set_clock(project, ms(B) + 185_000)
        wait_for(lambda: t(180) in payloads(), timeout=30, what="v1 to take the schedule back")
        assert payloads() == {t(30): 1, t(60): 2, t(90): 2, t(120): 2, t(150): 2, t(180): 1}
        assert log_has(project, "takes it back")
        wait_for(lambda: log_has(project, "takes it back", "worker-a.log") + log_has(
            project, "takes it back", "worker-b.log") == 1 and log_has(project, "holds it again"), timeout=15,
            what="the other v1 worker to rejoin")
    finally:
        v2.stop_all()


def test_a_schedule_a_newer_deploy_removed_stays_removed_after_its_tombstone(project: Project, tmp_path: Path) -> None:
    """v1 fires "beat"; canary v2 changes its payload (v1 stands by); v2 goes and "beat" is
    removed (a reload that drops SCHEDULE). Nobody restarts. When the tombstone expires (7 days; here the state key
    is deleted, which is what PEXPIRE does), v1's standby must not adopt "beat" again and
    fire it (a catch-up from v1's own load time): the newest code removed it."""
    add_function(project, "beat", 'SCHEDULE = "*/30 * * * * *"\nSCHEDULE_PAYLOAD = {"v": 1}\nMISSED = "all"')
    v2 = sibling(project, tmp_path / "v2")
    add_function(v2, "beat", 'SCHEDULE = "*/30 * * * * *"\nSCHEDULE_PAYLOAD = {"v": 2}\nMISSED = "all"')
    r, k = project.runtime.redis, project.keys()
    try:
        set_clock(project, ms(B) + 20_000)
        project.spawn_worker("fast", env=STANDBY_ENV, log_name="v1.log")
        wait_for(lambda: log_has(project, "schedules: 1 active", "v1.log"), timeout=30, what="v1")
        time.sleep(0.5)
        v2.spawn_worker("fast", env=STANDBY_ENV, log_name="worker.log")
        wait_for(lambda: log_has(project, "stands by", "v1.log"), timeout=20, what="v1 to stand by")
        v2.stop_all()
        # v3 removes "beat": a reload of a worker that defined it retires it at once (v1's
        # living standby would otherwise take it back before any removal: a living worker
        # still defines it).
        born = server_ms(project) + int(r.get(clock_offset(project.prefix, k.queue)) or 0)
        assert project.runtime.scripts.adopt(k, born, 60_000, [], ["beat"], forced=1) == [1]
        time.sleep(3)
        assert not log_has(project, "holds it again", "v1.log")
        r.delete(k.schedule("beat"))  # the tombstone expires (7 days later)
        set_clock(project, ms(B) + 7 * 86_400_000 + 100_000)
        time.sleep(4)
        fired = sorted(j["tick"] for j in jobs_of(project) if j["schedule"] == "beat")
        assert not log_has(project, "holds it again", "v1.log") and not fired, (
            f"removed by v3, yet v1 took it again and fired {len(fired)} tick(s): {fired[:3]}...")
    finally:
        v2.stop_all()


MANY = 400  # per-second schedules: 100 s of catch-up is 40,000 ticks, a few seconds of firing


def many(v: int) -> str:
    entries = [{"cron": "* * * * * *", "payload": {"v": v}, "id": f"e{i}"} for i in range(MANY)]
    return f'SCHEDULE = {json.dumps(entries)}\nMISSED = "all"'


def test_a_living_canary_busy_with_a_long_catch_up_keeps_its_schedules(project: Project, tmp_path: Path) -> None:
    """v1 and a canary v2 (new payloads) define MANY per-second schedules (MISSED = "all").
    The canary holds them and lives. The clock jumps 100 s (a short downtime of every
    worker): the canary's ticker fires MANY x 100 catch-up ticks, longer than the quiet time,
    and must keep saying it lives meanwhile, or v1's idle standby would take the schedules
    back from a living canary and fire part of the catch-up with v1's payload."""
    add_function(project, "many", many(1))
    v2 = sibling(project, tmp_path / "v2")
    add_function(v2, "many", many(2))
    try:
        set_clock(project, ms(B) + 1_000)
        project.spawn_worker("fast", env=STANDBY_ENV, log_name="v1.log")
        wait_for(lambda: log_has(project, f"schedules: {MANY} active", "v1.log"), timeout=60, what="v1")
        time.sleep(0.5)
        v2.spawn_worker("fast", env=STANDBY_ENV, log_name="worker.log")
        wait_for(lambda: log_has(v2, f"schedules: {MANY} active"), timeout=60, what="the canary")
        wait_for(lambda: log_has(project, "stands by", "v1.log"), timeout=30, what="v1 to stand by")
        time.sleep(3)
        set_clock(project, ms(B) + 110_000)
        r, k = project.runtime.redis, project.keys()
        pattern = k.schedule_prefix.replace("{", "\\{").replace("}", "\\}") + "*"

        def caught_up() -> bool:  # every schedule has fired its last tick at or past the jump
            pipe = r.pipeline(transaction=False)
            for key in r.scan_iter(match=pattern, count=SCAN_COUNT):
                pipe.hget(key, "tick")
            return sum(int(t or 0) >= ms(B) + 110_000 for t in pipe.execute()) >= MANY

        # Up to 15 s of the catch-up (it used to be watched for 15 s whatever it did); a
        # catch-up done sooner is watched one quiet time more (a take-back then shows).
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not caught_up():
            time.sleep(0.5)
        time.sleep(max(0.0, min(2.5, deadline - time.monotonic())))
        took = (project.root / "v1.log").read_text().count("takes it back")
        assert not took, (f"v1 took {took} schedules from the living canary and fired "  # (jobs read on failure only)
                          f"{sum(j['payload'] == {'v': 1} for j in jobs_of(project))} v1 ticks")
    finally:
        v2.stop_all()


def test_hot_reload_in_dev_adds_and_removes_a_schedule(project: Project) -> None:
    """In `runner dev`, saving SCHEDULE into a function file starts its ticks within a
    second or two; deleting it retires the schedule at once, and no tick fires after."""
    from test_dev import Dev

    add_function(project, "beat", "")
    dev = Dev(project.root, {**project.env, **TEST_ENV})
    path = project.root / "functions" / "beat.py"
    try:
        path.write_text(path.read_text().replace('QUEUE = "fast"', 'QUEUE = "fast"\nSCHEDULE = "* * * * * *"'))
        wait_for(lambda: len(ticks(project, "beat")) >= 2, timeout=10, what="the new schedule's ticks")
        path.write_text(path.read_text().replace('SCHEDULE = "* * * * * *"', ""))
        r, k = project.runtime.redis, project.keys()
        wait_for(lambda: r.hget(k.schedule("beat"), "def") == "", timeout=10, what="the schedule to be retired")
        retired_at = int(r.hget(k.schedule("beat"), "def_at"))
        assert all(ms(x[:-1]) <= retired_at for x in ticks(project, "beat"))
        assert "schedule beat: tick" in dev.log()
    finally:
        dev.stop()


def test_a_worker_without_its_functions_folder_retires_no_schedule(project: Project, tmp_path: Path) -> None:
    """A worker started without its functions folder (a volume not mounted, a wrong
    RUNNER_FUNCTIONS_DIR) loaded nothing: it retires no schedule, as a file that fails to
    load keeps its own, and the healthy workers go on firing them (it used to retire
    every schedule in Redis, and none fired again until the healthy workers restarted)."""
    add_function(project, "beat", 'SCHEDULE = "*/2 * * * * *"')
    set_clock(project, ms(B))
    project.spawn_worker("fast", env=TEST_ENV, log_name="healthy.log")
    r, k = project.runtime.redis, project.keys()
    wait_for(lambda: int(r.hget(k.schedule("beat"), "n_fired") or 0) >= 2, timeout=15, what="the healthy ticks")
    broken_env = {**TEST_ENV, "RUNNER_FUNCTIONS_DIR": str(tmp_path / "not-mounted")}
    project.spawn_worker("fast", env=broken_env, log_name="broken.log")
    wait_for(lambda: log_has(project, "no functions folder", "broken.log")
             and log_has(project, "serving", "broken.log"), timeout=30, what="the misconfigured worker to start")
    before = int(r.hget(k.schedule("beat"), "n_fired") or 0)
    set_clock(project, ms(B) + 30_000)
    wait_for(lambda: int(r.hget(k.schedule("beat"), "n_fired") or 0) > before, timeout=8,
             what="the healthy worker to go on firing")
    assert r.hget(k.schedule("beat"), "def")


# The first job to start runs until $RECORD_DIR/release exists (at most 15 s); any later
# job (the manual run) ends at once.
FIRST_BLOCKS = '''"""The first run is long; later runs are quick."""
import os
import time

QUEUE = "fast"
TIMEOUT = 18
{options}


def handle(payload, ctx):
    d = os.environ["RECORD_DIR"]
    try:
        os.close(os.open(os.path.join(d, "first"), os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return {{}}
    deadline = time.monotonic() + 15
    while not os.path.exists(os.path.join(d, "release")) and time.monotonic() < deadline:
        time.sleep(0.02)
    return {{}}
'''

def _t(seconds: int) -> str:
    return at(f"2030-01-01T00:{seconds // 60:02d}:{seconds % 60:02d}")


def test_a_manual_run_does_not_let_the_next_tick_overlap_a_running_scheduled_run(
        project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    """OVERLAP = "skip": a manual run (`runner schedules trigger`) made while the +30
    tick's run still runs, and ended first, does not let the +60 tick fire beside it."""
    monkeypatch.setenv("RUNNER_TEST_SCHEDULES", "1")  # this process reads the seconds field too
    add_function(project, "nightly", 'SCHEDULE = "*/30 * * * * *"\nOVERLAP = "skip"', FIRST_BLOCKS)
    set_clock(project, ms(B) + 20_000)
    project.spawn_worker("fast", env=TEST_ENV, log_name="worker.log")
    wait_for(lambda: log_has(project, "schedules: 1 active"), timeout=30, what="the worker to adopt")
    set_clock(project, ms(B) + 29_700)
    wait_for(lambda: [j["status"] for j in jobs_of(project)] == ["processing"], timeout=15,
             what="the +30 run to be running")
    scheduled_run = jobs_of(project)[0]["id"]

    manual = project.client.trigger("nightly")  # the operator's manual run: it ends at once
    project.client.wait(manual.id, timeout_s=15)
    assert project.client.get(scheduled_run).status == "processing"

    set_clock(project, ms(B) + 59_700)  # +60: the +30 run is still running
    r, k = project.runtime.redis, project.keys()
    wait_for(lambda: int(r.hget(k.schedule("nightly"), "tick") or 0) >= ms(B) + 60_000, timeout=15,
             what="the +60 tick to be handled")
    try:
        assert project.client.get(scheduled_run).status == "processing"
        assert ticks(project, "nightly") == [_t(30)], (
            "the +60 tick fired while the +30 run was still running (OVERLAP = 'skip')",
            [(j["tick"], j["status"], j["trigger"]) for j in jobs_of(project)])
    finally:
        (project.records / "release").write_text("")


def _states(project: Project) -> dict[str, str]:
    """`runner schedules --json` from this project's folder: id -> state."""
    from test_schedule_surfaces import run

    result = run(project, "schedules", "--json")
    assert result.exit_code == 0, result.output
    return {row["id"]: row["state"] for row in json.loads(result.stdout)["schedules"]}


def _added_fires(v2: Project) -> None:
    """The schedule v2 added is active (not pending) and ticks on, with no v2 worker restarted."""
    assert _states(v2) == {"beat": "active", "added": "active"}
    r, k = v2.runtime.redis, v2.keys()
    assert r.hget(k.schedule("added"), "def"), "an older worker retired the schedule a newer release added"
    n = len(ticks(v2, "added"))
    wait_for(lambda: len(ticks(v2, "added")) >= n + 2, timeout=15, what="the added schedule to tick on")


@pytest.mark.parametrize("order", ["older-restarts", "older-starts-last", "older-dev"])
def test_an_older_release_never_retires_a_schedule_a_newer_one_added(project: Project, tmp_path: Path,
                                                                      order: str) -> None:
    """v1 (one function folder) defines "beat"; v2 (another, the newer release) also adds
    "added". A v1 worker started after v2's, by a restart during a rolling deploy, a first
    start, or `runner dev` run for a few seconds from the older checkout, lacks "added",
    yet must not retire it: v2 goes on firing it, and `runner schedules` shows it active.
    Once every v2 worker is gone and quiet (a rollback), v1 retires it."""
    add_function(project, "beat", 'SCHEDULE = "* * * * * *"')
    v2 = sibling(project, tmp_path / "v2")
    add_function(v2, "added", 'SCHEDULE = "* * * * * *"')
    try:
        if order == "older-restarts":
            project.spawn_worker("fast", env=STANDBY_ENV, log_name="v1.log")
            wait_for(lambda: log_has(project, "schedules: 1 active", "v1.log"), timeout=30, what="v1")
        v2.spawn_worker("fast", env=STANDBY_ENV, log_name="v2.log")
        wait_for(lambda: log_has(v2, "schedules: 2 active", "v2.log"), timeout=30, what="v2")
        wait_for(lambda: len(ticks(v2, "added")) >= 1, timeout=15, what="v2's first tick of added")
        if order == "older-dev":
            from test_dev import Dev

            dev = Dev(project.root, {**project.env, **STANDBY_ENV})
            try:
                wait_for(lambda: "schedules: 1 active" in dev.log(), timeout=30, what="runner dev to adopt")
                time.sleep(1)  # a few beats of the older checkout beside the deployed release
            finally:
                dev.stop()
            _added_fires(v2)
            return
        stop(project)
        project.spawn_worker("fast", env=STANDBY_ENV, log_name="v1-again.log")
        wait_for(lambda: log_has(project, "schedules: 1 active", "v1-again.log"), timeout=30,
                 what="v1 to start again")
        time.sleep(1)  # a few beats of the older worker
        _added_fires(v2)
        v2.stop_all()  # rolled back: no worker defines "added" any more
        r, k = project.runtime.redis, project.keys()
        wait_for(lambda: r.hget(k.schedule("added"), "def") == "", timeout=30,
                 what="the older release to retire the schedule once no worker holds it")
        # (the worker logs the retirement after the script's reply: wait for the line)
        wait_for(lambda: log_has(project, "no worker defining it has been seen", "v1-again.log"), timeout=10,
                 what="the older worker to log the retirement")
    finally:
        v2.stop_all()


def test_a_newer_worker_heard_again_brings_back_what_an_older_one_retired_meanwhile(
        project: Project, tmp_path: Path) -> None:
    """v2 (the newer release) adds "added"; a v1 worker runs beside it. v2's only worker
    goes quiet past the takeover window (frozen: SIGSTOP, a long GC pause, a network cut)
    but lives, so v1 retires "added" as no living worker's. Once v2 is heard again it
    brings "added" back, and it ticks on after every v1 worker left."""
    add_function(project, "beat", 'SCHEDULE = "* * * * * *"')
    v2 = sibling(project, tmp_path / "v2")
    add_function(v2, "added", 'SCHEDULE = "* * * * * *"')
    r, k = project.runtime.redis, project.keys()
    try:
        w2 = v2.spawn_worker("fast", env=STANDBY_ENV, log_name="v2.log")
        wait_for(lambda: log_has(v2, "schedules: 2 active", "v2.log"), timeout=30, what="v2")
        project.spawn_worker("fast", env=STANDBY_ENV, log_name="v1.log")
        wait_for(lambda: log_has(project, "schedules: 1 active", "v1.log"), timeout=30, what="v1")
        w2.send_signal(signal.SIGSTOP)
        try:
            wait_for(lambda: r.hget(k.schedule("added"), "def") == "", timeout=30,
                     what="v1 to retire the schedule of the quiet v2")
        finally:
            w2.send_signal(signal.SIGCONT)
        wait_for(lambda: r.hget(k.schedule("added"), "def"), timeout=15,
                 what="v2, heard again, to bring its schedule back")
        stop(project)  # every v1 worker gone
        _added_fires(v2)
    finally:
        v2.stop_all()


def test_an_older_worker_restarted_mid_deploy_never_puts_its_changed_schedule_back(
        project: Project, tmp_path: Path) -> None:
    """v1 fires with payload v=1; v2 (started later) changes it and takes over. A v1 worker
    restarted during the rolling deploy is born after v2, yet its definition was first
    seen before v2's: it stays superseded, and every tick carries v=2 while both live."""
    add_function(project, "beat", 'SCHEDULE = "* * * * * *"\nSCHEDULE_PAYLOAD = {"v": 1}')
    v2 = sibling(project, tmp_path / "v2")
    add_function(v2, "beat", 'SCHEDULE = "* * * * * *"\nSCHEDULE_PAYLOAD = {"v": 2}')
    r, k = project.runtime.redis, project.keys()
    try:
        project.spawn_worker("fast", env=STANDBY_ENV, log_name="v1.log")
        wait_for(lambda: log_has(project, "schedules: 1 active", "v1.log"), timeout=30, what="v1")
        v2.spawn_worker("fast", env=STANDBY_ENV, log_name="v2.log")
        wait_for(lambda: log_has(v2, "schedules: 1 active", "v2.log"), timeout=30, what="v2 to take over")
        winner = r.hget(k.schedule("beat"), "def")
        stop(project)
        project.spawn_worker("fast", env=STANDBY_ENV, log_name="v1-again.log")
        wait_for(lambda: log_has(project, "held by a newer deploy", "v1-again.log"), timeout=30,
                 what="the restarted v1 worker to find its definition superseded")
        since = server_ms(project)
        wait_for(lambda: sum(1 for j in jobs_of(project) if ms(j["tick"][:-1]) > since) >= 3, timeout=15,
                 what="ticks after the restart")
        assert r.hget(k.schedule("beat"), "def") == winner
        assert {j["payload"]["v"] for j in jobs_of(project) if ms(j["tick"][:-1]) > since} == {2}
    finally:
        v2.stop_all()


def test_a_removed_schedule_an_older_worker_brought_back_is_retired_again_once_it_left(
        project: Project, tmp_path: Path) -> None:
    """v1 defines "beat" and "extra"; v2 (newer) drops "extra" and retires it once v1's
    workers are gone. A v1 worker comes back for a while (it lives and defines "extra": it
    fires it again) and leaves: v2, running all along, retires "extra" again."""
    add_function(project, "beat", 'SCHEDULE = "* * * * * *"')
    add_function(project, "extra", 'SCHEDULE = "* * * * * *"')
    v2 = sibling(project, tmp_path / "v2")
    (v2.root / "functions" / "extra.py").unlink()
    shutil.rmtree(v2.root / "schemas" / "extra")
    r, k = project.runtime.redis, project.keys()
    try:
        project.spawn_worker("fast", env=STANDBY_ENV, log_name="v1.log")
        wait_for(lambda: log_has(project, "schedules: 2 active", "v1.log"), timeout=30, what="v1")
        v2.spawn_worker("fast", env=STANDBY_ENV, log_name="v2.log")
        wait_for(lambda: log_has(v2, "schedules: 1 active", "v2.log"), timeout=30, what="v2")
        stop(project)
        wait_for(lambda: r.hget(k.schedule("extra"), "def") == "", timeout=30, what="v2 to retire extra")
        project.spawn_worker("fast", env=STANDBY_ENV, log_name="v1-again.log")
        wait_for(lambda: r.hget(k.schedule("extra"), "def"), timeout=30, what="v1, back, to define extra again")
        n = len(ticks(project, "extra"))
        wait_for(lambda: len(ticks(project, "extra")) > n, timeout=15, what="extra to fire while v1 lives")
        stop(project)
        wait_for(lambda: r.hget(k.schedule("extra"), "def") == "" and "extra" not in r.hgetall(k.schedules),
                 timeout=30, what="v2 to retire extra again once v1 left")
    finally:
        v2.stop_all()
