"""deploy/alerts.yml: Prometheus rule-file shape, every expression parses as PromQL, and every
metric it names is one the service exports (or Prometheus' own `up`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import promql_parser
import yaml
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.observability import MetricsRecorder, MetricsState

ALERTS = Path(__file__).resolve().parents[2] / "deploy" / "alerts.yml"
# Synthesised by Prometheus for every scrape target.
PROMETHEUS_OWN = {"up"}
SEVERITIES = {"critical", "warning", "info"}


def exported_names() -> set[str]:
    """Sample names of a /metrics exposition in which every family has a sample."""
    recorder = MetricsRecorder("test")
    recorder.http_request("GET", "/api/v1/whoami", 200, 0.01)
    recorder.provider_latency("openai", 0.2)
    recorder.gateway_call("gpt-4o-mini", "openai", 10, 5, 0.3)
    recorder.circuit_breaker("openai", 2)
    recorder.event("workflow.failed")
    recorder.background_restart("scheduler")
    state = MetricsState()
    state.apply(recorder.drain())
    text = state.render().decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def metric_names(node: Any) -> set[str]:
    """Names of every vector selector in a parsed PromQL expression."""
    if isinstance(node, promql_parser.VectorSelector):
        return {node.name} if node.name else set()
    found: set[str] = set()
    for attr in ("lhs", "rhs", "expr", "vector_selector", "param", "args"):
        child = getattr(node, attr, None)
        if isinstance(child, list):
            for each in child:
                found |= metric_names(each)
        elif child is not None and not isinstance(child, str | int | float):
            found |= metric_names(child)
    return found


def rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_rule_file_shape() -> None:
    doc = yaml.safe_load(ALERTS.read_text())
    assert set(doc) == {"groups"}
    for group in doc["groups"]:
        assert group["name"] and group["rules"]
    names = [r["alert"] for r in rules()]
    assert len(names) == len(set(names)), "alert names are unique"
    for rule in rules():
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}, rule["alert"]
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
        assert str(rule["for"])[-1] in "smh", rule["alert"]


def test_what_an_operator_needs_is_covered() -> None:
    used = set().union(*(metric_names(promql_parser.parse(r["expr"])) for r in rules()))
    for needed in (
        "up",
        "svc_http_requests_total",
        "svc_http_request_duration_seconds_bucket",
        "svc_circuit_breaker_state",
        "svc_background_restarts_total",
    ):
        assert needed in used, needed


def test_every_expression_parses_and_names_exported_metrics() -> None:
    exported = exported_names() | PROMETHEUS_OWN
    assert "svc_http_request_duration_seconds_bucket" in exported
    for rule in rules():
        expr = promql_parser.parse(rule["expr"])  # raises on a syntax error
        names = metric_names(expr)
        assert names, f"{rule['alert']} names no metric"
        assert names <= exported, f"{rule['alert']}: not exported: {names - exported}"


def test_the_name_walk_sees_through_functions_and_operators() -> None:
    expr = promql_parser.parse(
        "histogram_quantile(0.9, sum by (le) (rate(a_bucket[5m]))) > on() b and absent(c)"
    )
    assert metric_names(expr) == {"a_bucket", "b", "c"}
