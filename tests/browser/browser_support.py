"""Helpers of the browser tests: Debian's headless Chromium driven by selenium, on the
dashboard of a real coordinator (``e2e_support.Cluster``).

Waiting is always ``WebDriverWait`` on a condition, never a sleep. ``Page.shot`` saves a
screenshot in the test's own directory (``tmp_path/screenshots``).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
DESKTOP = (1280, 800)
PHONE = (390, 844)
WAIT_S = 30.0
WEBSOCKET = ("--transport", "websocket")  # the runners' link: corral's default
# What Chromium logs of a call a coordinator that went away cut or refused.
NETWORK_DOWN = (
    r"net::ERR_(CONNECTION_REFUSED|CONNECTION_RESET|EMPTY_RESPONSE|INCOMPLETE_CHUNKED_ENCODING)"
)

T = TypeVar("T")


def start_chromium(root: Path) -> webdriver.Chrome:
    """A headless Chromium with its own profile under ``root``; its console is recorded."""
    options = Options()
    options.binary_location = CHROMIUM
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={root / 'chromium-profile'}")
    options.add_argument(f"--window-size={DESKTOP[0]},{DESKTOP[1]}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    # The driver is named: selenium then looks nothing up and downloads nothing.
    service = Service(executable_path=CHROMEDRIVER, log_output=str(root / "chromedriver.log"))
    return webdriver.Chrome(options=options, service=service)


class Page:
    """The dashboard of one coordinator, in one browser."""

    def __init__(self, driver: webdriver.Chrome, url: str, shots: Path) -> None:
        self.driver = driver
        self.url = url
        self.shots = shots
        self.console: list[dict[str, Any]] = []

    def sign_in(self, token: str, where: str = "/runs") -> None:
        """Open the dashboard as ``corral up`` prints it: the token in the fragment."""
        self.driver.get(f"{self.url}/#token={token}")
        self.wait(lambda d: d.execute_script("return location.hash") == "#/runs", "the token taken")
        if where != "/runs":
            self.go(where)

    def go(self, where: str) -> None:
        """Move within the page (as a click on a link does: no reload)."""
        self.driver.execute_script("location.hash = arguments[0]", f"#{where}")
        self.wait_text("h1", "", what=f"{where} to show")

    def wait(self, condition: Callable[[webdriver.Chrome], T], what: str) -> T:
        # The pages redraw what changed: an element found may be replaced before it is read.
        return WebDriverWait(
            self.driver,
            WAIT_S,
            poll_frequency=0.05,
            ignored_exceptions=(StaleElementReferenceException, NoSuchElementException),
        ).until(condition, message=f"waiting for {what}")

    def find(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def wait_for(self, css: str, what: str | None = None) -> WebElement:
        def found(driver: webdriver.Chrome) -> WebElement | bool:
            elements = driver.find_elements(By.CSS_SELECTOR, css)
            return elements[0] if elements else False

        return self.wait(found, what or css)

    def wait_text(self, css: str, text: str, what: str | None = None) -> WebElement:
        """Wait until an element matching ``css`` contains ``text``; returns it."""

        def found(driver: webdriver.Chrome) -> WebElement | bool:
            for element in driver.find_elements(By.CSS_SELECTOR, css):
                if text in element.text:
                    return element
            return False

        return self.wait(found, what or f"{css} to say {text!r}")

    def wait_attr(self, css: str, name: str, values: set[str]) -> str:
        """Wait until the element matching ``css`` has attribute ``name`` in ``values``."""

        def found(driver: webdriver.Chrome) -> str | bool:
            elements = driver.find_elements(By.CSS_SELECTOR, css)
            value = elements[0].get_attribute(name) if elements else None
            return value if value in values else False

        return self.wait(found, f"{css} [{name}] in {sorted(values)}")

    def click(self, css: str) -> None:
        """Click the element matching ``css`` once it is enabled."""

        def clicked(driver: webdriver.Chrome) -> bool:
            element = driver.find_element(By.CSS_SELECTOR, css)
            if not element.is_enabled():
                return False
            element.click()
            return True

        self.wait(clicked, f"{css} to be clicked")

    def mark(self) -> None:
        """Mark this document: ``still_same_document`` is true until the page reloads."""
        self.driver.execute_script("window.__corralTestMark = true")

    def still_same_document(self) -> bool:
        return bool(self.driver.execute_script("return window.__corralTestMark === true"))

    def resize(self, size: tuple[int, int]) -> None:
        """Show the page in a viewport of exactly ``size`` (a phone's: a mobile one)."""
        width, height = size
        self.driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": width < 700},
        )

    def overflows_sideways(self) -> bool:
        """Whether the page is wider than the window (tables scroll within themselves)."""
        return bool(
            self.driver.execute_script(
                "return document.documentElement.scrollWidth > window.innerWidth + 1"
            )
        )

    def clipped_chart_labels(self) -> list[str]:
        """The texts of the charts' labels that stick out of their chart's drawing (cut off
        on screen: an axis label wider than the room left of the axis)."""
        clipped: list[str] = self.driver.execute_script(
            """
            const out = [];
            for (const svg of document.querySelectorAll("figure.chart svg")) {
              const box = svg.viewBox.baseVal;
              for (const text of svg.querySelectorAll("text")) {
                const b = text.getBBox();
                if (b.x < box.x || b.x + b.width > box.x + box.width) out.push(text.textContent);
              }
            }
            return out;
            """
        )
        return clipped

    def shot(self, name: str) -> Path:
        self.shots.mkdir(parents=True, exist_ok=True)
        path = self.shots / f"{name}.png"
        self.driver.save_screenshot(str(path))
        return path

    def console_errors(self) -> list[dict[str, Any]]:
        """Every console message of level SEVERE (errors, failed loads) so far."""
        self.console += self.driver.get_log("browser")
        return [entry for entry in self.console if entry["level"] == "SEVERE"]
