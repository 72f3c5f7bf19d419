"""The MCP client pool (orchestrator/tools/_mcp.py) against a real MCP server built with the
official SDK (tests/fakes/mcp_server.py), over streamable HTTP in a subprocess it can kill and
restart on the same port, and over stdio as the pool's own child. No database."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.config import Settings
from orchestrator.tools import _mcp
from orchestrator.tools._mcp import IDLE_CLOSE_S, McpPool, McpUnavailable
from orchestrator.tools._model import CallOutcome, McpServer
from tests.fakes.mcp_server import ROOT, McpServerProcess

TOOLS = {"echo", "add", "fail", "slow", "whoami"}


def _settings(tmp_path: Path, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "data_dir": tmp_path / "data",
        "outbound_allowed_cidrs": ["127.0.0.0/8"],
        "mcp_stdio_commands": [sys.executable],
    }
    values.update(overrides)
    return Settings.load(environ={}, **values)


@contextlib.asynccontextmanager
async def _pool(settings: Settings) -> AsyncIterator[McpPool]:
    pool = McpPool(settings)
    try:
        yield pool
    finally:
        await pool.aclose()


@pytest.fixture
async def pool(tmp_path: Path) -> AsyncIterator[McpPool]:
    async with _pool(_settings(tmp_path)) as p:
        yield p


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[McpServerProcess]:
    """One server (both protocol eras, as the SDK serves) for the tests that do not stop it."""
    record = tmp_path_factory.mktemp("mcp") / "calls.jsonl"
    with McpServerProcess(record=record) as server:
        yield server


def _http(proc: McpServerProcess, headers: dict[str, str] | None = None, **kw: Any) -> McpServer:
    values: dict[str, Any] = {"id": "mcp-1", "owner": "u-1", "name": "fake"}
    values.update(kw)
    return McpServer(transport="streamable_http", url=proc.url, headers=headers or {}, **values)


def _stdio(record: Path | None = None, **kw: Any) -> McpServer:
    args = ["-m", "tests.fakes.mcp_server", "--stdio"]
    if record is not None:
        args += ["--record", str(record)]
    values: dict[str, Any] = {"id": "mcp-7", "owner": "u-1", "name": "local", "args": tuple(args)}
    values.update(kw)
    return McpServer(
        transport="stdio",
        command=sys.executable,
        env={"PYTHONPATH": str(ROOT)},  # the child finds `tests` wherever pytest runs
        **values,
    )


async def _until(predicate: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def _pid(pool: McpPool, server: McpServer) -> int:
    outcome = await pool.call(server, "whoami", {})
    assert not outcome.is_error, outcome.text
    return int(json.loads(outcome.text)["pid"])


async def test_list_tools_gives_every_tool_with_its_input_schema(
    pool: McpPool, shared: McpServerProcess
) -> None:
    tools = {t.name: t for t in await pool.list_tools(_http(shared))}
    assert set(tools) == TOOLS
    echo = tools["echo"].input_schema
    assert echo["type"] == "object" and echo["required"] == ["text"]
    assert echo["properties"]["text"]["type"] == "string"
    add = tools["add"].input_schema
    assert {k: v["type"] for k, v in add["properties"].items()} == {"a": "integer", "b": "integer"}
    assert tools["slow"].input_schema["properties"]["seconds"]["type"] == "number"
    assert tools["echo"].description == "Returns the text."


async def test_a_call_gives_the_text_and_the_server_got_exactly_the_arguments(
    pool: McpPool, shared: McpServerProcess
) -> None:
    text = f"hello {uuid.uuid4().hex} ünïcödé"
    assert await pool.call(_http(shared), "echo", {"text": text}) == CallOutcome(text)
    assert [c["arguments"] for c in shared.calls() if c["arguments"].get("text") == text] == [
        {"text": text}
    ]
    assert await pool.call(_http(shared), "add", {"a": 2, "b": 40}) == CallOutcome("42")


async def test_an_is_error_result_is_an_error_outcome(
    pool: McpPool, shared: McpServerProcess
) -> None:
    outcome = await pool.call(_http(shared), "fail", {"message": "the disk is full"})
    assert outcome.is_error and "the disk is full" in outcome.text


async def test_a_call_past_its_timeout_is_an_error_outcome_at_the_timeout(
    pool: McpPool, shared: McpServerProcess
) -> None:
    server = _http(shared)
    await pool.list_tools(server)  # connected: the timeout measures the call alone
    started = time.monotonic()
    outcome = await pool.call(server, "slow", {"seconds": 5}, timeout=1)
    elapsed = time.monotonic() - started
    assert outcome == CallOutcome("error: MCP server 'fake' did not answer within 1s", True)
    assert 0.9 <= elapsed < 2.5, elapsed
    assert [c for c in shared.calls() if c["arguments"] == {"seconds": 5}] == [
        {"tool": "slow", "arguments": {"seconds": 5}, "pid": shared.calls()[0]["pid"]}
    ]  # sent once: a timeout is not retried


async def test_calls_to_one_server_run_concurrently(
    pool: McpPool, shared: McpServerProcess
) -> None:
    server = _http(shared)
    slow = asyncio.create_task(pool.call(server, "slow", {"seconds": 3}))
    await _until(lambda: any(c["tool"] == "slow" for c in shared.calls()))
    echoes = await asyncio.gather(*(pool.call(server, "echo", {"text": f"{i}"}) for i in range(8)))
    assert [o.text for o in echoes] == [f"{i}" for i in range(8)]
    assert not slow.done()  # the echoes did not wait for it
    assert await slow == CallOutcome("slept 3.0s")


async def test_a_long_result_is_cut_at_the_limit_on_a_character_boundary(
    tmp_path: Path, shared: McpServerProcess
) -> None:
    async with _pool(_settings(tmp_path, tool_result_max_bytes=1024)) as pool:
        text = "é" * 3000  # 6000 bytes, two per character
        outcome = await pool.call(_http(shared), "echo", {"text": text})
    assert not outcome.is_error
    assert len(outcome.text.encode()) <= 1024
    head, note = outcome.text.split("\n", 1)
    assert head == "é" * len(head) and len(head) > 400
    assert note == f"[... {6000 - 2 * len(head)} more bytes cut (tool_result_max_bytes)]"


@pytest.mark.parametrize("legacy", [True, False], ids=["2025-era", "both-eras"])
async def test_a_server_killed_mid_call_then_restarted(
    pool: McpPool, tmp_path: Path, legacy: bool
) -> None:
    with McpServerProcess(record=tmp_path / "calls.jsonl", legacy=legacy) as proc:
        server = _http(proc)
        assert await pool.call(server, "echo", {"text": "warm"}) == CallOutcome("warm")
        call = asyncio.create_task(pool.call(server, "slow", {"seconds": 30}))
        await _until(lambda: any(c["tool"] == "slow" for c in proc.calls()))
        proc.kill()
        outcome = await asyncio.wait_for(call, 10)
        assert outcome.is_error and "closed the connection" in outcome.text, outcome
        # down: an error outcome naming the failure, not an exception
        down = await pool.call(server, "echo", {"text": "down"})
        assert down.is_error and "cannot connect" in down.text, down
        await asyncio.to_thread(proc.start)
        assert await pool.call(server, "echo", {"text": "back"}) == CallOutcome("back")
        # the slow call was not sent again; nothing reached the server while it was down
        assert [c["tool"] for c in proc.calls()] == ["echo", "slow", "echo"]


@pytest.mark.parametrize("legacy", [True, False], ids=["2025-era", "both-eras"])
async def test_a_restarted_server_is_reconnected_to_by_the_same_pool(
    pool: McpPool, tmp_path: Path, legacy: bool
) -> None:
    """A 2025-era server forgets its sessions: the next call meets 404 for its session id,
    which says the call did not run; the pool opens a new session and sends it once more."""
    with McpServerProcess(record=tmp_path / "calls.jsonl", legacy=legacy) as proc:
        server = _http(proc)
        assert await pool.call(server, "echo", {"text": "one"}) == CallOutcome("one")
        before = proc.calls()[-1]["pid"]
        await asyncio.to_thread(proc.restart)
        assert await pool.call(server, "echo", {"text": "two"}) == CallOutcome("two")
        calls = proc.calls()
        assert [(c["arguments"], c["pid"] != before) for c in calls] == [
            ({"text": "one"}, False),
            ({"text": "two"}, True),  # once, by the new process
        ]
        assert {t.name for t in await pool.list_tools(server)} == TOOLS


async def test_headers_go_with_every_request_and_a_missing_one_is_refused(
    pool: McpPool, tmp_path: Path
) -> None:
    token = f"Bearer right-{uuid.uuid4().hex}"
    with McpServerProcess(require_header=("authorization", token)) as proc:
        good = _http(proc, {"Authorization": token})
        assert {t.name for t in await pool.list_tools(good)} == TOOLS
        seen = json.loads((await pool.call(good, "whoami", {})).text)
        assert seen["required"] == {"authorization": "matched"}
        with pytest.raises(McpUnavailable, match="401") as missing:
            await pool.list_tools(_http(proc, id="mcp-2"))
        assert "fake" in str(missing.value)
        wrong = f"Bearer wrong-{uuid.uuid4().hex}"
        with pytest.raises(McpUnavailable, match="401") as refused:
            await pool.list_tools(_http(proc, {"Authorization": wrong}, id="mcp-3"))
        assert wrong.split()[1] not in str(refused.value)
        outcome = await pool.call(_http(proc, id="mcp-4"), "echo", {"text": "x"})
        assert outcome.is_error and "401" in outcome.text


async def test_a_private_destination_is_refused_unless_allowed(
    tmp_path: Path, shared: McpServerProcess
) -> None:
    async with _pool(_settings(tmp_path, outbound_allowed_cidrs=[])) as pool:
        with pytest.raises(McpUnavailable, match="not allowed") as refused:
            await pool.list_tools(_http(shared))
        assert f"127.0.0.1:{shared.port}" in str(refused.value)
        outcome = await pool.call(_http(shared), "echo", {"text": "x"})
        assert outcome.is_error and "not allowed" in outcome.text


async def test_a_server_that_never_answers_is_unavailable_after_the_connect_timeout(
    tmp_path: Path,
) -> None:
    held: list[asyncio.StreamWriter] = []

    async def mute(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, never answered

    listener = await asyncio.start_server(mute, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    server = McpServer(
        id="mcp-9",
        owner="u-1",
        name="mute",
        transport="streamable_http",
        url=f"http://127.0.0.1:{port}/mcp",
    )
    try:
        async with _pool(_settings(tmp_path, mcp_connect_timeout_s=1)) as pool:
            started = time.monotonic()
            with pytest.raises(McpUnavailable, match="did not answer within 1s"):
                await pool.list_tools(server)
            assert time.monotonic() - started < 3
    finally:
        for writer in held:
            writer.close()
        listener.close()
        await listener.wait_closed()


async def test_stdio_server_of_an_allowed_command(pool: McpPool, tmp_path: Path) -> None:
    record = tmp_path / "stdio.jsonl"
    server = _stdio(record)
    assert {t.name for t in await pool.list_tools(server)} == TOOLS
    assert await pool.call(server, "echo", {"text": "over stdio"}) == CallOutcome("over stdio")
    lines = [json.loads(x) for x in record.read_text().splitlines()]
    assert [(c["tool"], c["arguments"]) for c in lines] == [("echo", {"text": "over stdio"})]
    outcome = await pool.call(server, "fail", {"message": "nope"})
    assert outcome.is_error and "nope" in outcome.text


async def test_a_slow_start_is_not_counted_against_the_call_timeout(pool: McpPool) -> None:
    """`mcp_call_timeout_s` bounds the call; a stdio command that takes longer than that to
    start (a loaded machine, a heavy import) has `mcp_connect_timeout_s` for its start."""
    late = (
        "import runpy, sys, time; time.sleep(1.5); sys.argv = ['mcp_server', '--stdio'];"
        " runpy.run_module('tests.fakes.mcp_server', run_name='__main__')"
    )
    server = _stdio(id="mcp-late", args=("-c", late))
    started = time.monotonic()
    outcome = await pool.call(server, "echo", {"text": "late but fine"}, timeout=1)
    assert outcome == CallOutcome("late but fine")
    assert time.monotonic() - started >= 1.5  # the start itself took longer than the call's 1 s


async def test_stdio_command_not_listed_is_refused(tmp_path: Path) -> None:
    async with _pool(_settings(tmp_path, mcp_stdio_commands=["/usr/bin/true"])) as pool:
        with pytest.raises(McpUnavailable, match="not allowed"):
            await pool.list_tools(_stdio())
        outcome = await pool.call(_stdio(), "echo", {"text": "x"})
        assert outcome.is_error and "not allowed" in outcome.text


async def test_stdio_child_lifecycle(tmp_path: Path) -> None:
    """A child that died is replaced on the next call; a newer version of the server's
    settings replaces the older one's child; aclose ends the last."""
    async with _pool(_settings(tmp_path)) as pool:
        first = await _pid(pool, _stdio())
        os.kill(first, signal.SIGKILL)
        await _until(lambda: not _alive(first))
        second = await _pid(pool, _stdio())
        assert second != first
        third = await _pid(pool, _stdio(version=2))
        assert third != second
        await _until(lambda: not _alive(second))  # the older version's child is ended
        assert _alive(third)
    assert not _alive(third)


async def test_a_forgotten_or_idle_server_loses_its_session(tmp_path: Path) -> None:
    """`forget` (the server was deleted) ends its stdio child at once; a session unused for
    IDLE_CLOSE_S is closed the next time the pool is used for any server."""
    async with _pool(_settings(tmp_path)) as pool:
        child = await _pid(pool, _stdio())
        pool.forget(_stdio().id)
        await _until(lambda: not _alive(child), within=15)
        again = await _pid(pool, _stdio())
        for conn in pool._conns.values():
            conn.used -= IDLE_CLOSE_S + 3600  # last used long ago
        await _pid(pool, _stdio(id="mcp-8"))
        await _until(lambda: not _alive(again), within=15)


async def test_idle_sessions_are_reaped_without_another_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweeper closes a session idle past IDLE_CLOSE_S though the pool is not used
    again (a worker whose tasks stopped calling a server keeps no child for it)."""
    monkeypatch.setattr(_mcp, "SWEEP_S", 0.1)
    async with _pool(_settings(tmp_path)) as pool:
        child = await _pid(pool, _stdio())
        await asyncio.sleep(0.3)  # swept a few times: a recent session stays
        assert _alive(child) and len(pool._conns) == 1
        for conn in pool._conns.values():
            conn.used -= IDLE_CLOSE_S + 3600  # last used long ago
        await _until(lambda: not _alive(child), within=15)  # no call, no listing since
        assert pool._conns == {}
        # A new session starts the sweeper again.
        again = await _pid(pool, _stdio())
        for conn in pool._conns.values():
            conn.used -= IDLE_CLOSE_S + 3600
        await _until(lambda: not _alive(again), within=15)


async def test_a_listing_that_keeps_nothing(pool: McpPool, tmp_path: Path) -> None:
    """`keep=False` (the API's registrations and refreshes): the listing's session is closed
    right after it, its stdio child ends, and a pooled session of the server is untouched."""
    record = tmp_path / "stdio.jsonl"
    server = _stdio(record)
    pooled = await _pid(pool, server)
    before = set(_children())
    assert {t.name for t in await pool.list_tools(server, keep=False)} == TOOLS
    await _until(lambda: set(_children()) == before, within=15)  # its own child has ended
    assert _alive(pooled) and list(pool._conns) == [(server.id, server.version)]
    assert await pool.call(server, "echo", {"text": "still"}) == CallOutcome("still")
    with pytest.raises(McpUnavailable, match="not allowed"):
        await pool.list_tools(dataclasses.replace(server, command="/bin/sh"), keep=False)


def _children() -> list[int]:
    """This process's live child processes (Linux /proc)."""
    me = str(os.getpid())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            found.append(int(entry.name))
    return found


async def test_a_stdio_childs_stderr_is_not_the_workers(
    pool: McpPool, capfd: pytest.CaptureFixture[str]
) -> None:
    """A server that prints its environment (a token set for it) to stderr: none of it
    reaches the worker's stderr, which ends in its logs. The child's fd 2 is looked at too:
    pytest's own capture may hold what the SDK's default (the stderr of import time) got."""
    secret = f"env-secret-{uuid.uuid4().hex}"
    script = (
        "import os, sys\n"
        "sys.stderr.write('starting with ' + repr(dict(os.environ)) + '\\n')\n"
        "sys.stderr.flush()\n"
        "from tests.fakes.mcp_server import main\n"
        "main(['--stdio'])\n"
    )
    server = McpServer(
        id="mcp-11",
        owner="u-1",
        name="chatty",
        transport="stdio",
        command=sys.executable,
        args=("-c", script),
        env={"PYTHONPATH": str(ROOT), "API_TOKEN": secret},
    )
    child = await _pid(pool, server)
    assert os.readlink(f"/proc/{child}/fd/2") == os.devnull
    assert await pool.call(server, "echo", {"text": "hi"}) == CallOutcome("hi")
    await pool.aclose()  # the child has ended: all it wrote has been written
    captured = capfd.readouterr()
    assert secret not in captured.err and secret not in captured.out


async def test_header_values_never_reach_the_logs(
    pool: McpPool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = f"sekrit-{uuid.uuid4().hex}"
    with McpServerProcess(require_header=("x-api-key", secret), legacy=True) as proc:
        server = _http(proc, {"X-Api-Key": secret, "Authorization": f"Bearer {secret}"})
        with contextlib.ExitStack() as stack:
            for name in ("mcp", "httpx2", "httpcore2", "orchestrator"):
                stack.enter_context(caplog.at_level(logging.DEBUG, logger=name))
            await pool.list_tools(server)
            assert await pool.call(server, "echo", {"text": "hi"}) == CallOutcome("hi")
            await asyncio.to_thread(proc.restart)  # reconnecting logs too
            assert await pool.call(server, "echo", {"text": "again"}) == CallOutcome("again")
    names = {r.name.split(".")[0] for r in caplog.records}
    assert {"mcp", "httpx2", "httpcore2"} <= names  # the SDK did log, at DEBUG
    for record in caplog.records:
        assert secret not in record.getMessage(), record.name
    assert secret not in caplog.text
