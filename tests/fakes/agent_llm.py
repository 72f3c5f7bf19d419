"""Replies of a loopback OpenAI-format model (`OpenAIFake(default_reply=agent_reply)`) that
an agent test steers from the task's prompt: the model reads directives in the text after
the last "## Task" heading (the step's own prompt; earlier steps' prompts are context):

- `[fail]`            -> an OpenAI 400 error (the task fails)
- `[sleep S]`         -> answers after S seconds
- `[tool NAME JSON]`  -> calls tool NAME with arguments JSON once, then answers with what the
                          tool returned: `tool NAME said: <result>`; `b64:<base64 of JSON>`
                          instead of JSON: arguments that appear nowhere in the prompt (a
                          secret the model came by, for the tests that look for it)
- `[loop NAME JSON]`  -> calls the same tool with the same arguments on every turn
- `[answer TEXT]`     -> answers TEXT
- `[steps NAME ARGS ;; NAME ARGS ...]` -> calls those tools one a turn, in order (ARGS: JSON
                          or `b64:...`, as for `tool`), then answers `steps: ` and every tool
                          result joined with ` | ` (the team tests script agents with it)
- otherwise           -> `done: <the step's prompt>`

Deterministic and stateless (the reply is a function of the request), so any number of
concurrent workflows can share one server."""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from tests.fakes.openai_server import FakeReply, FakeToolCall

DIRECTIVE = re.compile(r"\[(fail|sleep|tool|loop|answer|steps)(?:\s+([^\]]*))?\]")


def _arguments(args: str) -> Any:
    if args.startswith("b64:"):
        args = base64.b64decode(args[4:]).decode()
    return json.loads(args or "{}")


def steps_directive(*calls: tuple[str, dict[str, Any]]) -> str:
    """`[steps ...]` calling each (name, arguments) in turn (arguments base64-encoded, so
    they may hold brackets and other directives)."""
    encoded = [
        f"{name} b64:{base64.b64encode(json.dumps(args).encode()).decode()}" for name, args in calls
    ]
    return f"[steps {' ;; '.join(encoded)}]"


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content or "")


def task_prompt(body: dict[str, Any]) -> str:
    first_user = next(
        (m for m in body.get("messages", []) if m.get("role") == "user"), {"content": ""}
    )
    text = _text(first_user.get("content"))
    return text.rsplit("## Task\n", 1)[-1]


def agent_reply(body: Any) -> FakeReply:
    messages = body.get("messages", [])
    prompt = task_prompt(body)
    found = DIRECTIVE.search(prompt)
    kind, arg = (found.group(1), (found.group(2) or "").strip()) if found else ("", "")
    last = messages[-1] if messages else {}
    if kind == "fail":
        return FakeReply(
            status=400,
            error={
                "message": "scripted failure",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            },
        )
    if kind == "sleep":
        return FakeReply(text=f"slept: {prompt}", delay_s=float(arg.split()[0]))
    if kind in ("tool", "loop"):
        name, _, args = arg.partition(" ")
        if kind == "tool" and last.get("role") == "tool":
            return FakeReply(text=f"tool {name} said: {_text(last.get('content'))}")
        if args.startswith("b64:"):
            args = base64.b64decode(args[4:]).decode()
        return FakeReply(tool_calls=[FakeToolCall(name, json.loads(args or "{}"))])
    if kind == "answer":
        return FakeReply(text=arg)
    if kind == "steps":
        calls = [c.strip() for c in arg.split(";;") if c.strip()]
        results = [_text(m.get("content")) for m in messages if m.get("role") == "tool"]
        if len(results) >= len(calls):
            return FakeReply(text="steps: " + " | ".join(results))
        name, _, args = calls[len(results)].partition(" ")
        return FakeReply(tool_calls=[FakeToolCall(name, _arguments(args.strip()))])
    return FakeReply(text=f"done: {prompt.strip()}")
