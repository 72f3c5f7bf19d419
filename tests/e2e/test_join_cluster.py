"""`orchestrator serve --address` joins a running Ray cluster and leaves it running."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.conftest import free_port
from tests.e2e.test_serve import ROOT, _wait_for_ready_line

pytestmark = pytest.mark.e2e
RAY = str(ROOT / ".venv" / "bin" / "ray")


def _stop_cluster(temp_dir: str) -> None:
    # Not `ray stop`: that would stop every Ray cluster on the machine.
    procs = [
        p for p in psutil.process_iter(["cmdline"]) if temp_dir in " ".join(p.info["cmdline"] or [])
    ]
    for p in procs:
        p.terminate()
    # The raylet and the GCS server outlive a SIGTERM by more than 10 s (each test waited that
    # long for them, ~10 s per cluster): a throwaway cluster's last seconds are not worth it.
    _, alive = psutil.wait_procs(procs, timeout=2)
    for p in alive:
        p.kill()
    psutil.wait_procs(alive, timeout=10)


def ray_env() -> dict[str, str]:
    """The environment of a `ray start` cluster and its clients: none of our settings, and
    token auth on both sides, as a real cluster should run (the token: ~/.ray/auth_token)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ORCH_", "RAY_"))}
    env["RAY_AUTH_MODE"] = "token"
    return env


def ray(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [RAY, *args], capture_output=True, text=True, timeout=120, env=env, check=True
    )


def start_head(env: dict[str, str], port: int, temp_dir: str, *extra: str) -> None:
    ray(
        env,
        "start",
        "--head",
        f"--port={port}",
        "--num-cpus=2",
        f"--temp-dir={temp_dir}",
        "--disable-usage-stats",
        *(extra or ("--include-dashboard=false",)),
    )


def test_join_an_existing_cluster(tmp_path: Path) -> None:
    temp_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's socket paths must stay short
    gcs_port = free_port()
    env = ray_env()
    start_head(env, gcs_port, temp_dir)
    port = free_port()
    log = tmp_path / "serve.log"
    try:
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [
                    str(ROOT / "scripts" / "serve"),
                    "--address",
                    f"127.0.0.1:{gcs_port}",
                    "--data-dir",
                    str(tmp_path / "data"),
                    "--port",
                    str(port),
                ],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        _wait_for_ready_line(proc, log)
        assert "joining Ray cluster" in log.read_text()
        token = (tmp_path / "data" / "admin_token").read_text().strip()
        r = httpx.get(
            f"http://127.0.0.1:{port}/api/v1/whoami",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )
        assert r.status_code == 200 and r.json()["admin"] is True
        # SIGINT here (the other e2e module sends SIGTERM): both stop the service cleanly.
        proc.send_signal(signal.SIGINT)
        assert proc.wait(90) == 0
        # Our application is gone, the cluster is not.
        status = subprocess.run(
            [RAY, "status", f"--address=127.0.0.1:{gcs_port}"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert status.returncode == 0, status.stderr
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                # The cluster's proxy may stay up; our routes must not.
                if httpx.get(f"http://127.0.0.1:{port}/api/v1/ready", timeout=2).text != "OK":
                    break
            except httpx.HTTPError:
                break
            time.sleep(0.5)
        else:
            pytest.fail("the application still answers after the service stopped")
    finally:
        _stop_cluster(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
