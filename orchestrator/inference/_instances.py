"""Inference instances: the state machine, the table that holds them, and the cheap query
the gateway uses to find serving instances.

A state change and the `model.*` event it causes commit in one transaction. The moves:

    stopped -> starting          POST /inference (a record is born stopped and starts at once)
    starting -> starting         the process was (re)spawned: pid, port, host recorded
    starting -> ready            its /health passed
    ready <-> running            its /slots says a request is (not) being processed
    ready, running -> starting   the actor hosting it was restarted and respawns the process
    starting, ready, running -> failed   the process exited, or health timed out
    any but stopped -> stopped   POST /stop, /stop-all
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import asyncpg

from orchestrator.errors import Conflict
from orchestrator.events import EventStore, NewEvent

__all__ = [
    "LIVE_STATES",
    "SERVING_STATES",
    "TRANSITIONS",
    "IllegalTransition",
    "InstanceRecord",
    "InstanceState",
    "InstanceStore",
    "LocalEndpoint",
    "check_transition",
    "ready_endpoints",
]


class InstanceState(StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    RUNNING = "running"
    FAILED = "failed"


S = InstanceState
TRANSITIONS: Mapping[InstanceState, frozenset[InstanceState]] = {
    S.STOPPED: frozenset({S.STARTING}),
    S.STARTING: frozenset({S.STARTING, S.READY, S.FAILED, S.STOPPED}),
    S.READY: frozenset({S.RUNNING, S.STARTING, S.FAILED, S.STOPPED}),
    S.RUNNING: frozenset({S.READY, S.STARTING, S.FAILED, S.STOPPED}),
    S.FAILED: frozenset({S.STOPPED}),
}
LIVE_STATES = frozenset({S.STARTING, S.READY, S.RUNNING})
SERVING_STATES = frozenset({S.READY, S.RUNNING})


class IllegalTransition(Conflict):
    """The instance cannot move from its current state to the one asked for."""


def check_transition(current: InstanceState, new: InstanceState) -> None:
    """The one place that decides whether a move is allowed."""
    if new not in TRANSITIONS[current]:
        raise IllegalTransition(f"an instance cannot move from {current} to {new}")


def _now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class InstanceRecord:
    id: str
    model_name: str
    model_path: str
    state: InstanceState
    ctx_size: int
    gpu_layers: int
    threads: int
    user_uuid: str
    host: str | None
    port: int | None
    pid: int | None
    error: str | None
    created_at: int
    updated_at: int
    # The key its server requires (see `new_api_key`); never in `wire()`, logs or events.
    api_key: str = field(default="", repr=False)
    # Whether its server takes `tools` (its /props says; None: it did not say).
    tools: bool | None = None

    @property
    def base_url(self) -> str | None:
        """The OpenAI-compatible root of its server (`.../v1`), once it has a port."""
        if self.host is None or self.port is None:
            return None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def wire(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model_name,
            "state": str(self.state),
            "base_url": self.base_url if self.state in SERVING_STATES else None,
            "host": self.host,
            "port": self.port,
            "pid": self.pid,
            "ctx_size": self.ctx_size,
            "gpu_layers": self.gpu_layers,
            "threads": self.threads,
            "user_uuid": self.user_uuid,
            "error": self.error,
            "tools": self.tools,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


def _record(row: asyncpg.Record) -> InstanceRecord:
    return InstanceRecord(
        id=row["id"],
        model_name=row["model_name"],
        model_path=row["model_path"],
        state=InstanceState(row["state"]),
        ctx_size=row["ctx_size"],
        gpu_layers=row["gpu_layers"],
        threads=row["threads"],
        user_uuid=row["user_uuid"],
        host=row["host"],
        port=row["port"],
        pid=row["pid"],
        error=row["error"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        api_key=row["api_key"],
        tools=row["tools"],
    )


@dataclass(frozen=True, slots=True)
class LocalEndpoint:
    """A serving local instance, as the gateway routes to it."""

    id: str
    model: str
    base_url: str
    ctx_size: int
    state: str
    api_key: str = field(default="", repr=False)  # sent as `Authorization: Bearer`
    tools: bool | None = None  # whether its server takes tools (None: it did not say)


def new_api_key() -> str:
    """A random key for one instance's server: only the service, which reads it from the
    instance's row, can reach the server's port (a user who learns the port cannot)."""
    return secrets.token_urlsafe(32)


async def ready_endpoints(pool: asyncpg.Pool) -> list[LocalEndpoint]:
    """Instances that are ready or running (one query on a partial index)."""
    rows = await pool.fetch(
        """SELECT id, model_name, host, port, ctx_size, state, api_key, tools
           FROM inference_instances
           WHERE state IN ('ready', 'running') AND host IS NOT NULL AND port IS NOT NULL
           ORDER BY created_at, id"""
    )
    out = []
    for row in rows:
        host = f"[{row['host']}]" if ":" in row["host"] else row["host"]
        out.append(
            LocalEndpoint(
                id=row["id"],
                model=row["model_name"],
                base_url=f"http://{host}:{row['port']}/v1",
                ctx_size=row["ctx_size"],
                state=row["state"],
                api_key=row["api_key"],
                tools=row["tools"],
            )
        )
    return out


class InstanceStore:
    """Every SQL statement on `inference_instances`."""

    def __init__(self, events: EventStore) -> None:
        self._events = events

    @property
    def pool(self) -> asyncpg.Pool:
        return self._events.pool

    async def create(
        self,
        *,
        model_name: str,
        model_path: str,
        ctx_size: int,
        gpu_layers: int,
        threads: int,
        user_uuid: str,
    ) -> InstanceRecord:
        """A new instance, moved from its birth state (stopped) to starting, with its
        `model.prepared` event."""
        check_transition(S.STOPPED, S.STARTING)
        now = _now_ms()
        async with self._events.transaction() as tx:
            row = await tx.conn.fetchrow(
                """INSERT INTO inference_instances
                       (id, model_name, model_path, state, ctx_size, gpu_layers, threads,
                        user_uuid, created_at, updated_at, api_key)
                   VALUES ('inf-' || nextval('inference_instance_seq'), $1, $2, 'starting',
                           $3, $4, $5, $6, $7, $7, $8)
                   RETURNING *""",
                model_name,
                model_path,
                ctx_size,
                gpu_layers,
                threads,
                user_uuid,
                now,
                new_api_key(),
            )
            record = _record(row)
            await tx.append(
                [
                    NewEvent(
                        "model.prepared",
                        {
                            "model_name": model_name,
                            "provider": "local",
                            "path": model_path,
                            "instance_id": record.id,
                            "ctx_size": ctx_size,
                            "gpu_layers": gpu_layers,
                            "threads": threads,
                        },
                        user_uuid=user_uuid,
                    )
                ]
            )
        return record

    async def get(self, instance_id: str) -> InstanceRecord | None:
        row = await self.pool.fetchrow(
            "SELECT * FROM inference_instances WHERE id = $1", instance_id
        )
        return _record(row) if row is not None else None

    async def records(
        self, user_uuid: str | None = None, *, include_stopped: bool = True
    ) -> list[InstanceRecord]:
        """Instances of one user (None: everyone's), oldest first."""
        rows = await self.pool.fetch(
            """SELECT * FROM inference_instances
               WHERE ($1::text IS NULL OR user_uuid = $1) AND ($2 OR state <> 'stopped')
               ORDER BY created_at, id""",
            user_uuid,
            include_stopped,
        )
        return [_record(r) for r in rows]

    async def model_states(self) -> dict[str, tuple[str, int]]:
        """Per model name: the state that sums up its instances (loaded, loading, error) and
        the context size of the instance behind it. Models with only stopped instances (or
        none) are absent."""
        rows = await self.pool.fetch(
            """SELECT model_name,
                      bool_or(state IN ('ready', 'running')) AS loaded,
                      bool_or(state = 'starting') AS loading,
                      max(ctx_size) FILTER (WHERE state IN ('ready', 'running')) AS loaded_ctx,
                      max(ctx_size) FILTER (WHERE state = 'starting') AS loading_ctx,
                      (array_agg(state ORDER BY created_at DESC))[1] AS latest,
                      (array_agg(ctx_size ORDER BY created_at DESC))[1] AS latest_ctx
               FROM inference_instances GROUP BY model_name"""
        )
        out: dict[str, tuple[str, int]] = {}
        for r in rows:
            if r["loaded"]:
                out[r["model_name"]] = ("loaded", r["loaded_ctx"])
            elif r["loading"]:
                out[r["model_name"]] = ("loading", r["loading_ctx"])
            elif r["latest"] == S.FAILED:
                out[r["model_name"]] = ("error", r["latest_ctx"])
        return out

    async def transition(
        self,
        instance_id: str,
        new: InstanceState,
        *,
        event: str | None = None,
        data: Mapping[str, Any] | None = None,
        pid: int | None = None,
        port: int | None = None,
        host: str | None = None,
        error: str | None = None,
        tools: bool | None = None,
    ) -> InstanceRecord:
        """Move an instance (checked against TRANSITIONS under a row lock) and append its
        event, in one transaction. `pid`, `port`, `host`, `tools` are recorded when given;
        `error` is recorded on failed and cleared when the instance starts again (and so is
        `tools`: the server started again may be another binary)."""
        async with self._events.transaction() as tx:
            row = await tx.conn.fetchrow(
                "SELECT * FROM inference_instances WHERE id = $1 FOR UPDATE", instance_id
            )
            if row is None:
                raise IllegalTransition(f"no instance {instance_id!r}")
            current = _record(row)
            check_transition(current.state, new)
            row = await tx.conn.fetchrow(
                """UPDATE inference_instances SET
                       state = $2,
                       pid = coalesce($3, pid),
                       port = coalesce($4, port),
                       host = coalesce($5, host),
                       error = CASE WHEN $2 = 'starting' THEN NULL ELSE coalesce($6, error) END,
                       tools = CASE WHEN $2 = 'starting' THEN NULL ELSE coalesce($8, tools) END,
                       updated_at = $7
                   WHERE id = $1 RETURNING *""",
                instance_id,
                str(new),
                pid,
                port,
                host,
                error,
                _now_ms(),
                tools,
            )
            record = _record(row)
            if event is not None:
                payload = {
                    "model_name": record.model_name,
                    "provider": "local",
                    "instance_id": record.id,
                    **(data or {}),
                }
                await tx.append([NewEvent(event, payload, user_uuid=record.user_uuid)])
        return record
