"""Where and how the service's processes on the cluster log: Serve's replicas write Serve's
log files (logs/serve/replica_*.log), actors their worker's stderr; with `log_format: json`
both, and Serve's own controller and proxy logs, are one JSON object per line."""

from __future__ import annotations

import builtins
import logging
import sys
import types
from typing import IO, Any

from ray.serve.schema import EncodingType, LoggingConfig

from orchestrator.config import Settings
from orchestrator.observability import (
    OUR_LOGGERS,
    JsonFormatter,
    RedactedText,
    access_at_info,
    quiet_url_loggers,
)

SERVE_LOGGER = "ray.serve"


def serve_logging_config(settings: Settings) -> LoggingConfig:
    """Serve's logging for the application, its deployments, its controller and proxies.
    Serve's own access line stays off: ours (deployments/layers/records.py, `access_log`)
    names the user and the route template, and a request gets one line, not two."""
    encoding = EncodingType.JSON if settings.log_format == "json" else EncodingType.TEXT
    return LoggingConfig(encoding=encoding, log_level=settings.log_level, enable_access_log=False)


def log_like_serve(settings: Settings) -> None:
    """In a replica: our loggers write where Serve writes this replica's log, at our level
    (without this their records reached no handler and a 500's traceback was logged
    nowhere); with json, in our JSON shape, Serve's request context included; with text,
    in Serve's shape, secrets masked."""
    print_to_files_again()
    quiet_url_loggers()  # an MCP server's URL (listed from here) may hold a credential
    handlers = logging.getLogger(SERVE_LOGGER).handlers
    for handler in handlers:
        # Serve buffers its file handler behind a MemoryHandler: the target formats.
        for each in (handler, getattr(handler, "target", None)):
            if not isinstance(each, logging.Handler):
                continue
            if settings.log_format == "json":
                each.setFormatter(JsonFormatter())
            elif each.formatter is not None and not isinstance(each.formatter, RedactedText):
                each.setFormatter(RedactedText(each.formatter))
    if settings.log_format == "json":
        # Libraries log through the root logger: to the same file, in the same shape,
        # rather than as bare text on the worker's stderr.
        root = logging.getLogger()
        for handler in handlers:
            if handler not in root.handlers:
                root.addHandler(handler)
    for name in OUR_LOGGERS:
        ours = logging.getLogger(name)
        ours.setLevel(settings.log_level)
        for handler in handlers:
            if handler not in ours.handlers:
                ours.addHandler(handler)
        ours.propagate = False
    access_at_info()


def print_to_files_again() -> None:
    """Repairs `print` in a replica. Serve replaces it there (Ray 2.60, `redirected_print`)
    to send what is printed to stdout or stderr to the replica's log, and hands a call that
    names any other file to the real `print` as ONE tuple: `print("a", file=f)` writes
    "('a',)". Python's traceback module prints each line into a StringIO, so every
    traceback formatted in a replica (by any logging formatter, or a library's
    `traceback.print_exc(file=...)`) became a run of tuple reprs.
    Calls for another file are written as `print` writes them; the rest still go to
    Serve's `print`. A no-op where `print` is the builtin, and when called again."""
    serve_print = builtins.print
    if isinstance(serve_print, types.BuiltinFunctionType) or getattr(
        serve_print, "_prints_to_files", False
    ):
        return

    def print_(
        *objects: object,
        sep: str | None = " ",
        end: str | None = "\n",
        file: IO[str] | None = None,
        flush: bool = False,
    ) -> None:
        if file is None or file is sys.stdout or file is sys.stderr:
            serve_print(*objects, sep=sep, end=end, file=file, flush=flush)
            return
        sep = " " if sep is None else sep
        file.write(sep.join(map(str, objects)) + ("\n" if end is None else end))
        if flush:
            file.flush()

    marked: Any = print_
    marked._prints_to_files = True
    builtins.print = marked


def driver_logs_like_ours(settings: Settings) -> None:
    """In `orchestrator serve`: Ray's and Serve's own loggers print through ours (the root
    logger's JSON handler). Their handlers are removed, not reformatted: ray.init resets the
    formatter of every handler the "ray" logger has to its text format."""
    if settings.log_format != "json":
        return
    for name in ("ray", SERVE_LOGGER):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)
        logger.propagate = True
