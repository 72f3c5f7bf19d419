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
