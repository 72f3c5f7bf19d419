"""Log lines an operator can ship as they are.

`log_format: json` makes every line one JSON object: `time` (ISO 8601, UTC), `level`,
`logger`, `message`, then whatever context the record carries (Serve adds the request id,
route, deployment and replica in a replica; the access line adds its request fields). The
access line is one per request, written by the app's request layers when `access_log` is on.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import re
import sys
import traceback
from collections.abc import Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal, TextIO, TypeAlias

LogFormat = Literal["text", "json"]

ACCESS_LOGGER = "orchestrator.access"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Our packages' loggers: what the service configures (and nothing of its libraries').
OUR_LOGGERS = ("orchestrator", "deployments", "actors")

# The access line's fields travel in one attribute and win over same-named context that a
# filter (Serve's request context) sets on the record later.
_ACCESS_ATTR = "orch_access"
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
# A credential that reached a message by accident (an exception quoting a header, a URL
# with a token) is masked: no log line may carry one.
_SECRETS = re.compile(
    r"(?i)(?P<lead>bearer\s+|authorization[\"':=\s]+(?:bearer\s+|basic\s+)?|x-api-key[\"':=\s]+"
    r"|[?&](?:key|api_key|access_token|token)=)[^\s\"',;&]+"
    r"|orch_[A-Za-z0-9_\-]{8,}"
    # A channel's webhook token is its receiver's credential, and it rides in the path
    # (/channels/webhook/chw_...): a 500's log line quotes that path.
    r"|chw_[A-Za-z0-9_\-]{8,}"
    # A signed decision link's token (iv-7.a.<approver>.<expiry>.<mac>) decides by itself.
    r"|iv-\d+\.[ar]\.[A-Za-z0-9_\-]*\.\d+\.[A-Za-z0-9_\-]{16,}"
)


# Substrings every match contains (lowercased): a cheap test that spares most lines the
# regular expression (8 us a message; a JSON access line costs ~15 us in all).
_MARKERS = ("bearer", "authorization", "api-key", "key=", "token=", "orch_", "chw_", "iv-")


def redact(text: str) -> str:
    """`text` with bearer tokens, Authorization/x-api-key values, our API tokens,
    channels' webhook tokens and signed decision links' tokens masked."""
    lowered = text.lower()
    if not any(marker in lowered for marker in _MARKERS):
        return text
    return _SECRETS.sub(lambda m: (m.group("lead") or "") + "[redacted]", text)


REDACTED = "***"
# Argument and header names whose values are secrets wherever they appear (a tool call's
# arguments in audit events): a word of the name (split at `_`, `-`, `.`) that is one of
# these, or a name ending in one (`accessToken`, `dbPassword`); not `author`, `max_tokens`.
_SECRET_WORDS = (
    "password|passwd|passphrase|pwd|secret|token|apikey|api_key|auth|authorization"
    "|credential|credentials|cookie|privatekey|private_key|accesskey|access_key|sessionid"
    "|session_id|signature"
)
SECRET_NAME = re.compile(
    rf"(?:^|[_\-.])(?:{_SECRET_WORDS})(?:$|[_\-.])"
    r"|(?:token|secret|password|passwd|apikey|credentials?|privatekey|accesskey)$",
    re.IGNORECASE,
)


def secret_name(name: str) -> bool:
    return SECRET_NAME.search(name.replace("-", "_")) is not None


def mask_secrets(value: Any, depth: int = 0) -> Any:
    """`value` with the value of every key named like a secret (`password`, `api_key`,
    `accessToken`, ...) replaced by `***`, at any depth: what events and logs may show of a
    tool's arguments."""
    if depth > 32:
        return REDACTED
    if isinstance(value, Mapping):
        return {
            str(k): REDACTED if secret_name(str(k)) else mask_secrets(v, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [mask_secrets(v, depth + 1) for v in value]
    return value


ExcInfo: TypeAlias = (
    tuple[type[BaseException], BaseException, TracebackType | None] | tuple[None, None, None]
)


def traceback_text(exc_info: ExcInfo) -> str:
    """The traceback as Python prints it, built without `print`: the logging module's own
    `formatException` prints into a StringIO, and in a Serve replica `print` to any file
    but stdout/stderr writes each line as a tuple repr (deployments/logs.py)."""
    return "".join(traceback.format_exception(*exc_info)).rstrip("\n")


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | float):
        return value
    return redact(str(value))


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines inside are escaped); a record's
    traceback is one string, `exc_info`."""

    def formatException(self, ei: ExcInfo) -> str:
        return traceback_text(ei)

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": redact(record.getMessage()),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key != _ACCESS_ATTR and not key.startswith("_"):
                entry[key] = _plain(value)
        access = getattr(record, _ACCESS_ATTR, None)
        if isinstance(access, dict):
            entry.update(access)
        if record.exc_info:
            entry["exc_info"] = redact(self.formatException(record.exc_info))
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str)


class RedactedText(logging.Formatter):
    """Another formatter's text (Serve's, in a replica) with secrets masked, the message's
    and the traceback's alike; the traceback is the usual multi-line one, built without
    `print`."""

    def __init__(self, inner: logging.Formatter) -> None:
        super().__init__()
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        if record.exc_info and not record.exc_text:
            # logging.Formatter.format uses a traceback already formatted as it is.
            record.exc_text = traceback_text(record.exc_info)
        return redact(self.inner.format(record))


def formatter(log_format: LogFormat) -> logging.Formatter:
    if log_format == "json":
        return JsonFormatter()
    return RedactedText(logging.Formatter(TEXT_FORMAT))


def configure_process_logs(
    log_format: LogFormat, level: str, stream: TextIO | None = None
) -> logging.Handler:
    """The root logger of this process writes `stream` (stderr) in `log_format`; our
    loggers at `level`, libraries' at WARNING (httpx logs request URLs at INFO, and some
    carry a key). What was configured before is replaced. Returns the handler."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(formatter(log_format))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    for name in OUR_LOGGERS:
        logging.getLogger(name).setLevel(level)
    access_at_info()
    # Python warnings print bare text on stderr: as records they are lines like the others.
    logging.captureWarnings(log_format == "json")
    return handler


def access_at_info() -> None:
    """Access lines are switched by `access_log`, not by `log_level`."""
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.INFO)


# HTTP client libraries log each request's URL at INFO, and a user's URL may hold a
# credential (a Telegram bot token, a token in an MCP server's or HTTP tool's query string).
URL_LOGGERS = ("httpx", "httpcore", "httpx2")


def quiet_url_loggers() -> None:
    for name in URL_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def configure_actor_logs(log_format: LogFormat, level: str) -> None:
    """In an actor's process, with json: its records go to the worker's stderr
    (logs/worker-*.err) as JSON lines. With text, Ray's defaults stay as they were. Either
    way the HTTP clients' URL lines are off."""
    quiet_url_loggers()
    if log_format == "json":
        configure_process_logs(log_format, level)


# Serve's logger in a replica: its file handler sits behind a MemoryHandler that, in
# throughput-optimized mode, writes only every 1,000 records (or on an ERROR).
SERVE_LOGGER = "ray.serve"
# How often a replica writes what Serve buffered: a quiet replica's lines are at most this
# late in its log file, while a busy one still writes in batches.
LOG_FLUSH_S = 1.0


def flush_buffered_logs() -> None:
    """Write what Serve's buffering handlers hold (called every LOG_FLUSH_S in a replica)."""
    for handler in logging.getLogger(SERVE_LOGGER).handlers:
        if isinstance(handler, logging.handlers.MemoryHandler):
            handler.flush()


def log_access(
    *,
    request_id: str,
    user: str | None,
    method: str,
    route: str,
    status: int,
    duration_ms: float,
    client_request_id: str | None = None,
    logger: logging.Logger | None = None,
) -> None:
    """The request's access line: method, route template (never the raw path, which can
    carry ids), status and duration; never a header. `client_request_id`: the client's own
    X-Request-ID, when well-formed (deployments/edge.py), never the line's request id."""
    fields = {
        "request_id": request_id,
        "client_request_id": client_request_id,
        "user": user,
        "method": method,
        "route": route,
        "status": status,
        "duration_ms": round(duration_ms, 3),
    }
    text = "%s %s %d %.1fms request_id=%s user=%s"
    args: tuple[object, ...] = (method, route, status, duration_ms, request_id, user)
    if client_request_id is not None:
        text += " client_request_id=%s"
        args += (client_request_id,)
    (logger or logging.getLogger(ACCESS_LOGGER)).info(text, *args, extra={_ACCESS_ATTR: fields})
