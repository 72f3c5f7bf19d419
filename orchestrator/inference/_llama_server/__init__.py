"""A llama-server compatible server on cyllama (llama.cpp bindings): the bundled default
`inference_bin`.

It accepts llama-server's flags (`-m`, `--host`, `--port`, `-c`, `-ngl`, `-t`, `-a`,
`-b`, `--api-key`, whose default is `LLAMA_API_KEY` from the environment as llama-server's;
others are ignored with a warning). With a key, every route but /health answers 401
`Invalid API Key` unless the request carries `Authorization: Bearer <key>`. It serves what
the orchestrator and OpenAI clients use: `GET /health` (503 while the model loads, as
llama-server), `GET /v1/models`, `GET /slots` (`is_processing`), `GET /props`
(`chat_template_caps`: no tools), and `POST /v1/chat/completions`, plain or streamed as
`chat.completion.chunk` SSE frames ending with `data: [DONE]`, under llama-server's
`Content-Type: text/event-stream` without a charset (bodies and chunks follow OpenAI's
schemas; `response_format` json_object/json_schema is enforced by a grammar; `n` > 1 (as
llama-server), tools (as llama-server without --jinja) and logprobs are a 400). One request
is generated at a time (llama-server with one slot); others wait their turn. Generation
runs in a thread, so the event loop keeps answering /health and /slots meanwhile.

Modules: `options` (the command line), `request` (what a request may ask, judged before its
turn), `engine` (generation on cyllama, blocking, in a thread), `server` (HTTP, the turn,
the stream, `main`).

Run it as `python -m orchestrator.inference.llama_server` or `scripts/llama-server`.
"""

from __future__ import annotations

from orchestrator.inference._llama_server.engine import Engine, Outcome, Prepared, StopMatcher
from orchestrator.inference._llama_server.options import ServerOptions, parse_args
from orchestrator.inference._llama_server.request import (
    ApiError,
    ChatBody,
    chat_messages,
    json_grammar,
    json_schema,
)
from orchestrator.inference._llama_server.server import (
    Completion,
    LlamaServer,
    main,
    sse,
    usage,
)

__all__ = [
    "ApiError",
    "ChatBody",
    "Completion",
    "Engine",
    "LlamaServer",
    "Outcome",
    "Prepared",
    "ServerOptions",
    "StopMatcher",
    "chat_messages",
    "json_grammar",
    "json_schema",
    "main",
    "parse_args",
    "sse",
    "usage",
]
