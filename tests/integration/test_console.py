"""The dashboard as an operations console, in headless Chromium against a real gunicorn and
real workers: every page has its own URL (a deep link opens it, back and forward move
between them), every action works from its page (pause and resume a queue and a function,
run a job now, trigger a schedule, invoke a function with a test payload, signal a waiting
job), a read-only token sees no action, and the job page renders a 1,000-line log and a
10,000-chunk stream in under a second.

Screenshots at 1400x1000 of every page go to $DASHBOARD_SCREENSHOTS when set (a CI
artifact), else to the test's temporary folder."""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_dashboard import browser, fresh, press, read, screenshot, script_errors, signed_in, until  # noqa: F401
from test_web_support import Web, gunicorn, served

from runner.store.embedded import Server

from conftest import Project, wait_for

TOKEN = "console-token"
READER = "reader-token"
READ_ONLY = f"""
[api.tokens.reader]
hash = "sha256:{hashlib.sha256(READER.encode()).hexdigest()}"
scopes = ["read"]
"""

REPORT = '''"""Builds the nightly sales report."""
QUEUE = "slow"
SCHEDULE = "0 3 * * *"
SCHEDULE_PAYLOAD = {"region": "eu"}
TIMEOUT = 60

def handle(payload, ctx):
    ctx.logger.info("report for %s", payload.get("region"))
    return {"rows": 1200, "region": payload.get("region")}
'''

WAITER = '''"""Waits for a person's approval before shipping."""
QUEUE = "fast"

def handle(payload, ctx):
    ctx.step("reserve", lambda: {"reserved": payload.get("sku")})
    answer = ctx.wait_for_signal("approval", timeout=3600)
    ctx.step("ship", lambda: "shipped")
    return {"approved_by": answer.get("by") if isinstance(answer, dict) else answer}
'''

SLEEPER = '''"""Cools down for an hour between two steps."""
QUEUE = "fast"

def handle(payload, ctx):
    ctx.step("charge", lambda: 1)
    ctx.sleep("cool-down", 3600)
    return {"woke": True}
'''

ON_ORDER = '''"""Sends the confirmation mail of an order."""
QUEUE = "fast"
TRIGGERS = ["order.placed"]

def handle(payload, ctx):
    ctx.logger.info("mail for order %s", payload.get("order"))
    return {"mailed": payload.get("order")}
'''

CHATTY = '''"""Logs and streams as much as it is told to."""
QUEUE = "fast"
TIMEOUT = 20

def handle(payload, ctx):
    for i in range(payload.get("lines", 0)):
        ctx.logger.info("line %d of the build: compiling module_%04d", i, i)
    for i in range(payload.get("chunks", 0)):
        ctx.stream(f"token{i} ")
    return {"lines": payload.get("lines", 0), "chunks": payload.get("chunks", 0)}
'''

INVOKED_SCHEMA = ('{"type": "object", "required": ["to", "amount_cents"], "additionalProperties": false, '
                  '"properties": {"to": {"type": "string"}, "amount_cents": {"type": "integer", "minimum": 1}}}')
INVOKED = '''"""Pays a supplier (a test double here)."""
QUEUE = "fast"

def handle(payload, ctx):
    return {"paid": payload["amount_cents"], "to": payload["to"]}
'''

# Big enough to show that a payload is not squeezed or split mid-number.
ORDER = {"n": 4, "fail_times": 99, "order": {"id": "ord_8f3a2c91", "customer": "cus_20417",
                                            "total_cents": 1234567890123,
         "items": [{"sku": "SKU-0042-BLUE", "qty": 3, "price_cents": 411522630041}], "note": "leave at the door"}}


def console_project(project: Project) -> None:
    project.add_function("report", REPORT)
    project.add_function("waiter", WAITER)
    project.add_function("sleeper", SLEEPER)
    project.add_function("on_order", ON_ORDER)
    project.add_function("chatty", CHATTY)
    project.add_function("pay", INVOKED, INVOKED_SCHEMA)
    project.write_config(extra=READ_ONLY)
    toml = project.root / "runner.toml"
    bounds = "[retention]\nlogs = { lines = 2000, bytes = 4194304 }\n"
    toml.write_text(toml.read_text().replace("[retention]\n", bounds))


def realistic(project: Project, web: Web) -> dict[str, str]:
    """Jobs in every state the pages show: done, dead (with a payload worth reading),
    scheduled, waiting for a signal, sleeping, one that logged and streamed, an event, and
    an audit trail."""
    c = project.client
    ids: dict[str, str] = {}
    ids["done"] = web.post("/jobs/record", json={"n": 1}).json()["id"]
    ids["dead"] = web.post("/jobs/record", json=ORDER).json()["id"]
    ids["perm"] = web.post("/jobs/perm", json={"invoice": "inv_3391", "amount_cents": 129900}).json()["id"]
    ids["scheduled"] = c.enqueue("record", {"n": 7}, delay=3600).id
    ids["waiting"] = web.post("/jobs/waiter", json={"sku": "SKU-0042-BLUE"}).json()["id"]
    ids["sleeping"] = web.post("/jobs/sleeper", json={}).json()["id"]
    r = web.post("/jobs/chatty", json={"lines": 1000, "chunks": 10000})
    assert r.status_code == 202, r.text
    ids["chatty"] = r.json()["id"]
    ids["slow"] = c.enqueue("slow", {"seconds": 0.2}).id
    assert web.post("/events/order.placed", json={"order": "ord_1"}).status_code == 202
    assert web.post("/functions/record/pause").status_code == 200
    assert web.post("/functions/record/resume").status_code == 200
    wait_for(lambda: all(c.get(ids[k]).status == s for k, s in [
        ("done", "done"), ("dead", "dead"), ("perm", "dead"), ("waiting", "waiting"), ("sleeping", "sleeping"),
        ("chatty", "done"), ("slow", "done")]), timeout=60, what="the jobs to reach their states")
    return ids


def has_route(web: Web, method: str, path: str) -> bool:
    paths = web.get("/openapi.json").json().get("paths", {})
    return method.lower() in paths.get(path, {})


def go(d: Any, hash_: str) -> None:
    d.execute_script("go(arguments[0])", hash_)


def shown(d: Any) -> str:
    """The page on show, by its section."""
    return ",".join(page for _, page in displayed(d, "main > section[data-page]", "data-page", with_text=False))


def has(d: Any, css: str) -> list[Any]:
    from selenium.webdriver.common.by import By

    found: list[Any] = d.find_elements(By.CSS_SELECTOR, css)
    return found


def text(d: Any, css: str) -> str:
    return read(d, css)


def displayed(d: Any, css: str, attribute: str, with_text: bool = True) -> list[tuple[str, str]]:
    """(text, or "" if not ``with_text``; ``attribute``) of each element ``css`` finds that WebDriver calls displayed
    (its own isDisplayed check), read in one round trip: a call per element for each of a
    page's many hidden buttons was most of a look at a page."""
    from selenium.webdriver.remote import webelement

    if webelement.isDisplayed_js is None:
        webelement._load_js()
    found: list[list[str]] = d.execute_script(
        f"const shown = ({webelement.isDisplayed_js});"
        "return [...document.querySelectorAll(arguments[0])].filter((e) => shown(e))"
        "  .map((e) => [arguments[2] ? e.innerText.trim() : '', e.getAttribute(arguments[1]) || ''])",
        css, attribute, with_text)
    return [(t, a) for t, a in found]


PAGES = [  # (hash, page, what shows it has its data, screenshot)
    ("#overview", "overview", "#overview-tiles .tile", "overview"),
    ("#queues", "queues", '#queue-table tr[data-queue="fast"]', "queues"),
    ("#queue/fast", "queue", '#queue-view [data-field="dead"]', "queue"),
    ("#jobs/dead", "jobs", "#job-table tr[data-job-id]", "jobs-dead"),
    ("#dead/fast", "dead", "#dead-table tr[data-job-id]", "dead-letters"),
    ("#schedules", "schedules", '#schedule-table tr[data-schedule="report"]', "schedules"),
    ("#functions", "functions", '#function-list [data-function="pay"]', "functions"),
    ("#function/pay", "function", "#invoke-form", "function"),
    ("#workers", "workers", "#workers-view table, #workers-view [data-workers]", "workers"),
    ("#events", "events", "#event-table tr[data-event]", "events"),
    ("#audit", "audit", "#audit-table tr[data-audit-action]", "audit"),
]


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory, server: Server) -> Iterator[tuple[Project, Web, dict[str, str]]]:
    """The console project with its worker, its server and the realistic jobs, for the
    tests that only look (every page and its links; a read-only token's pages; the big
    log's and stream's page; a done job's text with bidi controls): none acts on a job or
    a queue, and nothing of theirs is scheduled, sleeping or waiting. The setup (a worker,
    a server, and the jobs: the 10,000-chunk stream among them) was each one's biggest
    cost after the browser's work."""
    def setup(project: Project) -> None:
        console_project(project)
        project.add_function("bidi", BIDI)
        project.spawn_worker("fast", "slow")

    with served(tmp_path_factory, server, setup, token=TOKEN) as (project, web):
        yield project, web, realistic(project, web)


def test_every_page_has_its_url_deep_links_open_it_and_back_and_forward_work(
        console: tuple[Project, Web, dict[str, str]], browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """Each page opens from the navigation and from its URL typed in (a deep link, signed in
    already in this tab), shows its data, and is screenshotted at 1400x1000; back and
    forward walk the pages visited, in order, without a reload; a job's and a group's URL
    open readable pages; dead-letter payloads keep their numbers whole."""
    from selenium.webdriver.common.by import By

    _, web, ids = console
    group = web.post("/groups", json={"members": [{"type": "record", "payload": {"n": i}} for i in range(3)],
                                      "then": {"type": "record", "payload": {"n": 99}}}).json()
    d = browser
    d.set_window_size(1400, 1000)
    signed_in(d, web, TOKEN)
    d.execute_script("window.sameDocument = true")
    for hash_, page, ready, name in PAGES:
        go(d, hash_)
        until(f"the {page} page", lambda page=page: shown(d) == page)  # type: ignore[misc]
        until(f"the {page} page's data", lambda ready=ready: d.find_elements(By.CSS_SELECTOR, ready))  # type: ignore[misc]
        assert d.current_url.endswith(hash_)
        screenshot(d, tmp_path, f"console-{name}.png")
    go(d, f"#job/{ids['chatty']}")
    until("the job page", lambda: has(d, f'#job-view table[data-job-id="{ids["chatty"]}"]'))
    until("its stream", lambda: "token9999" in text(d, '#job-view [data-field="stream"]'))
    screenshot(d, tmp_path, "console-job.png")
    go(d, f"#job/{ids['waiting']}")
    until("the waiting job's page", lambda: d.find_elements(By.ID, "signal-form"))
    assert "reserve" in text(d, '#job-view [data-field="steps"]')
    screenshot(d, tmp_path, "console-job-waiting.png")
    fresh(d, '#job-view [data-field="steps"]',
          lambda steps: d.execute_script("arguments[0].scrollIntoView({block: 'center'})", steps))
    d.save_screenshot(str(Path(os.environ.get("DASHBOARD_SCREENSHOTS") or tmp_path) / "console-job-steps.png"))
    go(d, f"#group/{group['id']}")
    until("the group page", lambda: has(d, f'#group-view table[data-group-id="{group["id"]}"]'))
    assert not has(d, "#group-view pre") and "3 done" in text(d, "#group-view")  # a page, not raw JSON
    screenshot(d, tmp_path, "console-group.png")

    # Back walks the pages visited, newest first; forward comes back.
    visited = [p[1] for p in PAGES] + ["job", "job", "group"]
    for page in reversed(visited[-6:-1]):
        d.back()
        until(f"back on {page}", lambda page=page: shown(d) == page)  # type: ignore[misc]
    for page in visited[-5:]:
        d.forward()
        until(f"forward to {page}", lambda page=page: shown(d) == page)  # type: ignore[misc]
    assert d.execute_script("return window.sameDocument") is True  # no reload

    # A deep link loads its page directly, in a fresh load of the document.
    for hash_, page, ready, _ in PAGES[1:]:
        d.get(f"{web.url}/{hash_}")
        until(f"{page} from its link", lambda page=page, ready=ready: shown(d) == page  # type: ignore[misc]
              and d.find_elements(By.CSS_SELECTOR, ready))
    d.get(f"{web.url}/#jobs/dead?type=perm")
    until("the dead perm jobs", lambda: [r.get_attribute("data-job-id")
                                         for r in has(d, "#job-table tr[data-job-id]")] == [ids["perm"]])
    assert read(d, "#filter-type", "value") == "perm"
    d.get(f"{web.url}/#job/{ids['dead']}")
    until("the dead job from its link", lambda: has(d, f'#job-view table[data-job-id="{ids["dead"]}"]'))

    # Legibility: the dead letter's payload keeps every number on one line, whole.
    d.get(f"{web.url}/#dead/fast")
    css = f'#dead-table tr[data-job-id="{ids["dead"]}"] pre[data-field="payload"]'
    until("the dead payload", lambda: d.find_elements(By.CSS_SELECTOR, css))
    time.sleep(0.5)  # the list's second read (the queue chosen) lands
    width, lines, rects = d.execute_script("""
        const pre = document.querySelector(arguments[0]), range = document.createRange();
        const node = pre.firstChild, t = node.textContent, i = t.indexOf('1234567890123');
        range.setStart(node, i); range.setEnd(node, i + 13);
        return [pre.getBoundingClientRect().width, t.split('\\n').length, range.getClientRects().length];""", css)
    assert width >= 300 and lines > 10, (width, lines)
    assert rects == 1, "the number is split over lines"
    # One time format, no epoch numbers on any page.
    for hash_, page, ready, _ in PAGES:
        go(d, hash_)
        until(f"{page} again", lambda ready=ready: d.find_elements(By.CSS_SELECTOR, ready))  # type: ignore[misc]
        body = d.find_element(By.TAG_NAME, "main").text
        assert not re.search(r"\b1[6-9]\d{8}(\.\d+)?\b", body), (page, body)
        assert not re.search(r"\d{1,2}/\d{1,2}/\d{4}", body), (page, body)  # no locale dates
    assert script_errors(d) == []


def toast_text(d: Any) -> str:
    return text(d, "#toast")


def test_every_action_from_its_page(project: Project, browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """Pause and resume a queue (queues page) and a function (its page); run a sleeping job
    now; trigger a schedule; invoke a function (a 422 shows each error; a valid payload shows
    the job's result); signal a waiting job, which then finishes."""
    from selenium.webdriver.common.by import By

    console_project(project)
    project.spawn_worker("fast", "slow")
    with gunicorn(project, token=TOKEN) as web:
        c = project.client
        waiting = web.post("/jobs/waiter", json={"sku": "SKU-1"}).json()["id"]
        sleeping = web.post("/jobs/sleeper", json={}).json()["id"]
        wait_for(lambda: c.get(waiting).status == "waiting" and c.get(sleeping).status == "sleeping",
                 timeout=30, what="the durable jobs to wait and sleep")
        d = browser
        d.set_window_size(1400, 1000)
        signed_in(d, web, TOKEN)

        # A queue: pause, then resume, from the queues page.
        go(d, "#queues")
        pause = '#queue-table tr[data-queue="slow"] button[data-action="pause"]'
        until("the pause button", lambda: has(d, pause))
        press(d, pause)
        until("the queue paused", lambda: web.get("/queues").json()["queues"][1]["paused"] is True)
        resume = '#queue-table tr[data-queue="slow"] button[data-action="resume"]'
        until("the resume button", lambda: has(d, resume))
        assert text(d, '#queue-table tr[data-queue="slow"] td[data-field="paused"]') == "queue"
        press(d, resume)
        until("the queue resumed", lambda: not any(q["paused"] for q in web.get("/queues").json()["queues"]))

        # A function: pause and resume from its page.
        go(d, "#function/record")
        until("the function's pause", lambda: has(d, '#function-actions button[data-action="pause"]'))
        press(d, '#function-actions button[data-action="pause"]')
        until("the function paused", lambda: "record" in web.get("/queues").json()["queues"][0]["paused_functions"])
        until("its paused mark", lambda: text(d, '#function-paused [data-field="paused"]') == "paused")
        until("the function's resume", lambda: has(d, '#function-actions button[data-action="resume"]'))
        press(d, '#function-actions button[data-action="resume"]')
        until("the function resumed", lambda: not web.get("/queues").json()["queues"][0]["paused_functions"])

        # Run now: a sleeping job.
        go(d, f"#job/{sleeping}")
        until("the run-now button", lambda: has(d, '#job-view button[data-action="run-now"]'))
        press(d, '#job-view button[data-action="run-now"]')
        if has_route(web, "post", "/jobs/{id}/run-now"):
            until("the job run now", lambda: c.get(sleeping).status == "done")
        else:
            until("a clear refusal", lambda: "run-now route" in toast_text(d))

        # Trigger a schedule.
        go(d, "#schedules")
        trigger = '#schedule-table button[data-action="trigger"][data-schedule="report"]'
        until("the trigger button", lambda: has(d, trigger))
        press(d, trigger)
        if has_route(web, "post", "/schedules/{name}/trigger"):
            until("a job of the schedule", lambda: "Triggered report" in toast_text(d))
        else:
            until("a clear refusal", lambda: "no trigger route" in toast_text(d))

        # Invoke: an invalid payload is refused with its errors; a valid one shows its result.
        go(d, "#function/pay")
        box = until("the invoke form", lambda: d.find_element(By.ID, "invoke-payload"))
        assert '"amount_cents": 0' in box.get_attribute("value")  # the schema's required fields
        box.clear()
        box.send_keys('{"to": "acme", "amount_cents": "ten"}')
        press(d, "#invoke-submit")
        until("the 422's errors", lambda: "$.amount_cents" in text(d, "#invoke-result"))
        box.clear()
        box.send_keys('{"to": "acme", "amount_cents": 1250}')
        press(d, "#invoke-submit")
        until("the job's result", lambda: '"paid": 1250' in text(d, '#invoke-result [data-field="result"]'))
        screenshot(d, tmp_path, "console-invoke.png")

        # Signal the waiting job from its page.
        go(d, f"#job/{waiting}")
        until("the signal form", lambda: has(d, "#signal-body"))
        assert read(d, "#signal-name", "value") == "approval"
        fresh(d, "#signal-body", lambda body: (body.clear(), body.send_keys('{"by": "dana"}')))
        press(d, '#signal-form button[type="submit"]')
        until("the job to finish", lambda: c.get(waiting).status == "done")
        assert c.get(waiting).as_dict()["result"] == {"approved_by": "dana"}
        until("its page to follow",
              lambda: text(d, f'#job-view table[data-job-id="{waiting}"] [data-field="status"]') == "done")

        # The audit page shows the actions taken.
        go(d, "#audit")
        until("the pauses on the audit page", lambda: len(has(d, '#audit-table tr[data-audit-action="pause"]')) == 2)
        assert script_errors(d) == []


SPAN = " \N{EN DASH} "  # between a folded audit entry's first and last time


def test_the_audit_page_shows_a_folded_entry_once_with_its_repeats(
        project: Project, browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """Three triggers of one schedule by one caller are one audit entry (folded): its row
    says "trigger 3 times" and spans its first to its last time; a single pause beside it
    says no count."""
    console_project(project)
    with gunicorn(project, token=TOKEN) as web:
        for _ in range(3):
            assert web.post("/schedules/report/trigger").status_code == 202
        assert web.post("/queues/slow/pause").status_code in (200, 202, 204)
        entries = web.get("/audit").json()["entries"]
        folded = next(e for e in entries if e["action"] == "trigger")
        assert folded["repeats"] == 3 and folded["last_at"] >= folded["at"], folded
        d = browser
        d.set_window_size(1400, 1000)
        signed_in(d, web, TOKEN)
        go(d, "#audit")
        trigger = '#audit-table tr[data-audit-action="trigger"]'
        until("the folded trigger entry", lambda: has(d, trigger))
        assert len(has(d, trigger)) == 1
        cells = has(d, f"{trigger} td")
        assert cells[2].text == "trigger 3 times", cells[2].text  # (its count, 3, is its repeats': not said)
        assert SPAN in cells[0].text, cells[0].text  # its first to its last time
        pause = has(d, '#audit-table tr[data-audit-action="pause"] td')
        assert pause[2].text == "pause" and SPAN not in pause[0].text, (pause[2].text, pause[0].text)
        screenshot(d, tmp_path, "console-audit-folded.png")
        assert script_errors(d) == []


def test_a_read_only_token_sees_no_action(console: tuple[Project, Web, dict[str, str]],
                                          browser: Any) -> None:  # noqa: F811
    """Signed in with a read-only token, no page shows a button or form it cannot use: no
    pause, resume, run now, trigger, requeue, delete, cancel, bulk, invoke or signal."""

    _, web, ids = console
    d = browser
    signed_in(d, web, READER)
    pages = [(p[0], "#function-view dl" if p[1] == "function" else p[2]) for p in PAGES]
    pages += [("#jobs/queued", "#job-table tbody tr")]
    pages += [(f"#job/{ids[k]}", f'#job-view table[data-job-id="{ids[k]}"]')
              for k in ("dead", "waiting", "sleeping", "scheduled")]
    for hash_, ready in pages:
        go(d, hash_)
        until(f"{hash_} with its data", lambda ready=ready: has(d, ready))  # type: ignore[misc]
        time.sleep(0.3)  # any later read of the page lands
        visible = [text or action for text, action in displayed(d, "main button:not([role=tab])", "data-action")]
        allowed = {"Find", "Newer", "Older", "Newest"}
        assert all(v in allowed for v in visible if v), (hash_, visible)
        forms = [form_id for _, form_id in displayed(d, "main form", "id")]
        assert set(forms) <= {"job-filters"}, (hash_, forms)
    assert "read-only" in text(d, "#scope-note")
    go(d, "#jobs/sleeping")  # each tab counts its own: the sleeper and the waiter apart from scheduled
    for status in ("scheduled", "sleeping", "waiting"):
        until(f"the {status} tab's count",
              lambda s=status: text(d, f'#status-tabs [data-count="{s}"]') == "1")  # type: ignore[misc]
    go(d, "#queues")  # and the queues table's columns
    for field in ("sleeping", "waiting"):
        until(f"the {field} column", lambda f=field: text(  # type: ignore[misc]
            d, f'#queue-table tr[data-queue="fast"] td[data-field="{f}"]') == "1")
    go(d, "#function/pay")
    until("the function page says why it has no form", lambda: "may not enqueue" in text(d, "#function-view"))
    assert script_errors(d) == []


def test_a_big_log_and_stream_render_in_under_a_second(console: tuple[Project, Web, dict[str, str]],
                                                       browser: Any) -> None:  # noqa: F811
    """A job that logged 1,000 lines and streamed 10,000 chunks (the console's, done): its
    page shows all of both within a second of being opened (measured in the browser, from
    the page opening to both painted; asserted with room for a loaded machine)."""
    _, web, ids = console
    job = ids["chatty"]
    d = browser
    signed_in(d, web, TOKEN)
    timings = []
    for _ in range(3):
        go(d, "#overview")
        go(d, f"#job/{job}")
        until("the log and the stream", lambda: d.execute_script(
            "return joblog.doneAt > 0 && jobstream.doneAt > 0 && page.id === arguments[0]", job))
        took = d.execute_script("return Math.max(joblog.doneAt, jobstream.doneAt) - page.openedAt")
        timings.append(took)
        log = read(d, '#job-view [data-field="log"]', "textContent")
        assert len(log.splitlines()) == 1000 and "compiling module_0999" in log
        stream = read(d, '#job-view [data-field="stream"]', "textContent")
        assert stream.startswith("token0 ") and stream.endswith("token9999 ")
        assert text(d, '#job-view [data-field="stream-count"]') == "10,000 chunks"
    print(f"log of 1,000 lines and stream of 10,000 chunks rendered in {sorted(timings)} ms")
    # About 0.3-0.5 s on a quiet 2-core machine, most of it the 10,000 events on the
    # wire; the bound is generous for a loaded one.
    assert min(timings) < 2000, timings
    assert script_errors(d) == []


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_live_views_hold_with_10000_jobs_in_every_status(project: Project, browser: Any) -> None:  # noqa: F811
    """10,000 jobs in every status: queued, scheduled, processing (claimed by a worker that
    froze: its leases an hour long), deferred (a paused function's), sleeping, waiting,
    done, dead and cancelled: every page opens and shows its first page of jobs within
    two seconds, the figures stay live (a job enqueued shows in the count within
    seconds), and the page's scripts keep up. (The sleeping and waiting pages are left
    out: they share the scheduled set, and 10,000 jobs due later in it leave their first
    page empty, a known limit pinned by test_job_lists.py,
    test_the_scheduled_list_behind_many_sleeping_jobs.)"""
    from selenium.webdriver.common.by import By

    from runner.client import Request
    from runner.worker.fetcher import CLAIM_FIELDS

    n = 10_000
    project.add_function("waiter", WAITER)
    project.add_function("sleeper", SLEEPER)
    project.add_function("held", INVOKED, INVOKED_SCHEMA)
    project.write_config(concurrency=64, batch=256, prefetch=256)
    c = project.client
    c.enqueue_many([Request("slow", {"seconds": 1}) for _ in range(2 * n)])   # queued: no slow worker
    claimed, slow = 0, project.keys("slow")
    while claimed < n:  # processing: half of them claimed by a worker that then froze
        got = project.runtime.scripts.claim(slow, n=min(500, n - claimed), start=min(500, n - claimed),
                                             lease_ms=3_600_000, token_base=f"frozen.{claimed}",
                                             dead_ttl_ms=3_600_000, done_ttl_ms=3_600_000)
        claimed += (len(got) - 2) // CLAIM_FIELDS
    c.pause("fast", function="held")
    c.enqueue_many([Request("held", {"to": "s", "amount_cents": i + 1}) for i in range(n)])  # deferred
    c.enqueue_many([Request("sleeper", {"i": i}) for i in range(n)])
    c.enqueue_many([Request("waiter", {"sku": f"s{i}"}) for i in range(n)])
    # Due after the sleeping and waiting jobs: the scheduled list reads the same index, latest
    # due first, and a first stretch of only sleeping jobs shows an empty page (a known limit,
    # see the docstring).
    scheduled = c.enqueue_many([Request("record", {"n": i}, delay_s=7200) for i in range(2 * n)])
    ids = [m.id for m in scheduled]  # type: ignore[union-attr]
    with gunicorn(project, token=TOKEN) as web:
        for i in range(0, n, 500):  # half the scheduled ones cancelled, 500 a request
            chunk = [{"queue": "fast", "id": j} for j in ids[i:i + 500]]
            assert web.post("/bulk", json={"action": "cancel", "jobs": chunk}).status_code == 200
        c.enqueue_many([Request("noop", {}) for _ in range(n)])
        c.enqueue_many([Request("perm", {"i": i}) for i in range(n)])
        project.spawn_worker("fast")
        figures = lambda: {q["name"]: q for q in web.get("/queues").json()["queues"]}  # noqa: E731
        wait_for(lambda: figures()["fast"]["dead"] == n and figures()["fast"]["ready"] == 0
                 and figures()["fast"]["processing"] == 0 and figures()["fast"]["scheduled"] == n
                 and figures()["fast"]["sleeping"] == n and figures()["fast"]["waiting"] == n, timeout=600,
                 interval=1, what="10,000 done, dead, sleeping and waiting")
        assert figures()["slow"]["processing"] == n and figures()["slow"]["ready"] == n
        d = browser
        signed_in(d, web, TOKEN)
        took = {}
        for hash_, ready in [("#overview", "#overview-tiles .tile"), ("#queues", '#queue-table tr[data-queue="fast"]'),
                             ("#queue/fast", '#queue-view [data-field="dead"]'),
                             ("#dead/fast", "#dead-table tr[data-job-id]"),
                             *[(f"#jobs/{s}", "#job-table tr[data-job-id]")
                               for s in ("queued", "scheduled", "processing", "deferred", "done", "dead",
                                         "cancelled")]]:
            go(d, "#audit")
            until("the audit page", lambda: shown(d) == "audit")
            start = time.monotonic()
            go(d, hash_)
            until(f"{hash_} with its data", lambda ready=ready: d.find_elements(By.CSS_SELECTOR, ready), timeout=30)  # type: ignore[misc]
            took[hash_] = round(time.monotonic() - start, 3)
        print("pages with 10,000 jobs in each status opened in (s):", took)
        assert max(took.values()) < 2, took
        go(d, "#jobs/queued")
        until("the queued count", lambda: text(d, '#status-tabs [data-count="queued"]') == str(n))
        for status in ("scheduled", "sleeping", "waiting"):  # counted apart, each its own tab's
            until(f"the {status} count", lambda s=status: text(d, f'#status-tabs [data-count="{s}"]') == str(n))
        c.enqueue("slow", {"seconds": 1})
        until("the new job counted, pushed",
              lambda: text(d, '#status-tabs [data-count="queued"]') == str(n + 1), timeout=10)
        assert script_errors(d) == []


DRIP = '''"""Streams a chunk, another once told to (a file appears), then waits to be cancelled."""
import os
import time
QUEUE = "slow"
TIMEOUT = 60

def handle(payload, ctx):
    ctx.stream("first ")
    ctx.logger.info("streamed the first")
    while not os.path.exists(os.path.join(os.environ["RECORD_DIR"], "go")):
        time.sleep(0.02)
    ctx.stream("second ")
    while not ctx.cancelled:
        time.sleep(0.02)
    ctx.raise_if_cancelled()
'''


def test_a_running_jobs_stream_shows_live(project: Project, browser: Any) -> None:  # noqa: F811
    """A running job's page shows its streamed output as the chunks land, without a
    reload, and keeps it when the job ends."""
    project.add_function("drip", DRIP)
    project.write_config(grace=1)
    project.spawn_worker("slow")
    with gunicorn(project, token=TOKEN) as web:
        job = web.post("/jobs/drip", json={}).json()["id"]
        d = browser
        signed_in(d, web, TOKEN)
        d.execute_script("window.sameDocument = true")
        go(d, f"#job/{job}")
        stream = lambda: text(d, '#job-view [data-field="stream"]')  # noqa: E731
        until("the first chunk while it runs", lambda: "first" in stream())
        (project.records / "go").write_text("")  # the job streams its second chunk now
        until("the second, pushed", lambda: stream().strip() == "first second")
        assert "streamed the first" in text(d, '#job-view [data-field="log"]')
        project.client.cancel(job)
        until("the job's end", lambda: text(d, f'#job-view table[data-job-id="{job}"] [data-field="status"]')
              == "cancelled")
        assert stream().strip() == "first second"
        assert d.execute_script("return window.sameDocument") is True
        assert script_errors(d) == []


FLOOD = '''"""Streams and logs far more than the server keeps, while a page follows, then waits."""
import os
import time
QUEUE = "slow"
TIMEOUT = 60

def handle(payload, ctx):
    ctx.stream("start ")
    while not os.path.exists(os.path.join(os.environ["RECORD_DIR"], "go")):  # the page follows
        time.sleep(0.02)
    for i in range(12):
        for _ in range(4):
            ctx.stream("x" * 30_000)
        for j in range(1_200):
            ctx.logger.info("line %d %d", i, j)
        time.sleep(0.15)  # (the page's follows, a quarter second apart, take it in pieces)
    ctx.stream(" end")
    while not ctx.cancelled:
        time.sleep(0.02)
    ctx.raise_if_cancelled()
'''


def test_a_followed_flood_stays_bounded_in_the_page(project: Project, browser: Any) -> None:  # noqa: F811
    """A page following a job that streams about 1.4 MB and logs 14,400 lines keeps about
    what the server keeps (the newest 1 MiB of output, the newest lines), with a mark that
    older output is not shown, and its newest output whole."""
    project.add_function("flood", FLOOD)
    toml = project.root / "runner.toml"
    bounds = "[retention]\nlogs = { lines = 100000, bytes = 16777216 }\n"
    toml.write_text(toml.read_text().replace("[retention]\n", bounds, 1))
    project.spawn_worker("slow")
    with gunicorn(project, token=TOKEN) as web:
        job = web.post("/jobs/flood", json={}).json()["id"]
        d = browser
        signed_in(d, web, TOKEN)
        go(d, f"#job/{job}")
        stream = lambda: text(d, '#job-view [data-field="stream"]')  # noqa: E731
        until("the page to follow the job", lambda: stream().startswith("start"))
        (project.records / "go").write_text("")  # the flood begins
        until("the end of the flood", lambda: stream().endswith(" end"), timeout=60)
        shown = stream()
        assert shown.startswith("… (older output not shown)") and len(shown) <= (1 << 20) + 64, len(shown)
        lines = text(d, '#job-view [data-field="log"]').splitlines()
        assert len(lines) <= 10_000 and lines[-1].endswith("line 11 1199"), (len(lines), lines[-1:])
        project.client.cancel(job)
        assert script_errors(d) == []


PAUSING = '''"""Logs and streams a line, waits for a file, does it again, then waits to be cancelled."""
import os
import time
QUEUE = "slow"
TIMEOUT = 60

def handle(payload, ctx):
    ctx.logger.info("first line")
    ctx.stream("first ")
    while not os.path.exists(os.path.join(os.environ["RECORD_DIR"], "go")):
        time.sleep(0.02)
    ctx.logger.info("second line")
    ctx.stream("second ")
    while not ctx.cancelled:
        time.sleep(0.02)
    ctx.raise_if_cancelled()
'''


def test_the_job_page_follows_on_across_a_redis_restart(tmp_path: Path, browser: Any) -> None:  # noqa: F811
    """Redis restarted while a running job's page follows its log and stream: the page
    keeps following and shows what the job logs and streams after Redis is back, then
    its end, without a reload."""
    from runner.store.embedded import Server

    from conftest import make_project

    srv = Server(tmp_path / "redis", appendonly=True).start()
    project = make_project(tmp_path / "p", srv)
    try:
        project.add_function("pausing", PAUSING)
        project.write_config(grace=1)
        project.spawn_worker("slow")
        with gunicorn(project, token=TOKEN) as web:
            job = web.post("/jobs/pausing", json={}).json()["id"]
            d = browser
            signed_in(d, web, TOKEN)
            go(d, f"#job/{job}")
            log = lambda: text(d, '#job-view [data-field="log"]')  # noqa: E731
            stream = lambda: text(d, '#job-view [data-field="stream"]')  # noqa: E731
            until("the first line", lambda: "first line" in log() and "first" in stream())
            srv.stop()
            wait_for(lambda: web.get(f"/jobs/{job}").status_code == 503, timeout=20, what="the web to see Redis away")
            away = time.monotonic()  # down past a few of the follows' polls (a quarter second each)
            wait_for(lambda: time.monotonic() - away > 1.5, timeout=5, what="the outage")
            srv.start()
            (project.records / "go").write_text("")
            until("the lines after the restart", lambda: "second line" in log() and "second" in stream(),
                  timeout=40)
            project.client.cancel(job)
            until("the job's end", lambda: text(d, f'#job-view table[data-job-id="{job}"] [data-field="status"]')
                  == "cancelled", timeout=40)
            assert "second line" in log() and stream().strip() == "first second"
    finally:
        project.stop_all()
        srv.stop(kill=True)


BIDI = '''"""Logs, streams and returns a producer's text with bidi controls in it."""
QUEUE = "fast"

def handle(payload, ctx):
    ctx.logger.info("acct %s", payload["acct"])
    ctx.stream("total: \\u202e00.001$")
    return {"acct": payload["acct"]}
'''


def test_bidi_controls_in_a_producers_text_are_shown_escaped(console: tuple[Project, Web, dict[str, str]],
                                                             browser: Any) -> None:  # noqa: F811
    """A right-to-left override (and every other bidi control) in a payload, a log line,
    a stream chunk or a result reaches no page raw, where it turned "00.001$" into
    "$100.00" on screen: each page shows it escaped, as `runner logs` does (the
    console's project, which has the function bidi)."""
    project, web, _ = console
    controls = "\u202e\u202a\u202b\u202c\u202d\u2066\u2067\u2068\u2069\u200e\u200f\u061c"
    job = web.post("/jobs/bidi", json={"acct": f"\u202e9876-5432 {controls}"}).json()["id"]
    wait_for(lambda: project.client.get(job).status == "done", timeout=30, what="the job to end")
    d = browser
    signed_in(d, web, TOKEN)
    go(d, f"#job/{job}")
    until("the log and the stream", lambda: d.execute_script(
        "return joblog.doneAt > 0 && jobstream.doneAt > 0 && page.id === arguments[0]", job))
    stream = read(d, '#job-view [data-field="stream"]', "textContent")
    assert stream == "total: \\u202e00.001$"
    log = read(d, '#job-view [data-field="log"]', "textContent")
    assert "acct \\u202e9876-5432" in log and "\\u061c" in log
    pages = {}
    for where in (f"#job/{job}", "#jobs/done"):
        go(d, where)
        until(f"{where} to show the job", lambda: job in d.execute_script("return document.body.textContent"))
        pages[where] = d.execute_script("return document.body.textContent")
    for where, body in pages.items():
        assert not set(controls) & set(body), (where, sorted(set(controls) & set(body)))
        assert "\\u202e9876-5432" in body, where
    assert script_errors(d) == []


def test_a_dead_letter_with_a_long_unbroken_payload_keeps_its_actions_in_the_card(
        project: Project, browser: Any, tmp_path: Path) -> None:  # noqa: F811
    """A dead letter whose payload holds a 3,000-character unbroken string nested 25 deep
    (a base64 blob, a URL): at 1400x1000 the dead-letters table stays within its card and
    the page does not scroll sideways, so Requeue, Edit and Delete stay on screen (the
    table grew to 1,415 px and pushed them out); the payload scrolls in its own box."""
    project.write_config(max_attempts=1)
    deep: dict[str, Any] = {}
    cur = deep
    for _ in range(25):
        cur["d"] = {}
        cur = cur["d"]
    cur["blob"] = "QUJD" * 750
    project.spawn_worker("fast")
    with gunicorn(project, token=TOKEN) as web:
        wide = web.post("/jobs/record", json={"n": 1, "fail_times": 9, "blob": "QUJD" * 750, "deep": deep}).json()["id"]
        plain = web.post("/jobs/record", json=ORDER).json()["id"]
        wait_for(lambda: {project.client.get(j).status for j in (wide, plain)} == {"dead"}, timeout=60,
                 what="the dead letters")
        d = browser
        d.set_window_size(1400, 1000)
        signed_in(d, web, TOKEN)
        go(d, "#dead/fast")
        row = f'#dead-table tr[data-job-id="{wide}"]'
        until("the wide dead letter's actions", lambda: len(has(d, f"{row} td.actions button")) == 3)
        time.sleep(0.5)  # the list's second read (the queue chosen) lands
        screenshot(d, tmp_path, "console-dead-wide.png")
        card, table, buttons, view, scroll = d.execute_script("""
            const box = (e) => { const r = e.getBoundingClientRect(); return [r.left, r.right]; };
            return [box(document.querySelector('#dead')), box(document.querySelector('#dead-table')),
                    [...document.querySelectorAll(arguments[0] + ' td.actions button')].map(box),
                    document.documentElement.clientWidth, document.documentElement.scrollWidth];""", row)
        assert scroll <= view, ("the page scrolls sideways", scroll, view)
        assert card[0] <= table[0] and table[1] <= card[1], ("the table is wider than its card", table, card)
        assert all(card[0] <= b[0] and b[1] <= card[1] and b[1] <= view for b in buttons), (buttons, card, view)
        spilt = d.execute_script("""
            return [...document.querySelectorAll('#dead-table td, #dead-table td.actions button')]
                .filter((e) => e.scrollWidth > e.clientWidth + 1).map((e) => e.outerHTML.slice(0, 80));""")
        assert spilt == [], "a cell or a button's label spills out of its box"
        pre = f'{row} pre[data-field="payload"]'
        assert d.execute_script("const p = document.querySelector(arguments[0]); return p.scrollWidth > "
                                "p.clientWidth", pre), "the long line scrolls in the payload's own box"
        # The plain one still keeps its numbers whole, on one line each.
        css = f'#dead-table tr[data-job-id="{plain}"] pre[data-field="payload"]'
        rects = d.execute_script("""
            const pre = document.querySelector(arguments[0]), range = document.createRange();
            const node = pre.firstChild, t = node.textContent, i = t.indexOf('1234567890123');
            range.setStart(node, i); range.setEnd(node, i + 13);
            return range.getClientRects().length;""", css)
        assert rects == 1, "the number is split over lines"
        assert script_errors(d) == []


def test_keys_of_another_type_show_what_to_do_on_their_pages(project: Project, browser: Any) -> None:  # noqa: F811
    """A done job whose log key another program made a hash and whose stream key a string,
    the workers' roster and the audit trail made strings: the job's log and stream, the
    workers page and the audit page show the server's note naming each key and what to
    do (each read was a 500, the job page's retried every second), with no script error."""
    project.spawn_worker("fast")
    c, r, k = project.client, project.runtime.redis, project.keys()
    job = c.enqueue("noop", {}).id
    wait_for(lambda: c.get(job).status == "done", timeout=30, what="the job to end")
    project.stop_all()  # (a worker's heartbeat would set the roster aside at once)
    damaged = {k.log(job): "hash", k.stream(job): "string", f"{project.prefix}:workers": "string",
               f"{project.prefix}:audit": "string"}
    for key, kind in damaged.items():
        r.delete(key)
        r.hset(key, "x", "y") if kind == "hash" else r.set(key, "garbage")
    with gunicorn(project, token=TOKEN) as web:
        d = browser
        signed_in(d, web, TOKEN)
        go(d, f"#job/{job}")
        for field, key in (("log", k.log(job)), ("stream", k.stream(job))):
            until(f"the {field}'s note", lambda field=field, key=key: key in text(  # type: ignore[misc]
                d, f'#job-view [data-field="{field}"]'))
            assert "DEL" in text(d, f'#job-view [data-field="{field}"]')
        go(d, "#workers")
        until("the roster's note", lambda: f"{project.prefix}:workers" in text(d, "#workers-view [data-damaged]"))
        go(d, "#audit")
        until("the trail's note", lambda: f"{project.prefix}:audit " in text(d, "#audit-view [data-damaged]"))
        assert script_errors(d) == []
