"""One instance's process, run: spawn it, wait for its /health, follow its /slots
(ready <-> running), report an exit or a server that stops answering as failed, stop it.
(An `InstanceRunner`, not a supervisor: the process's one `Supervisor` runs loops; this runs
a llama-server.)

Hosted by the `InferenceInstance` actor under Ray, or by `InProcessInference` without it.
Requests to the model never pass through here: clients talk to the server's port."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import asyncpg
import httpx

from orchestrator.config import Settings
from orchestrator.inference._instances import (
    LIVE_STATES,
    IllegalTransition,
    InstanceRecord,
    InstanceState,
    InstanceStore,
)
from orchestrator.inference._process import (
    build_command,
    free_port,
    kill_stale,
    log_tail,
    resolve_binary,
    server_env,
    spawn,
    terminate,
)
from orchestrator.runtime.supervisor import cancel_and_wait

__all__ = ["InstanceRunner"]

log = logging.getLogger(__name__)

HEALTH_STEP_S = 0.25
PROBE_TIMEOUT_S = 2.0
MAX_ERROR_CHARS = 1200


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


class InstanceRunner:
    def __init__(
        self, store: InstanceStore, instance_id: str, settings: Settings, host: str
    ) -> None:
        self._store = store
        self._id = instance_id
        self._settings = settings
        self._host = host
        self._record: InstanceRecord | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._task: asyncio.Task[InstanceRecord | None] | None = None
        self._slots = True  # llama-server started with --no-slots answers 501: /health only
        self.log_path: Path = settings.data_dir / "inference" / f"{instance_id}.log"

    # --- what it holds ------------------------------------------------------------------

    @property
    def instance_id(self) -> str:
        return self._id

    @property
    def record(self) -> InstanceRecord | None:
        return self._record

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def describe(self) -> str:
        r = self._record
        if r is None:
            return f"id={self._id}, loading record"
        return f"id={self._id}, model={r.model_name}, port={r.port}, state={r.state}"

    # --- running ------------------------------------------------------------------------

    def start(self) -> asyncio.Task[InstanceRecord | None]:
        """Run the instance in a task of the current loop; it ends when the instance is
        failed, or at once when its record says there is nothing to run."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"supervise-{self._id}")
        return self._task

    async def _run(self) -> InstanceRecord | None:
        record = await self._store.get(self._id)
        self._record = record
        if record is None or record.state not in LIVE_STATES:
            return record
        if record.pid is not None and record.port is not None and record.host == self._host:
            # An earlier incarnation of this actor died; its server may still be up.
            await asyncio.to_thread(kill_stale, record.pid, record.port)
        binary = resolve_binary(self._settings.inference_bin)
        try:
            port = free_port(self._host)
            command = build_command(
                binary,
                model_path=record.model_path,
                host=self._host,
                port=port,
                ctx_size=record.ctx_size,
                gpu_layers=record.gpu_layers,
                threads=record.threads,
                alias=record.model_name,
            )
            self._proc = await spawn(command, self.log_path, server_env(record.api_key))
        except OSError as exc:
            return await self._fail("model.start_failed", f"cannot start {binary[0]}: {exc}")
        log.info("%s: started %s (pid %s)", self._id, " ".join(command), self._proc.pid)
        try:
            self._record = await self._store.transition(
                self._id,
                InstanceState.STARTING,
                event="model.started",
                data={"pid": self._proc.pid, "port": port, "host": self._host},
                pid=self._proc.pid,
                port=port,
                host=self._host,
            )
        except IllegalTransition:  # stopped while it was being spawned
            await terminate(self._proc)
            self._record = await self._store.get(self._id)
            return self._record
        exited = asyncio.ensure_future(self._proc.wait())
        base = f"http://{_url_host(self._host)}:{port}"
        # Loopback and node addresses: never through a proxy from the environment. /slots
        # needs the server's key (/health does not).
        auth = {"Authorization": f"Bearer {record.api_key}"}
        async with httpx.AsyncClient(
            timeout=PROBE_TIMEOUT_S, trust_env=False, headers=auth
        ) as http:
            try:
                failed = await self._wait_healthy(http, base, exited)
                if failed is not None:
                    return failed
                tools = await self._takes_tools(http, base)
                self._record = await self._store.transition(
                    self._id,
                    InstanceState.READY,
                    event="model.ready",
                    data={"port": port, "ctx_size": record.ctx_size, "tools": tools},
                    tools=tools,
                )
                return await self._monitor(http, base, exited)
            finally:
                exited.cancel()

    async def _wait_healthy(
        self, http: httpx.AsyncClient, base: str, exited: asyncio.Future[int]
    ) -> InstanceRecord | None:
        loop = asyncio.get_running_loop()
        timeout = self._settings.inference_start_timeout_s
        deadline = loop.time() + timeout
        while True:
            if exited.done():
                return await self._fail(
                    "model.start_failed",
                    f"the server exited with code {exited.result()} while starting: "
                    f"{log_tail(self.log_path)}",
                )
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(f"{base}/health")).status_code == 200:
                    return None
            remaining = deadline - loop.time()
            if remaining <= 0:
                return await self._fail(
                    "model.start_failed",
                    f"the server's health check did not pass within {timeout:g}s: "
                    f"{log_tail(self.log_path)}",
                )
            await asyncio.wait({exited}, timeout=min(HEALTH_STEP_S, remaining))

    async def _monitor(
        self, http: httpx.AsyncClient, base: str, exited: asyncio.Future[int]
    ) -> InstanceRecord | None:
        loop = asyncio.get_running_loop()
        unanswered_since: float | None = None
        limit = self._settings.inference_health_timeout_s
        while True:
            await asyncio.wait({exited}, timeout=self._settings.inference_poll_interval_s)
            if exited.done():
                return await self._fail(
                    "model.failed",
                    f"the server exited with code {exited.result()}: {log_tail(self.log_path)}",
                )
            busy = await self._busy(http, base)
            if busy is None:
                unanswered_since = unanswered_since or loop.time()
                if loop.time() - unanswered_since >= limit:
                    return await self._fail(
                        "model.failed",
                        f"the server has not answered its health check for {limit:g}s",
                    )
                continue
            unanswered_since = None
            wanted = InstanceState.RUNNING if busy else InstanceState.READY
            if self._record is not None and wanted != self._record.state:
                # Busy and idle flips carry no event: they follow every request.
                try:
                    self._record = await self._store.transition(self._id, wanted)
                except IllegalTransition:
                    # Stopped behind our back (by the API, without reaching us): obey it.
                    if self._proc is not None:
                        await terminate(self._proc)
                    self._record = await self._store.get(self._id)
                    return self._record
                except (asyncpg.PostgresError, OSError) as exc:
                    # The database is away for a moment: the server is fine, try next tick.
                    log.warning("%s: cannot record %s: %r", self._id, wanted, exc)

    async def _takes_tools(self, http: httpx.AsyncClient, base: str) -> bool | None:
        """Whether the server takes `tools`, as llama.cpp's server tells in its /props
        (`chat_template_caps`: the model's chat template must render tool definitions and
        tool calls); None when it does not say (an older build, another server)."""
        try:
            response = await http.get(f"{base}/props")
            props = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        caps = props.get("chat_template_caps") if isinstance(props, dict) else None
        if not isinstance(caps, dict) or "supports_tools" not in caps:
            return None
        return caps.get("supports_tools") is True and caps.get("supports_tool_calls") is True

    async def _busy(self, http: httpx.AsyncClient, base: str) -> bool | None:
        """Whether the server is processing a request; None when it does not answer."""
        if self._slots:
            try:
                response = await http.get(f"{base}/slots")
            except httpx.HTTPError:
                return None
            if response.status_code == 200:
                try:
                    slots = response.json()
                except ValueError:
                    return None
                return isinstance(slots, list) and any(
                    isinstance(s, dict) and bool(s.get("is_processing")) for s in slots
                )
            if response.status_code not in (404, 501):
                return None
            self._slots = False
        try:
            response = await http.get(f"{base}/health")
        except httpx.HTTPError:
            return None
        return False if response.status_code == 200 else None

    async def _fail(self, event: str, error: str) -> InstanceRecord | None:
        error = error.strip()[:MAX_ERROR_CHARS]
        log.warning("%s failed: %s", self._id, error)
        if self._proc is not None:
            await terminate(self._proc)
        try:
            self._record = await self._store.transition(
                self._id, InstanceState.FAILED, event=event, data={"error": error}, error=error
            )
        except IllegalTransition:  # stopped in the meantime
            self._record = await self._store.get(self._id)
        return self._record

    # --- stopping -----------------------------------------------------------------------

    async def stop(self, reason: str) -> InstanceRecord | None:
        """Stop following the server, stop the server, record the instance stopped."""
        task = self._task
        if task is not None and not task.done():
            await cancel_and_wait([task])
        if self._proc is not None:
            await terminate(self._proc)
        record = await self._store.get(self._id)
        if record is not None and record.state != InstanceState.STOPPED:
            record = await self._store.transition(
                self._id, InstanceState.STOPPED, event="model.stopped", data={"reason": reason}
            )
        self._record = record
        return record
