"""The application version and the actor names of a generation."""

from __future__ import annotations

from pydantic import SecretStr

from actors import Generation, app_prefix, app_version
from actors.generation import members
from orchestrator.config import Settings


def test_the_version_follows_the_actor_settings_secrets_included() -> None:
    base = Settings()
    assert app_version(base) == app_version(Settings())
    assert app_version(base.model_copy(update={"provider_retries": 5})) != app_version(base)
    assert app_version(base.model_copy(update={"agent_worker_cpus": 0.5})) != app_version(base)
    keyed = base.model_copy(update={"channel_secret_key": SecretStr("a" * 32)})
    rekeyed = base.model_copy(update={"channel_secret_key": SecretStr("b" * 32)})
    assert app_version(keyed) != app_version(rekeyed)
    assert "a" * 32 not in app_version(keyed)


def test_names_are_readable_and_carry_the_version() -> None:
    g = Generation("orchestrator", "0123456789abcdef")
    assert g.name("WorkflowShard", 0) == "orch-orchestrator-01234567-WorkflowShard-0"
    assert g.name("Scheduler") == "orch-orchestrator-01234567-Scheduler"
    assert g.prefix.startswith(app_prefix("orchestrator"))
    parsed = Generation.of_actor_name(g.name("AgentWorker", 3))
    assert parsed.prefix == g.prefix and parsed.app == "orchestrator"


def test_a_generation_has_every_actor_once() -> None:
    settings = Settings(agent_workers=3, workflow_shards=2, channel_hubs=1)
    g = Generation.of("orchestrator", settings)
    names = [m.name for m in members(settings, g)]
    assert len(names) == len(set(names)) == 1 + 1 + 3 + 2 + 1 + 1
    assert all(n.startswith(g.prefix) for n in names)
    kinds = [m.kind for m in members(settings, g)]
    # What others look up exists before them: Metrics and EventBus, then the workers.
    assert kinds[:2] == ["Metrics", "EventBus"]
    assert kinds.index("AgentWorker") < kinds.index("WorkflowShard") < kinds.index("Scheduler")
