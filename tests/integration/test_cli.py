"""The `orchestrator` command as an operator runs it: a subprocess against the real embedded
Postgres (a fresh database per test), its output and exit codes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import asyncpg
import yaml

from orchestrator.auth import hash_token
from orchestrator.db import MIGRATIONS_DIR

DAY_MS = 86_400_000
# Secrets `config check` must never print, wherever they come from.
PG_PASSWORD = "pg-hunter2-secret"
REDIS_PASSWORD = "redis-hunter2-secret"
ADMIN_SECRET = "orch_admin-secret-0123456789abcdefghijkl"
JWT_SECRET = "jwt-hunter2-secret"
OPENAI_KEY = "sk-openai-hunter2-secret"
ANTHROPIC_KEY = "sk-ant-hunter2-secret"


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m orchestrator.cli ARGS` with only the environment given (plus PATH)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("ORCH_")}
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AWS_ACCESS_KEY_ID"):
        base.pop(var, None)
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=Path(__file__).resolve().parents[2],
    )


def db_env(database_url: str, tmp_path: Path) -> dict[str, str]:
    return {"ORCH_DATABASE_URL": database_url, "ORCH_DATA_DIR": str(tmp_path / "data")}


def test_version() -> None:
    r = cli("--version")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"orchestrator {version('orchestrator')}"


def test_tokens_with_an_expiry_are_listed_without_their_secret(
    database_url: str, tmp_path: Path
) -> None:
    env = db_env(database_url, tmp_path)
    before = int(time.time() * 1000)
    r = cli("token", "create", "--user", "alice", "--expires-in", "30d", "--description", "ci",
            env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    alice = r.stdout.strip()
    r = cli("token", "create", "--user", "ops", "--admin", env=env)
    assert r.returncode == 0, r.stderr
    ops = r.stdout.strip()
    after = int(time.time() * 1000)

    r = cli("token", "list", "--json", env=env)
    assert r.returncode == 0, r.stderr
    for secret in (alice, ops, hash_token(alice), hash_token(ops)):
        assert secret not in r.stdout
    rows = {row["user_uuid"]: row for row in json.loads(r.stdout)}
    assert set(rows) == {"alice", "ops"}
    a, o = rows["alice"], rows["ops"]
    assert a["prefix"] == alice[:12] and o["prefix"] == ops[:12]
    assert (a["admin"], o["admin"]) == (False, True)
    assert before <= a["created_at"] <= after
    assert before + 30 * DAY_MS <= a["expires_at"] <= after + 30 * DAY_MS
    assert o["expires_at"] is None and a["expired"] is False
    assert a["last_used_at"] is None and a["description"] == "ci"
    assert set(a) >= {"prefix", "user_uuid", "admin", "created_at", "last_used_at", "expires_at"}

    r = cli("token", "list", env=env)
    assert r.returncode == 0, r.stderr
    assert alice not in r.stdout and ops not in r.stdout
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["PREFIX", "USER", "ADMIN", "CREATED", "LAST", "USED", "EXPIRES",
                                "DESCRIPTION"]  # fmt: skip
    alice_line = next(line for line in lines if line.startswith(alice[:12]))
    assert " alice " in alice_line and " no " in alice_line and " never " in alice_line

    # Revoked tokens leave the list, unless asked for.
    assert cli("token", "revoke", alice[:12], env=env).returncode == 0
    r = cli("token", "list", "--json", env=env)
    assert [row["user_uuid"] for row in json.loads(r.stdout)] == ["ops"]
    r = cli("token", "list", "--json", "--all", env=env)
    revoked = {row["user_uuid"]: row for row in json.loads(r.stdout)}["alice"]
    assert revoked["revoked_at"] is not None


def test_expires_in_must_be_a_positive_duration(database_url: str, tmp_path: Path) -> None:
    env = db_env(database_url, tmp_path)
    assert cli("token", "create", "--user", "alice", "--expires-in", "1h", env=env).returncode == 0
    for bad in ("30", "0d", "5x", "-1h"):
        r = cli("token", "create", "--user", "alice", "--expires-in", bad, env=env)
        assert r.returncode == 2, (bad, r.stdout, r.stderr)
        assert "--expires-in" in r.stderr


def test_migrate_applies_then_refuses_an_edited_migration(
    empty_database_url: str, tmp_path: Path
) -> None:
    env = db_env(empty_database_url, tmp_path)
    files = sorted(p.name for p in MIGRATIONS_DIR.glob("*.sql"))
    r = cli("migrate", env=env)
    assert r.returncode == 0, r.stderr
    assert [line.removeprefix("applied ") for line in r.stdout.splitlines()[:-1]] == files
    assert f"schema up to date ({len(files)} migration(s) applied now)" in r.stdout

    r = cli("migrate", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "schema up to date (0 migration(s) applied now)"

    async def recorded() -> dict[str, str]:
        conn = await asyncpg.connect(empty_database_url)
        try:
            rows = await conn.fetch("SELECT name, checksum FROM schema_migrations")
        finally:
            await conn.close()
        return {row["name"]: row["checksum"] for row in rows}

    sums = asyncio.run(recorded())
    assert sums == {f: hashlib.sha256((MIGRATIONS_DIR / f).read_bytes()).hexdigest() for f in files}

    # What an edited file looks like to the runner: its sha256 differs from the one recorded.
    async def tamper() -> None:
        conn = await asyncpg.connect(empty_database_url)
        try:
            await conn.execute(
                "UPDATE schema_migrations SET checksum = repeat('0', 64) WHERE name = $1", files[2]
            )
        finally:
            await conn.close()

    asyncio.run(tamper())
    r = cli("migrate", env=env)
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert files[2] in r.stderr and "changed" in r.stderr
    # `token` commands open the same database the same way: refused too.
    r = cli("token", "list", env=env)
    assert r.returncode == 3 and files[2] in r.stderr


def config_env(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    config = tmp_path / "orchestrator.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "port": 9000,
                "database_url": f"postgresql://orch:{PG_PASSWORD}@db.internal:5432/orch",
                "redis_url": f"redis://:{REDIS_PASSWORD}@cache.internal:6379/0",
                "providers": {"anthropic": {"api_key": ANTHROPIC_KEY}},
                "channel_api_base_urls": {
                    "telegram": "https://api.telegram.example/?token=tg-hunter2-secret&x=1"
                },
            }
        )
    )
    env = {
        "ORCH_DATA_DIR": str(tmp_path / "data"),
        "ORCH_PORT": "9001",  # the environment wins over the file
        "ORCH_ADMIN_TOKEN": ADMIN_SECRET,
        "ORCH_JWT_SECRET": JWT_SECRET,
        "OPENAI_API_KEY": OPENAI_KEY,
    }
    return config, env


SECRETS = (PG_PASSWORD, REDIS_PASSWORD, ADMIN_SECRET, JWT_SECRET, OPENAI_KEY, ANTHROPIC_KEY,
           "tg-hunter2-secret")  # fmt: skip


def test_config_check_prints_the_effective_settings_masked(tmp_path: Path) -> None:
    config, env = config_env(tmp_path)
    r = cli("config", "check", "--config", str(config), env=env)
    assert r.returncode == 0, r.stderr
    for secret in SECRETS:
        assert secret not in r.stdout and secret not in r.stderr
    shown = yaml.safe_load(r.stdout)
    assert shown["port"] == 9001 and shown["data_dir"] == str(tmp_path / "data")
    assert shown["database_url"] == "postgresql://orch:**********@db.internal:5432/orch"
    assert shown["redis_url"] == "redis://:**********@cache.internal:6379/0"
    assert shown["admin_token"] == shown["jwt_secret"] == "**********"
    assert shown["providers"]["openai"]["api_key"] == "**********"
    assert shown["providers"]["anthropic"]["api_key"] == "**********"
    assert shown["channel_api_base_urls"]["telegram"].endswith("token=**********&x=1")
    assert shown["jwt_jwks_url"] is None  # every setting is shown, unset ones too

    r = cli("config", "check", "--json", env={**env, "ORCH_CONFIG": str(config)})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == shown
    for secret in SECRETS:
        assert secret not in r.stdout


def test_config_check_refuses_an_invalid_config(tmp_path: Path) -> None:
    config, env = config_env(tmp_path)
    config.write_text("port: 99999\n")
    r = cli("config", "check", "--config", str(config), env={"ORCH_DATA_DIR": env["ORCH_DATA_DIR"]})
    assert r.returncode == 2
    assert r.stdout == "" and "configuration error" in r.stderr and "port" in r.stderr

    # The environment is validated the same way (a weak admin token is refused at start).
    r = cli("config", "check", env={"ORCH_ADMIN_TOKEN": "short"})
    assert r.returncode == 2 and "admin_token" in r.stderr

    r = cli("config", "check", "--config", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2 and "missing.yaml" in r.stderr
