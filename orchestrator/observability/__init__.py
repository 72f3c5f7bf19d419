"""Metrics recording per process and cluster-wide aggregation for /metrics and /slo."""

from ._paths import UNMATCHED, RouteTemplates
from ._pusher import MetricsPusher
from ._recorder import LATENCY_BUCKETS, MetricsRecorder, MetricsSnapshot, process_rss_bytes
from ._state import MetricsState, SloQuery, SloTargets
from ._uptime import heartbeat, prune_heartbeats, uptime_ratio

__all__ = [
    "LATENCY_BUCKETS",
    "UNMATCHED",
    "MetricsPusher",
    "MetricsRecorder",
    "MetricsSnapshot",
    "MetricsState",
    "RouteTemplates",
    "SloQuery",
    "SloTargets",
    "heartbeat",
    "process_rss_bytes",
    "prune_heartbeats",
    "uptime_ratio",
]
