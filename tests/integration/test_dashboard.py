"""The dashboard in headless Chromium against a real gunicorn and a real worker: sign in
with the token, see the queues and a dead job, requeue it with an edited payload (an
invalid edit is refused and the job stays dead), and see it complete; with scoped
tokens, see only what their scopes allow; job lists, search, cancel, bulk actions with
their progress, updates pushed without a reload, and job data shown as text only.

Screenshots go to $DASHBOARD_SCREENSHOTS when set (a CI artifact), else to the test's
temporary folder."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import browserkit
import pytest
from browserkit import INSTALL, browser_programs
from test_web_support import gunicorn

from conftest import Project, wait_for

TOKEN = "dashboard-token"
browser = browserkit.browser  # the fixture, here for this module's tests and the modules that import it
def test_the_browser_and_its_driver_are_found_by_every_distribution_s_names(tmp_path: Path) -> None:
    """Ubuntu's chromium-browser and Google's google-chrome are found on PATH as Debian's
    chromium is, and CHROME_BIN / CHROMEDRIVER win; what is missing is None, and the skip
    message names each distribution's packages."""
    def program(folder: Path, name: str) -> str:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("#!/bin/sh\n")
        (folder / name).chmod(0o755)
        return str(folder / name)

    ubuntu = tmp_path / "ubuntu"
    assert browser_programs({"PATH": str(ubuntu)}, also=()) == (None, None)
    chrome = program(ubuntu, "chromium-browser")
    assert browser_programs({"PATH": str(ubuntu)}, also=()) == (chrome, None)
    driver = program(ubuntu, "chromedriver")
    assert browser_programs({"PATH": str(ubuntu)}, also=()) == (chrome, driver)
    assert browser_programs({"PATH": str(tmp_path / "none")}, also=(str(ubuntu),)) == (chrome, driver)
    google = program(tmp_path / "google", "google-chrome")
    assert browser_programs({"PATH": str(tmp_path / "google")}, also=(str(ubuntu),)) == (chrome, driver)  # by name
    google_driver = program(tmp_path / "google", "chromedriver")
    assert browser_programs({"PATH": str(tmp_path / "google")}, also=()) == (google, google_driver)
    mine = program(tmp_path / "mine", "my-chrome")
    assert browser_programs({"PATH": str(ubuntu), "CHROME_BIN": mine}, also=()) == (mine, driver)
    assert "chromium-browser chromium-chromedriver" in INSTALL and "chromium chromium-driver" in INSTALL


def visit(d: Any, hash_: str) -> None:
    """Open one of the dashboard's pages (#queues, #dead, #jobs/queued ...) as a link does."""
    d.execute_script("go(arguments[0])", hash_)


def until(what: str, pred: Callable[[], Any], timeout: float = 20) -> Any:
    """Poll the page (it refreshes itself) until ``pred`` holds; an element the page
    re-rendered under ``pred`` (stale) or has not drawn yet counts as not yet."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    def probe() -> Any:
        try:
            return pred()
        except (NoSuchElementException, StaleElementReferenceException):
            return None

    return wait_for(probe, timeout=timeout, interval=0.05, what=what)


def click(d: Any, element: Any) -> None:
    """Click, with the element first scrolled to the middle of the window (not under the
    page's sticky header, where the click would land on the header)."""
    d.execute_script("arguments[0].scrollIntoView({block: 'center'})", element)
    element.click()


def fresh(d: Any, css: str, act: Callable[[Any], Any], timeout: float = 10) -> Any:
    """``act`` on the element ``css`` finds, looked up again whenever the page re-rendered
    it between the lookup and the act (a push redraws lists, tables and the job page at
    any moment: an element held across that is stale), or has not drawn it yet."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.common.by import By

    deadline = time.monotonic() + timeout
    while True:
        try:
            return act(d.find_element(By.CSS_SELECTOR, css))
        except StaleElementReferenceException:
            if time.monotonic() > deadline:
                raise
        except NoSuchElementException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def read(d: Any, css: str, attribute: str = "") -> str:
    """The text (or an attribute) of the element ``css`` finds, as the page shows it now."""
    value: str = fresh(d, css, lambda e: e.get_attribute(attribute) if attribute else e.text)
    return value


def press(d: Any, css: str) -> None:
    """Click the element ``css`` finds (see click), looked up again if the page redrew it."""
    fresh(d, css, lambda e: click(d, e))


def choose(d: Any, css: str, value: str) -> None:
    """Pick ``value`` in the select ``css`` finds (its options are redrawn as queues and
    functions come and go)."""
    from selenium.webdriver.support.ui import Select

    fresh(d, css, lambda e: Select(e).select_by_value(value))


def test_a_read_or_a_click_looks_the_element_up_again_when_the_page_redrew_it(browser: Any) -> None:
    """The page redraws an element between its lookup and the read (or the click): the
    helpers every test here reads and clicks through find it again and read the new one,
    where a read of the element held raises StaleElementReferenceException."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By

    d = browser
    d.get("data:text/html,<main><p id='cell'>old</p></main>"
          "<script>window.redraw = (text) => { const p = document.createElement('p'); p.id = 'cell';"
          " p.textContent = text; p.onclick = () => { p.textContent = 'clicked'; };"
          " document.querySelector('main').replaceChildren(p); };</script>")
    held = d.find_element(By.ID, "cell")
    d.execute_script("redraw('new')")
    with pytest.raises(StaleElementReferenceException):
        held.text  # noqa: B018
    redrawn: list[str] = []

    def redraw_once(e: Any) -> str:
        if not redrawn:  # the page redraws it between the lookup and this read
            redrawn.append(d.execute_script("redraw('newer'); return 'redrawn'"))
        text: str = e.text
        return text

    assert fresh(d, "#cell", redraw_once) == "newer" and redrawn == ["redrawn"]
    redrawn.clear()
    fresh(d, "#cell", lambda e: redraw_once(e) and click(d, e))
    assert read(d, "#cell") == "clicked" and redrawn == ["redrawn"]


def test_dashboard_requeues_a_dead_job_with_an_edited_payload(project: Project, browser: Any,
                                                              tmp_path: Path) -> None:
    """The whole operator loop, clicked through the page; asserts on the page's text."""
    from selenium.webdriver.common.by import By

    project.spawn_worker("fast")
    with gunicorn(project, token=TOKEN) as web:
        ok = web.post("/jobs/record", json={"n": 1}).json()["id"]
        dead = web.post("/jobs/record", json={"n": 5, "fail_times": 99}).json()["id"]
        until("the job to die", lambda: web.get(f"/jobs/{dead}").json()["status"] == "dead")
        assert web.get(f"/jobs/{ok}").json()["status"] == "done"
        # A cancel is counted apart: never as dead-lettered.
        later = project.client.enqueue("record", {"n": 7}, delay=600).id
        assert project.client.cancel(later) == "cancelled"

        d = browser
        d.get(web.url + "/")
        # The API needs the token: the page asks for it and keeps it in this tab only.
        login = until("the sign-in prompt", lambda: d.find_element(By.ID, "login"))
        until("the prompt to open", login.is_displayed)
        d.find_element(By.ID, "token").send_keys("wrong")
        press(d, "#login-submit")
        until("a refusal", lambda: "refused" in d.find_element(By.ID, "login-error").text)
        field = d.find_element(By.ID, "token")
        field.clear()
        field.send_keys(TOKEN)
        press(d, "#login-submit")
        until("the prompt to close", lambda: not login.is_displayed())
        assert TOKEN not in d.current_url
        assert d.execute_script("return sessionStorage.getItem('runner.token')") == TOKEN

        def cell(queue: str, field: str) -> str:
            return read(d, f'#queue-table tr[data-queue="{queue}"] td[data-field="{field}"]')

        visit(d, "#queues")
        until("the queues with one dead job", lambda: cell("fast", "dead") == "1")
        until("the other figures", lambda: cell("slow", "dead") == "0" and cell("fast", "ready") == "0")

        def figures() -> list[str]:
            return read(d, '#function-figures tr[data-function="record"]').split()[:5]

        # A success reaches the figures within a second of its ack (the worker sums them).
        until("the success in the figures", lambda: figures()[3] == "1")
        assert figures() == ["record", "fast", "3", "1", "3"]  # enqueued, succeeded, retried

        def figure(field: str) -> str:
            return read(d, f'#function-figures tr[data-function="record"] td[data-field="{field}"]')

        assert (figure("dead"), figure("cancelled")) == ("1", "1")
        visit(d, "#functions")
        until("the functions", lambda: d.find_elements(By.CSS_SELECTOR, '#function-list [data-function="record"]'))
        fn = read(d, '#function-list [data-function="record"]')
        assert "max attempts" in fn and "schema v1" in fn

        visit(d, "#dead")
        row_css = f'#dead-table tr[data-job-id="{dead}"]'
        until("the dead job's row", lambda: d.find_element(By.CSS_SELECTOR, row_css))
        assert read(d, f'{row_css} [data-field="reason"]') == "max attempts reached"
        assert "planned failure on attempt 4" in read(d, f'{row_css} [data-field="error"]')
        assert read(d, f'{row_css} [data-field="attempts"]') == "4 / 4"
        assert '"fail_times": 99' in read(d, f'{row_css} [data-field="payload"]')

        # An invalid edit is refused with its JSON path, and the job stays dead.
        press(d, f"{row_css} button.edit")
        editor = d.find_element(By.ID, "edit-payload")
        until("the editor", editor.is_displayed)
        assert '"fail_times": 99' in editor.get_attribute("value")
        editor.clear()
        editor.send_keys('{"n": "five"}')
        press(d, "#edit-submit")
        until("the validation error", lambda: "$.n" in d.find_element(By.ID, "edit-errors").text)
        assert web.get(f"/jobs/{dead}").json()["status"] == "dead"

        editor.clear()
        editor.send_keys('{"n": 5, "fail_times": 0}')
        press(d, "#edit-submit")
        until("the editor to close", lambda: not editor.is_displayed())

        # The page follows the requeued job until it is done.
        until("the requeued job to complete", lambda: shown_status(d, dead) == "done")
        result = read(d, '#job-view [data-field="result"]')
        assert '"attempt": 1' in result and '"n": 5' in result
        d.back()  # to the dead letters, where the requeue began
        until("the dead-letter list to empty", lambda: d.find_element(By.ID, "dead").is_displayed()
              and not d.find_elements(By.CSS_SELECTOR, row_css))
        visit(d, "#queues")
        until("the queue figures to follow", lambda: cell("fast", "dead") == "0")
        d.execute_script("window.scrollTo(0, 0)")
        d.save_screenshot(str(tmp_path / "dashboard.png"))
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000
    job = project.client.get(dead).as_dict()
    # A done job keeps its outcome, not its payload: the result shows the edit ran.
    assert job["status"] == "done" and job["result"] == {"n": 5, "attempt": 1}


SUPPORT, PRODUCER = "support-token", "producer-token"
SCOPED = f"""
[api.tokens.support]
hash = "sha256:{hashlib.sha256(SUPPORT.encode()).hexdigest()}"
scopes = ["read"]

[api.tokens.producer]
hash = "sha256:{hashlib.sha256(PRODUCER.encode()).hexdigest()}"
scopes = ["enqueue:record"]
"""


def test_the_page_shows_only_what_the_tokens_scopes_allow(project: Project, browser: Any) -> None:
    """Signed in with a read-only token, the page names the token and its scopes, shows the
    queues and the dead job, and offers no requeue, edit or delete; signed in with a token
    that may only enqueue, it shows no data at all and says why."""
    from selenium.webdriver.common.by import By

    project.write_config(extra=SCOPED)
    dead = project.client.enqueue("perm", {}).id
    project.spawn_worker("fast")
    until("the job to die", lambda: project.client.get(dead).status == "dead")
    with gunicorn(project) as web:  # no RUNNER_API_TOKEN: only the tokens of runner.toml
        d = browser
        d.get(web.url + "/")

        def sign_in(secret: str) -> None:
            login = until("the sign-in prompt", lambda: d.find_element(By.ID, "login"))
            until("the prompt to open", login.is_displayed)
            field = d.find_element(By.ID, "token")
            field.clear()
            field.send_keys(secret)
            press(d, "#login-submit")
            until("the prompt to close", lambda: not login.is_displayed())

        sign_in(SUPPORT)
        who = d.find_element(By.ID, "whoami")
        until("the token's name and scopes", lambda: who.text == "support · read")
        visit(d, "#dead")
        row_css = f'#dead-table tr[data-job-id="{dead}"]'
        until("the dead job's row", lambda: d.find_element(By.CSS_SELECTOR, row_css))
        assert read(d, f'{row_css} [data-field="reason"]') == "permanent failure"
        assert d.find_elements(By.CSS_SELECTOR, f"{row_css} button") == []  # none made, not merely hidden
        assert "read-only" in d.find_element(By.ID, "scope-note").text
        visit(d, "#queues")
        assert d.find_element(By.ID, "queues").is_displayed()

        press(d, "#logout")
        sign_in(PRODUCER)
        until("the producer's name", lambda: who.text == "producer · enqueue:record")
        assert not d.find_element(By.ID, "queues").is_displayed()
        assert not d.find_element(By.ID, "dead").is_displayed()
        assert "cannot read" in d.find_element(By.ID, "scope-note").text
    assert project.client.get(dead).status == "dead"


# --- job lists, search, actions, live updates ----------------------------------------------


def screenshot(d: Any, tmp_path: Path, name: str) -> Path:
    folder = Path(os.environ.get("DASHBOARD_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    d.execute_script("window.scrollTo(0, 0)")
    path = folder / name
    d.save_screenshot(str(path))
    assert path.stat().st_size > 10_000
    return path


def script_errors(d: Any) -> list[str]:
    """What the page's scripts logged as errors (a failed fetch the page handles, such as
    a 404 for an unknown id, is the browser's own line, not an error of the page)."""
    return [e["message"] for e in d.get_log("browser")
            if e["level"] == "SEVERE" and "Failed to load resource" not in e["message"]]


def signed_in(d: Any, web: Any, token: str = TOKEN) -> None:
    from selenium.webdriver.common.by import By

    d.get(web.url + "/")
    login = until("the sign-in prompt", lambda: d.find_element(By.ID, "login"))
    until("the prompt to open", login.is_displayed)
    d.find_element(By.ID, "token").send_keys(token)
    press(d, "#login-submit")
    until("the prompt to close", lambda: not login.is_displayed())
    until("the event stream", lambda: d.find_element(By.ID, "live").text == "live")


def listed(d: Any) -> list[str]:
    from selenium.webdriver.common.by import By

    rows = d.find_elements(By.CSS_SELECTOR, "#job-table tbody tr[data-job-id]")
    return [r.get_attribute("data-job-id") for r in rows]


def tab_count(d: Any, status: str) -> str:
    from selenium.webdriver.common.by import By

    if not d.find_element(By.ID, "jobs").is_displayed():
        visit(d, f"#jobs/{status}")
    return read(d, f'#status-tabs [data-count="{status}"]')


def shown_status(d: Any, job_id: str) -> str:
    return read(d, f'#job-view table[data-job-id="{job_id}"] [data-field="status"]')


def find(d: Any, text: str) -> None:
    from selenium.webdriver.common.by import By

    box = d.find_element(By.ID, "search")
    if not box.is_displayed():
        visit(d, "#jobs/queued")
    box.clear()
    box.send_keys(text)
    press(d, "#search-go")


def test_lists_search_cancel_and_updates_pushed_without_a_reload(project: Project, browser: Any,
                                                                 tmp_path: Path) -> None:
    """The queued list shows the jobs newest first with the count on its tab; a job enqueued
    while the page is open appears, and the count follows, without a reload and without the
    page reading the figures itself (they come through the event stream). The search finds a
    job by idempotency key and by id, and says so when neither matches. Cancel on a job's
    page (two clicks) cancels it through DELETE /jobs/{id}; the cancelled list shows it. The
    open job's page follows it to done once a worker runs it."""
    from selenium.webdriver.common.by import By

    with gunicorn(project, token=TOKEN) as web:
        ids = [web.post("/jobs/record", json={"n": i}).json()["id"] for i in range(3)]
        keyed = web.post("/jobs/idem", json={"k": "order-42"}).json()["id"]
        d = browser
        signed_in(d, web)
        visit(d, "#jobs/queued")
        until("the queued list, newest first", lambda: listed(d) == [keyed, *ids[::-1]])
        until("the queued count", lambda: tab_count(d, "queued") == "4")

        d.execute_script("window.sameDocument = true; performance.clearResourceTimings()")
        new = web.post("/jobs/record", json={"n": 99}).json()["id"]
        until("the new job at the top of the list", lambda: listed(d)[:1] == [new])
        until("the count to follow", lambda: tab_count(d, "queued") == "5")
        assert d.execute_script("return window.sameDocument") is True  # no reload
        fetched = d.execute_script("return performance.getEntriesByType('resource')"
                                ".map((e) => new URL(e.name).pathname)")
        assert "/jobs" in fetched and "/queues" not in fetched, fetched  # the list read again; figures pushed

        find(d, "order-42")
        until("the keyed job's page", lambda: shown_status(d, keyed) == "queued")
        assert read(d, '#job-view [data-field="idempotency_key"]') == "order-42"
        # One found: its page opens; the list's page keeps what the search found.
        assert "by idempotency key" in read(d, "#search-result", "textContent")
        find(d, ids[0])
        until("the job found by id", lambda: shown_status(d, ids[0]) == "queued")
        find(d, "no-such-job-or-key")
        until("a search that finds nothing",
              lambda: "No job has the id or idempotency key" in d.find_element(By.ID, "search-result").text)

        visit(d, "#jobs/queued")
        press(d, f'#job-table a[data-job-link="{ids[1]}"]')
        cancel_css = f'#job-view:has(table[data-job-id="{ids[1]}"]) button[data-action="cancel"]'
        press(d, cancel_css)
        until("the button to arm", lambda: read(d, cancel_css) == "Confirm cancel")
        assert web.get(f"/jobs/{ids[1]}").json()["status"] == "queued"  # one click changes nothing
        press(d, cancel_css)
        until("the job cancelled", lambda: shown_status(d, ids[1]) == "cancelled")
        assert web.get(f"/jobs/{ids[1]}").json()["status"] == "cancelled"
        visit(d, "#jobs/queued")
        press(d, '#status-tabs [data-status="cancelled"]')
        until("the cancelled list", lambda: listed(d) == [ids[1]])
        until("the cancelled count", lambda: tab_count(d, "cancelled") == "1")

        find(d, ids[0])
        until("the job's page", lambda: shown_status(d, ids[0]) == "queued")
        project.spawn_worker("fast")
        until("the open job to finish, pushed", lambda: shown_status(d, ids[0]) == "done")
        d.execute_script("window.scrollTo(0, 0)")
        assert '"n": 0' in read(d, '#job-view [data-field="result"]')
        assert "done" in read(d, '#job-view [data-field="history"]')
        until("the queued count to drain", lambda: tab_count(d, "queued") == "0")
        assert d.execute_script("return window.sameDocument") is True
        screenshot(d, tmp_path, "dashboard-jobs.png")
        assert script_errors(d) == []


def test_the_tabs_count_the_queue_filtered_on_as_soon_as_the_filter_changes(project: Project,
                                                                             browser: Any) -> None:
    """Choosing a queue in the filter (and going back to all) shows that queue's counts on
    the status tabs at once, from the figures the page holds, in the same step that shows
    its list: never the previous queue's counts until the next push of the figures."""

    with gunicorn(project, token=TOKEN) as web:
        for i in range(3):
            web.post("/jobs/record", json={"n": i})  # fast: 3 queued
        web.post("/jobs/record?delay=600", json={"n": 9})  # fast: 1 scheduled
        web.post("/jobs/slow", json={"seconds": 1})  # slow: 1 queued, no worker for either
        d = browser
        signed_in(d, web)
        visit(d, "#jobs/queued")
        until("the counts of every queue",
              lambda: (tab_count(d, "queued"), tab_count(d, "scheduled")) == ("4", "1"))
        # What the tabs show in the very step that routes to the new filter (a listener
        # added after the page's own runs right after it, before any push can land).
        d.execute_script("""
            window.countsShown = [];
            window.addEventListener('hashchange', () => window.countsShown.push([list.queue,
              ...['queued', 'scheduled', 'processing', 'dead'].map(
                (s) => document.querySelector(`#status-tabs [data-count="${s}"]`).textContent)]));""")
        choose(d, "#filter-queue", "slow")
        until("the filter's route", lambda: len(d.execute_script("return window.countsShown")) == 1)
        d.back()  # to every queue
        until("the route back", lambda: len(d.execute_script("return window.countsShown")) == 2)
        choose(d, "#filter-queue", "fast")
        until("the next filter's route", lambda: len(d.execute_script("return window.countsShown")) == 3)
        assert d.execute_script("return window.countsShown") == [
            ["slow", "1", "0", "0", "0"], ["", "4", "1", "0", "0"], ["fast", "3", "1", "0", "0"]]
        assert script_errors(d) == []


def dead_jobs(project: Project, *batches: tuple[str, int, dict[str, Any]]) -> list[list[str]]:
    """The ids of each batch's jobs (of its type, as many, with its payload), dead: run
    to their end by one worker in this process."""
    from runner.worker.worker import Worker

    c = project.client
    ids = [[c.enqueue(type_, payload).id for _ in range(n)] for type_, n, payload in batches]
    worker = Worker(project.runtime, ["fast"])
    worker.start()
    try:
        wait_for(lambda: all(c.get(i).status == "dead" for batch in ids for i in batch), timeout=30,
                 what="the jobs to die")
    finally:
        worker.stop(2)
    return ids


def test_bulk_requeue_and_cancel_of_a_filtered_set_with_confirmation_and_progress(
        project: Project, browser: Any, tmp_path: Path) -> None:
    """Dead jobs filtered by type: "Requeue all" reads the set page by page, asks (naming
    how many), then requeues them through POST /bulk, counting "n of m" up to the end, on
    the audit trail as one entry; the job of another type stays dead. "Cancel all" on the queued list, declined
    at the confirmation, changes nothing; confirmed, cancels every one."""
    from selenium.webdriver.common.by import By

    perm, [other] = dead_jobs(project, ("perm", 30, {}), ("record", 1, {"fail_times": 99}))
    with gunicorn(project, token=TOKEN) as web:
        d = browser
        signed_in(d, web)
        visit(d, "#jobs/queued")
        press(d, '#status-tabs [data-status="dead"]')
        until("the dead count", lambda: tab_count(d, "dead") == "31")
        until("the type filter's choices",
              lambda: d.find_elements(By.CSS_SELECTOR, '#filter-type option[value="perm"]'))
        choose(d, "#filter-type", "perm")
        until("a page of dead perm jobs", lambda: len(listed(d)) == 25 and other not in listed(d))

        # Every text the progress shows, in order, as the page shows it.
        d.execute_script("""
            window.progressSeen = [];
            new MutationObserver(() => window.progressSeen.push(document.querySelector('#bulk-text').textContent))
              .observe(document.querySelector('#bulk-text'), {childList: true, characterData: true, subtree: true});""")
        press(d, "#bulk-requeue")
        dialog = d.find_element(By.ID, "bulk-dialog")
        until("the confirmation", dialog.is_displayed)
        assert d.find_element(By.ID, "bulk-title").text == "Requeue 30 dead jobs?"
        assert "type perm" in d.find_element(By.ID, "bulk-summary").text
        press(d, "#bulk-yes")
        until("the bulk requeue to finish", lambda: d.find_element(By.ID, "bulk-text").text == "requeued: 30 of 30")
        counts = [int(m.group(1)) for t in d.execute_script("return window.progressSeen")
                  if (m := re.search(r"(\d+) of 30", t))]
        # One chunk (up to 500 jobs) a request: from 0 to all 30 in one step.
        assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 30, counts
        for job_id in perm:
            job = web.get(f"/jobs/{job_id}").json()
            assert job["status"] == "queued" and job["history"][-1]["outcome"] == "requeued", job
        assert web.get(f"/jobs/{other}").json()["status"] == "dead"
        # One request (POST /bulk), one audit entry: not one per job.
        trail = web.get("/audit").json()
        assert trail["total"] == 1 and trail["entries"][0]["action"] == "requeue", trail
        assert trail["entries"][0]["by"] == "default"
        assert trail["entries"][0]["count"] == 30 and sorted(trail["entries"][0]["ids"]) == sorted(perm)
        until("the dead count to follow", lambda: tab_count(d, "dead") == "1")
        until("the emptied list", lambda: "No dead jobs" in d.find_element(By.ID, "job-table").text)
        screenshot(d, tmp_path, "dashboard-bulk.png")

        press(d, '#status-tabs [data-status="queued"]')
        until("the requeued jobs, queued", lambda: len(listed(d)) == 25)
        press(d, "#bulk-cancel")
        until("the confirmation", dialog.is_displayed)
        assert d.find_element(By.ID, "bulk-title").text == "Cancel 30 queued jobs?"
        press(d, "#bulk-no")
        until("the confirmation to close", lambda: not dialog.is_displayed())
        assert all(web.get(f"/jobs/{i}").json()["status"] == "queued" for i in perm)
        press(d, "#bulk-cancel")
        until("the confirmation", dialog.is_displayed)
        press(d, "#bulk-yes")
        until("the bulk cancel to finish", lambda: d.find_element(By.ID, "bulk-text").text == "cancelled: 30 of 30")
        assert all(web.get(f"/jobs/{i}").json()["status"] == "cancelled" for i in perm)
        trail = web.get("/audit").json()
        assert [(e["action"], e.get("count")) for e in trail["entries"]] == [("cancel", 30), ("requeue", 30)], trail
        until("the cancelled count", lambda: tab_count(d, "cancelled") == "30")
        assert script_errors(d) == []


HOSTILE = '<img src=x onerror="window.injected=1"><script>window.injected=2</script><b id="injected">b</b>'


def test_job_data_is_shown_as_text_never_as_markup(project: Project, browser: Any) -> None:
    """Payloads, results, idempotency keys and the parent, children and group fields are
    user data: the page shows them as text, wherever they appear (list, search, job page),
    and no element or script of theirs comes to life. Links to related jobs stay links to
    this page's job view."""
    from selenium.webdriver.common.by import By

    project.spawn_worker("fast")  # not the slow queue: its job stays queued
    with gunicorn(project, token=TOKEN) as web:
        hostile = {"Idempotency-Key": HOSTILE}
        done = web.post("/jobs/noop", json={"note": HOSTILE, HOSTILE: [HOSTILE]}, headers=hostile).json()["id"]
        queued = web.post("/jobs/slow", json={"seconds": 1, "note": HOSTILE}, headers=hostile).json()["id"]
        until("the job to finish", lambda: web.get(f"/jobs/{done}").json()["status"] == "done")
        d = browser
        signed_in(d, web)
        visit(d, "#jobs/queued")
        row_css = f'#job-table tr[data-job-id="{queued}"]'
        until("the queued job's row", lambda: d.find_element(By.CSS_SELECTOR, row_css))
        assert read(d, f'{row_css} [data-field="idempotency_key"]') == HOSTILE

        find(d, HOSTILE)  # a key per function: both hold it
        found = until("both jobs found", lambda: len(d.find_elements(By.CSS_SELECTOR, "#search-result li")) == 2)
        assert found
        assert "by idempotency key (noop)" in d.find_element(By.ID, "search-result").text
        press(d, f'#search-result a[data-job-link="{done}"]')
        until("the done job's page", lambda: shown_status(d, done) == "done")
        as_json = json.dumps(HOSTILE)  # as the page shows a string in JSON
        assert as_json in read(d, '#job-view [data-field="result"]')
        d.back()  # to the list and its search
        other = f'#search-result a[data-job-link="{queued}"]'
        press(d, other)
        until("the queued job's page", lambda: shown_status(d, queued) == "queued")
        assert read(d, '#job-view [data-field="idempotency_key"]') == HOSTILE
        assert as_json in read(d, '#job-view [data-field="payload"]')
        job = queued

        # The fields of workflows, as GET /jobs/{id} may carry them: links when they name jobs.
        # Shown under an id of its own, so that the stream's news of the real job cannot
        # replace it.
        shown = {**web.get(f"/jobs/{job}").json(), "id": "with-workflow-fields", "parent": HOSTILE,
                 "children": ["child-1", {"id": HOSTILE}], "group": {"id": HOSTILE, "size": 3}}
        d.execute_script("page.id = arguments[0].id; onJob(arguments[0]);", shown)
        view = d.find_element(By.ID, "job-view")
        parents = view.find_elements(By.CSS_SELECTOR, "a[data-job-link]")
        assert [a.text for a in parents] == [HOSTILE, "child-1", HOSTILE]
        for a in parents:
            assert a.get_attribute("href").startswith(web.url + "/#job/"), a.get_attribute("href")
        group = view.find_element(By.CSS_SELECTOR, "a[data-group-link]")
        assert group.text == HOSTILE
        counted = d.execute_script(
            "return document.querySelectorAll('main img, main script, #injected, main b').length")
        assert counted == 0
        assert d.execute_script("return window.injected") is None

        press(d, '#job-view a[data-job-link="child-1"]')
        until("the child's page (no such job here)",
              lambda: d.find_element(By.CSS_SELECTOR, '#job-view [data-job-gone="child-1"]'))
        assert script_errors(d) == []


def test_a_partitioned_queue_shows_each_partition_under_its_sums(project: Project, browser: Any) -> None:
    """A queue of 3 partitions: its row holds the sums, and a row per partition under it
    names the partition's tag and holds its own figures."""
    from selenium.webdriver.common.by import By

    project.write_config(fast="partitions = 3")
    with gunicorn(project, token=TOKEN) as web:
        for i in range(9):  # keyless: each enqueue's round trip goes to the next partition
            assert web.post("/jobs/record", json={"n": i}).status_code == 202
        d = browser
        signed_in(d, web)
        visit(d, "#queues")

        def ready(css: str) -> str:
            return read(d, f'#queue-table tr{css} td[data-field="ready"]')

        until("the queue's sums", lambda: ready('[data-queue="fast"]') == "9")
        rows = [f'#queue-table tr[data-queue-partition="fast/{i}"]' for i in range(3)]
        tags = {k.partition: k.tag for k in project.runtime.parts["fast"]}
        assert [read(d, row).split()[2] for row in rows] == ["{" + tags[i] + "}" for i in range(3)]
        assert sum(int(ready(f'[data-queue-partition="fast/{i}"]')) for i in range(3)) == 9
        assert not d.find_elements(By.CSS_SELECTOR, 'tr[data-queue-partition^="slow/"]')
        assert not script_errors(d)


LOGGING = '''"""Logs a line, then another once told to (a file appears), until cancelled."""
import os
import time
QUEUE = "slow"
TIMEOUT = 60

def handle(payload, ctx):
    ctx.logger.info("first line %s", payload["note"])
    while not os.path.exists(os.path.join(os.environ["RECORD_DIR"], "go")):
        time.sleep(0.02)
    ctx.logger.info("second line")
    while not ctx.cancelled:
        time.sleep(0.02)
    ctx.raise_if_cancelled()
'''


def test_the_job_page_shows_its_log_live_and_as_text(project: Project, browser: Any) -> None:
    """A running job's page shows its log lines as they land, without a reload; a line
    holding markup is shown as text, and nothing of it comes to life."""

    project.add_function("logging", LOGGING)
    project.write_config(grace=1)
    project.spawn_worker("slow")
    with gunicorn(project, token=TOKEN) as web:
        job = web.post("/jobs/logging", json={"note": HOSTILE}).json()["id"]
        d = browser
        signed_in(d, web)
        d.execute_script("lookUp(arguments[0]);", job)
        log = lambda: read(d, '#job-view [data-field="log"]')  # noqa: E731
        until("the first line on the page", lambda: f"first line {HOSTILE}" in log())
        (project.records / "go").write_text("")  # the job logs its second line now
        until("the second line, pushed without a reload", lambda: "second line" in log())
        assert d.execute_script("return window.injected") is None
        assert d.execute_script("return document.querySelectorAll('#job-view img, #job-view script').length") == 0
        project.client.cancel(job)
        until("the job's end", lambda: shown_status(d, job) == "cancelled")
        assert script_errors(d) == []


def test_foreign_records_render_on_every_page(project: Project, browser: Any) -> None:
    """Records another writer put in Redis (test_foreign_records.plant_foreign: times past
    the year 9999 in a history entry, the meta, a log line, a roster entry, events and an
    audit entry; meta steps "abc"; an error and a progress holding objects; events whose
    jobs are "abc" or [null]; a group whose then-job is unreadable) render on every page:
    the job page stayed on "Reading job…" and the workers, events and audit pages stayed
    blank (RangeError: Invalid time value, steps.map is not a function), objects showed as
    "[object Object]", and the group page named a "waiting" then-job with no id. The page's
    own formatting holds too, for a view no server bounded."""
    from selenium.webdriver.common.by import By
    from test_foreign_records import FOREIGN_GROUP, FOREIGN_JOB, FOREIGN_WORKER, plant_foreign

    plant_foreign(project)
    with gunicorn(project, token=TOKEN) as web:
        raw = web.get(f"/jobs/{FOREIGN_JOB}").json()
        d = browser
        signed_in(d, web)
        pages = {f"#job/{FOREIGN_JOB}": ("job-view", f'#job-view table[data-job-id="{FOREIGN_JOB}"]'),
                 "#workers": ("workers-view", f'#workers-view tr[data-worker="{FOREIGN_WORKER}"]'),
                 "#events": ("events-view", '#events-view tr[data-event="foreign-ev"]'),
                 "#audit": ("audit-view", "#audit-view tr[data-audit-action]"),
                 f"#group/{FOREIGN_GROUP}": ("group-view", f'#group-view table[data-group-id="{FOREIGN_GROUP}"]')}
        shown = {}
        for hash_, (view, drawn) in pages.items():
            visit(d, hash_)
            until(f"{hash_} drawn", lambda drawn=drawn: d.find_elements(By.CSS_SELECTOR, drawn))
            if hash_.startswith("#job/"):
                until("the job's log", lambda: '{"an":"object"}' in read(d, '#job-view [data-field="log"]'))
                assert read(d, '#job-view [data-field="progress"]') == '{"a":1}'
                assert read(d, '#job-view [data-field="error"] strong') == '{"a":1}:'
            if hash_ == "#events":
                assert len(d.find_elements(By.CSS_SELECTOR, "#events-view tr[data-event]")) == 4
            shown[hash_] = d.find_element(By.ID, view).text
        assert script_errors(d) == []
        for hash_, text in shown.items():
            assert "[object Object]" not in text and "Reading" not in text, (hash_, text[:400])
        then = read(d, '#group-view [data-field="then"]')
        assert "unreadable" in then and "waiting" not in shown[f"#group/{FOREIGN_GROUP}"], then

        # The page's own formatting, handed the record as no server bounded it.
        assert d.execute_script("return [when(1e300), when(1e14), when(-5), when(NaN), when(86400)]") == [
            "?", "?", "?", "—", "1970-01-02 00:00:00"]
        unbounded = {**raw, "id": "unbounded", "history": [{"attempt": 1, "at_ms": 1e17, "foo_at": 1e300}],
                     "steps": "abc", "lease_expires_at": 1e300, "sleeping_until": 1e300, "invoked_by": 5,
                     "waiting_for": {"signal": {"a": 1}}}
        visit(d, f"#job/{FOREIGN_JOB}")
        until("the job page", lambda: d.find_elements(By.CSS_SELECTOR, f'#job-view table[data-job-id="{FOREIGN_JOB}"]'))
        d.execute_script("page.id = arguments[0].id; onJob(arguments[0]);", unbounded)
        text = until("the unbounded view", lambda: d.find_element(By.CSS_SELECTOR,
                                                                  '#job-view table[data-job-id="unbounded"]')) and \
            d.find_element(By.ID, "job-view").text
        assert '"abc"' in text and "?" in text and "[object Object]" not in text, text[:600]
        assert script_errors(d) == []


BIG = 9007199254740993  # 2**53 + 1: a double rounds it to ...992; the API takes integers to 2**64 - 1
ECHO = '''"""Echoes its payload, or dies at once when told to."""
from runner import PermanentFailure

QUEUE = "fast"


def handle(payload, ctx):
    if payload.get("die"):
        raise PermanentFailure("told to die")
    return payload
'''
ASKER = '''"""Waits for a signal, streams its body, and returns it."""
QUEUE = "fast"


def handle(payload, ctx):
    answer = ctx.wait_for_signal("go", timeout=120)
    ctx.stream(answer)
    return answer
'''


def test_integers_past_2_53_are_shown_and_sent_back_exactly(project: Project, browser: Any) -> None:
    """An integer the API accepted past 2**53 is shown as it was sent (the dead letters,
    the job page's payload, result and stream), and whatever the page sends back keeps it:
    an "Edit & requeue" with nothing edited, an invoke and a signal. The page parsed JSON
    into doubles and sent them back re-serialized: ...993 showed, and was written back into
    the job, as ...992."""
    from selenium.webdriver.common.by import By

    project.add_function("echo", ECHO)
    project.add_function("asker", ASKER)
    project.spawn_worker("fast")
    body = f'{{"die": true, "order_id": {BIG}, "note": "untouched"}}'.encode()
    with gunicorn(project, token=TOKEN) as web:
        dead = web.post("/jobs/echo", data=body, headers={"Content-Type": "application/json"}).json()["id"]
        until("the job to die", lambda: web.get(f"/jobs/{dead}").json()["status"] == "dead")
        d = browser
        signed_in(d, web)
        visit(d, "#dead/fast")
        row_css = f'#dead-table tr[data-job-id="{dead}"]'
        until("the dead job's row", lambda: d.find_element(By.CSS_SELECTOR, row_css))
        assert str(BIG) in read(d, f'{row_css} [data-field="payload"]')

        press(d, f"{row_css} button.edit")  # and nothing edited
        editor = d.find_element(By.ID, "edit-payload")
        until("the editor", editor.is_displayed)
        assert str(BIG) in editor.get_attribute("value")
        press(d, "#edit-submit")
        until("the requeued job to die again", lambda: len(project.client.get(dead).as_dict()["history"]) > 1
              and project.client.get(dead).status == "dead", timeout=30)
        assert project.client.get(dead).as_dict()["payload"] == {"die": True, "order_id": BIG, "note": "untouched"}
        until("the job page", lambda: shown_status(d, dead) == "dead")
        assert str(BIG) in read(d, '#job-view [data-field="payload"]')

        visit(d, "#function/echo")
        box = until("the invoke form", lambda: d.find_element(By.ID, "invoke-payload"))
        box.clear()
        box.send_keys(f'{{"order_id": {BIG}}}')
        press(d, "#invoke-submit")
        until("the invoked job's result", lambda: str(BIG) in read(d, '#invoke-result [data-field="result"]'))
        invoked = read(d, "#invoke-result table[data-job-id]", "data-job-id")
        assert project.client.get(invoked).as_dict()["result"] == {"order_id": BIG}

        asker = web.post("/jobs/asker", json={}).json()["id"]
        until("the job to wait", lambda: web.get(f"/jobs/{asker}").json()["status"] == "waiting", timeout=30)
        visit(d, f"#job/{asker}")
        signal = until("the signal form", lambda: d.find_element(By.ID, "signal-body"))
        signal.clear()
        signal.send_keys(f'{{"n": {BIG}}}')
        press(d, '#signal-form button[type="submit"]')
        until("the signalled job's end", lambda: shown_status(d, asker) == "done", timeout=30)
        assert project.client.get(asker).as_dict()["result"] == {"n": BIG}
        assert str(BIG) in read(d, '#job-view [data-field="result"]')
        until("the streamed body", lambda: str(BIG) in read(d, '#job-view [data-field="stream"]'))
        assert str(BIG - 1) not in d.find_element(By.ID, "job-view").text
        # The page's own reading and writing: integers in strings stay text, floats stay
        # doubles, and an object without big integers is written as JSON.stringify writes it.
        tricky = ('{"a": [-18446744073709551615, 1.5e300, 0.1, "9007199254740993 \\" 9007199254740993", '
                  '{"b": 18446744073709551615, "\\u0000x": 123456789012345678901234567890}], "c": 3}')
        assert d.execute_script("return compact(parseJSON(arguments[0]))", tricky) == (
            '{"a":[-18446744073709551615,1.5e+300,0.1,"9007199254740993 \\" 9007199254740993",'
            '{"b":18446744073709551615,"\\u0000x":123456789012345678901234567890}],"c":3}')
        plain = '{"a": [1, {"b": "x"}], "c": null}'
        assert d.execute_script("const text = arguments[0];"
                                "return json(parseJSON(text)) === JSON.stringify(JSON.parse(text), null, 2)", plain)
        assert script_errors(d) == []


COMMENTER = '''"""Logs a comment a producer sent."""
QUEUE = "fast"


def handle(payload, ctx):
    ctx.logger.info("comment received: %s", payload["text"])
    ctx.logger.info("next line")
'''


def test_a_log_lines_newlines_cannot_forge_lines_of_their_own(project: Project, browser: Any) -> None:
    """A log line's text may hold newlines (here from a producer's payload): the job page
    shows what follows each one indented and marked as a part of its line, as `runner logs`
    indents it, so it cannot pass for a line with a time, level and source of its own (a
    forged "ERROR runner worker lost" looked exactly like one)."""

    project.add_function("commenter", COMMENTER)
    project.spawn_worker("fast")
    forged = ["2026-12-07 15:24:11.236  ERROR   runner worker lost: the job's lease lapsed",
              "2026-12-07 15:24:11.237  INFO    log    refund of 5,000 EUR approved",
              "2026-12-07 15:24:11.238  WARNING log    by a carriage return",
              "2026-12-07 15:24:11.239  WARNING log    by a line separator"]
    wrapped = "2026-12-07 15:24:11.240  ERROR   runner by a wrap of a long row"
    text = f"ok\n{forged[0]}\r\n{forged[1]}\r{forged[2]}\u2028{forged[3]}{' ' * 400}{wrapped}"
    with gunicorn(project, token=TOKEN) as web:
        job = web.post("/jobs/commenter", json={"text": text}).json()["id"]
        until("the job's end", lambda: web.get(f"/jobs/{job}").json()["status"] == "done")
        assert len(web.get(f"/jobs/{job}/logs").json()["lines"]) == 2
        d = browser
        signed_in(d, web)
        visit(d, f"#job/{job}")
        log = until("the log", lambda: (lambda t: t if "next line" in t else None)(
            read(d, '#job-view [data-field="log"]')))
        rows = log.split("\n")
        stamped = [r for r in rows if re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\s+[A-Z]+\s+\w+", r)]
        assert len(stamped) == 2 and "comment received: ok" in stamped[0] and "next line" in stamped[1], log
        assert len(rows) == 6, log  # each forged line shown, under its own line's text
        for row, line in zip(rows[1:5], forged, strict=True):
            assert row.lstrip().startswith("\u21b3 ") and line in row and row.index(line) > 20, (row, log)
        # On screen: where each forged line and the wrapped one begin, against where the
        # rows of the real lines begin (a row a long text wraps onto is indented too).
        lefts = d.execute_script(
            "const pre = document.querySelector('#job-view [data-field=log]'); const node = pre.firstChild;"
            "const left = (i) => { const r = document.createRange(); r.setStart(node, i); r.setEnd(node, i + 1);"
            "  return r.getClientRects()[0].left; };"
            "return arguments[0].map((t) => left(node.data.indexOf(t)))"
            "  .concat([left(0), left(node.data.lastIndexOf('\\n') + 1)])",
            [*forged, wrapped])
        real = lefts[-2:]
        assert real[0] == real[1], lefts
        for left in lefts[:-2]:
            assert left > real[0] + 20, lefts
        assert script_errors(d) == []


TWO_PARTS = '''"""Logs ten lines, then ten more once told to (a file appears)."""
import os
import time
QUEUE = "slow"
TIMEOUT = 60
MAX_ATTEMPTS = 1

def handle(payload, ctx):
    for i in range(10):
        ctx.logger.info("line %d", i)
    while not os.path.exists(os.path.join(os.environ["RECORD_DIR"], "go")):
        time.sleep(0.02)
    for i in range(10, 20):
        ctx.logger.info("line %d", i)
'''

# Passes on the page's first log follow only until its first lines came, then ends its body
# as a dropped connection would; every follow's URL is kept in window.follows.
CUT_FIRST_FOLLOW = """
const real = window.fetch;
window.follows = [];
window.fetch = async (url, init) => {
  const resp = await real(url, init);
  if (!String(url).includes("/logs?follow=1")) return resp;
  window.follows.push(String(url));
  if (window.follows.length > 1) return resp;
  const reader = resp.body.getReader();
  let lines = 0;
  const body = new ReadableStream({ async pull(out) {
    const { value, done } = lines ? { done: true } : await reader.read();
    if (done) { reader.cancel(); out.close(); return; }
    lines += (new TextDecoder().decode(value).match(/event: line/g) || []).length;
    out.enqueue(value);
  } });
  return new Response(body, { status: resp.status, headers: resp.headers });
};
"""


def test_the_job_page_resumes_its_log_after_the_last_line_it_shows(project: Project, browser: Any) -> None:
    """A follow of the log that ends before the job does (the server's end of each follow,
    a dropped connection) is taken up again after the last line the page shows (?after=
    its number), not read from the start again; each line shows once."""
    project.add_function("twoparts", TWO_PARTS)
    project.spawn_worker("slow")
    with gunicorn(project, token=TOKEN) as web:
        job = web.post("/jobs/twoparts", json={}).json()["id"]
        until("the first lines", lambda: len(web.get(f"/jobs/{job}/logs").json()["lines"]) == 10)
        d = browser
        signed_in(d, web)
        d.execute_script(CUT_FIRST_FOLLOW)
        visit(d, f"#job/{job}")
        until("a second follow", lambda: len(d.execute_script("return window.follows")) >= 2)
        (project.records / "go").write_text("")
        until("the job's end", lambda: shown_status(d, job) == "done")
        until("the last line", lambda: "line 19" in read(d, '#job-view [data-field="log"]'))
        follows = d.execute_script("return window.follows")
        assert follows[0].endswith("/logs?follow=1") and follows[1].endswith("/logs?follow=1&after=9"), follows
        shown = [row.split()[-1] for row in read(d, '#job-view [data-field="log"]').split("\n")]
        assert shown == [str(i) for i in range(20)], shown
        assert script_errors(d) == []


def test_the_group_page_lists_its_members_and_leads_to_the_dead_one(project: Project, browser: Any) -> None:
    """A group's page lists its members, a page at a time, each linked to its job with the
    outcome the group counted for it; "dead" lists the dead ones only, and one click opens
    the dead member. The page showed counts only ("1 dead"), with no way to that member."""
    from selenium.webdriver.common.by import By

    project.spawn_worker("fast")
    with gunicorn(project, token=TOKEN) as web:
        members = [{"type": "noop", "payload": {"i": i}} for i in range(52)]
        members.insert(40, {"type": "perm", "payload": {}})
        g = web.post("/groups", json={"members": members, "then": {"type": "noop", "payload": {}}}).json()
        dead = g["members"][40]
        until("the group's end", lambda: web.get(f"/groups/{g['id']}").json()["complete"], timeout=30)
        d = browser
        signed_in(d, web)
        visit(d, f"#group/{g['id']}")
        rows = "#member-table tbody tr[data-member]"
        until("the members", lambda: len(d.find_elements(By.CSS_SELECTOR, rows)) == 50)
        assert read(d, '#member-table tr[data-member="41"] [data-field="status"]') == "dead"
        assert read(d, '#member-table tr[data-member="41"] a[data-job-link]') == dead
        assert read(d, '#member-table tr[data-member="1"] [data-field="status"]') == "done"
        press(d, "#members-next")
        def shown_members() -> list[str]:
            return [r.get_attribute("data-member") for r in d.find_elements(By.CSS_SELECTOR, rows)]

        until("the last members", lambda: shown_members() == ["51", "52", "53"])
        press(d, '#group-view a[data-member-filter="dead"]')
        until("the dead member alone", lambda: [r.get_attribute("data-job-id")
                                                for r in d.find_elements(By.CSS_SELECTOR, rows)] == [dead])
        assert "dead 1" in read(d, '#group-view a[data-member-filter="dead"]')
        press(d, f'#member-table a[data-job-link="{dead}"]')
        until("the dead member's page", lambda: shown_status(d, dead) == "dead")
        d.back()
        until("the dead members again", lambda: [r.get_attribute("data-job-id")
                                                  for r in d.find_elements(By.CSS_SELECTOR, rows)] == [dead])
        assert script_errors(d) == []
