"""The deployment files validate with Ray's own code: `cluster.yaml` with the autoscaler's
config preparation and JSON schema (what `ray up` runs first), `serve_config.yaml` with
Serve's deploy schema (what `serve deploy` checks), and its app arguments as our settings."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from orchestrator.config import Settings

with warnings.catch_warnings():  # Serve's own models still use pydantic v1 idioms
    warnings.simplefilter("ignore", DeprecationWarning)
    from ray.serve.schema import ServeDeploySchema

    from deployments.app import build_app

ROOT = Path(__file__).resolve().parents[2]


def _cluster() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "cluster.yaml").read_text()))


def test_cluster_yaml_is_valid_for_ray_up() -> None:
    prepared = prepare_config(copy.deepcopy(_cluster()))
    validate_config(prepared)
    types = prepared["available_node_types"]
    assert prepared["head_node_type"] == "head" and {"cpu_worker", "gpu_worker"} <= set(types)
    gpu = types["gpu_worker"]
    assert gpu["resources"].get("GPU", 0) >= 1 and gpu["min_workers"] <= gpu["max_workers"]
    assert types["cpu_worker"]["resources"].get("GPU", 0) == 0
    assert any("pip install" in c for c in prepared["setup_commands"])
    assert any("ray start --head" in c for c in prepared["head_start_ray_commands"])


def test_ray_rejects_a_broken_cluster_yaml() -> None:
    """The check above can fail: an unknown key or a missing head type is refused."""
    bad = _cluster()
    bad["available_node_types"]["head"]["bogus"] = 1
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(bad))
    bad = _cluster()
    bad["head_node_type"] = "nowhere"
    with pytest.raises(ValueError, match="head_node_type"):
        validate_config(prepare_config(bad))


def test_serve_config_is_valid_for_serve_deploy() -> None:
    raw = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    schema = ServeDeploySchema.model_validate(raw)
    [app] = schema.applications
    assert app.import_path == "deployments.app:build_app"
    # Every argument is a setting, with a valid value.
    args = dict(app.args or {})
    unknown = set(args) - set(Settings.model_fields) - {"config"}
    assert not unknown, unknown
    Settings.load(environ={}, **args)


def test_build_app_refuses_embedded_state_without_urls() -> None:
    raw = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    args = dict(raw["applications"][0]["args"])
    with pytest.raises(ValueError, match="database_url and redis_url"):
        build_app(args)
