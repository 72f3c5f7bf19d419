"""Where and how the service's processes on the cluster log: Serve's replicas write Serve's
log files (logs/serve/replica_*.log), actors their worker's stderr; with `log_format: json`
both, and Serve's own controller and proxy logs, are one JSON object per line."""

from __future__ import annotations

import logging

from ray.serve.schema import EncodingType, LoggingConfig

from orchestrator.config import Settings
from orchestrator.observability import OUR_LOGGERS, JsonFormatter, access_at_info

SERVE_LOGGER = "ray.serve"


def serve_logging_config(settings: Settings) -> LoggingConfig:
    """Serve's logging for the application, its deployments, its controller and proxies.
    Serve's own access line stays off: ours (the middleware's, `access_log`) names the user
    and the route template, and a request gets one line, not two."""
    encoding = EncodingType.JSON if settings.log_format == "json" else EncodingType.TEXT
    return LoggingConfig(encoding=encoding, log_level=settings.log_level, enable_access_log=False)


def log_like_serve(settings: Settings) -> None:
    """In a replica: our loggers write where Serve writes this replica's log, at our level
    (without this their records reached no handler and a 500's traceback was logged
    nowhere); with json, in our JSON shape, Serve's request context included."""
    handlers = logging.getLogger(SERVE_LOGGER).handlers
    if settings.log_format == "json":
        for handler in handlers:
            # Serve buffers its file handler behind a MemoryHandler: the target formats.
            for each in (handler, getattr(handler, "target", None)):
                if isinstance(each, logging.Handler):
                    each.setFormatter(JsonFormatter())
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
