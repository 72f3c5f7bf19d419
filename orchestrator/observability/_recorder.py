"""Per-process metric buffer, drained periodically into the cluster-wide aggregator."""

from __future__ import annotations

import os
import resource
import sys
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

# Upper bounds in seconds. Dense between 50 ms and 2.5 s because that is where the
# latency SLO target lives: the p99 is interpolated inside one bucket, so the bucket
# width around the target bounds the SLO error.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.25,
    0.3,
    0.4,
    0.5,
    0.6,
    0.75,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)

# Non-cumulative counts, one per LATENCY_BUCKETS bound plus a final +Inf slot.
BucketCounts = tuple[int, ...]

# The exported per-route request-duration histogram: coarser than LATENCY_BUCKETS (which
# serve the SLO, summed over routes) because it is kept per route, method and status class,
# and every bucket is a series. Bounds at 0.25/0.5/1 s bracket the latency target.
HTTP_BUCKETS: tuple[float, ...] = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
# Time to the first token of a gateway stream.
TTFT_BUCKETS: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
# Methods kept as label values; anything else a client sends is one label, OTHER.
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})

# (bucket counts, sum of seconds, count) over the bounds of one of the tuples above.
Histogram = tuple[BucketCounts, float, int]


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """What one process sends to the aggregator on each drain.

    Only builtins inside, so it pickles cheaply across actor boundaries. Counter and
    histogram fields are deltas since the previous drain; gauge fields are absolute.
    """

    source: str
    timestamp: float
    rss_bytes: int
    # (method, route template, status) -> requests since the last drain.
    http_requests: dict[tuple[str, str, int], int] = field(default_factory=dict)
    # Unix second -> (bucket counts of request durations, requests with status >= 500).
    # Keyed by the second the request finished, not the drain time, so SLO windows
    # stay accurate however late a snapshot arrives.
    http_seconds: dict[int, tuple[BucketCounts, int]] = field(default_factory=dict)
    # provider -> (bucket counts, sum of seconds, count).
    provider_latency: dict[str, tuple[BucketCounts, float, int]] = field(default_factory=dict)
    # (method, route template, status class "2xx") -> request durations over HTTP_BUCKETS.
    http_durations: dict[tuple[str, str, str], Histogram] = field(default_factory=dict)
    # (model, provider, "in" | "out") -> gateway tokens since the last drain.
    gateway_tokens: dict[tuple[str, str, str], int] = field(default_factory=dict)
    # (model, provider) -> times to the first token of streams, over TTFT_BUCKETS.
    gateway_ttft: dict[tuple[str, str], Histogram] = field(default_factory=dict)
    events: dict[str, int] = field(default_factory=dict)
    # supervised task name -> restarts since the last drain.
    background_restarts: dict[str, int] = field(default_factory=dict)
    # provider -> (state, wall-clock time it was reported); the time lets the
    # aggregator pick the most recent report across sources.
    circuit_breakers: dict[str, tuple[int, float]] = field(default_factory=dict)
    active_workers: int = 0
    stream_sockets: int = 0
    in_memory_bytes: int = 0


def process_rss_bytes() -> int:
    """Resident set size of this process in bytes."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    # Without /proc only the peak RSS is available; an over-estimate beats a zero.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


_SLOTS = len(LATENCY_BUCKETS) + 1  # one extra for +Inf


def bucket_index(seconds: float, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> int:
    # bisect_left keeps Prometheus `le` semantics: a value equal to a bound lands in it.
    return bisect_left(bounds, seconds)


def status_class(status: int) -> str:
    return f"{status // 100}xx"


class _Hist:
    """A histogram being filled between drains."""

    __slots__ = ("bounds", "buckets", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.buckets = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.buckets[bucket_index(seconds, self.bounds)] += 1
        self.total += seconds

    def frozen(self) -> Histogram:
        return tuple(self.buckets), self.total, sum(self.buckets)


class MetricsRecorder:
    """Buffers metrics of one process (an HTTP replica or an actor) between drains.

    Every method is a handful of dict operations and takes no lock: callers run on one
    event loop. drain() swaps the buffers out before reading them, so a stray
    increment from another thread can at worst be lost, never corrupt a snapshot.
    """

    def __init__(self, source: str, *, clock: Callable[[], float] = time.time) -> None:
        self._source = source
        self._clock = clock
        self._requests: dict[tuple[str, str, int], int] = {}
        self._seconds: dict[int, tuple[list[int], list[int]]] = {}
        self._provider: dict[str, tuple[list[int], list[float]]] = {}
        self._durations: dict[tuple[str, str, str], _Hist] = {}
        self._tokens: dict[tuple[str, str, str], int] = {}
        self._ttft: dict[tuple[str, str], _Hist] = {}
        self._events: dict[str, int] = {}
        self._restarts: dict[str, int] = {}
        self._breakers: dict[str, tuple[int, float]] = {}
        self._workers = 0
        self._sockets = 0
        self._in_memory = 0

    @property
    def source(self) -> str:
        return self._source

    def http_request(self, method: str, path: str, status: int, duration_s: float) -> None:
        """One answered request; `path` is its route template (bounded label values)."""
        method = method if method in HTTP_METHODS else "OTHER"
        key = (method, path, status)
        self._requests[key] = self._requests.get(key, 0) + 1
        by_route = (method, path, status_class(status))
        hist = self._durations.get(by_route)
        if hist is None:
            hist = self._durations[by_route] = _Hist(HTTP_BUCKETS)
        hist.observe(duration_s)
        second = int(self._clock())
        slot = self._seconds.get(second)
        if slot is None:
            slot = self._seconds[second] = ([0] * _SLOTS, [0])
        slot[0][bucket_index(duration_s)] += 1
        if status >= 500:
            slot[1][0] += 1

    def provider_latency(self, provider: str, seconds: float) -> None:
        hist = self._provider.get(provider)
        if hist is None:
            hist = self._provider[provider] = ([0] * _SLOTS, [0.0])
        hist[0][bucket_index(seconds)] += 1
        hist[1][0] += seconds

    def gateway_call(
        self, model: str, provider: str, tokens_in: int, tokens_out: int, ttft_s: float | None
    ) -> None:
        """A completed gateway call (from the inference log's flusher, off the request
        path); `ttft_s` for a stream that produced a token."""
        for direction, n in (("in", tokens_in), ("out", tokens_out)):
            key = (model, provider, direction)
            self._tokens[key] = self._tokens.get(key, 0) + n
        if ttft_s is not None:
            hist = self._ttft.get((model, provider))
            if hist is None:
                hist = self._ttft[(model, provider)] = _Hist(TTFT_BUCKETS)
            hist.observe(ttft_s)

    def circuit_breaker(self, provider: str, state: int) -> None:
        self._breakers[provider] = (state, self._clock())

    def active_workers(self, n: int) -> None:
        self._workers = n

    def stream_sockets(self, n: int) -> None:
        self._sockets = n

    def in_memory_bytes(self, n: int) -> None:
        self._in_memory = n

    def event(self, type: str, n: int = 1) -> None:
        self._events[type] = self._events.get(type, 0) + n

    def background_restart(self, task: str) -> None:
        """A supervised loop was restarted (the Supervisor's `on_restart`)."""
        self._restarts[task] = self._restarts.get(task, 0) + 1

    def drain(self) -> MetricsSnapshot:
        """Return deltas since the previous drain plus current gauges, and reset deltas."""
        requests, self._requests = self._requests, {}
        seconds, self._seconds = self._seconds, {}
        provider, self._provider = self._provider, {}
        durations, self._durations = self._durations, {}
        tokens, self._tokens = self._tokens, {}
        ttft, self._ttft = self._ttft, {}
        events, self._events = self._events, {}
        restarts, self._restarts = self._restarts, {}
        return MetricsSnapshot(
            source=self._source,
            timestamp=self._clock(),
            rss_bytes=process_rss_bytes(),
            http_requests=requests,
            http_seconds={s: (tuple(b), e[0]) for s, (b, e) in seconds.items()},
            provider_latency={
                p: (tuple(b), total[0], sum(b)) for p, (b, total) in provider.items()
            },
            http_durations={k: h.frozen() for k, h in durations.items()},
            gateway_tokens=tokens,
            gateway_ttft={k: h.frozen() for k, h in ttft.items()},
            events=events,
            background_restarts=restarts,
            circuit_breakers=dict(self._breakers),
            active_workers=self._workers,
            stream_sockets=self._sockets,
            in_memory_bytes=self._in_memory,
        )
