"""Shared fixtures: a real embedded Postgres (pgvector) and Redis for the whole session, a
fresh database per test that asks for one (a copy of a migrated template; an empty one for
the tests of migrations), and the real app served over loopback HTTP."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
import uvicorn

from orchestrator.config import Settings
from orchestrator.runtime import EmbeddedPostgres, EmbeddedRedis
from orchestrator.runtime.backoff import Backoff
from orchestrator.runtime.supervisor import Supervisor
from tests.fakes._sockets import bound_socket


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Collect what the session left for the garbage collector while its ResourceWarnings
    are ignored. A leak during a test still fails that test (filterwarnings: error); what
    only the final collection finds belongs to no test, and pytest would report it as an
    error of the whole run: seen once in a full run, three asyncio Redis connections of the
    session's Redis collected after their event loop had closed (not reproduced by any
    module alone). First of the session's finishers: another plugin's (schemathesis imports
    a module there) can set off the collection, and a session's fake upstream's socket
    found then crashed the run (tests/e2e's shared service, its fakes' last connections)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


C = TypeVar("C", bound=Any)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def pg_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = EmbeddedPostgres(tmp_path_factory.mktemp("pg"))
    uri = server.start()
    yield uri
    server.stop()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedRedis]:
    server = EmbeddedRedis(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: EmbeddedRedis) -> str:
    return redis_server.uri()


def with_database(uri: str, name: str) -> str:
    parts = urlsplit(uri)
    return urlunsplit(parts._replace(path=f"/{name}"))


MIGRATED = "t_migrated"  # the session's template: every migration applied, pgvector on


@pytest.fixture(scope="session")
def migrated_template(pg_uri: str) -> str:
    """A database with the schema as the service leaves it on its first start (migrations,
    pgvector), copied for each test: a copy costs ~0.1 s where migrating a new database
    costs ~0.19 s, over a thousand tests."""
    from orchestrator.db import connect

    async def build() -> None:
        conn = await asyncpg.connect(pg_uri)
        try:
            await conn.execute(f'CREATE DATABASE "{MIGRATED}"')
        finally:
            await conn.close()
        db = await connect(with_database(pg_uri, MIGRATED))
        await db.close()  # a template takes no connections while it is copied

    asyncio.run(build())
    return MIGRATED


async def _fresh_database(pg_uri: str, template: str | None) -> AsyncIterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    conn = await asyncpg.connect(pg_uri)
    try:
        copy = f' TEMPLATE "{template}"' if template else ""
        await conn.execute(f'CREATE DATABASE "{name}"{copy}')
    finally:
        await conn.close()
    yield with_database(pg_uri, name)
    conn = await asyncpg.connect(pg_uri)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


@pytest.fixture
async def database_url(pg_uri: str, migrated_template: str) -> AsyncIterator[str]:
    """A database of its own on the session's server, migrated (what the service's start
    does to a new database; a start against it applies nothing)."""
    async for url in _fresh_database(pg_uri, migrated_template):
        yield url


@pytest.fixture
async def empty_database_url(pg_uri: str) -> AsyncIterator[str]:
    """A new, empty database: for the tests of migrations themselves."""
    async for url in _fresh_database(pg_uri, None):
        yield url


class ServedApp:
    """`deployments.api.create_app` under uvicorn on a loopback port, in a thread."""

    def __init__(self, settings: Settings, app: Any = None) -> None:
        from deployments.api import create_app

        # Listening before uvicorn starts (no free-port race with another server).
        self._socket = bound_socket()
        self.port = int(self._socket.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._clients: list[Any] = []
        config = uvicorn.Config(
            create_app(settings) if app is None else app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._socket]}, daemon=True
        )

    def track(self, client: C) -> C:
        """A sync SDK client (openai, anthropic, httpx) closed when the app stops: left to
        the garbage collector, its pooled sockets are reported unclosed in a later test."""
        self._clients.append(client)
        return client

    async def __aenter__(self) -> ServedApp:
        self.thread.start()
        # Generous: on a loaded 2-core machine migrations and the first connections can take
        # several seconds (a timeout here would drop the database under a starting app).
        for _ in range(3000):
            if self.server.started:
                return self
            if not self.thread.is_alive():
                self._socket.close()
                raise RuntimeError("the app failed to start")
            await asyncio.sleep(0.02)
        await self.__aexit__()
        raise RuntimeError("the app did not start in time")

    async def __aexit__(self, *exc: object) -> None:
        for client in self._clients:
            client.close()
        self.server.should_exit = True
        await asyncio.to_thread(self.thread.join, 10)
        self._socket.close()


ADMIN_TOKEN = "orch_test-admin-token-0123456789abcdef"


async def empty_redis(redis_url: str) -> None:
    """Empty the session's Redis: rate-limit windows and the failed-auth throttle of an
    earlier test (all tests send from 127.0.0.1) do not leak into the next."""
    import redis.asyncio as aioredis

    client = aioredis.from_url(redis_url)
    await client.flushdb()
    await client.aclose()


@pytest.fixture
async def clean_redis(redis_url: str) -> str:
    """The session's Redis, emptied (for module-scoped services: `empty_redis`)."""
    await empty_redis(redis_url)
    return redis_url


def make_supervisor(owner: str = "test") -> Supervisor:
    """A process's supervisor for a test (components take one), restarting fast."""
    return Supervisor(owner, backoff=Backoff(base=0.05, cap=0.5))


@pytest.fixture
async def supervisor() -> AsyncIterator[Supervisor]:
    """The test's process supervisor, closed (its tasks cancelled) after the test."""
    sup = make_supervisor()
    yield sup
    await sup.aclose()


@pytest.fixture
def make_settings(database_url: str, clean_redis: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    redis_url = clean_redis

    def make(**overrides: object) -> Settings:
        values: dict[str, object] = {
            "database_url": database_url,
            "redis_url": redis_url,
            "data_dir": tmp_path / "data",
            "admin_token": ADMIN_TOKEN,
        }
        values.update(overrides)
        return Settings.load(environ={}, **values)

    return make
