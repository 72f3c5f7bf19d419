"""One service per spec module: the real app under uvicorn on loopback (ServedApp), on a
database of the module's own, with the loopback OpenAI fake as the agents' model and local
inference instances run in the test process.

Each module of this package walks one part of SPEC.md against it; module scope keeps the
package cheap (one start per module, not per case), so cases must not depend on each other's
leftovers: each uses its own names (user, agent namespace, workflow name)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import httpx
import pytest

from orchestrator.config import Settings
from orchestrator.inference import InProcessInference
from tests.conftest import ADMIN_TOKEN, ServedApp, empty_redis, with_database
from tests.fakes.agent_llm import agent_reply
from tests.fakes.openai_server import OpenAIFake
from tests.gguf import write_gguf
from tests.integration.spec._kit import LOCAL_MODEL, MODEL, Spec


@pytest.fixture(scope="module")
def spec_overrides() -> dict[str, Any]:
    """Settings a module needs beyond these (a module overrides this fixture)."""
    return {}


@pytest.fixture(scope="module")
async def spec(
    pg_uri: str,
    redis_url: str,
    tmp_path_factory: pytest.TempPathFactory,
    spec_overrides: dict[str, Any],
) -> AsyncIterator[Spec]:
    # Module-scoped (make_settings is per test): the settings make_settings builds, on a
    # database of this module's own, dropped at the end.
    from deployments.api import create_app

    base = tmp_path_factory.mktemp("spec")
    await empty_redis(redis_url)
    name = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(pg_uri)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    try:
        async with OpenAIFake(api_key="sk-agent", default_reply=agent_reply) as llm:
            values: dict[str, Any] = {
                "database_url": with_database(pg_uri, name),
                "redis_url": redis_url,
                "data_dir": base / "data",
                "admin_token": ADMIN_TOKEN,
                # Not a SPEC limit: off, so a module's many requests are never throttled.
                "rate_limit_per_minute": 0,
                "provider_retries": 0,
                "providers": {
                    "openai": {"base_url": llm.base_url, "api_key": "sk-agent", "models": [MODEL]}
                },
                "default_model": MODEL,
                "embedder": "none",
                # Local instances run in this process (as the Ray actor would run them): a
                # tiny GGUF to discover, and a binary that exits at once, so an instance
                # goes starting -> failed without loading anything.
                "models_dir": base / "models",
                "inference_bin": "/bin/false",
            }
            values.update(spec_overrides)
            settings = Settings.load(environ={}, **values)
            write_gguf(base / "models" / f"{LOCAL_MODEL}.gguf")
            app = create_app(settings, local_inference=InProcessInference(settings))
            async with ServedApp(settings, app) as served:
                async with httpx.AsyncClient(base_url=f"{served.url}/api/v1", timeout=60) as client:
                    yield Spec(client, settings, llm, base, served.url)
    finally:
        conn = await asyncpg.connect(pg_uri)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()
