"""Schemathesis against our own `/openapi.json` (the app over HTTP, real Postgres and Redis),
authenticated as an admin: every operation, at least 2,000 generated requests; no response is
a 5xx and every documented response matches its schema."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ADMIN_TOKEN, ServedApp

pytestmark = pytest.mark.fuzz

MIN_CASES = 2000
SCHEMATHESIS = Path(sys.executable).with_name("schemathesis")


@pytest.mark.timeout(900)
async def test_fuzz_every_operation(make_settings: Any, tmp_path: Path) -> None:
    assert SCHEMATHESIS.exists(), "schemathesis comes with the [test] extra"
    settings = make_settings(
        rate_limit_per_minute=0,
        marketplace_publish_per_hour=0,
        agent_task_timeout_s=2,
    )
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=served.url, timeout=30) as client:
            schema = (
                await client.get(
                    "/api/v1/openapi.json", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
                )
            ).json()
        path = tmp_path / "openapi.json"
        path.write_text(json.dumps(schema))
        report = tmp_path / "report.json"
        proc = await asyncio.create_subprocess_exec(
            str(SCHEMATHESIS),
            "run",
            str(path),
            "--url",
            served.url,
            "--header",
            f"Authorization: Bearer {ADMIN_TOKEN}",
            "--checks",
            "not_a_server_error,response_schema_conformance",
            "--max-examples",
            "40",
            "--phases",
            "examples,coverage,fuzzing",
            # An endless stream by design; and local inference, which needs Ray (503 in
            # process; tests/e2e/test_inference.py covers it under Serve).
            "--exclude-path-regex",
            "sync-events|/inference$|/stop$|/stop-all$",
            "--request-timeout",
            "20",
            "--seed",
            "1",
            "--report",
            "ndjson",
            "--report-ndjson-path",
            str(report),
            "--no-color",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "SCHEMATHESIS_HOOKS": ""},
        )
        out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-6000:]
    cases = _cases(report)
    assert cases >= MIN_CASES, (cases, text[-2000:])


def _cases(report: Path) -> int:
    """Requests made, from the ndjson event stream."""
    total = 0
    for line in report.read_text().splitlines():
        event = json.loads(line)
        for key in ("ScenarioFinished",):
            if key in event:
                total += len(event[key].get("recorder", {}).get("interactions", {}))
    return total


HOSTILE_BODIES = {
    "a NUL character": lambda props: json.dumps({p: "a\x00b" for p in props} or {"x": "a\x00b"}),
    "a lone surrogate": lambda props: json.dumps({p: "a\ud800b" for p in props} or {"x": "\ud800"}),
    "nesting past 64 levels": lambda props: json.dumps(
        {(props or ["x"])[0]: json.loads("[" * 200 + "]" * 200)}
    ),
}


def _body_properties(schema: dict[str, Any], operation: dict[str, Any]) -> list[str] | None:
    """The top-level property names of an operation's JSON body ([] for a free-form body),
    or None when it takes no JSON body."""
    content = operation.get("requestBody", {}).get("content", {})
    if "application/json" not in content:
        return None
    body = content["application/json"].get("schema", {})
    ref = body.get("$ref", "")
    if ref:
        body = schema["components"]["schemas"][ref.rsplit("/", 1)[1]]
    return list(body.get("properties", {}))


async def test_hostile_text_in_every_operation_is_a_clear_400(make_settings: Any) -> None:
    """What schemathesis' generators do not make: for every operation of the OpenAPI document,
    NUL characters, lone surrogates and deep nesting in every field of its JSON body, and a
    NUL in its path and in each query parameter. Each is a 400 with the error body, never a
    5xx, whatever the route (webhooks and admin routes included)."""
    settings = make_settings(rate_limit_per_minute=0, marketplace_publish_per_hour=0)
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    wrong: list[tuple[str, str, str, int, str]] = []
    tried = 0
    async with ServedApp(settings) as served:
        async with httpx.AsyncClient(base_url=served.url, headers=admin, timeout=30) as client:
            schema = (await client.get("/api/v1/openapi.json")).json()

            async def expect_400(method: str, url: str, what: str, **kw: Any) -> None:
                nonlocal tried
                tried += 1
                r = await client.request(method, url, **kw)
                body = r.json() if r.headers.get("content-type", "").startswith("appl") else {}
                if r.status_code != 400 or body.get("ok") is not False or "error" not in body:
                    wrong.append((method, url, what, r.status_code, r.text[:200]))

            for path, operations in schema["paths"].items():
                if "sync-events" in path:
                    continue  # an endless stream (its parameters are GET /events')
                url = "/api/v1" + path.removeprefix("/api/v1")
                plain = url.replace("{", "").replace("}", "")  # {id} -> id: any value
                for method, operation in operations.items():
                    if method not in ("get", "post", "put", "patch", "delete"):
                        continue
                    if "{" in url:
                        bad = url.split("{")[0] + "a%00b" + url.split("}", 1)[1]
                        await expect_400(method, bad.replace("{", "").replace("}", ""), "path")
                    for param in operation.get("parameters", []):
                        if param["in"] == "query":
                            await expect_400(
                                method,
                                plain,
                                f"query {param['name']}",
                                params={param["name"]: "a\x00b"},
                            )
                    props = _body_properties(schema, operation)
                    if props is None:
                        continue
                    for what, make in HOSTILE_BODIES.items():
                        await expect_400(
                            method,
                            plain,
                            what,
                            content=make(props),
                            headers={"content-type": "application/json"},
                        )
    assert tried >= 100, tried
    assert not wrong, wrong[:20]
