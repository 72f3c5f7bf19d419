"""The base install (`pip install .`, no extras) serves against an external Postgres and Redis.

Installing into a fresh venv takes over a minute (Ray's wheel), so this runs the project's
own .venv with every extra's modules made unimportable in every process the service starts
(a sitecustomize on PYTHONPATH, which Ray's workers inherit): the same imports fail as in a
base install. docs/operations.md gives the fresh-venv commands."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from orchestrator.extras import EXTRA_MODULES
from tests.conftest import free_port
from tests.e2e.test_serve import _wait_for_ready_line

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
ABSENT = sorted({m for modules in EXTRA_MODULES.values() for m in modules} - {"numpy"})


async def test_serves_without_any_extra(
    database_url: str, clean_redis: str, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        f"import sys\nfor m in {ABSENT!r}:\n    sys.modules[m] = None\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "RAY_SERVE_"))}
    env |= {
        "PYTHONPATH": str(site),
        "ORCH_DATABASE_URL": database_url,
        "ORCH_REDIS_URL": clean_redis,
        "PATH": os.pathsep.join(  # no system haproxy either
            p for p in env.get("PATH", "").split(os.pathsep) if not (Path(p) / "haproxy").exists()
        ),
    }
    port = free_port()
    log = tmp_path / "serve.log"
    data_dir = tmp_path / "data"
    command = [sys.executable, "-m", "orchestrator.cli", "serve", "--data-dir", str(data_dir)]
    with log.open("wb") as out:
        proc = await asyncio.to_thread(
            subprocess.Popen,
            [*command, "--port", str(port)],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    try:
        await asyncio.to_thread(_wait_for_ready_line, proc, log)
        async with httpx.AsyncClient(timeout=10) as client:
            health = await client.get(f"http://127.0.0.1:{port}/api/v1/health")
        assert health.status_code == 200 and health.json()["status"] == "ok", health.text
        text = log.read_text(errors="replace")
        fallback = [line for line in text.splitlines() if "[haproxy]" in line]
        assert len(fallback) == 1 and "standard proxy" in fallback[0], text[-3000:]
        assert not (data_dir / "pg").exists() and not (data_dir / "redis").exists()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 90) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        sys.stdout.write(log.read_text(errors="replace")[-3000:])
