"""The console's models page in a real browser against `scripts/serve`: discover the bundled
local model, start a real llama.cpp instance of it (SmolLM2 through the cyllama launcher, as
tests/e2e/test_inference.py) from its row, watch it become ready, stop it from the page;
provider health with breaker states, base URLs for admins only."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psutil
import pytest
from playwright.sync_api import expect

from tests.e2e.test_inference import _gone
from tests.e2e.test_workflows import Orchestrator
from tests.e2e.ui.conftest import shot
from tests.fakes.openai_server import OpenAIFake

pytestmark = pytest.mark.e2e
SMOL = "SmolLM2-135M-Instruct.Q4_1"
START_MS = 180_000  # loading the model on 2 busy cores


def _admin_token(console: Orchestrator) -> str:
    return console.admin["Authorization"].removeprefix("Bearer ")


def test_start_and_stop_a_local_instance(
    console: Orchestrator, signed_in_page: Callable[[str | None], Any]
) -> None:
    page = signed_in_page(_admin_token(console))
    page.get_by_test_id("nav-models").click()
    expect(page.get_by_test_id("model-row-fake-agent")).to_contain_text("remote")
    page.get_by_test_id("models-discover").click()
    expect(page.get_by_test_id(f"model-status-{SMOL}")).to_have_text("available")

    page.get_by_test_id(f"model-start-{SMOL}").click()
    # The click's POST /inference is the page's, answered after the click returns: its row
    # says it was created.
    expect(page.locator("[data-testid^='instance-state-']")).to_have_count(1, timeout=30_000)
    with console.client() as c:
        instances = c.get("/inference").json()["data"]
    assert [i["model"] for i in instances] == [SMOL]
    iid = instances[0]["id"]
    state = page.get_by_test_id(f"instance-state-{iid}")
    expect(state).to_have_text("ready", timeout=START_MS)
    expect(page.get_by_test_id(f"model-status-{SMOL}")).to_have_text("loaded")
    with console.client() as c:
        pid = c.get(f"/inference/{iid}").json()["pid"]
    assert psutil.pid_exists(pid)
    shot(page, "models")

    page.get_by_test_id(f"instance-stop-{iid}").click()
    expect(state).to_have_text("stopped")
    expect(page.get_by_test_id(f"instance-stop-{iid}")).to_have_count(0)
    with console.client() as c:
        assert c.get(f"/inference/{iid}").json()["state"] == "stopped"
    assert _gone(pid, within=30), f"the model server {pid} outlived its stop"
    assert page.errors == []


def test_provider_health_and_breakers(
    console: Orchestrator,
    signed_in_page: Callable[[str | None], Any],
    user_token: Callable[[str], str],
    llm: OpenAIFake,
) -> None:
    admin = signed_in_page(_admin_token(console))
    admin.get_by_test_id("nav-models").click()
    row = admin.get_by_test_id("provider-row-openai")
    expect(admin.get_by_test_id("provider-breaker-openai")).to_have_text("closed")
    expect(row).to_contain_text(llm.base_url)  # admins see where it points
    expect(admin.get_by_test_id("provider-row-anthropic")).to_contain_text("no")

    user = signed_in_page(user_token("ui-models-user"))
    user.get_by_test_id("nav-models").click()
    expect(user.get_by_test_id("provider-breaker-openai")).to_have_text("closed")
    expect(user.get_by_test_id("providers-table")).not_to_contain_text(llm.base_url)
    expect(user.get_by_test_id("models-discover")).to_have_count(0)
    assert admin.errors == [] and user.errors == []
