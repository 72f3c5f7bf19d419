"""Anthropic's forms of optional fields, for providers whose tables lack them (issue 34):
translated where the provider honours the OpenAI form, else left to be refused by name."""

from __future__ import annotations

import pytest

from orchestrator.errors import ValidationFailed
from orchestrator.providers import _params


class _Adapter:
    def __init__(self, table: object) -> None:
        self.params = table


def test_anthropic_keeps_its_own_forms() -> None:
    params = {"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}
    assert _params.portable(_params.ANTHROPIC, params) is params
    assert _params.unsupported(_Adapter(_params.ANTHROPIC), {"content.server_tool_use": True}) == []


def test_claude_on_vertex_refuses_what_only_a_caller_body_carries() -> None:
    """Vertex's Claude body is encoded from the internal model, which cannot carry server
    tools or server-tool blocks: refused by name there, not honoured and lost."""
    from orchestrator.providers._vertex import _VertexAnthropic

    vertex = _Adapter(_VertexAnthropic.params)
    wanted = {"tools.web_search_20250305": True, "content.server_tool_use": True}
    assert _params.unsupported(vertex, wanted) == list(wanted)
    everything_else = {"thinking": {"type": "enabled", "budget_tokens": 1024}, "top_k": 5}
    assert _params.unsupported(vertex, {**everything_else, "cache_control": True}) == []
    with pytest.raises(ValidationFailed) as caught:
        _params.fit(wanted, vertex, "vertex", drop=False)
    assert [f["field"] for f in caught.value.extra["fields"]] == list(wanted)


def test_effort_and_adaptive_thinking_become_reasoning_effort_for_openai() -> None:
    params = {
        "thinking": {"type": "adaptive"},
        "output_config": {"effort": "xhigh", "format": {"type": "json_schema", "schema": {}}},
    }
    out = _params.portable(_params.OPENAI, params)
    assert out == {
        "reasoning_effort": "high",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": {"type": "object"}},
        },
    }
    assert _params.portable(_params.OPENAI, {"thinking": {"type": "adaptive"}}) == {
        "reasoning_effort": "high"  # Anthropic's default effort
    }


def test_adaptive_thinking_is_a_budget_where_only_budgets_are_taken() -> None:
    out = _params.portable(_params.QWEN, {"thinking": {"type": "adaptive"}})
    assert out == {"thinking": {"type": "enabled", "budget_tokens": 24576}}


def test_an_untranslatable_form_keeps_its_name_for_the_refusal() -> None:
    params = {"output_config": {"effort": "low", "task_budget": {"total": 5}}}
    adapter = _Adapter(_params.LOCAL)  # no reasoning_effort either
    assert _params.unsupported(adapter, params) == ["output_config"]
    with pytest.raises(ValidationFailed) as info:
        _params.fit(params, adapter, "local", drop=False)
    assert "output_config" in info.value.message and "local" in info.value.message


def test_cache_control_is_dropped_and_listed_never_refused() -> None:
    adapter = _Adapter(_params.OPENAI)
    kept = _params.fit({"cache_control": True, "seed": 1}, adapter, "openai", drop=False)
    assert kept == {"seed": 1}
    assert _params.unsupported(adapter, {"cache_control": True}) == ["cache_control"]
    with pytest.raises(ValidationFailed):
        _params.fit(
            {"cache_control": True, "context_management": {}}, adapter, "openai", drop=False
        )


def test_documents_by_source_kind() -> None:
    assert _params.unsupported(_Adapter(_params.OPENAI), {"document": ("base64", "text")}) == []
    assert _params.unsupported(_Adapter(_params.OPENAI), {"document": ("url",)}) == ["document"]
    assert _params.unsupported(_Adapter(_params.ANTHROPIC), {"document": ("file",)}) == []
    assert _params.unsupported(_Adapter(_params.OLLAMA), {"document": ("base64",)}) == ["document"]
