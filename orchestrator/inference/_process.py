"""The llama-server process: which binary, its command line, spawning it in a process group
of its own, and stopping it.

Its API key is given in the environment (`LLAMA_API_KEY`, which llama-server and the bundled
launcher read like `--api-key`), not on the command line: any local user can read a
process's command line, only its owner its environment."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

__all__ = [
    "API_KEY_ENV",
    "BUNDLED_LAUNCHER",
    "build_command",
    "free_port",
    "kill_stale",
    "log_tail",
    "resolve_binary",
    "server_env",
    "spawn",
    "terminate",
]

log = logging.getLogger(__name__)

BUNDLED_LAUNCHER = "orchestrator.inference.llama_server"
API_KEY_ENV = "LLAMA_API_KEY"
_PR_SET_PDEATHSIG = 1


def resolve_binary(
    configured: str,
    *,
    which: Callable[[str], str | None] = shutil.which,
    python: str = sys.executable,
) -> list[str]:
    """The argv prefix that starts a llama-server compatible server.

    In order: the configured path when it is an executable file (a relative path is taken
    from the working directory of the process hosting the instance: under a local Ray
    cluster, where the service was started), or the configured command name found on PATH;
    then `llama-server` on PATH; then the bundled cyllama launcher, run by this Python
    (`python -m orchestrator.inference.llama_server`)."""
    is_path = os.sep in configured or (os.altsep is not None and os.altsep in configured)
    if is_path:
        path = Path(configured).expanduser().absolute()  # exec would search PATH for "x"
        if path.is_file() and os.access(path, os.X_OK):
            return [str(path)]
    elif configured and (found := which(configured)):
        return [found]
    if found := which("llama-server"):
        return [found]
    return [python, "-m", BUNDLED_LAUNCHER]


def build_command(
    binary: list[str],
    *,
    model_path: str,
    host: str,
    port: int,
    ctx_size: int,
    gpu_layers: int,
    threads: int,
    alias: str,
) -> list[str]:
    """llama-server's own flags, which the bundled launcher accepts too."""
    return [
        *binary,
        "-m",
        model_path,
        "--host",
        host,
        "--port",
        str(port),
        "--ctx-size",
        str(ctx_size),
        "--n-gpu-layers",
        str(gpu_layers),
        "--threads",
        str(threads),
        "--alias",
        alias,
    ]


def free_port(host: str) -> int:
    """A port the OS just handed out on `host` (the server binds it a moment later; a
    collision in between makes the process exit, which is reported as a failed start)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


# Loaded before any fork: nothing but a C call may run in the child before exec.
_LIBC = ctypes.CDLL(None, use_errno=True) if sys.platform == "linux" else None


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: the server gets SIGTERM when the process
    # that started it (the actor) dies, so a killed actor leaves no orphan behind. The
    # forking thread is the event loop's, which lives as long as that process.
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _open_log(path: Path) -> IO[bytes]:
    path.parent.mkdir(parents=True, exist_ok=True)
    return path.open("ab")


def server_env(api_key: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a server that requires `api_key` on every request but /health."""
    return {**(os.environ if base is None else base), API_KEY_ENV: api_key}


async def spawn(
    command: list[str], log_path: Path, env: Mapping[str, str] | None = None
) -> asyncio.subprocess.Process:
    """Start `command` in a new session (its own process group, so stopping it stops its
    children too), output appended to `log_path`, with `env` (default: this process's).
    Raises OSError when it cannot start."""
    with _open_log(log_path) as out:
        return await asyncio.create_subprocess_exec(
            *command,
            env=None if env is None else dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent if _LIBC is not None else None,
        )


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def terminate(proc: asyncio.subprocess.Process, grace_s: float = 5.0) -> int | None:
    """SIGTERM the process group, SIGKILL it after `grace_s`; return the exit code."""
    if proc.returncode is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), grace_s)
        except TimeoutError:
            _signal_group(proc.pid, signal.SIGKILL)
            await proc.wait()
    else:
        # The leader is gone; whatever it left in its group goes too.
        _signal_group(proc.pid, signal.SIGKILL)
    return proc.returncode


def kill_stale(pid: int, port: int) -> bool:
    """Kill a server an earlier incarnation of this instance left running on this node:
    only a process group led by `pid` whose command line serves `port` (a reused pid
    belongs to someone else)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    serves_port = any(
        a == b"--port" and i + 1 < len(argv) and argv[i + 1] == str(port).encode()
        for i, a in enumerate(argv)
    )
    if not serves_port:
        return False
    try:
        if os.getpgid(pid) != pid:
            return False
    except ProcessLookupError:
        return False
    _signal_group(pid, signal.SIGKILL)
    log.warning("killed a stale server (pid %s, port %s) left by an earlier actor", pid, port)
    return True


def log_tail(path: Path, limit: int = 600) -> str:
    """The end of a process log, for an error message."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - limit))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return text.strip()
