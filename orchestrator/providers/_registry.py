"""Provider kinds -> adapter classes, default endpoints, and the configured provider list."""

from __future__ import annotations

import importlib
from typing import Any

import httpx

from orchestrator.config import Settings
from orchestrator.extras import ExtraMissing, require
from orchestrator.providers._types import ProviderAdapter, ProviderConfig, ProviderError

__all__ = ["ADAPTERS", "DEFAULT_BASE_URLS", "build_adapter", "configured_providers"]

# kind -> "module:Class". Imported lazily so one broken optional dependency (botocore for
# Bedrock) cannot stop the others from loading.
ADAPTERS: dict[str, str] = {
    "anthropic": "orchestrator.providers._anthropic:AnthropicAdapter",
    "openai": "orchestrator.providers._openai:OpenAIAdapter",
    "zhipu": "orchestrator.providers._openai:ZhipuAdapter",
    "deepseek": "orchestrator.providers._openai:DeepSeekAdapter",
    "qwen": "orchestrator.providers._openai:QwenAdapter",
    "ollama": "orchestrator.providers._ollama:OllamaAdapter",
    "gemini": "orchestrator.providers._gemini:GeminiAdapter",
    "bedrock": "orchestrator.providers._bedrock:BedrockAdapter",
    "azure_openai": "orchestrator.providers._azure:AzureOpenAIAdapter",
    "vertex": "orchestrator.providers._vertex:VertexAdapter",
    # declarative adapters: `format` picks the wire format
    "custom:openai": "orchestrator.providers._openai:OpenAIAdapter",
    "custom:anthropic": "orchestrator.providers._anthropic:AnthropicAdapter",
    # a local llama-server instance speaks chat completions
    "local": "orchestrator.providers._openai:LocalAdapter",
}

DEFAULT_BASE_URLS: dict[str, str] = {
    "anthropic": "https://api.anthropic.com",
    "openai": "https://api.openai.com/v1",
    "zhipu": "https://open.bigmodel.cn/api/paas/v4",
    "deepseek": "https://api.deepseek.com",
    "qwen": "https://dashscope.aliyuncs.com/compatible-mode/v1",
    "ollama": "http://127.0.0.1:11434",
    "gemini": "https://generativelanguage.googleapis.com/v1beta",
    "bedrock": "https://bedrock-runtime.{region}.amazonaws.com",
    # azure_openai has none: its base_url (the resource endpoint) is required
    "vertex": "https://{location}-aiplatform.googleapis.com/v1",
}
VERTEX_GLOBAL_URL = "https://aiplatform.googleapis.com/v1"
AZURE_API_VERSION = "2024-10-21"  # Azure OpenAI's latest GA data-plane version (2026-11)
ENTRA_AUTHORITY = "https://login.microsoftonline.com"
VERTEX_LOCATION = "us-central1"


def build_adapter(config: ProviderConfig, http: httpx.AsyncClient) -> ProviderAdapter:
    kind = config.kind
    if kind == "custom":
        kind = f"custom:{config.extra.get('format', 'openai')}"
    module_name, _, class_name = ADAPTERS[kind].partition(":")
    if kind in ("bedrock", "vertex"):  # their adapters need an extra; `serve` checks at start
        try:
            require(kind, f"the {kind} provider")
        except ExtraMissing as exc:
            raise ProviderError(str(exc), provider=config.name) from exc
    cls: Any = getattr(importlib.import_module(module_name), class_name)
    adapter: ProviderAdapter = cls(config, http)
    return adapter


def configured_providers(settings: Settings) -> list[ProviderConfig]:
    """Every provider the settings configure (kinds with a key, a base_url or models; Ollama
    needs no key; custom adapters), in a stable order."""
    out: list[ProviderConfig] = []
    for kind, ps in settings.providers.items():
        extra: dict[str, Any] = {}
        if kind == "bedrock":
            region = ps.region or "us-east-1"
            extra = {
                "region": region,
                "access_key_id": ps.access_key_id.get_secret_value() if ps.access_key_id else None,
                "secret_access_key": (
                    ps.secret_access_key.get_secret_value() if ps.secret_access_key else None
                ),
                "session_token": ps.session_token.get_secret_value() if ps.session_token else None,
                "model_id": ps.model_id,
            }
            base = ps.base_url or DEFAULT_BASE_URLS["bedrock"].format(region=region)
        elif kind == "azure_openai":
            extra = {
                "api_version": ps.api_version or AZURE_API_VERSION,
                "deployments": dict(ps.deployments),
                "tenant_id": ps.tenant_id,
                "client_id": ps.client_id,
                "client_secret": (
                    ps.client_secret.get_secret_value() if ps.client_secret else None
                ),
                "authority": (ps.authority or ENTRA_AUTHORITY).rstrip("/"),
            }
            base = ps.base_url or ""  # required by the settings' validation
        elif kind == "vertex":
            location = ps.location or VERTEX_LOCATION
            extra = {"project": ps.project, "location": location}
            default = (
                VERTEX_GLOBAL_URL
                if location == "global"
                else DEFAULT_BASE_URLS["vertex"].format(location=location)
            )
            base = ps.base_url or default
        else:
            base = ps.base_url or DEFAULT_BASE_URLS[kind]
        models = (
            tuple(ps.models) or tuple(ps.deployments) or ((ps.model_id,) if ps.model_id else ())
        )
        out.append(
            ProviderConfig(
                name=kind,
                kind=kind,
                base_url=base.rstrip("/"),
                api_key=ps.api_key.get_secret_value() if ps.api_key else None,
                models=models,
                timeout_s=settings.provider_timeout_s,
                connect_timeout_s=settings.provider_connect_timeout_s,
                extra=extra,
            )
        )
    for cp in settings.custom_providers:
        models = tuple(cp.models)
        out.append(
            ProviderConfig(
                name=cp.id,
                kind="custom",
                base_url=cp.base_url.rstrip("/"),
                api_key=cp.api_key.get_secret_value() if cp.api_key else None,
                models=models,
                timeout_s=settings.provider_timeout_s,
                connect_timeout_s=settings.provider_connect_timeout_s,
                extra={"format": cp.format, "alias": cp.alias},
            )
        )
    return out
