"""One tenant's workflow cannot stall another's on the same engine: a catastrophic regular
expression (branch `pattern`, condition `matches`) and a calculator expression with huge
intermediate results are bounded (through the real HTTP app and its agent runtime)."""

from __future__ import annotations

import asyncio
import time

import httpx

from tests.integration.test_workflows_api import api, create, finished, llm, user

__all__ = ["api", "llm"]  # fixtures used here

EVIL = "(a+)+$"
VICTIM = "a" * 34 + "!"  # Python's re: ~2**34 steps; RE2: linear


async def test_a_catastrophic_pattern_does_not_stall_another_tenant(
    api: httpx.AsyncClient,
) -> None:
    ann, bob = await user(api, "ann"), await user(api, "bob")
    evil = await create(
        api,
        ann,
        name="evil",
        steps=[
            {"name": "a", "prompt": f"[answer {VICTIM}]"},
            {
                "name": "c",
                "prompt": "checked",
                "condition": f"{{{{a.result}}}} matches '{EVIL}' or true",
            },
            {
                "name": "b",
                "type": "branch",
                "conditions": {
                    "evil": {"match": "{{a.result}}", "pattern": EVIL, "then": "a"},
                    "fallback": {"then": "d"},
                },
            },
            {"name": "d", "prompt": "after"},
        ],
    )
    started = time.monotonic()
    plain = await create(api, bob, name="plain", steps=[{"name": "x", "prompt": "hello"}])
    done, body = await asyncio.gather(finished(api, bob, plain), finished(api, ann, evil))
    assert done["status"] == "completed"
    assert time.monotonic() - started < 20
    assert body["status"] == "completed", body
    steps = {s["name"]: s for s in body["steps"]}
    assert steps["b"]["result"] == "fallback -> d" and steps["c"]["status"] == "completed"


async def test_a_huge_power_is_a_tool_error_not_a_frozen_worker(api: httpx.AsyncClient) -> None:
    ann, bob = await user(api, "ann"), await user(api, "bob")
    bomb = await create(
        api,
        ann,
        name="bomb",
        steps=[
            {
                "name": "calc",
                "prompt": '[tool calculate {"expression": "(((9**99)**99)**99)**99"}]',
                "tools": ["calculate"],
            }
        ],
    )
    plain = await create(api, bob, name="plain", steps=[{"name": "x", "prompt": "hello"}])
    body, done = await asyncio.gather(finished(api, ann, bomb), finished(api, bob, plain))
    assert done["status"] == "completed"
    result = body["steps"][0]["result"]
    assert result.startswith("tool calculate said:") and "too large" in result, result
