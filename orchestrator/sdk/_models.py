"""Typed results of the API, as a client sees them.

They mirror the response bodies of the API (SPEC part 4 and DESIGN). They are written once,
here, and tests/unit/test_sdk_openapi.py checks each against the app's OpenAPI
document (every field the server declares is here, nothing here that it does not send,
required where the server always sends it), so a drift fails a test. The SDK does not import
the server's models: it installs and runs without FastAPI or the service's dependencies.
Unknown fields are kept rather than refused, so a newer server that adds a field does not
break an older client.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

__all__ = [
    "ApiModel",
    "Channel",
    "ChannelCreated",
    "ChannelDeleted",
    "ChannelList",
    "ChannelUpdated",
    "ChatChoice",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatMessage",
    "ChunkChoice",
    "ComponentHealth",
    "CreatedChannel",
    "DirectoryEntry",
    "DirectoryListing",
    "Embedding",
    "EmbeddingList",
    "EmbeddingUsage",
    "Encoding",
    "Event",
    "EventPage",
    "FileContent",
    "FileEdited",
    "FileHit",
    "FileSearch",
    "FileWritten",
    "Health",
    "HealthComponents",
    "Instance",
    "InstanceDetail",
    "InstanceList",
    "InstanceState",
    "InstancesStopped",
    "Job",
    "JobCreated",
    "JobPage",
    "JobStatus",
    "MemoryCleared",
    "MemoryCopied",
    "MemoryEntries",
    "MemoryEntry",
    "MemoryForgotten",
    "MemoryOk",
    "MemoryPinned",
    "MemoryResults",
    "MemoryStats",
    "Message",
    "MessageStreamEvent",
    "MessagingHealth",
    "Model",
    "ModelInfo",
    "ModelList",
    "ModelsDiscovered",
    "ProviderStatus",
    "ProviderStatusDetail",
    "ProvidersHealth",
    "ProvidersStatus",
    "Reflection",
    "Reflections",
    "ReportFiled",
    "ReportPage",
    "ReportsDismissed",
    "SchedulePreview",
    "SimilarEntry",
    "SimilarResults",
    "Skill",
    "SkillDeleted",
    "SkillDetail",
    "SkillPage",
    "SkillPublished",
    "SkillReport",
    "Slo",
    "SloEntry",
    "StoreHealth",
    "TemplateSaved",
    "TokenCreated",
    "TokenRevoked",
    "Usage",
    "WebhookAck",
    "WhoAmI",
    "WorkersHealth",
    "Workflow",
    "WorkflowCancelled",
    "WorkflowCreated",
    "WorkflowDeleted",
    "WorkflowPage",
    "WorkflowStep",
    "WorkflowSummary",
    "WorkflowTemplate",
    "WorkflowTemplates",
]


class ApiModel(BaseModel):
    """Base of every result: immutable, and tolerant of fields added by newer servers."""

    model_config = ConfigDict(extra="allow", frozen=True)


class ComponentHealth(ApiModel):
    status: str


class StoreHealth(ComponentHealth):
    tables: int


class MessagingHealth(ComponentHealth):
    sockets: int


class ProvidersHealth(ApiModel):
    total: int
    healthy: int


class WorkersHealth(ApiModel):
    active: int
    idle: int


class HealthComponents(ApiModel):
    store: StoreHealth
    messaging: MessagingHealth
    providers: ProvidersHealth
    workers: WorkersHealth


class Health(ApiModel):
    """GET /health. A degraded service answers 503 with this same body."""

    status: str
    version: str
    uptime_seconds: float
    components: HealthComponents

    @property
    def healthy(self) -> bool:
        return self.status == "ok"


class SloEntry(ApiModel):
    target: float
    current: float
    compliant: bool


class Slo(ApiModel):
    latency_p99: SloEntry
    uptime_7d: SloEntry
    error_rate: SloEntry

    @property
    def compliant(self) -> bool:
        return self.latency_p99.compliant and self.uptime_7d.compliant and self.error_rate.compliant


class WhoAmI(ApiModel):
    ok: bool = True
    user_uuid: str
    admin: bool


class TokenCreated(ApiModel):
    """A newly issued token. `token` is shown only here; `prefix` identifies it later."""

    ok: bool = True
    token: str
    prefix: str
    user_uuid: str
    admin: bool
    expires_at: int | None = None  # Unix ms; None: never


class TokenRevoked(ApiModel):
    ok: bool = True
    revoked: int


class WorkflowCreated(ApiModel):
    ok: bool = True
    id: str
    status: str


class WorkflowStep(ApiModel):
    name: str
    status: str
    result: str | None = None
    error: str | None = None
    skills: list[dict[str, Any]] | None = None  # pinned: {name, author, version, body}


class Workflow(ApiModel):
    id: str
    name: str
    status: str
    steps: list[WorkflowStep]
    parent_id: str | None = None
    children: list[str] = []
    created_at: int
    updated_at: int
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in ("completed", "failed", "cancelled")


class WorkflowSummary(ApiModel):
    id: str
    name: str
    status: str
    created_at: int
    updated_at: int
    parent_id: str | None = None


class WorkflowPage(ApiModel):
    ok: bool = True
    data: list[WorkflowSummary]
    total: int
    limit: int
    offset: int


class WorkflowCancelled(ApiModel):
    ok: bool = True
    id: str
    status: str


class WorkflowDeleted(ApiModel):
    ok: bool = True
    id: str


class TemplateSaved(ApiModel):
    ok: bool = True
    name: str


class WorkflowTemplate(ApiModel):
    name: str
    steps: list[dict[str, Any]]
    variables: list[str]
    shared: bool
    owner: str | None = None
    created_at: int


class WorkflowTemplates(ApiModel):
    ok: bool = True
    data: list[WorkflowTemplate]


class JobCreated(ApiModel):
    status: str = "ok"
    id: int
    next_run: int | None = None


class Job(ApiModel):
    """A scheduled job; the list's items carry the summary fields only (the rest None)."""

    id: int
    name: str
    schedule_type: str
    enabled: bool
    next_run: int | None = None
    last_run: int | None = None
    consecutive_errors: int = 0
    created_at: int
    cron_expr: str | None = None
    interval_ms: int | None = None
    prompt: str | None = None
    model: str | None = None
    last_result: str | None = None
    last_error: str | None = None
    user_uuid: str | None = None
    running: bool | None = None


class JobPage(ApiModel):
    items: list[Job]
    total: int
    page: int
    per_page: int


class JobStatus(ApiModel):
    status: str
    id: int
    next_run: int | None = None


class SchedulePreview(ApiModel):
    """The next runs a job with a schedule would have if created now (nothing stored)."""

    status: str = "ok"
    schedule_type: str
    cron_expr: str | None = None
    interval_ms: int | None = None
    at: int | None = None
    tz: str
    next_runs: list[int]


# --- events (SPEC part 2 / part 4 "Events") -------------------------------------------------


class Event(ApiModel):
    """One stored event; `position` is its global order (the SSE `id`, the Last-Event-ID)."""

    id: str
    type: str
    version: int
    aggregate_id: str
    seq: int
    timestamp: int
    data: dict[str, Any]
    position: int
    user_uuid: str | None = None


class EventPage(ApiModel):
    ok: bool = True
    data: list[Event]
    total: int
    offset: int
    limit: int


# --- memory (SPEC part 7) ------------------------------------------------------------------


class MemoryOk(ApiModel):
    status: str = "ok"


class MemoryEntry(ApiModel):
    key: str
    value: str
    created_at: int


class MemoryResults(ApiModel):
    results: list[MemoryEntry]


class MemoryEntries(ApiModel):
    entries: list[MemoryEntry]


class Reflection(ApiModel):
    key: str
    value: str


class Reflections(ApiModel):
    reflections: list[Reflection]


class MemoryCleared(ApiModel):
    status: str = "ok"
    cleared: int


class MemoryStats(ApiModel):
    total_entries: int
    total_agents: int
    pg_enabled: bool
    pgvector_enabled: bool


class SimilarEntry(ApiModel):
    key: str
    value: str
    similarity: float


class SimilarResults(ApiModel):
    results: list[SimilarEntry]


class MemoryForgotten(ApiModel):
    status: str = "ok"
    forgotten: int


class MemoryCopied(ApiModel):
    status: str = "ok"
    copied: int


class MemoryPinned(ApiModel):
    status: str = "ok"
    pinned: bool


# --- workspace files -----------------------------------------------------------------------

Encoding = Literal["utf-8", "base64"]


class FileContent(ApiModel):
    path: str
    content: str
    size: int
    encoding: Encoding = "utf-8"


class FileWritten(ApiModel):
    ok: bool = True
    path: str
    size: int
    created: bool


class FileEdited(ApiModel):
    ok: bool = True
    path: str
    size: int
    replacements: int = 1


class FileHit(ApiModel):
    path: str
    size: int
    modified: str


class FileSearch(ApiModel):
    results: list[FileHit]
    count: int
    truncated: bool


class DirectoryEntry(ApiModel):
    path: str
    type: Literal["file", "directory"]
    size: int
    modified: str


class DirectoryListing(ApiModel):
    path: str
    entries: list[DirectoryEntry]
    count: int
    truncated: bool


# --- marketplace ---------------------------------------------------------------------------


class Skill(ApiModel):
    name: str
    author: str
    description: str
    tags: list[str]
    downloads: int
    version: str


class SkillPage(ApiModel):
    items: list[Skill]
    total: int
    limit: int
    offset: int
    has_more: bool


class SkillDetail(Skill):
    body: str
    created_at: int
    updated_at: int


class SkillPublished(ApiModel):
    ok: bool = True
    name: str
    author: str
    version: str
    created: bool


class SkillDeleted(ApiModel):
    ok: bool = True
    name: str
    author: str
    deleted: bool = True


class ReportFiled(ApiModel):
    ok: bool = True
    id: int
    name: str
    author: str


class SkillReport(ApiModel):
    id: int
    name: str
    author: str
    reporter: str
    reason: str
    created_at: int


class ReportPage(ApiModel):
    ok: bool = True
    reports: list[SkillReport]
    total: int
    limit: int
    offset: int
    has_more: bool


class ReportsDismissed(ApiModel):
    ok: bool = True
    name: str
    author: str
    dismissed: int


# --- channels ------------------------------------------------------------------------------


class Channel(ApiModel):
    id: str
    type: str
    name: str
    status: str
    config: dict[str, Any]
    user_uuid: str
    failures: int
    last_error: str | None = None
    created_at: int
    updated_at: int


class CreatedChannel(Channel):
    """The webhook token is shown only here (and when rotated)."""

    webhook_token: str
    webhook_path: str


class ChannelList(ApiModel):
    ok: bool = True
    data: list[Channel]


class ChannelCreated(ApiModel):
    ok: bool = True
    data: CreatedChannel


class ChannelUpdated(ApiModel):
    ok: bool = True
    data: Channel
    webhook_token: str | None = None
    webhook_path: str | None = None


class ChannelDeleted(ApiModel):
    ok: bool = True
    deleted: str


class WebhookAck(ApiModel):
    ok: bool = True
    accepted: bool
    duplicate: bool = False
    ignored: str | None = None
    answer: str | None = None


# --- inference instances, models, providers ------------------------------------------------


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
    ctx_size: int | None = None


class Embedding(ApiModel):
    object: str = "embedding"
    index: int
    embedding: list[float] | str  # a string with encoding_format: base64


class EmbeddingUsage(ApiModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(ApiModel):
    """OpenAI's CreateEmbeddingResponse (POST /embeddings)."""

    object: str = "list"
    model: str
    data: list[Embedding]
    usage: EmbeddingUsage


class ModelList(ApiModel):
    models: list[ModelInfo]
    object: str = "list"
    data: list[Model] = []


class ModelsDiscovered(ApiModel):
    ok: bool = True
    discovered: int
    warnings: list[str]


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
    models: list[str] = []
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


# --- chat (OpenAI chat completions and Anthropic messages, as the gateway answers) ---------


class ChatMessage(ApiModel):
    role: str
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChoice(ApiModel):
    index: int
    message: ChatMessage
    finish_reason: str | None = None


class Usage(ApiModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class ChatCompletion(ApiModel):
    """OpenAI's CreateChatCompletionResponse (the fields this service fills)."""

    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class ChunkChoice(ApiModel):
    index: int
    delta: dict[str, Any]
    finish_reason: str | None = None


class ChatCompletionChunk(ApiModel):
    """One `data:` chunk of a streamed chat completion (the last may carry only usage)."""

    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class Message(ApiModel):
    """Anthropic's Messages response: `content` is a list of blocks (text, tool_use)."""

    id: str
    type: str = "message"
    role: str
    model: str
    content: list[dict[str, Any]]
    stop_reason: str | None = None
    usage: dict[str, Any]

    @property
    def text(self) -> str:
        return "".join(b.get("text", "") for b in self.content if b.get("type") == "text")


class MessageStreamEvent(ApiModel):
    """One event of a streamed message (message_start, content_block_delta, ...); the rest of
    the event's fields are kept as extra attributes (`.delta`, `.message`, `.index`)."""

    type: str
