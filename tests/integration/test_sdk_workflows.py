"""The SDK's workflow methods (sync and async) against the real app and a loopback model."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from orchestrator.sdk import ApiError, AsyncClient, Client
from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.agent_llm import agent_reply
from tests.fakes.openai_server import OpenAIFake
from tests.integration.test_workflows_api import agent_settings


async def test_sdk_workflows(make_settings: Any) -> None:
    async with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as llm:
        async with ServedApp(agent_settings(make_settings, llm)) as app:

            def sync_part() -> str:
                with Client(app.url, token=ADMIN_TOKEN) as api:
                    saved = api.save_template("t", [{"name": "a", "prompt": "[answer {{x}}]"}])
                    assert saved.name == "t"
                    assert [t.variables for t in api.templates().data] == [["x"]]
                    made = api.create_workflow(template="t", variables={"x": "42"})
                    deadline = time.monotonic() + 20
                    while not (wf := api.workflow(made.id)).finished:
                        assert time.monotonic() < deadline
                        time.sleep(0.05)
                    assert wf.status == "completed" and wf.steps[0].result == "42"
                    assert api.workflows(status="completed").total == 1
                    assert api.delete_workflow(made.id).id == made.id
                    with pytest.raises(ApiError) as caught:
                        api.workflow(made.id)
                    assert caught.value.status == 404 and caught.value.code == "not_found"
                    return made.id

            await asyncio.to_thread(sync_part)
            async with AsyncClient(app.url, token=ADMIN_TOKEN) as api:
                made = await api.create_workflow("slow", [{"name": "a", "prompt": "[sleep 10]"}])
                assert made.status == "pending"
                cancelled = await api.cancel_workflow(made.id)
                assert cancelled.status == "cancelled"
                page = await api.workflows(limit=5)
                assert page.limit == 5 and page.data[0].id == made.id
                with pytest.raises(ApiError) as caught:
                    await api.create_workflow("bad", [])
                assert caught.value.status == 400 and "steps" in caught.value.message


async def test_sdk_schedules(make_settings: Any) -> None:
    async with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as llm:
        async with ServedApp(agent_settings(make_settings, llm)) as app:
            async with AsyncClient(app.url, token=ADMIN_TOKEN) as api:
                made = await api.create_schedule("report", schedule="every day at 9:00")
                assert made.status == "ok" and made.next_run
                job = await api.schedule(made.id)
                assert job.schedule_type == "cron" and job.cron_expr == "0 9 * * *"
                assert (await api.schedules()).items[0].id == made.id
                assert (await api.pause_schedule(made.id)).status == "paused"
                with pytest.raises(ApiError) as caught:
                    await api.run_schedule(made.id)
                assert caught.value.status == 400
                assert (await api.unpause_schedule(made.id)).status == "active"
                assert (await api.run_schedule(made.id)).status == "dispatched"
                deadline = time.monotonic() + 15
                while (await api.schedule(made.id)).last_result != "ok":
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.1)
                assert (await api.delete_schedule(made.id)).status == "deleted"
                with pytest.raises(ApiError) as caught:
                    await api.create_schedule("x", cron="not cron")
                assert caught.value.status == 400
