"""`serve run serve_config.yaml` (Serve's own tooling, no `orchestrator serve`) on a running
`ray start` cluster, with external-style Postgres and Redis URLs: the app builds from the
import path and args, migrates the database and answers `/api/v1/ready` and `/health`."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import pytest
import yaml

from orchestrator.runtime import EmbeddedPostgres, EmbeddedRedis
from tests.conftest import free_port
from tests.e2e.test_join_cluster import _stop_cluster, ray_env, start_head
from tests.e2e.test_serve import ROOT

pytestmark = pytest.mark.e2e
SERVE = str(ROOT / ".venv" / "bin" / "serve")


def test_serve_run_serve_config(tmp_path: Path) -> None:
    pg = EmbeddedPostgres(tmp_path / "pg")
    redis = EmbeddedRedis(tmp_path / "redis")
    temp_dir = tempfile.mkdtemp(prefix="r", dir="/tmp")  # Ray's socket paths must stay short
    gcs_port, http_port = free_port(), free_port()
    env = ray_env()
    proc: subprocess.Popen[bytes] | None = None
    try:
        env["ORCH_DATABASE_URL"] = pg.start()
        env["ORCH_REDIS_URL"] = redis.start()
        env["ORCH_DATA_DIR"] = str(tmp_path / "data")
        env["ORCH_ADMIN_TOKEN"] = "serve-config-admin-token-0123456789abcdef"
        start_head(env, gcs_port, temp_dir)
        # The shipped file, with only the HTTP port moved off 8000.
        config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
        config["http_options"] = {"host": "127.0.0.1", "port": http_port}
        path = tmp_path / "serve_config.yaml"
        path.write_text(yaml.safe_dump(config))
        log = tmp_path / "serve.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [SERVE, "run", "--address", f"127.0.0.1:{gcs_port}", str(path)],
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        base = f"http://127.0.0.1:{http_port}/api/v1"
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{base}/ready", timeout=2).text == "OK":
                    break
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(1)
        health = httpx.get(f"{base}/health", timeout=10)
        assert health.status_code == 200, health.text
        assert health.json()["components"]["store"]["status"] == "ok"
        admin = {"Authorization": f"Bearer {env['ORCH_ADMIN_TOKEN']}"}
        r = httpx.get(f"{base}/whoami", headers=admin, timeout=10)
        assert r.json()["admin"] is True
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)  # reaped: an unreaped Popen warns (and fails) a later test
        _stop_cluster(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
        redis.stop()
        pg.stop()
