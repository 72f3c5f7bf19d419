"""Recorder -> aggregator -> Prometheus text and /slo, without Ray."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.observability import (
    LATENCY_BUCKETS,
    MetricsRecorder,
    MetricsSnapshot,
    MetricsState,
    SloTargets,
    process_rss_bytes,
)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


class FakeClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def parse(state: MetricsState) -> tuple[dict[str, str], Samples]:
    """Family name -> type, and (sample name, labels) -> value, via the official parser."""
    types: dict[str, str] = {}
    samples: Samples = {}
    for family in text_string_to_metric_families(state.render().decode()):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return types, samples


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


def test_counters_are_summed_across_sources() -> None:
    state = MetricsState()
    a, b = MetricsRecorder("replica-a"), MetricsRecorder("actor-b")
    route = "/api/v1/schedules/{job_id}"
    for _ in range(3):
        a.http_request("GET", route, 200, 0.01)
    b.http_request("GET", route, 200, 0.02)
    b.http_request("DELETE", route, 404, 0.02)
    a.event("workflow.completed")
    b.event("workflow.completed", 4)
    b.event("job.paused")
    state.apply(a.drain())
    state.apply(b.drain())

    _, samples = parse(state)

    assert samples[key("svc_http_requests_total", method="GET", path=route, status="200")] == 4
    assert samples[key("svc_http_requests_total", method="DELETE", path=route, status="404")] == 1
    assert samples[key("svc_event_total", type="workflow.completed")] == 5
    assert samples[key("svc_event_total", type="job.paused")] == 1


def test_background_restarts_are_summed_across_sources() -> None:
    state = MetricsState()
    a, b = MetricsRecorder("replica-a"), MetricsRecorder("event_bus")
    a.background_restart("event-feed")
    b.background_restart("event-feed")
    b.background_restart("metrics-flush")
    state.apply(a.drain())
    state.apply(b.drain())
    assert b.drain().background_restarts == {}  # a delta, reset by the drain

    types, samples = parse(state)

    assert types["svc_background_restarts"] == "counter"
    assert samples[key("svc_background_restarts_total", task="event-feed")] == 2
    assert samples[key("svc_background_restarts_total", task="metrics-flush")] == 1


def test_drain_resets_deltas_but_keeps_gauges() -> None:
    recorder = MetricsRecorder("replica-a")
    recorder.http_request("POST", "/api/v1/workflows", 201, 0.05)
    recorder.provider_latency("openai", 0.2)
    recorder.event("workflow.created")
    recorder.active_workers(3)
    recorder.stream_sockets(2)
    recorder.circuit_breaker("openai", 1)

    first = recorder.drain()
    second = recorder.drain()

    assert first.http_requests == {("POST", "/api/v1/workflows", 201): 1}
    assert first.events == {"workflow.created": 1}
    assert sum(first.provider_latency["openai"][0]) == 1
    assert (second.http_requests, second.events) == ({}, {})
    assert (second.provider_latency, second.http_seconds) == ({}, {})
    assert (second.active_workers, second.stream_sockets) == (3, 2)
    assert second.circuit_breakers["openai"][0] == 1

    state = MetricsState()
    state.apply(first)
    state.apply(second)
    _, samples = parse(state)
    labels = {"method": "POST", "path": "/api/v1/workflows", "status": "201"}
    assert samples[key("svc_http_requests_total", **labels)] == 1


def test_provider_histogram_buckets_sum_and_count() -> None:
    state = MetricsState()
    a, b = MetricsRecorder("a"), MetricsRecorder("b")
    # 0.01 sits exactly on a bound and must count in it (Prometheus `le`); 100 s
    # is beyond the last finite bound and must only show in +Inf.
    for seconds in (0.0005, 0.01, 0.3):
        a.provider_latency("anthropic", seconds)
    state.apply(a.drain())
    b.provider_latency("anthropic", 100.0)
    b.provider_latency("ollama", 0.02)
    state.apply(b.drain())

    types, samples = parse(state)

    assert types["svc_provider_latency_seconds"] == "histogram"

    def bucket(le: str, provider: str = "anthropic") -> float:
        return samples[key("svc_provider_latency_seconds_bucket", le=le, provider=provider)]

    assert bucket("0.001") == 1
    assert bucket("0.005") == 1
    assert bucket("0.01") == 2
    assert bucket("0.25") == 2
    assert bucket("0.3") == 3
    assert bucket("60.0") == 3
    assert bucket("+Inf") == 4
    assert samples[key("svc_provider_latency_seconds_count", provider="anthropic")] == 4
    assert samples[key("svc_provider_latency_seconds_sum", provider="anthropic")] == (
        pytest.approx(100.3105)
    )
    assert bucket("0.01", "ollama") == 0
    assert bucket("0.025", "ollama") == 1
    assert samples[key("svc_provider_latency_seconds_count", provider="ollama")] == 1


def test_all_families_present_when_empty() -> None:
    text = MetricsState().render().decode()
    types = {f.name: f.type for f in text_string_to_metric_families(text)}

    # The parser drops the `_total` suffix from counter family names.
    assert types == {
        "svc_http_requests": "counter",
        "svc_http_request_duration_seconds": "histogram",
        "svc_provider_latency_seconds": "histogram",
        "svc_gateway_tokens": "counter",
        "svc_gateway_ttft_seconds": "histogram",
        "svc_circuit_breaker_state": "gauge",
        "svc_active_workers": "gauge",
        "svc_memory_bytes": "gauge",
        "svc_event": "counter",
        "svc_stream_sockets": "gauge",
        "svc_background_restarts": "counter",
    }
    for name in ("svc_http_requests_total", "svc_event_total", "svc_circuit_breaker_state"):
        assert f"# HELP {name} " in text
        assert f"# TYPE {name} " in text


def test_gauges_sum_over_live_sources_and_expire_when_stale() -> None:
    clock_a, clock_b = FakeClock(1_000.0), FakeClock(1_050.0)
    a = MetricsRecorder("a", clock=clock_a)
    b = MetricsRecorder("b", clock=clock_b)
    a.active_workers(2)
    a.stream_sockets(5)
    a.in_memory_bytes(1_000)
    a.circuit_breaker("openai", 2)
    a.http_request("GET", "/api/v1/health", 200, 0.001)
    b.active_workers(3)
    b.stream_sockets(1)
    b.in_memory_bytes(500)
    b.circuit_breaker("gemini", 1)
    snap_a, snap_b = a.drain(), b.drain()
    state = MetricsState()
    state.apply(snap_a)
    state.apply(snap_b)

    assert state.active_workers() == 5
    assert state.stream_sockets() == 6
    _, samples = parse(state)
    memory = snap_a.rss_bytes + snap_b.rss_bytes + 1_500
    assert samples[key("svc_memory_bytes")] == memory
    assert samples[key("svc_circuit_breaker_state", provider="openai")] == 2

    state.forget_stale_sources(max_age_s=30.0, now=1_060.0)

    assert state.active_workers() == 3
    assert state.stream_sockets() == 1
    _, samples = parse(state)
    assert samples[key("svc_memory_bytes")] == snap_b.rss_bytes + 500
    assert key("svc_circuit_breaker_state", provider="openai") not in samples
    assert samples[key("svc_circuit_breaker_state", provider="gemini")] == 1
    # Counters are cumulative and survive their source going away.
    labels = {"method": "GET", "path": "/api/v1/health", "status": "200"}
    assert samples[key("svc_http_requests_total", **labels)] == 1


def test_circuit_breaker_reports_latest_value_across_sources() -> None:
    clock = FakeClock(100.0)
    a = MetricsRecorder("a", clock=clock)
    b = MetricsRecorder("b", clock=clock)
    state = MetricsState()
    a.circuit_breaker("openai", 2)
    clock.now = 200.0
    b.circuit_breaker("openai", 0)
    clock.now = 250.0
    # `a` drains after `b` reported, but its reading is older and must not win.
    state.apply(b.drain())
    state.apply(a.drain())
    assert state.circuit_breakers() == {"openai": 0}

    clock.now = 300.0
    a.circuit_breaker("openai", 1)
    state.apply(a.drain())
    assert state.circuit_breakers() == {"openai": 1}


def test_late_snapshot_does_not_overwrite_newer_gauges() -> None:
    clock = FakeClock(100.0)
    recorder = MetricsRecorder("a", clock=clock)
    recorder.active_workers(1)
    recorder.event("x")
    older = recorder.drain()
    clock.now = 110.0
    recorder.active_workers(7)
    recorder.event("x")
    newer = recorder.drain()
    state = MetricsState()
    state.apply(newer)
    state.apply(older)

    assert state.active_workers() == 7
    _, samples = parse(state)
    assert samples[key("svc_event_total", type="x")] == 2


def _record(recorder: MetricsRecorder, n: int, seconds: float, status: int = 200) -> None:
    for _ in range(n):
        recorder.http_request("GET", "/api/v1/models", status, seconds)


def test_p99_from_known_distribution_across_sources() -> None:
    clock = FakeClock(5_000.0)
    a = MetricsRecorder("a", clock=clock)
    b = MetricsRecorder("b", clock=clock)
    _record(a, 500, 0.01)
    _record(b, 480, 0.01)
    clock.now = 5_001.0
    _record(b, 20, 2.0)  # 2 % of 1000 requests are slow
    state = MetricsState()
    state.apply(a.drain())
    state.apply(b.drain())

    slo = state.slo(SloTargets(), uptime_ratio=None, now=5_002.0)

    # Rank 990 falls 10 of 20 into the (1.5, 2.0] bucket: 1.5 + 0.5 * 10/20.
    assert slo["latency_p99"] == {
        "target": 0.5,
        "current": pytest.approx(1.75),
        "compliant": False,
    }


def test_p99_stays_fast_when_exactly_one_percent_is_slow() -> None:
    clock = FakeClock(5_000.0)
    recorder = MetricsRecorder("a", clock=clock)
    _record(recorder, 990, 0.2)
    _record(recorder, 10, 2.0)
    state = MetricsState()
    state.apply(recorder.drain())

    p99 = state.slo(SloTargets(), uptime_ratio=None, now=5_000.5)["latency_p99"]

    # The 990th of 1000 requests is the last fast one, so p99 lies in (0.15, 0.2].
    assert 0.15 < p99["current"] <= 0.2
    assert p99["compliant"] is True


def test_slo_without_requests() -> None:
    slo = MetricsState().slo(SloTargets(), uptime_ratio=None, now=1_000.0)

    assert slo == {
        "latency_p99": {"target": 0.5, "current": 0.0, "compliant": True},
        "uptime_7d": {"target": 99.9, "current": 100.0, "compliant": True},
        "error_rate": {"target": 0.01, "current": 0.0, "compliant": True},
    }


def test_error_rate_counts_only_5xx() -> None:
    clock = FakeClock(2_000.0)
    recorder = MetricsRecorder("a", clock=clock)
    _record(recorder, 96, 0.01)
    _record(recorder, 1, 0.01, status=404)
    _record(recorder, 2, 0.01, status=503)
    _record(recorder, 1, 0.01, status=500)
    state = MetricsState()
    state.apply(recorder.drain())

    strict = state.slo(SloTargets(), uptime_ratio=None, now=2_000.0)["error_rate"]
    lenient = state.slo(SloTargets(error_rate=0.05), uptime_ratio=None, now=2_000.0)

    assert strict == {"target": 0.01, "current": pytest.approx(0.03), "compliant": False}
    assert lenient["error_rate"]["compliant"] is True


@pytest.mark.parametrize(
    ("ratio", "current", "compliant"),
    [(None, 100.0, True), (0.9995, 99.95, True), (0.999, 99.9, True), (0.998, 99.8, False)],
)
def test_uptime_is_a_percentage(ratio: float | None, current: float, compliant: bool) -> None:
    uptime = MetricsState().slo(SloTargets(), uptime_ratio=ratio, now=0.0)["uptime_7d"]

    assert uptime == {"target": 99.9, "current": pytest.approx(current), "compliant": compliant}


def test_window_excludes_and_prunes_old_seconds() -> None:
    clock = FakeClock(10_000.0)
    recorder = MetricsRecorder("a", clock=clock)
    _record(recorder, 50, 5.0, status=500)
    state = MetricsState(window_s=300.0)
    state.apply(recorder.drain())
    clock.now = 10_400.0
    _record(recorder, 50, 0.01)
    state.apply(recorder.drain())

    # A wider window cannot bring the old second back: it was pruned when the newer
    # snapshot arrived, which is what keeps the per-second data bounded.
    wide = state.slo(SloTargets(window_s=3_600.0), uptime_ratio=None, now=10_400.5)
    assert wide["error_rate"]["current"] == 0.0
    assert wide["latency_p99"]["current"] <= 0.01


def test_window_filters_retained_seconds() -> None:
    clock = FakeClock(10_000.0)
    recorder = MetricsRecorder("a", clock=clock)
    _record(recorder, 50, 5.0, status=500)
    clock.now = 10_400.0
    _record(recorder, 50, 0.01)
    state = MetricsState(window_s=3_600.0)
    state.apply(recorder.drain())

    narrow = state.slo(SloTargets(window_s=300.0), uptime_ratio=None, now=10_400.5)
    wide = state.slo(SloTargets(window_s=3_600.0), uptime_ratio=None, now=10_400.5)

    assert narrow["error_rate"]["current"] == 0.0
    assert narrow["latency_p99"]["current"] <= 0.01
    assert wide["error_rate"]["current"] == pytest.approx(0.5)
    assert wide["latency_p99"]["current"] > 2.5


def test_window_uses_now_not_arrival_order() -> None:
    clock = FakeClock(10_000.0)
    recorder = MetricsRecorder("a", clock=clock)
    _record(recorder, 10, 3.0, status=502)
    state = MetricsState()
    state.apply(recorder.drain())

    inside = state.slo(SloTargets(), uptime_ratio=None, now=10_299.0)
    after = state.slo(SloTargets(), uptime_ratio=None, now=10_301.0)

    assert inside["error_rate"]["current"] == 1.0
    assert inside["latency_p99"]["compliant"] is False
    assert after["error_rate"]["current"] == 0.0
    assert after["latency_p99"]["current"] == 0.0


def test_snapshot_pickles_and_is_frozen() -> None:
    recorder = MetricsRecorder("a")
    recorder.http_request("GET", "/api/v1/ready", 200, 0.001)
    recorder.provider_latency("openai", 0.4)
    recorder.circuit_breaker("openai", 2)
    snapshot = recorder.drain()

    assert isinstance(snapshot, MetricsSnapshot)
    assert pickle.loads(pickle.dumps(snapshot)) == snapshot
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.source = "b"  # type: ignore[misc]
    state = MetricsState()
    state.apply(snapshot)
    assert pickle.loads(pickle.dumps(state)).render() == state.render()


def test_buckets_and_rss() -> None:
    assert list(LATENCY_BUCKETS) == sorted(set(LATENCY_BUCKETS))
    assert LATENCY_BUCKETS[0] <= 0.001 and LATENCY_BUCKETS[-1] >= 60.0
    assert 0.5 in LATENCY_BUCKETS  # the default p99 target is a bucket bound
    assert process_rss_bytes() > 1_000_000
