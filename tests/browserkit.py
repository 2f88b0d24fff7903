"""Headless Chromium for the dashboard's browser tests: the browser and its driver found
by each distribution's names, and one browser per test process (the fixture ``chromium``
in conftest), handed to each test as a fresh tab (the fixture ``browser``, imported by
each test module that uses it). A browser's start is the costliest part of a short
browser test (a browser and a driver process, about a second of CPU each time)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# The browser and its driver, by the names distributions give them (Debian: chromium and
# chromium-driver's chromedriver; Ubuntu: chromium-browser and chromium-chromedriver,
# snaps under /snap/bin; Google's: google-chrome), looked for on PATH; CHROME_BIN and
# CHROMEDRIVER name others.
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
DRIVERS = ("chromedriver", "chromium.chromedriver")
INSTALL = ("Debian: sudo apt-get install chromium chromium-driver; "
           "Ubuntu: sudo apt-get install chromium-browser chromium-chromedriver (snaps); "
           "Fedora: sudo dnf install chromium chromedriver; Arch: sudo pacman -S chromium; "
           "Alpine: apk add chromium chromium-chromedriver; elsewhere set CHROME_BIN and CHROMEDRIVER")
WINDOW = (1400, 2400)


def browser_programs(env: dict[str, str] | None = None, also: tuple[str, ...] = ("/snap/bin",)
                     ) -> tuple[str | None, str | None]:
    """(the Chromium or Chrome binary, its chromedriver), each None when not found: the
    variable CHROME_BIN / CHROMEDRIVER if set, else the first name on PATH, then in
    ``also`` (/snap/bin, where Ubuntu's snaps are, which a service's PATH may lack)."""
    env = dict(os.environ) if env is None else env
    path = os.pathsep.join(p for p in (env.get("PATH", os.defpath), *also) if p)

    def first(var: str, names: tuple[str, ...]) -> str | None:
        if env.get(var):
            return shutil.which(env[var], path=path)
        return next((found for n in names if (found := shutil.which(n, path=path))), None)

    return first("CHROME_BIN", BROWSERS), first("CHROMEDRIVER", DRIVERS)


class Chromium:
    """One headless browser, started at its first use and again if it died; each test gets
    it as a new tab with the others closed, no cookies and the console log read empty."""

    def __init__(self, profile: Path) -> None:
        chrome, driver_path = browser_programs()
        if not (chrome and driver_path):
            missing = " and ".join(what for what, got in (("a Chromium browser", chrome),
                                                          ("its chromedriver", driver_path)) if not got)
            if os.environ.get("CI"):
                raise RuntimeError(f"CI must install {missing} ({INSTALL})")
            pytest.skip(f"{missing} not found on PATH: the browser tests need both ({INSTALL})")
        self.chrome, self.driver_path, self.profile = chrome, driver_path, profile
        self.driver: Any = None

    def _start(self) -> Any:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        opts = webdriver.ChromeOptions()
        opts.binary_location = self.chrome
        for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    f"--user-data-dir={self.profile}", f"--window-size={WINDOW[0]},{WINDOW[1]}"):
            opts.add_argument(arg)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # for script_errors()
        return webdriver.Chrome(service=Service(self.driver_path), options=opts)

    def fresh(self) -> Any:
        """The browser with one new tab: the last test's page (its follows, its token in
        sessionStorage, which is kept per tab) closed with its tab, cookies cleared, the
        window at its size and the console log drained (script_errors reads it)."""
        from selenium.common.exceptions import WebDriverException

        if self.driver is not None:
            try:
                d = self.driver
                d.switch_to.new_window("tab")
                tab = d.current_window_handle
                for other in [h for h in d.window_handles if h != tab]:
                    d.switch_to.window(other)
                    d.close()
                d.switch_to.window(tab)
                d.execute_cdp_cmd("Network.clearBrowserCookies", {})
                d.set_window_size(*WINDOW)
                d.get_log("browser")
                return d
            except WebDriverException:  # the browser died or hangs on the last page: a new one
                self.quit()
        self.driver = self._start()
        return self.driver

    def quit(self) -> None:
        if self.driver is not None:
            try:
                self.driver.quit()
            finally:
                self.driver = None


@pytest.fixture
def browser(chromium: Chromium) -> Iterator[Any]:
    d = chromium.fresh()
    yield d
    from selenium.common.exceptions import WebDriverException

    try:  # the page's pushes and follows stop before the test's server does
        d.set_page_load_timeout(10)  # a page hung past it: the next test gets a new browser
        d.get("about:blank")
        d.set_page_load_timeout(300)  # (WebDriver's default)
    except WebDriverException:
        chromium.quit()
