"""`orchestrator serve` refuses a database whose applied migration file was edited: it exits
with code 3 naming the file, and never serves."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from orchestrator.db import MIGRATIONS_DIR
from tests.conftest import free_port

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


async def _migrate_then_tamper(database_url: str, name: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "orchestrator.cli", "migrate", env=_env(database_url), cwd=ROOT
    )
    assert await proc.wait() == 0
    conn = await asyncpg.connect(database_url)
    try:
        # What an edited file looks like to the runner: its sha256 differs from the recorded.
        await conn.execute(
            "UPDATE schema_migrations SET checksum = repeat('0', 64) WHERE name = $1", name
        )
    finally:
        await conn.close()


def _env(database_url: str, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "RAY_SERVE_"))}
    return {**env, "ORCH_DATABASE_URL": database_url, **more}


async def test_serve_refuses_an_edited_migration(
    database_url: str, redis_url: str, tmp_path: Path
) -> None:
    name = sorted(p.name for p in MIGRATIONS_DIR.glob("*.sql"))[-1]
    await _migrate_then_tamper(database_url, name)
    port = free_port()
    data_dir = tmp_path / "data"
    env = _env(database_url, ORCH_REDIS_URL=redis_url)
    args = ["serve", "--data-dir", str(data_dir), "--port", str(port), "--no-haproxy"]
    proc = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "orchestrator.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert name in proc.stderr and "changed" in proc.stderr
    assert "Orchestrator ready" not in proc.stdout
    assert not (data_dir / "runtime.json").exists()
    with socket.socket() as sock:  # nothing was left listening on its port
        assert sock.connect_ex(("127.0.0.1", port)) != 0
