"""Optional request fields (seed, penalties, logit_bias, response_format, reasoning, parallel
tool calls, metadata, Anthropic `thinking`) through the real Gateway to loopback upstreams:
each field a provider declares reaches it in its documented wire form; one it does not is a
400 naming field and provider before anything is sent, or, with `drop_unsupported_params`,
is dropped and the request succeeds."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from orchestrator.config import Settings
from orchestrator.errors import ValidationFailed
from orchestrator.observability import MetricsRecorder
from orchestrator.providers import ChatRequest, Gateway, Message, TextBlock, ToolDef
from orchestrator.providers import _anthropic_format as anthropic_format
from orchestrator.providers import _openai_format as openai_format
from tests.fakes._wire_checks import bedrock_problems
from tests.fakes.anthropic_server import FakeAnthropic, text_reply
from tests.fakes.bedrock_server import ACCESS_KEY, SECRET_KEY, BedrockFake, BedrockTurn
from tests.fakes.gemini_server import GeminiFake, GeminiTurn
from tests.fakes.ollama_server import OllamaFake, OllamaTurn
from tests.fakes.openai_server import FakeReply, OpenAIFake

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}}
TOOL = ToolDef("get_weather", "Weather of a city", SCHEMA)
MODELS = {
    "openai": "gpt-4o-mini",
    "anthropic": "claude-sonnet-4-5",
    "gemini": "gemini-2.0-flash",
    "bedrock": "anthropic.claude-3-haiku",
    "ollama": "llama3.2:latest",
    "zhipu": "glm-4.6",
    "deepseek": "deepseek-chat",
    "qwen": "qwen-plus",
}
COMPATIBLE = ("zhipu", "deepseek", "qwen")  # OpenAI's wire, each with its own table


class Upstreams:
    def __init__(self) -> None:
        self.openai = OpenAIFake(api_key="sk-openai")
        self.anthropic = FakeAnthropic(api_key="sk-ant")
        self.gemini = GeminiFake(api_key="g-key")
        self.bedrock = BedrockFake()
        self.ollama = OllamaFake()
        self.compatible = {kind: OpenAIFake(api_key=f"sk-{kind}") for kind in COMPATIBLE}

    def providers(self) -> dict[str, Any]:
        return {
            "openai": {
                "base_url": self.openai.base_url,
                "api_key": "sk-openai",
                "models": [MODELS["openai"]],
            },
            "anthropic": {
                "base_url": self.anthropic.url,
                "api_key": "sk-ant",
                "models": [MODELS["anthropic"]],
            },
            "gemini": {
                "base_url": self.gemini.base_url,
                "api_key": "g-key",
                "models": [MODELS["gemini"]],
            },
            "bedrock": {
                "base_url": self.bedrock.url,
                "region": "us-east-1",
                "access_key_id": ACCESS_KEY,
                "secret_access_key": SECRET_KEY,
                "models": [MODELS["bedrock"]],
            },
            "ollama": {"base_url": self.ollama.url, "models": [MODELS["ollama"]]},
        } | {
            kind: {"base_url": fake.base_url, "api_key": f"sk-{kind}", "models": [MODELS[kind]]}
            for kind, fake in self.compatible.items()
        }

    def script_ok(self, kind: str) -> None:
        if kind == "openai":
            self.openai.script([FakeReply(text="ok")])
        elif kind == "anthropic":
            self.anthropic.enqueue(text_reply("ok"))
        elif kind == "gemini":
            self.gemini.script(GeminiTurn(parts=[{"text": "ok"}]))
        elif kind == "bedrock":
            self.bedrock.script(BedrockTurn(text="ok"))
        elif kind in self.compatible:
            self.compatible[kind].script([FakeReply(text="ok")])
        else:
            self.ollama.script(OllamaTurn(content="ok"))

    def sent(self, kind: str) -> list[Any]:
        if kind == "openai":
            return [r.json for r in self.openai.chat_requests]
        if kind == "anthropic":
            return [r.json for r in self.anthropic.requests if r.path.endswith("/messages")]
        if kind == "gemini":
            return [r.json for r in self.gemini.generate_requests]
        if kind == "bedrock":
            return [r.json for r in self.bedrock.requests if "/model/" in r.path]
        if kind in self.compatible:
            return [r.json for r in self.compatible[kind].chat_requests]
        return [r.json for r in self.ollama.chat_requests]

    def violations(self) -> list[str]:
        fakes = (self.openai, self.anthropic, self.gemini, self.bedrock, self.ollama)
        return [v for fake in (*fakes, *self.compatible.values()) for v in fake.violations]


@pytest.fixture
async def upstreams() -> AsyncIterator[Upstreams]:
    ups = Upstreams()
    zhipu, deepseek, qwen = ups.compatible.values()
    async with ups.openai, ups.anthropic, ups.gemini, ups.bedrock, ups.ollama:
        async with zhipu, deepseek, qwen:
            yield ups


def gateway(ups: Upstreams, **kw: Any) -> Gateway:
    settings = Settings.load(
        environ={}, providers=ups.providers(), provider_retries=0, admin_token="x" * 32, **kw
    )
    return Gateway(settings, MetricsRecorder("test"))


def ask(kind: str, params: dict[str, Any], **kw: Any) -> ChatRequest:
    return ChatRequest(
        model=MODELS[kind],
        messages=(Message("user", (TextBlock("weather in Paris?"),)),),
        max_tokens=64,
        params=params,
        **kw,
    )


async def sent_body(ups: Upstreams, kind: str, request: ChatRequest, **kw: Any) -> Any:
    gw = gateway(ups, **kw)
    try:
        ups.script_ok(kind)
        response, route = await gw.complete(request)
        assert response.text == "ok"
        assert route.provider == kind
    finally:
        await gw.aclose()
    assert ups.violations() == []  # the fakes found the body well formed
    return ups.sent(kind)[-1]


async def test_openai_takes_every_field_as_is(upstreams: Upstreams) -> None:
    body = {
        "model": MODELS["openai"],
        "messages": [{"role": "user", "content": "hi"}],
        "seed": 7,
        "frequency_penalty": 0.5,
        "presence_penalty": -0.5,
        "logit_bias": {"50256": -100},
        "response_format": JSON_SCHEMA_FORMAT,
        "reasoning_effort": "low",
        "parallel_tool_calls": False,
        "metadata": {"team": "search"},
        "max_completion_tokens": 33,
    }
    request = openai_format.decode_request(body)
    sent = await sent_body(upstreams, "openai", request)
    for field in (
        "seed",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "response_format",
        "reasoning_effort",
        "parallel_tool_calls",
        "metadata",
    ):
        assert sent[field] == body[field], field
    assert sent["max_completion_tokens"] == 33


async def test_anthropic_gets_thinking_and_disable_parallel_tool_use(
    upstreams: Upstreams,
) -> None:
    body = {
        "model": MODELS["anthropic"],
        "max_tokens": 2048,
        "messages": [{"role": "user", "content": "hi"}],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "tools": [
            {"name": "get_weather", "description": "Weather", "input_schema": SCHEMA},
        ],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
    }
    request = anthropic_format.decode_request(body)
    sent = await sent_body(upstreams, "anthropic", request)
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    assert sent["tool_choice"]["disable_parallel_tool_use"] is True


async def test_gemini_translates_into_generation_config(upstreams: Upstreams) -> None:
    params = {
        "seed": 7,
        "frequency_penalty": 0.5,
        "presence_penalty": 0.25,
        "response_format": JSON_SCHEMA_FORMAT,
        "thinking": {"type": "enabled", "budget_tokens": 512},
    }
    sent = await sent_body(upstreams, "gemini", ask("gemini", params))
    config = sent["generationConfig"]
    assert config["seed"] == 7
    assert config["frequencyPenalty"] == 0.5
    assert config["presencePenalty"] == 0.25
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"] == SCHEMA
    assert config["thinkingConfig"] == {"thinkingBudget": 512}
    assert config["maxOutputTokens"] == 64


async def test_gemini_json_object_is_a_mime_type_only(upstreams: Upstreams) -> None:
    params = {"response_format": {"type": "json_object"}}
    sent = await sent_body(upstreams, "gemini", ask("gemini", params))
    assert sent["generationConfig"]["responseMimeType"] == "application/json"
    assert "responseJsonSchema" not in sent["generationConfig"]


async def test_ollama_translates_into_options_format_and_think(upstreams: Upstreams) -> None:
    params = {
        "seed": 7,
        "frequency_penalty": 0.5,
        "presence_penalty": 0.25,
        "response_format": JSON_SCHEMA_FORMAT,
        "reasoning_effort": "high",
    }
    sent = await sent_body(upstreams, "ollama", ask("ollama", params))
    assert sent["options"]["seed"] == 7
    assert sent["options"]["frequency_penalty"] == 0.5
    assert sent["options"]["presence_penalty"] == 0.25
    assert sent["options"]["num_predict"] == 64
    assert sent["format"] == SCHEMA
    assert sent["think"] == "high"
    json_mode = await sent_body(
        upstreams, "ollama", ask("ollama", {"response_format": {"type": "json_object"}})
    )
    assert json_mode["format"] == "json"


def chat(kind: str, **fields: Any) -> ChatRequest:
    """A caller's /chat/completions body for `kind`'s model, decoded as the endpoint does."""
    body = {"model": MODELS[kind], "messages": [{"role": "user", "content": "hi"}], **fields}
    return openai_format.decode_request({"max_tokens": 64, **body})


async def test_anthropic_structured_outputs_from_response_format(upstreams: Upstreams) -> None:
    sent = await sent_body(
        upstreams, "anthropic", chat("anthropic", response_format=JSON_SCHEMA_FORMAT)
    )
    assert sent["output_config"] == {"format": {"type": "json_schema", "schema": SCHEMA}}
    headers = upstreams.anthropic.requests[-1].headers
    assert "anthropic-beta" not in headers  # the generally available form needs none
    json_object = {"type": "json_object"}
    sent = await sent_body(upstreams, "anthropic", chat("anthropic", response_format=json_object))
    assert sent["output_config"] == {
        "format": {"type": "json_schema", "schema": {"type": "object"}}
    }


@pytest.mark.parametrize(
    ("effort", "max_tokens", "thinking", "sent_max"),
    [
        ("low", 64, {"type": "enabled", "budget_tokens": 1024}, 1088),
        ("medium", 64, {"type": "enabled", "budget_tokens": 8192}, 8256),
        ("high", 30000, {"type": "enabled", "budget_tokens": 24576}, 30000),
        ("minimal", 4096, {"type": "enabled", "budget_tokens": 1024}, 4096),
        ("none", 64, {"type": "disabled"}, 64),
    ],
)
async def test_anthropic_thinking_budget_from_reasoning_effort(
    upstreams: Upstreams, effort: str, max_tokens: int, thinking: Any, sent_max: int
) -> None:
    request = chat("anthropic", reasoning_effort=effort, max_tokens=max_tokens)
    sent = await sent_body(upstreams, "anthropic", request)
    assert sent["thinking"] == thinking
    assert sent["max_tokens"] == sent_max


async def test_anthropic_user_goes_in_metadata(upstreams: Upstreams) -> None:
    sent = await sent_body(upstreams, "anthropic", chat("anthropic", user="end-user-7"))
    assert sent["metadata"] == {"user_id": "end-user-7"}


@pytest.mark.parametrize(
    ("effort", "budget"), [("low", 1024), ("medium", 8192), ("high", 24576), ("none", 0)]
)
async def test_gemini_thinking_budget_from_reasoning_effort(
    upstreams: Upstreams, effort: str, budget: int
) -> None:
    sent = await sent_body(upstreams, "gemini", chat("gemini", reasoning_effort=effort))
    assert sent["generationConfig"]["thinkingConfig"] == {"thinkingBudget": budget}


async def test_zhipu_table(upstreams: Upstreams) -> None:
    request = openai_format.decode_request(
        {
            "model": MODELS["zhipu"],
            "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_object"},
            "user": "end-user-7",
            "stop": ["END"],
            "max_completion_tokens": 50,
        }
    )
    params = {**request.params, "thinking": {"type": "enabled", "budget_tokens": 2048}}
    request = dataclasses.replace(request, params=params)
    sent = await sent_body(upstreams, "zhipu", request)
    assert sent["response_format"] == {"type": "json_object"}
    assert sent["thinking"] == {"type": "enabled"}  # GLM's switch: no budget
    assert sent["user_id"] == "end-user-7" and "user" not in sent
    assert sent["stop"] == ["END"]
    assert sent["max_tokens"] == 50
    assert "stream_options" not in sent


async def test_deepseek_table(upstreams: Upstreams) -> None:
    request = chat(
        "deepseek",
        frequency_penalty=0.5,
        presence_penalty=0.25,
        response_format={"type": "json_object"},
        stop=["END"],
    )
    request = dataclasses.replace(
        request, params={**request.params, "thinking": {"type": "disabled"}}
    )
    sent = await sent_body(upstreams, "deepseek", request)
    assert sent["frequency_penalty"] == 0.5
    assert sent["presence_penalty"] == 0.25
    assert sent["response_format"] == {"type": "json_object"}
    assert sent["thinking"] == {"type": "disabled"}
    assert sent["stop"] == ["END"]


async def test_qwen_table(upstreams: Upstreams) -> None:
    request = chat(
        "qwen",
        seed=7,
        presence_penalty=0.25,
        response_format=JSON_SCHEMA_FORMAT,
        parallel_tool_calls=False,
    )
    thinking = {"type": "enabled", "budget_tokens": 2048}
    request = dataclasses.replace(request, params={**request.params, "thinking": thinking})
    sent = await sent_body(upstreams, "qwen", request)
    assert sent["seed"] == 7
    assert sent["presence_penalty"] == 0.25
    assert sent["response_format"] == JSON_SCHEMA_FORMAT
    assert sent["parallel_tool_calls"] is False
    assert sent["enable_thinking"] is True and sent["thinking_budget"] == 2048


async def test_the_runners_own_user_goes_only_where_a_provider_takes_one(
    upstreams: Upstreams,
) -> None:
    """`ChatRequest.user` set without `params` (the agent runner's attribution) is never a
    400: providers that document an end-user id get it, the others do not."""
    sent = await sent_body(upstreams, "deepseek", ask("deepseek", {}, user="u-1"))
    assert "user" not in sent
    sent = await sent_body(upstreams, "openai", ask("openai", {}, user="u-1"))
    assert sent["user"] == "u-1"


async def test_a_dropped_user_is_not_sent(upstreams: Upstreams) -> None:
    request = chat("deepseek", user="u-1")
    sent = await sent_body(upstreams, "deepseek", request, drop_unsupported_params=True)
    assert "u-1" not in str(sent)
    sent = await sent_body(upstreams, "zhipu", chat("zhipu", user="u-1x42"))
    assert sent["user_id"] == "u-1x42"  # kept where the table has it


@pytest.mark.parametrize(
    ("kind", "field", "value"),
    [
        ("openai", "thinking", {"type": "enabled", "budget_tokens": 1024}),
        ("openai", "n", 2),
        ("anthropic", "seed", 7),
        ("anthropic", "logit_bias", {"1": 5}),
        ("anthropic", "n", 2),
        ("anthropic", "reasoning_effort", "extreme"),
        ("gemini", "user", "u-1"),
        ("gemini", "reasoning_effort", "extreme"),
        ("gemini", "logit_bias", {"1": 5}),
        ("gemini", "parallel_tool_calls", False),
        ("bedrock", "seed", 7),
        ("bedrock", "response_format", JSON_SCHEMA_FORMAT),
        ("bedrock", "frequency_penalty", 0.5),
        ("ollama", "logit_bias", {"1": 5}),
        ("ollama", "metadata", {"a": "b"}),
        ("ollama", "user", "u-1"),
        ("bedrock", "user", "u-1"),
        ("zhipu", "seed", 7),
        ("zhipu", "response_format", JSON_SCHEMA_FORMAT),
        ("zhipu", "frequency_penalty", 0.5),
        ("deepseek", "seed", 7),
        ("deepseek", "logit_bias", {"1": 5}),
        ("deepseek", "response_format", JSON_SCHEMA_FORMAT),
        ("deepseek", "user", "u-1"),
        ("qwen", "logit_bias", {"1": 5}),
        ("qwen", "frequency_penalty", 0.5),
        ("qwen", "user", "u-1"),
    ],
)
async def test_a_field_the_provider_cannot_honour_is_a_400_naming_both(
    upstreams: Upstreams, kind: str, field: str, value: Any
) -> None:
    gw = gateway(upstreams)
    try:
        with pytest.raises(ValidationFailed) as caught:
            await gw.complete(ask(kind, {field: value}, tools=(TOOL,)))
    finally:
        await gw.aclose()
    err = caught.value
    assert err.status_code == 400
    assert field in err.message and kind in err.message
    assert err.extra["fields"][0]["field"] == field
    assert err.extra["provider"] == kind
    assert upstreams.sent(kind) == []  # refused before anything went upstream


async def test_with_drop_unsupported_params_the_request_succeeds_without_them(
    upstreams: Upstreams,
) -> None:
    request = ask("bedrock", {"seed": 7, "logit_bias": {"1": 5}})
    sent = await sent_body(upstreams, "bedrock", request, drop_unsupported_params=True)
    assert "seed" not in str(sent) and "logit_bias" not in str(sent)
    assert sent["inferenceConfig"] == {"maxTokens": 64}
    # Supported ones still go: Gemini keeps seed, drops logit_bias.
    request = ask("gemini", {"seed": 7, "logit_bias": {"1": 5}})
    sent = await sent_body(upstreams, "gemini", request, drop_unsupported_params=True)
    assert sent["generationConfig"]["seed"] == 7
    assert "logit_bias" not in str(sent)


def test_decoders_keep_only_declared_optional_fields() -> None:
    chat = openai_format.decode_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "hi"}],
            "seed": None,
            "response_format": {"type": "text"},
            "logit_bias": {"1": 2},
        }
    )
    assert chat.params == {"logit_bias": {"1": 2}}
    one = openai_format.decode_request(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 1, "user": "u"}
    )
    assert one.params == {"user": "u"} and one.user == "u"  # n=1: every answer's one choice
    with pytest.raises(ValidationFailed, match="n"):
        openai_format.decode_request(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 0}
        )
    with pytest.raises(ValidationFailed, match="seed"):
        openai_format.decode_request(
            {"model": "m", "messages": [{"role": "user", "content": "hi"}], "seed": "7"}
        )
    with pytest.raises(ValidationFailed, match="response_format"):
        openai_format.decode_request(
            {
                "model": "m",
                "messages": [{"role": "user", "content": "hi"}],
                "response_format": {"type": "xml"},
            }
        )


@pytest.mark.parametrize(
    ("kind", "path", "body", "problem"),
    [
        ("openai", "/v1/chat/completions", {"model": "m", "messages": "hi"}, "messages"),
        ("openai", "/v1/chat/completions", {"model": "m"}, "messages"),
        ("gemini", "/v1beta/models/g:generateContent", {"contents": []}, "contents"),
        (
            "gemini",
            "/v1beta/models/g:generateContent",
            {"contents": [{"role": "user", "parts": [{"text": "a", "inlineData": {}}]}]},
            "exactly one data field",
        ),
        (
            "gemini",
            "/v1beta/models/g:generateContent",
            {
                "contents": [{"role": "user", "parts": [{"text": "a"}]}],
                "generationConfig": {"response_schema": {}},
            },
            "response_schema",
        ),
        ("ollama", "/api/chat", {"messages": []}, "model"),
        ("ollama", "/api/chat", {"model": "m", "messages": [], "seed": 1}, "seed"),
        (
            "ollama",
            "/api/chat",
            {"model": "m", "messages": [], "options": {"max_tokens": 5}},
            "max_tokens",
        ),
    ],
)
async def test_the_fakes_answer_400_to_a_malformed_request_and_record_it(
    upstreams: Upstreams, kind: str, path: str, body: Any, problem: str
) -> None:
    fake = getattr(upstreams, kind)
    headers = {"Authorization": "Bearer sk-openai", "x-goog-api-key": "g-key"}
    async with httpx.AsyncClient(base_url=fake.url, headers=headers) as client:
        r = await client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert any(problem in v for v in fake.violations), fake.violations


def test_the_bedrock_fake_checks_converse_bodies() -> None:
    assert bedrock_problems({"messages": [{"role": "user", "content": [{"text": "a"}]}]}) == []
    assert bedrock_problems({"messages": [{"role": "system", "content": [{"text": "a"}]}]})
    assert bedrock_problems({"messages": [{"role": "user", "content": [{"text": "a", "x": 1}]}]})
    assert bedrock_problems({"inferenceConfig": {"seed": 1}}) == [
        "inferenceConfig.seed: not an InferenceConfiguration field"
    ]
