"""A configured remote model's `ctx_size` in GET /models comes from its provider's model
metadata where the API gives one (Gemini `GET /models` inputTokenLimit, Anthropic
`GET /v1/models` max_input_tokens, Ollama `POST /api/show` model_info), else from the
maintained table, else null; read once (cached), not per listing. Listed with the official
openai SDK against the real app (Postgres, Redis) and loopback upstreams."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from tests.conftest import ADMIN_TOKEN, ServedApp
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.gemini_server import GeminiFake
from tests.fakes.ollama_server import OllamaFake, OllamaModel
from tests.openai_schema import validate


class Upstreams:
    def __init__(self) -> None:
        self.gemini = GeminiFake(api_key="g-key")
        self.gemini.models = ["gemini-1.5-pro", "gemini-2.5-flash"]
        self.anthropic = FakeAnthropic(api_key="sk-ant", models=("claude-sonnet-4-5", "c-x"))
        self.anthropic.context = {"claude-sonnet-4-5": 1_000_000}
        self.ollama = OllamaFake()
        self.ollama.models = [OllamaModel("llama3.2:latest", context_length=32_768)]

    def providers(self) -> dict[str, Any]:
        return {
            "gemini": {
                "base_url": self.gemini.base_url,
                "api_key": "g-key",
                "models": ["gemini-1.5-pro"],
            },
            "anthropic": {
                "base_url": self.anthropic.url,
                "api_key": "sk-ant",
                "models": ["claude-sonnet-4-5", "claude-opus-4-1"],
            },
            "ollama": {"base_url": self.ollama.url, "models": ["llama3.2:latest", "qwen3:8b"]},
        }


@pytest.fixture
async def upstreams() -> AsyncIterator[Upstreams]:
    ups = Upstreams()
    async with ups.gemini, ups.anthropic, ups.ollama:
        yield ups


def listed(app: ServedApp) -> tuple[list[str], dict[str, int | None]]:
    """The ids the openai SDK lists, and the SPEC's `ctx_size` of the same answer."""
    with openai.OpenAI(base_url=f"{app.url}/api/v1", api_key=ADMIN_TOKEN, max_retries=0) as client:
        raw = client.models.with_raw_response.list()
    ids = [m.id for m in raw.parse()]
    body = json.loads(raw.http_response.text)
    validate(body, "ListModelsResponse")
    return ids, {m["name"]: m["ctx_size"] for m in body["models"]}


async def test_ctx_size_from_each_providers_metadata(
    make_settings: Any, upstreams: Upstreams
) -> None:
    settings = make_settings(providers=upstreams.providers(), rate_limit_per_minute=0)
    async with ServedApp(settings) as app:
        ids, ctx = listed(app)
        assert {"gemini-1.5-pro", "claude-sonnet-4-5", "llama3.2:latest"} <= set(ids)
        # Metadata beats the table (which says 2097152 and 200000 for these two).
        assert ctx["gemini-1.5-pro"] == 1_048_576
        assert ctx["claude-sonnet-4-5"] == 1_000_000
        # Not in Anthropic's list: the table's figure for claude-*.
        assert ctx["claude-opus-4-1"] == 200_000
        assert ctx["llama3.2:latest"] == 32_768
        assert ctx["qwen3:8b"] is None  # not pulled: Ollama cannot say, nor can the table
        shows = [r for r in upstreams.ollama.requests if r.path == "/api/show"]
        assert {r.json["model"] for r in shows} == {"llama3.2:latest", "qwen3:8b"}
        gemini_lists = [r for r in upstreams.gemini.requests if r.path.endswith("/models")]
        assert gemini_lists[0].headers["x-goog-api-key"] == "g-key"
        ant_lists = [r for r in upstreams.anthropic.requests if r.path == "/v1/models"]
        assert ant_lists[0].headers["x-api-key"] == "sk-ant"
        assert "anthropic-version" in ant_lists[0].headers
        # A second listing is answered from the cache: no new metadata call.
        reads = [r for r in upstreams.gemini.requests if "pageSize" in r.query]
        assert len(reads) == 1
        assert listed(app)[1] == ctx
        assert [r for r in upstreams.gemini.requests if "pageSize" in r.query] == reads
        assert len([r for r in upstreams.ollama.requests if r.path == "/api/show"]) == 2


async def test_a_failing_metadata_call_leaves_the_table_or_null(
    make_settings: Any, upstreams: Upstreams
) -> None:
    upstreams.gemini.models_status = 500
    upstreams.anthropic.models_error = None
    providers = upstreams.providers()
    providers["gemini"]["models"] = ["gemini-1.5-pro", "my-tuned-model"]
    providers["ollama"]["base_url"] = "http://127.0.0.1:9"  # nothing listens
    settings = make_settings(providers=providers, rate_limit_per_minute=0)
    async with ServedApp(settings) as app:
        _ids, ctx = listed(app)
        assert ctx["gemini-1.5-pro"] == 2_097_152  # the table
        assert ctx["my-tuned-model"] is None  # neither metadata nor table
        assert ctx["llama3.2:latest"] is None
        assert ctx["claude-sonnet-4-5"] == 1_000_000  # one provider's failure is its own
