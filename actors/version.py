"""The application version: what decides that a deploy needs new actors.

A generation's actors are named by the version (`orch-<app>-<version8>-<Kind>`), and the
Runtime replica that owns them is deployed under it: a deploy with the same version keeps
the running actors, one with another version drains them and starts a new generation. The
version is a digest of two things:

- Code: every Python and SQL file of the packages in CODE_PACKAGES (`orchestrator`,
  `actors`, `deployments`), whole. That is more than the generation runs: the routers,
  request layers and UI under deployments/ and the SDK under orchestrator/sdk are hashed
  too, although only the Api replicas (or clients) run them, so a change there also starts
  a new generation. Hashing whole packages needs no import graph at deploy time and cannot
  miss a module the actors or the Runtime replica (deployments/runtime.py, deployments/logs.py)
  import, deferred imports included; narrowing it to what they import is possible
  (tests/unit/test_actor_settings.py already follows those imports) but not done.
- Settings: exactly ACTOR_SETTINGS, the settings the generation's processes read, no more:
  a change to a setting only the HTTP replicas read (a rate limit, the JWT issuer) restarts
  those replicas, not the nine actor processes. `log_level` is read by the actors but left
  out on purpose (UNVERSIONED_SETTINGS).

ACTOR_SETTINGS is kept honest by tests/unit/test_actor_settings.py, which scans the code a
generation runs for settings it reads: a setting read there and not listed fails it, and so
does one listed and no longer read.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretBytes, SecretStr

# Packages whose code the actors run: a change in any of them is a new application version.
CODE_PACKAGES = ("orchestrator", "actors", "deployments")

# Every setting the generation's processes read (the actors and the Runtime replica).
ACTOR_SETTINGS: tuple[str, ...] = (
    # Where the actors run and with what: the state layer, the generation's shape and resources.
    "agent_worker_concurrency",
    "agent_worker_cpus",
    "agent_workers",
    "channel_hub_cpus",
    "channel_hubs",
    "data_dir",
    "database_url",
    "generation_drain_s",
    "log_format",
    "models_dir",
    "redis_url",
    "slo_window_s",
    "workflow_shard_cpus",
    "workflow_shards",
    "workspace_root",
    # The agent loop and the AgentWorker's admission.
    "agent_ctx_tokens",
    "agent_loop_limit",
    "agent_loop_warn",
    "agent_max_tokens",
    "agent_max_tool_calls",
    "agent_max_turns",
    "agent_task_timeout_s",
    "agent_worker_max_running",
    "agent_worker_niceness",
    "agent_worker_tenant_share",
    "default_model",
    "tool_result_max_bytes",
    # The providers (the gateway in each worker).
    "breaker_cooldown_s",
    "breaker_failure_threshold",
    "custom_providers",
    "drop_unsupported_params",
    "fallback_models",
    "provider_connect_timeout_s",
    "provider_health_ttl_s",
    "provider_retries",
    "provider_retry_backoff_s",
    "provider_timeout_s",
    "providers",
    # Agents' tools: memory, workspace, marketplace, MCP and HTTP tools, the egress guard.
    "embedder",
    "embedding_max_inputs",
    "embedding_max_request_tokens",
    "embedding_provider_max_request_tokens",
    "http_tool_timeout_s",
    "http_tools_max_per_user",
    "marketplace_browse_limit",
    "marketplace_publish_per_hour",
    "mcp_call_timeout_s",
    "mcp_connect_timeout_s",
    "mcp_max_servers_per_user",
    "mcp_stdio_commands",
    "memory_agent_id_max",
    "memory_embedding_dim",
    "memory_enabled",
    "memory_key_scope",
    "outbound_allowed_cidrs",
    "skill_body_max",
    "skill_description_max",
    "workspace_isolation",
    "workspace_max_file_bytes",
    # Agent teams (issue 33: the workers' team tools).
    "team_max_mails",
    "team_max_message_bytes",
    "team_receive_max_s",
    "team_receive_poll_s",
    # Workflows (the shards).
    "intervention_timeout_s",
    "step_max_skills",
    "workflow_claim_ttl_ms",
    "workflow_max_children",
    "workflow_max_declared_steps",
    "workflow_max_depth",
    "workflow_max_descendants",
    "workflow_max_live_per_user",
    "workflow_max_spec_chars",
    "workflow_max_steps",
    "workflow_max_template_expansions",
    "workflow_pattern_budget_ms",
    "workflow_pattern_max_program",
    "workflow_retry_attempts",
    "workflow_retry_base_ms",
    "workflow_retry_max_ms",
    "workflow_shard_max_active",
    "workflow_shard_tenant_share",
    # A spawned child's spec is parsed in its shard: its steps' retry defaults.
    "step_retry_backoff_ms",
    "step_retry_max_attempts",
    "step_retry_max_backoff_ms",
    # The scheduler.
    "catchup_enabled",
    "catchup_stagger_ms",
    "catchup_window_ms",
    "max_catchup_runs",
    "max_consecutive_errors",
    "max_dispatch_per_tick",
    "scheduler_lease_ttl_ms",
    "timer_clamp_ms",
    # Channels (the hubs).
    "channel_api_base_urls",
    "channel_delivery_attempts",
    "channel_error_after",
    "channel_history_turns",
    "channel_retry_base_s",
    "channel_secret_key",
    "public_url",  # the base of a webhook question's signed links (issue 32)
)

# Read by the actors but left out of the version on purpose: a change alone does not replace
# the generation (it applies to the actors from the next one; the replicas at once).
UNVERSIONED_SETTINGS: tuple[str, ...] = ("log_level",)


@functools.cache
def code_version() -> str:
    """A digest of the source the actors run (Python and SQL of our packages)."""
    digest = hashlib.sha256()
    for package in CODE_PACKAGES:
        spec = importlib.util.find_spec(package)
        for location in (spec.submodule_search_locations or []) if spec else []:
            root = Path(location)
            for path in sorted(root.rglob("*")):
                if path.suffix in (".py", ".sql") and path.is_file():
                    digest.update(str(path.relative_to(root.parent)).encode())
                    digest.update(path.read_bytes())
    return digest.hexdigest()


def _reveal(value: Any) -> Any:
    # Secrets count too (a new provider key must reach the workers); only their digest is kept.
    if isinstance(value, SecretStr | SecretBytes):
        return str(value.get_secret_value())
    if isinstance(value, set | frozenset):
        return sorted(value, key=str)
    return str(value)


def app_version(settings: BaseModel) -> str:
    """The application version: the code plus the settings the actors read."""
    actor_settings = settings.model_dump(include=set(ACTOR_SETTINGS))
    body = json.dumps(actor_settings, default=_reveal, sort_keys=True)
    return hashlib.sha256(f"{code_version()}\n{body}".encode()).hexdigest()[:16]
