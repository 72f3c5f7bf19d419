"""Metrics recording per process and cluster-wide aggregation for /metrics and /slo."""

from ._logs import (
    ACCESS_LOGGER,
    LOG_FLUSH_S,
    OUR_LOGGERS,
    REDACTED,
    JsonFormatter,
    LogFormat,
    RedactedText,
    access_at_info,
    configure_actor_logs,
    configure_process_logs,
    flush_buffered_logs,
    formatter,
    log_access,
    mask_secrets,
    quiet_url_loggers,
    redact,
)
from ._paths import UNMATCHED, RouteTemplates
from ._pusher import MetricsPusher
from ._recorder import LATENCY_BUCKETS, MetricsRecorder, MetricsSnapshot, process_rss_bytes
from ._state import MetricsState, SloQuery, SloTargets
from ._uptime import heartbeat, prune_heartbeats, uptime_ratio

__all__ = [
    "ACCESS_LOGGER",
    "LATENCY_BUCKETS",
    "LOG_FLUSH_S",
    "OUR_LOGGERS",
    "REDACTED",
    "UNMATCHED",
    "JsonFormatter",
    "LogFormat",
    "MetricsPusher",
    "MetricsRecorder",
    "MetricsSnapshot",
    "MetricsState",
    "RedactedText",
    "RouteTemplates",
    "SloQuery",
    "SloTargets",
    "access_at_info",
    "configure_actor_logs",
    "configure_process_logs",
    "flush_buffered_logs",
    "formatter",
    "heartbeat",
    "log_access",
    "mask_secrets",
    "process_rss_bytes",
    "prune_heartbeats",
    "quiet_url_loggers",
    "redact",
    "uptime_ratio",
]
