"""Memory's settings (issue 33): the default `embedder` is the local one exactly when the
[embed] extra can be imported, else `none`; `memory_key_scope` defaults to the spec's
"agent" and takes only "agent" or "owner"."""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest

from orchestrator.config import ConfigError, Settings, _settings


def test_the_default_embedder_is_local_when_the_extra_is_installed() -> None:
    assert Settings.load(environ={}).embedder == "local"  # the [test] extra brings [embed]


def test_the_default_embedder_is_none_without_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    found = importlib.util.find_spec

    def without_onnxruntime(name: str, *args: Any) -> Any:
        return None if name == "onnxruntime" else found(name, *args)

    monkeypatch.setattr(_settings.importlib.util, "find_spec", without_onnxruntime)
    assert Settings.load(environ={}).embedder == "none"
    # A value given wins either way.
    assert Settings.load(environ={}, embedder="local").embedder == "local"


def test_memory_key_scope() -> None:
    assert Settings.load(environ={}).memory_key_scope == "agent"
    assert Settings.load(environ={}, memory_key_scope="owner").memory_key_scope == "owner"
    with pytest.raises(ConfigError):
        Settings.load(environ={}, memory_key_scope="user")
