"""Browser fixtures for the web console (tests/e2e/ui): the e2e modules' shared service
(tests/e2e/shared.py, `scripts/serve` as the README starts it), its agents answered by a
loopback OpenAI-format model, and Debian's chromium driven by Playwright.

`signed_in_page(token)` opens a fresh browser context (its own sessionStorage) on /ui and
signs in through the form; `shot(page, name)` saves <name>.png (docs/console/ with
UPDATE_CONSOLE_SCREENSHOTS=1). Every page
collects its script errors and CSP violations (`page.errors`, console errors other than
failed loads, and uncaught exceptions) for the tests to check."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.shared import SharedService
from tests.e2e.test_workflows import Orchestrator
from tests.fakes.openai_server import OpenAIFake

ROOT = Path(__file__).resolve().parents[3]
CHROMIUM = os.environ.get("ORCH_TEST_CHROMIUM", "/usr/bin/chromium")
# The docs' screenshots are rewritten only when asked (UPDATE_CONSOLE_SCREENSHOTS=1): every run
# renders them a few bytes differently, which left a checkout changed after each test run.
SHOTS = (
    ROOT / "docs" / "console"
    if os.environ.get("UPDATE_CONSOLE_SCREENSHOTS") == "1"
    else Path(os.environ.get("TMPDIR", "/tmp")) / "orchestrator-console-shots"
)
TIMEOUT_MS = 30_000


# One service for every console module and the other e2e modules it agrees with (each module
# started its own before, ~17 s of set-up apiece). The tests' data are their own users', so
# they do not see each other's.
@pytest.fixture(scope="package")
def llm(shared_service: SharedService) -> OpenAIFake:
    """The agents' model, `providers.openai` (answers with agent_llm's `agent_reply`)."""
    return shared_service.llm


@pytest.fixture(scope="package")
def console(shared_service: SharedService) -> Orchestrator:
    """The shared service: provider_retries 0, local inference sized for this machine
    (test_console_models starts the bundled model), loopback allowed outbound
    (test_console_tools registers an MCP server and an HTTP tool on loopback)."""
    return shared_service.orch


@pytest.fixture(scope="package")
def base_url(console: Orchestrator) -> str:
    return f"http://127.0.0.1:{console.port}"


@pytest.fixture(scope="package")
def admin_api(console: Orchestrator) -> Iterator[httpx.Client]:
    with console.client() as c:
        yield c


@pytest.fixture(scope="package")
def user_token(admin_api: httpx.Client) -> Callable[[str], str]:
    """A bearer token for `user` (issued by the admin)."""

    def issue(user: str) -> str:
        r = admin_api.post("/tokens", json={"user_uuid": user})
        assert r.status_code == 200, r.text
        return str(r.json()["token"])

    return issue


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for one module's tests. Not for the session: Playwright's sync API keeps its
    own asyncio loop running in this thread while it is open, so every asyncio test that ran
    after the first console test (asyncio.run, pytest-asyncio) would fail with 'cannot be
    called from a running event loop'."""
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(
            f"no chromium at {CHROMIUM}: the console's browser tests need Debian's chromium "
            "(`scripts/test` installs it as root with apt: apt-get install -y "
            "--no-install-recommends chromium; or set ORCH_TEST_CHROMIUM)"
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--headless=new"]
        )
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def signed_in_page(browser: Any, base_url: str) -> Iterator[Callable[[str], Any]]:
    contexts: list[Any] = []

    def open_page(token: str | None) -> Any:
        context = browser.new_context(viewport={"width": 1280, "height": 860})
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.errors = []  # type: ignore[attr-defined]

        def on_console(m: Any) -> None:
            # An HTTP error status the app handles (a wrong token's 401) is the test's to
            # check; what is collected is script errors and CSP violations.
            if m.type == "error" and not m.text.startswith("Failed to load resource"):
                page.errors.append(f"console: {m.text}")

        page.on("console", on_console)
        page.on("pageerror", lambda e: page.errors.append(f"pageerror: {e}"))  # type: ignore[attr-defined]
        page.goto(f"{base_url}/ui/")
        if token is not None:
            page.get_by_test_id("signin-token").fill(token)
            page.get_by_test_id("signin-submit").click()
            page.get_by_test_id("whoami").wait_for()
        return page

    yield open_page
    for context in contexts:
        context.close()


def shot(page: Any, name: str) -> Path:
    """<name>.png: the screenshots the docs show, taken by the tests (into docs/console
    with UPDATE_CONSOLE_SCREENSHOTS=1, else into a temporary directory)."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=False)
    return path
