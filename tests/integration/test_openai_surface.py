"""OpenAI's surface of the API checked against OpenAI's published schemas: /models (list and
retrieve) through the official `openai` SDK and raw httpx, the real app under uvicorn with
real Postgres and Redis, loopback upstreams."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ServedApp
from tests.integration.test_gateway import ADMIN, app, oai_client, upstreams
from tests.openai_schema import validate

__all__ = ["app", "upstreams"]  # fixtures shared with the gateway tests


async def test_models_list_has_spec_and_openai_shapes(app: ServedApp) -> None:
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as http:
        body = (await http.get("/models")).json()
    validate(body, "ListModelsResponse")
    for model in body["data"]:
        validate(model, "Model")
    assert {m["name"] for m in body["models"]} == {m["id"] for m in body["data"]}
    by_id = {m["id"]: m for m in body["data"]}
    assert by_id["gpt-4o-mini"]["owned_by"] == "openai"
    spec = {m["name"]: m for m in body["models"]}
    assert spec["gpt-4o-mini"]["ctx_size"] == 128_000  # the maintained table of hosted models


async def test_openai_sdk_lists_and_retrieves_models(app: ServedApp) -> None:
    client = oai_client(app)
    listed = [m.id for m in client.models.list()]
    assert {"gpt-4o-mini", "gpt-4o", "claude-sonnet-4-5"} <= set(listed)
    model = client.models.retrieve("claude-sonnet-4-5")
    assert (model.id, model.object, model.owned_by) == ("claude-sonnet-4-5", "model", "anthropic")
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


async def test_unknown_model_is_a_design_404(app: ServedApp) -> None:
    async with httpx.AsyncClient(base_url=f"{app.url}/api/v1", headers=ADMIN) as http:
        answer = await http.get("/models/no-such-model")
        body: dict[str, Any] = answer.json()
        assert answer.status_code == 404
        assert body["ok"] is False and body["code"] == "model_not_found", body
        assert body["request_id"]
        one = (await http.get("/models/gpt-4o")).json()
        validate(one, "Model")
        assert (await http.get("/models/gpt-4o")).status_code == 200
        anonymous = await http.get("/models/gpt-4o", headers={"Authorization": ""})
        assert anonymous.status_code == 401
