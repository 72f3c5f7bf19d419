"""Helpers of the spec conformance modules: the running service's handle, SPEC's types
checked on JSON values, and waits with deadlines."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from orchestrator.config import Settings
from tests.conftest import ADMIN_TOKEN
from tests.fakes.openai_server import OpenAIFake

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
MODEL = "fake-agent"
LOCAL_MODEL = "spec-tiny"
TG_TOKEN = "123456:" + "A" * 35  # a Telegram bot token's shape: <digits>:<35 characters>
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|\+00:00)$")


@dataclass
class Spec:
    """The module's running service: `c` is an httpx client on `/api/v1`."""

    c: httpx.AsyncClient
    settings: Settings
    llm: OpenAIFake
    root: Path
    url: str
    _users: dict[str, dict[str, str]] = field(default_factory=dict)

    async def user(self, name: str) -> dict[str, str]:
        """The headers of a (non-admin) user, made once per module."""
        if name not in self._users:
            made = await self.c.post("/tokens", headers=ADMIN, json={"user_uuid": name})
            assert made.status_code == 200, made.text
            self._users[name] = {"Authorization": f"Bearer {made.json()['token']}"}
        return self._users[name]


def is_type(value: Any, kind: str) -> bool:
    """A JSON value of one of SPEC's field types."""
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "array of string":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == "array of number":
        return isinstance(value, list) and all(is_type(v, "number") for v in value)
    if kind == "unix ms":
        # An integer of milliseconds: after 2020 and not in the far future (seconds or
        # microseconds would fall outside).
        return is_type(value, "integer") and 1_577_836_800_000 < value < 4_102_444_800_000
    if kind == "iso8601 utc":
        if not isinstance(value, str) or not ISO_UTC.match(value):
            return False
        dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        return True
    raise AssertionError(f"unknown SPEC type {kind}")


async def until(check: Callable[[], Awaitable[Any]], within: float = 60.0) -> Any:
    """Poll `check` until it returns something truthy (a deadline, never a bare sleep)."""
    deadline = time.monotonic() + within
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.05)


async def create_workflow(c: httpx.AsyncClient, h: dict[str, str], **body: Any) -> str:
    r = await c.post("/workflows", headers=h, json=body)
    assert r.status_code == 200, r.text
    return str(r.json()["id"])


async def finished(
    c: httpx.AsyncClient, h: dict[str, str], wid: str, within: float = 60
) -> dict[str, Any]:
    """The workflow once it is completed, failed or cancelled."""

    async def done() -> dict[str, Any] | None:
        body: dict[str, Any] = (await c.get(f"/workflows/{wid}", headers=h)).json()
        return body if body["status"] in ("completed", "failed", "cancelled") else None

    result: dict[str, Any] = await until(done, within)
    return result


async def events(
    c: httpx.AsyncClient, aggregate: str, h: dict[str, str] = ADMIN, **params: Any
) -> list[dict[str, Any]]:
    r = await c.get("/events", headers=h, params={"aggregate": aggregate, "limit": 1000, **params})
    assert r.status_code == 200, r.text
    return list(r.json()["data"])


def error_body(r: httpx.Response) -> dict[str, Any]:
    """An error response's body, checked against DESIGN.md's one shape."""
    body: dict[str, Any] = r.json()
    assert body.get("ok") is False, body
    assert isinstance(body.get("error"), str) and body["error"], body
    assert isinstance(body.get("code"), str) and re.fullmatch(r"[a-z0-9_]+", body["code"]), body
    assert isinstance(body.get("request_id"), str) and body["request_id"], body
    return body
