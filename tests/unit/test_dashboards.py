"""The shipped Grafana dashboard is valid JSON, and every metric it queries is one the service
exports (so a renamed metric cannot leave an empty panel behind)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

from orchestrator.observability import MetricsState

ROOT = Path(__file__).resolve().parents[2]


def test_grafana_dashboard_queries_only_exported_metrics() -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(exprs) >= 9
    exported = {f.name for f in text_string_to_metric_families(MetricsState().render().decode())}
    used = {m for e in exprs for m in re.findall(r"\b(svc_[a-z_]+)", e)}
    base = {re.sub(r"_(bucket|sum|count|total)$", "", m) for m in used}
    assert base <= exported, base - exported
    assert {"svc_http_requests", "svc_event", "svc_provider_latency_seconds"} <= base
    assert {
        "svc_http_request_duration_seconds",
        "svc_gateway_tokens",
        "svc_gateway_ttft_seconds",
    } <= base


def test_prometheus_config_scrapes_the_metrics_path() -> None:
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "orchestrator"]
    assert job["metrics_path"] == "/api/v1/metrics"
