"""The dashboard in headless Chromium against a real gunicorn and a real worker: sign in
with the token, see the queues and a dead job, requeue it with an edited payload (an
invalid edit is refused and the job stays dead), and see it complete; and with scoped
tokens, see only what their scopes allow."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_web_support import gunicorn

from conftest import Project, wait_for

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
TOKEN = "dashboard-token"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    if not (shutil.which(CHROMIUM) and shutil.which(CHROMEDRIVER)):
        if os.environ.get("CI"):
            raise RuntimeError("CI must install Debian's chromium and chromium-driver")
        pytest.skip("Debian's chromium and chromium-driver are not installed here")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--user-data-dir={tmp_path / 'chromium-profile'}", "--window-size=1400,2400"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()


def until(what: str, pred: Callable[[], Any], timeout: float = 20) -> Any:
    """Poll the page (it refreshes itself) until ``pred`` holds."""
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    def probe() -> Any:
        try:
            return pred()
        except (NoSuchElementException, StaleElementReferenceException):
            return None

    return wait_for(probe, timeout=timeout, interval=0.05, what=what)


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

        d = browser
        d.get(web.url + "/")
        # The API needs the token: the page asks for it and keeps it in this tab only.
        login = until("the sign-in prompt", lambda: d.find_element(By.ID, "login"))
        until("the prompt to open", login.is_displayed)
        d.find_element(By.ID, "token").send_keys("wrong")
        d.find_element(By.ID, "login-submit").click()
        until("a refusal", lambda: "refused" in d.find_element(By.ID, "login-error").text)
        field = d.find_element(By.ID, "token")
        field.clear()
        field.send_keys(TOKEN)
        d.find_element(By.ID, "login-submit").click()
        until("the prompt to close", lambda: not login.is_displayed())
        assert TOKEN not in d.current_url
        assert d.execute_script("return sessionStorage.getItem('runner.token')") == TOKEN

        def cell(queue: str, field: str) -> str:
            text: str = d.find_element(By.CSS_SELECTOR, f'#queue-table tr[data-queue="{queue}"] '
                                                        f'td[data-field="{field}"]').text
            return text

        until("the queues with one dead job", lambda: cell("fast", "dead") == "1")
        until("the other figures", lambda: cell("slow", "dead") == "0" and cell("fast", "ready") == "0")
        figures = d.find_element(By.CSS_SELECTOR, '#function-figures tr[data-function="record"]').text
        assert figures.split()[:5] == ["record", "fast", "2", "1", "3"]  # enqueued, succeeded, retried
        fn = d.find_element(By.CSS_SELECTOR, '#function-list [data-function="record"]').text
        assert "max attempts" in fn and "schema v1" in fn

        row_css = f'#dead-table tr[data-job-id="{dead}"]'
        row = until("the dead job's row", lambda: d.find_element(By.CSS_SELECTOR, row_css))
        assert row.find_element(By.CSS_SELECTOR, '[data-field="reason"]').text == "max attempts reached"
        assert "planned failure on attempt 4" in row.find_element(By.CSS_SELECTOR, '[data-field="error"]').text
        assert row.find_element(By.CSS_SELECTOR, '[data-field="attempts"]').text == "4 / 4"
        assert '"fail_times": 99' in row.find_element(By.CSS_SELECTOR, '[data-field="payload"]').text

        # An invalid edit is refused with its JSON path, and the job stays dead.
        row.find_element(By.CSS_SELECTOR, "button.edit").click()
        editor = d.find_element(By.ID, "edit-payload")
        until("the editor", editor.is_displayed)
        assert '"fail_times": 99' in editor.get_attribute("value")
        editor.clear()
        editor.send_keys('{"n": "five"}')
        d.find_element(By.ID, "edit-submit").click()
        until("the validation error", lambda: "$.n" in d.find_element(By.ID, "edit-errors").text)
        assert web.get(f"/jobs/{dead}").json()["status"] == "dead"

        editor.clear()
        editor.send_keys('{"n": 5, "fail_times": 0}')
        d.find_element(By.ID, "edit-submit").click()
        until("the editor to close", lambda: not editor.is_displayed())

        # The page follows the requeued job until it is done.
        def status() -> str:
            text: str = d.find_element(By.CSS_SELECTOR, f'#job-view table[data-job-id="{dead}"] '
                                                         '[data-field="status"]').text
            return text

        until("the requeued job to complete", lambda: status() == "done")
        result = d.find_element(By.CSS_SELECTOR, '#job-view [data-field="result"]').text
        assert '"attempt": 1' in result and '"n": 5' in result
        until("the dead-letter list to empty", lambda: not d.find_elements(By.CSS_SELECTOR, row_css))
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
            d.find_element(By.ID, "login-submit").click()
            until("the prompt to close", lambda: not login.is_displayed())

        sign_in(SUPPORT)
        who = d.find_element(By.ID, "whoami")
        until("the token's name and scopes", lambda: who.text == "support · read")
        row_css = f'#dead-table tr[data-job-id="{dead}"]'
        row = until("the dead job's row", lambda: d.find_element(By.CSS_SELECTOR, row_css))
        assert row.find_element(By.CSS_SELECTOR, '[data-field="reason"]').text == "permanent failure"
        buttons = row.find_elements(By.CSS_SELECTOR, "td.actions button")
        assert len(buttons) == 3 and not any(b.is_displayed() for b in buttons)
        assert "read-only" in d.find_element(By.ID, "scope-note").text
        assert d.find_element(By.ID, "queues").is_displayed()

        d.find_element(By.ID, "logout").click()
        sign_in(PRODUCER)
        until("the producer's name", lambda: who.text == "producer · enqueue:record")
        assert not d.find_element(By.ID, "queues").is_displayed()
        assert not d.find_element(By.ID, "dead").is_displayed()
        assert "cannot read" in d.find_element(By.ID, "scope-note").text
    assert project.client.get(dead).status == "dead"
