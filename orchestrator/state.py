"""Bringing the state layer up: embedded servers when no URLs are configured, migrations,
and the admin token. Used by `orchestrator serve` and `orchestrator token`."""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from orchestrator.auth import TokenStore, generate_token
from orchestrator.config import Settings
from orchestrator.db import connect
from orchestrator.extras import require_embedded
from orchestrator.runtime import EmbeddedPostgres, EmbeddedRedis

RUNTIME_FILE = "runtime.json"
ADMIN_TOKEN_FILE = "admin_token"


@dataclass
class StateLayer:
    """The servers this process started (and so must stop) and the URLs to reach them."""

    settings: Settings
    postgres: EmbeddedPostgres | None = None
    redis: EmbeddedRedis | None = None
    owned: list[str] = field(default_factory=list)

    def start(self, progress: Callable[[str], None], *, need_redis: bool = True) -> Settings:
        """Start what is missing; return settings with `database_url`/`redis_url` filled in."""
        s = self.settings
        require_embedded(s, need_redis=need_redis)  # before anything starts
        s.data_dir.mkdir(parents=True, exist_ok=True)
        updates: dict[str, str] = {}
        if not s.database_url:
            self.postgres = EmbeddedPostgres(s.data_dir)
            was_running = self.postgres.is_running()
            progress(f"starting embedded Postgres + pgvector in {self.postgres.pgdata}")
            updates["database_url"] = self.postgres.start()
            if not was_running:
                self.owned.append("postgres")
        if need_redis and not s.redis_url:
            self.redis = EmbeddedRedis(s.data_dir)
            progress(f"starting embedded Redis in {self.redis.dir}")
            updates["redis_url"] = self.redis.start()
            self.owned.append("redis")
        self.settings = s.model_copy(update=updates)
        return self.settings

    def stop(self) -> None:
        if self.redis is not None and "redis" in self.owned:
            self.redis.stop()
        if self.postgres is not None and "postgres" in self.owned:
            self.postgres.stop()
        self.owned.clear()


def admin_token(settings: Settings) -> tuple[str, str]:
    """The admin token and where it came from: the configuration, or `<data_dir>/admin_token`
    (created with a fresh random token, mode 0600, on first start)."""
    if settings.admin_token is not None:
        return settings.admin_token.get_secret_value(), "ORCH_ADMIN_TOKEN / config admin_token"
    path = settings.data_dir / ADMIN_TOKEN_FILE
    if path.exists():
        return path.read_text().strip(), f"{path} (generated earlier)"
    token = generate_token()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token, f"{path} (generated now)"


async def prepare_database(settings: Settings, token: str | None) -> bool:
    """Apply migrations and register the admin token; return whether pgvector is on."""
    assert settings.database_url
    db = await connect(settings.database_url, min_size=1, max_size=2)
    try:
        if token:
            await TokenStore(db.pool).register_configured_admin(token)
        return db.pgvector
    finally:
        await db.close()


def write_runtime(settings: Settings, url: str, ray_address: str | None = None) -> Path:
    path = settings.data_dir / RUNTIME_FILE
    data = {
        "pid": os.getpid(),
        "url": url,
        "database_url": settings.database_url,
        "redis_url": settings.redis_url,
        "ray_address": ray_address,
    }
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    # The URLs may carry credentials: owner-only, like the admin token file.
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(data, indent=2))
    tmp.replace(path)
    return path


def read_runtime(data_dir: Path) -> dict[str, object] | None:
    path = data_dir / RUNTIME_FILE
    try:
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    except (OSError, ValueError):
        return None


def clear_runtime(settings: Settings) -> None:
    (settings.data_dir / RUNTIME_FILE).unlink(missing_ok=True)


class DataDirInUse(RuntimeError):
    """Another service already runs on this data directory."""


class DataDirLock:
    """An exclusive lock on `<data_dir>/service.lock`, held while a service runs: two
    services on one data directory would fight over its embedded Postgres and Redis."""

    def __init__(self, data_dir: Path) -> None:
        self._path = data_dir / "service.lock"
        self._fh: IO[str] | None = None

    def acquire(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        fh = self._path.open("a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "unknown"
            fh.close()
            raise DataDirInUse(
                f"another service (pid {holder}) is running on {self._path.parent}"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None
