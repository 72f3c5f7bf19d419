"""Cluster-wide aggregation of recorder snapshots: Prometheus exposition and SLO status."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from ._recorder import (
    HTTP_BUCKETS,
    LATENCY_BUCKETS,
    TTFT_BUCKETS,
    Histogram,
    MetricsSnapshot,
)

_SLOTS = len(LATENCY_BUCKETS) + 1
# Distinct (model, provider) pairs kept as label values; later ones are summed as model
# "<other>", so clients naming models cannot grow the exposition without bound.
MAX_MODEL_LABELS = 200
OTHER_MODEL = "<other>"


@dataclass(frozen=True, slots=True)
class SloTargets:
    """Targets reported by /slo; window_s is the look-back for latency and error rate."""

    latency_p99_s: float = 0.5
    uptime_7d_pct: float = 99.9
    error_rate: float = 0.01
    window_s: float = 300.0


@dataclass(frozen=True, slots=True)
class SloQuery:
    """One /slo question: the targets, and the uptime measured elsewhere (None: unknown)."""

    targets: SloTargets
    uptime_ratio: float | None


@dataclass(slots=True)
class _SourceGauges:
    last_seen: float
    rss_bytes: int
    in_memory_bytes: int
    active_workers: int
    stream_sockets: int
    circuit_breakers: dict[str, tuple[int, float]]


@dataclass(slots=True)
class _Histogram:
    buckets: list[int] = field(default_factory=lambda: [0] * _SLOTS)
    total: float = 0.0
    count: int = 0


class MetricsState:
    """Cumulative metrics of the whole cluster, fed by MetricsRecorder snapshots.

    Holds only plain containers, so the owning actor can pickle it as a checkpoint.
    `window_s` bounds the per-second SLO data kept in memory; SLO windows longer
    than it see only the retained part.
    """

    def __init__(self, window_s: float = 300.0) -> None:
        self._window_s = window_s
        self._requests: dict[tuple[str, str, int], int] = {}
        self._provider: dict[str, _Histogram] = {}
        self._durations: dict[tuple[str, str, str], _Histogram] = {}
        self._tokens: dict[tuple[str, str, str], int] = {}
        self._ttft: dict[tuple[str, str], _Histogram] = {}
        self._models: set[tuple[str, str]] = set()
        self._events: dict[str, int] = {}
        self._restarts: dict[str, int] = {}
        self._gauges: dict[str, _SourceGauges] = {}
        # Unix second -> (duration bucket counts, 5xx count), summed over sources.
        self._seconds: dict[int, tuple[list[int], list[int]]] = {}
        self._latest = 0.0

    def apply(self, snapshot: MetricsSnapshot) -> None:
        for key, n in snapshot.http_requests.items():
            self._requests[key] = self._requests.get(key, 0) + n
        for type_, n in snapshot.events.items():
            self._events[type_] = self._events.get(type_, 0) + n
        for task, n in snapshot.background_restarts.items():
            self._restarts[task] = self._restarts.get(task, 0) + n
        for provider, (buckets, total, count) in snapshot.provider_latency.items():
            hist = self._provider.setdefault(provider, _Histogram())
            for i, n in enumerate(buckets):
                hist.buckets[i] += n
            hist.total += total
            hist.count += count
        for route_key, frozen in snapshot.http_durations.items():
            _add(self._durations, route_key, frozen, len(HTTP_BUCKETS))
        for (model, provider, direction), n in snapshot.gateway_tokens.items():
            tokens_key = (self._model(model, provider), provider, direction)
            self._tokens[tokens_key] = self._tokens.get(tokens_key, 0) + n
        for (model, provider), frozen in snapshot.gateway_ttft.items():
            _add(self._ttft, (self._model(model, provider), provider), frozen, len(TTFT_BUCKETS))
        for second, (buckets, errors) in snapshot.http_seconds.items():
            slot = self._seconds.setdefault(second, ([0] * _SLOTS, [0]))
            for i, n in enumerate(buckets):
                slot[0][i] += n
            slot[1][0] += errors
        previous = self._gauges.get(snapshot.source)
        # Deltas above are order-independent; gauges are not, so a snapshot delivered
        # late (a retried actor call) must not overwrite a newer reading.
        if previous is None or snapshot.timestamp >= previous.last_seen:
            self._set_gauges(snapshot)
        # Prune against the newest report rather than the local clock, so a replayed
        # checkpoint is not emptied just because it is read later.
        self._latest = max(self._latest, snapshot.timestamp)
        self._prune(self._latest - self._window_s)

    def _model(self, model: str, provider: str) -> str:
        if (model, provider) in self._models:
            return model
        if len(self._models) < MAX_MODEL_LABELS:
            self._models.add((model, provider))
            return model
        return OTHER_MODEL

    def _set_gauges(self, snapshot: MetricsSnapshot) -> None:
        self._gauges[snapshot.source] = _SourceGauges(
            last_seen=snapshot.timestamp,
            rss_bytes=snapshot.rss_bytes,
            in_memory_bytes=snapshot.in_memory_bytes,
            active_workers=snapshot.active_workers,
            stream_sockets=snapshot.stream_sockets,
            circuit_breakers=dict(snapshot.circuit_breakers),
        )

    def forget_stale_sources(self, max_age_s: float, now: float | None = None) -> None:
        """Drop gauges of sources silent for max_age_s; their counters stay cumulative."""
        cutoff = (time.time() if now is None else now) - max_age_s
        for source in [s for s, g in self._gauges.items() if g.last_seen < cutoff]:
            del self._gauges[source]

    def active_workers(self) -> int:
        return sum(g.active_workers for g in self._gauges.values())

    def stream_sockets(self) -> int:
        return sum(g.stream_sockets for g in self._gauges.values())

    def memory_bytes(self) -> int:
        return sum(g.rss_bytes + g.in_memory_bytes for g in self._gauges.values())

    def circuit_breakers(self) -> dict[str, int]:
        """Latest reported state per provider, across all live sources."""
        latest: dict[str, tuple[int, float]] = {}
        for gauges in self._gauges.values():
            for provider, (state, at) in gauges.circuit_breakers.items():
                if provider not in latest or at >= latest[provider][1]:
                    latest[provider] = (state, at)
        return {provider: state for provider, (state, _) in latest.items()}

    def render(self, event_totals: Mapping[str, int] | None = None) -> bytes:
        """Prometheus text exposition of every family, with HELP/TYPE even when empty.
        `event_totals` (the durable per-type counts of committed events) is what
        svc_event_total shows when given; else the counts reported to this state."""
        # A private registry per call: the default one would mix in process metrics of
        # the actor, and a stored registry (it holds a lock) would not pickle.
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self, event_totals))
        return generate_latest(registry)

    def slo(
        self, targets: SloTargets, uptime_ratio: float | None, now: float | None = None
    ) -> dict[str, dict[str, Any]]:
        now = time.time() if now is None else now
        self._prune(now - max(self._window_s, targets.window_s))
        first = int(now - targets.window_s)
        buckets = [0] * _SLOTS
        errors = 0
        for second, (counts, five_xx) in self._seconds.items():
            if first <= second <= now:
                for i, n in enumerate(counts):
                    buckets[i] += n
                errors += five_xx[0]
        total = sum(buckets)
        p99 = _quantile(0.99, buckets)
        error_rate = errors / total if total else 0.0
        uptime = 100.0 if uptime_ratio is None else uptime_ratio * 100.0
        return {
            "latency_p99": _objective(targets.latency_p99_s, p99, p99 <= targets.latency_p99_s),
            "uptime_7d": _objective(targets.uptime_7d_pct, uptime, uptime >= targets.uptime_7d_pct),
            "error_rate": _objective(
                targets.error_rate, error_rate, error_rate <= targets.error_rate
            ),
        }

    def _prune(self, cutoff: float) -> None:
        for second in [s for s in self._seconds if s < int(cutoff)]:
            del self._seconds[second]


def _add(into: dict[Any, _Histogram], key: Any, hist: Histogram, bounds: int) -> None:
    buckets, total, count = hist
    into_hist = into.get(key)
    if into_hist is None:
        into_hist = into[key] = _Histogram(buckets=[0] * (bounds + 1))
    for i, n in enumerate(buckets):
        into_hist.buckets[i] += n
    into_hist.total += total
    into_hist.count += count


def _cumulative(hist: _Histogram, bounds: tuple[float, ...]) -> list[tuple[str, float]]:
    out: list[tuple[str, float]] = []
    running = 0
    for bound, n in zip((*bounds, float("inf")), hist.buckets, strict=True):
        running += n
        out.append((floatToGoString(bound), running))  # type: ignore[no-untyped-call]
    return out


def _objective(target: float, current: float, compliant: bool) -> dict[str, Any]:
    return {"target": float(target), "current": float(current), "compliant": compliant}


def _quantile(q: float, buckets: list[int]) -> float:
    """Quantile from non-cumulative bucket counts, interpolating linearly in a bucket.

    Same convention as Prometheus histogram_quantile: rank q*count, and a rank in the
    +Inf bucket reports the largest finite bound because nothing better is known.
    """
    total = sum(buckets)
    if total == 0:
        return 0.0
    rank = q * total
    below = 0
    for i, n in enumerate(buckets):
        if below + n >= rank:
            if i == len(LATENCY_BUCKETS):
                return LATENCY_BUCKETS[-1]
            lower = LATENCY_BUCKETS[i - 1] if i else 0.0
            upper = LATENCY_BUCKETS[i]
            return lower + (upper - lower) * (rank - below) / n
        below += n
    return LATENCY_BUCKETS[-1]


class _Collector(Collector):
    """Adapts a MetricsState to prometheus_client's collector protocol."""

    def __init__(self, state: MetricsState, event_totals: Mapping[str, int] | None) -> None:
        self._state = state
        self._event_totals = event_totals

    def collect(self) -> Iterator[Metric]:
        state = self._state
        requests = CounterMetricFamily(
            "svc_http_requests_total", "HTTP requests", labels=("method", "path", "status")
        )
        for (method, path, status), n in sorted(state._requests.items()):
            requests.add_metric((method, path, str(status)), n)
        yield requests

        durations = HistogramMetricFamily(
            "svc_http_request_duration_seconds",
            "HTTP request duration by route template, method and status class",
            labels=("method", "route", "status_class"),
        )
        for route_key, route_hist in sorted(state._durations.items()):
            durations.add_metric(route_key, _cumulative(route_hist, HTTP_BUCKETS), route_hist.total)
        yield durations

        latency = HistogramMetricFamily(
            "svc_provider_latency_seconds", "Provider call latency", labels=("provider",)
        )
        for provider, hist in sorted(state._provider.items()):
            latency.add_metric((provider,), _cumulative(hist, LATENCY_BUCKETS), hist.total)
        yield latency

        tokens = CounterMetricFamily(
            "svc_gateway_tokens",
            "Gateway tokens by model, provider and direction (in: prompt, out: completion)",
            labels=("model", "provider", "direction"),
        )
        for tokens_key, count in sorted(state._tokens.items()):
            tokens.add_metric(tokens_key, count)
        yield tokens

        ttft = HistogramMetricFamily(
            "svc_gateway_ttft_seconds",
            "Time from a gateway stream's request to its first token",
            labels=("model", "provider"),
        )
        for model_key, ttft_hist in sorted(state._ttft.items()):
            ttft.add_metric(model_key, _cumulative(ttft_hist, TTFT_BUCKETS), ttft_hist.total)
        yield ttft

        breakers = GaugeMetricFamily(
            "svc_circuit_breaker_state",
            "Circuit breaker state: 0 closed, 1 half-open, 2 open",
            labels=("provider",),
        )
        for provider, value in sorted(state.circuit_breakers().items()):
            breakers.add_metric((provider,), value)
        yield breakers

        yield GaugeMetricFamily(
            "svc_active_workers", "Active workers", value=state.active_workers()
        )
        yield GaugeMetricFamily(
            "svc_memory_bytes", "In-memory storage plus process memory", value=state.memory_bytes()
        )
        yield GaugeMetricFamily(
            "svc_stream_sockets", "Open SSE streams", value=state.stream_sockets()
        )

        events = CounterMetricFamily("svc_event_total", "Events on the bus", labels=("type",))
        totals = self._event_totals if self._event_totals is not None else state._events
        for type_, n in sorted(totals.items()):
            events.add_metric((type_,), n)
        yield events

        restarts = CounterMetricFamily(
            "svc_background_restarts_total",
            "Restarts of supervised background loops after they failed or returned",
            labels=("task",),
        )
        for task, n in sorted(state._restarts.items()):
            restarts.add_metric((task,), n)
        yield restarts
