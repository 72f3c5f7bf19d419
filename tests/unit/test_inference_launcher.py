"""The bundled llama-server launcher: its flags, request parsing and chunk shapes."""

import asyncio
import json

import pytest
from starlette.testclient import TestClient

from orchestrator.inference._llama_server import (
    ApiError,
    ChatBody,
    Completion,
    LlamaServer,
    Outcome,
    StopMatcher,
    chat_messages,
    json_grammar,
    json_schema,
    parse_args,
    sse,
    usage,
)
from tests.openai_schema import validate


def test_accepts_llama_server_flags_and_reports_the_rest() -> None:
    options, unknown = parse_args(
        [
            "-m",
            "/m.gguf",
            "--host",
            "0.0.0.0",
            "--port",
            "9001",
            "-c",
            "2048",
            "-ngl",
            "99",
            "-t",
            "3",
            "--alias",
            "smol",
            "--flash-attn",
            "on",
            "--jinja",
        ]
    )
    assert (options.model, options.host, options.port) == ("/m.gguf", "0.0.0.0", 9001)
    assert (options.ctx_size, options.gpu_layers, options.threads) == (2048, 99, 3)
    assert options.model_id == "smol"
    assert unknown == ["--flash-attn", "on", "--jinja"]
    long, _ = parse_args(["--model", "/m.gguf", "--ctx-size", "512", "--n-gpu-layers", "all"])
    assert (long.ctx_size, long.gpu_layers, long.model_id) == (512, -1, "/m.gguf")


def test_the_api_key_comes_from_the_environment_or_the_flag(monkeypatch) -> None:
    monkeypatch.delenv("LLAMA_API_KEY", raising=False)
    assert parse_args(["-m", "/m.gguf"])[0].api_key is None
    monkeypatch.setenv("LLAMA_API_KEY", "from-env")  # as llama-server: off the command line
    assert parse_args(["-m", "/m.gguf"])[0].api_key == "from-env"
    assert parse_args(["-m", "/m.gguf", "--api-key", "flag"])[0].api_key == "flag"
    monkeypatch.setenv("LLAMA_API_KEY", "")
    assert parse_args(["-m", "/m.gguf"])[0].api_key is None


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/models"),
        ("GET", "/v1/models"),
        ("GET", "/slots"),
        ("POST", "/chat/completions"),
        ("POST", "/v1/chat/completions"),
    ],
)
def test_with_a_key_only_health_is_open(monkeypatch, method: str, path: str) -> None:
    monkeypatch.delenv("LLAMA_API_KEY", raising=False)
    options, _ = parse_args(["-m", "/m.gguf", "--api-key", "s3cret-key"])
    client = TestClient(LlamaServer(options).app())  # no lifespan: no model is loaded
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-key"}):
        r = client.request(method, path, headers=headers, json={})
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["error"] == {
            "code": 401,
            "message": "Invalid API Key",
            "type": "authentication_error",
        }
    keyed = client.request(method, path, headers={"Authorization": "Bearer s3cret-key"}, json={})
    assert keyed.status_code != 401
    assert client.get("/health").status_code == 503  # open, and honest: still loading
    assert client.get("/v1/health").status_code == 503


def test_stop_strings_are_cut_across_pieces() -> None:
    stops = StopMatcher(["</end>", "STOP"])
    out = [stops.feed(p) for p in ["Hello <", "/en", "d> never"]]
    assert "".join(out) == "Hello " and stops.stopped
    stops = StopMatcher(["STOP"])
    out = [stops.feed(p) for p in ["ST", "ay", " S"]]
    assert "".join(out) + stops.flush() == "STay S" and not stops.stopped
    assert StopMatcher([]).feed("as is") == "as is"


def test_messages_for_the_template() -> None:
    body = ChatBody.model_validate(
        {
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
                },
                {"role": "assistant", "content": None},
            ],
            "max_completion_tokens": 5,
            "stop": "x",
        }
    )
    assert chat_messages(body) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": ""},
    ]
    assert body.limit == 5 and body.stops == ["x"]
    assert (
        ChatBody.model_validate(
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": -1}
        ).limit
        is None
    )


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
        ({"n": 2}, "n=1"),
        ({"response_format": {"type": "yaml"}}, "response_format"),
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": False, "top_logprobs": 2}, "logprobs"),
        ({"response_format": {"type": "json_schema", "json_schema": []}}, "response_format"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ]
            },
            "image_url",
        ),
        ({"messages": [{"role": "tool", "content": "42"}]}, "tool"),
    ],
)
def test_unsupported_requests_are_400(extra: dict, needle: str) -> None:
    body = ChatBody.model_validate({"messages": [{"role": "user", "content": "x"}], **extra})
    with pytest.raises(ApiError) as caught:
        chat_messages(body)
    assert caught.value.status == 400 and needle in caught.value.message
    assert caught.value.body()["error"]["type"] == "invalid_request_error"


def test_response_format_becomes_a_compact_json_grammar() -> None:
    def schema_of(fmt: dict) -> dict | None:
        return json_schema(
            ChatBody.model_validate({"messages": [{"role": "user", "content": "x"}], **fmt})
        )

    assert schema_of({}) is None and schema_of({"response_format": {"type": "text"}}) is None
    assert schema_of({"response_format": {"type": "json_object"}}) == {"type": "object"}
    city = {"type": "object", "properties": {"name": {"type": "string"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": city}}
    assert schema_of({"response_format": fmt}) == city
    grammar = json_grammar(city)
    assert "root ::=" in grammar
    # Whitespace is one optional space: no newline/tab padding after the closing brace.
    assert [line for line in grammar.splitlines() if line.startswith("space ::=")] == [
        'space ::= | " "'
    ]


def test_chunk_shapes_follow_openai() -> None:
    c = Completion(model="smol", fingerprint="fp_0123456789")
    first = c.chunk({"role": "assistant", "content": ""}, with_usage=True)
    assert first["object"] == "chat.completion.chunk" and first["usage"] is None
    assert first["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    last = c.chunk(None, usage=usage(3, 4))
    assert last["choices"] == [] and last["usage"] == {
        "prompt_tokens": 3,
        "completion_tokens": 4,
        "total_tokens": 7,
    }
    assert "usage" not in c.chunk({"content": "x"})
    assert {first["id"], last["id"]} == {c.id} and c.id.startswith("chatcmpl-")
    frame = sse(last)
    assert frame.startswith(b"data: {") and frame.endswith(b"}\n\n")
    assert json.loads(frame[6:]) == last
    assert sse("[DONE]") == b"data: [DONE]\n\n"
    whole = c.response("hi", Outcome(completion_tokens=1, finish_reason="length"), 5)
    assert whole["object"] == "chat.completion" and whole["choices"][0]["finish_reason"] == "length"
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": "hi", "refusal": None}
    assert whole["system_fingerprint"] == first["system_fingerprint"] == "fp_0123456789"
    validate(whole, "CreateChatCompletionResponse")
    for chunk in (first, last, c.chunk({}, "stop", usage=usage(3, 4))):
        validate(chunk, "CreateChatCompletionStreamResponse")


class _InstantEngine:
    """Stands in for the model: prepares nothing, generates one piece at once."""

    n_ctx = 64
    fingerprint = "fp_instant"

    def prepare(self, messages: object, body: object) -> object:
        from orchestrator.inference._llama_server import Prepared

        return Prepared(tokens=[1], limit=8)

    def generate(self, prepared: object, body: object, emit, cancel) -> Outcome:  # type: ignore[no-untyped-def]
        emit("hi")
        return Outcome(completion_tokens=1)


async def _post_chat(app, send) -> None:  # type: ignore[no-untyped-def]
    body = json.dumps({"messages": [{"role": "user", "content": "x"}], "stream": True}).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
    }
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays connected
        return {"type": "http.disconnect"}

    await app(scope, receive, send)


async def test_a_stream_cancelled_before_its_body_starts_does_not_wedge_the_turn() -> None:
    server = LlamaServer(parse_args(["-m", "/m.gguf"])[0])
    server.engine = _InstantEngine()  # type: ignore[assignment]
    server.loaded = True
    app = server.app()
    headers_sending = asyncio.Event()

    async def stuck_send(message: dict) -> None:
        if message["type"] == "http.response.start":
            headers_sending.set()
            await asyncio.Event().wait()  # the client is gone; the write never completes

    queued = asyncio.create_task(_post_chat(app, stuck_send))
    await asyncio.wait_for(headers_sending.wait(), 5)
    assert server._turn.locked()  # the stream holds the turn; its body has not started
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued

    # The next request gets its turn and its whole answer.
    frames: list[bytes] = []

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body":
            frames.append(message.get("body", b""))

    await asyncio.wait_for(_post_chat(app, send), 5)
    assert b"data: [DONE]\n\n" in b"".join(frames)
    assert not server._turn.locked()
