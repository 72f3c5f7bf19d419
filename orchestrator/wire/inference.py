"""Inference instances, the model list, embeddings and provider health (SPEC part 4,
inference and models). GET /inference, GET /inference/{id} and GET /providers/health build
their bodies from the domain's `wire()` functions; their models here are what a client reads
(tests/unit/test_sdk_openapi.py checks them against those functions)."""

from __future__ import annotations

from pydantic import Field

from orchestrator.wire._base import ApiModel

__all__ = [
    "Embedding",
    "EmbeddingList",
    "EmbeddingUsage",
    "Instance",
    "InstanceDetail",
    "InstanceList",
    "InstanceState",
    "InstancesStopped",
    "Model",
    "ModelInfo",
    "ModelList",
    "ModelsDiscovered",
    "ProviderStatus",
    "ProviderStatusDetail",
    "ProvidersStatus",
]


class InstanceState(ApiModel):
    ok: bool = True
    id: str
    state: str


class InstancesStopped(ApiModel):
    ok: bool = True
    stopped: list[str]


class Instance(ApiModel):
    id: str
    model: str
    state: str
    base_url: str | None = None
    host: str | None = None
    port: int | None = None
    pid: int | None = None
    ctx_size: int | None = None
    gpu_layers: int | None = None
    threads: int | None = None
    user_uuid: str | None = None
    error: str | None = None
    tools: bool | None = None  # whether its server takes tools (None: it did not say)
    created_at: int
    updated_at: int


class InstanceDetail(Instance):
    ok: bool = True


class InstanceList(ApiModel):
    ok: bool = True
    data: list[Instance]
    total: int


class ModelInfo(ApiModel):
    """A model entry of GET /models `models` (SPEC part 2)."""

    name: str
    status: str
    provider: str
    ctx_size: int | None = None


class Model(ApiModel):
    """OpenAI's Model object (GET /models `data`, GET /models/{id}); `ctx_size` is ours."""

    id: str
    object: str = "model"
    created: int
    owned_by: str
    ctx_size: int | None = Field(
        None, description="Context window in tokens (as in `models`); null when not known"
    )


class ModelList(ApiModel):
    """SPEC's `models` and, for OpenAI clients, the same models as OpenAI's list."""

    models: list[ModelInfo]
    object: str = "list"
    data: list[Model]


class ModelsDiscovered(ApiModel):
    ok: bool = True
    discovered: int
    warnings: list[str]


class Embedding(ApiModel):
    object: str = "embedding"
    index: int
    embedding: list[float] | str  # a string with encoding_format: base64


class EmbeddingUsage(ApiModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(ApiModel):
    """OpenAI's CreateEmbeddingResponse."""

    object: str = "list"
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage


class ProviderStatus(ApiModel):
    """One provider kind. base_url, last_error and probe_error are shown to admins only;
    `instances` is the local provider's; the probe's fields once it has been probed."""

    configured: bool
    reachable: bool | None = None
    breaker: str = "closed"
    breaker_state: int = 0
    last_error: str | None = None
    kind: str | None = None
    base_url: str | None = None
    models: list[str] = Field(default_factory=list)
    instances: int | None = None
    probe_error: str | None = None
    latency_ms: float | None = None
    checked_at: int | None = None


class ProvidersStatus(ApiModel):
    ok: bool = True
    providers: dict[str, ProviderStatus]
    configured: int
    healthy: int


class ProviderStatusDetail(ProviderStatus):
    ok: bool = True
    provider: str
