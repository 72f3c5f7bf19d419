"""Agent teams (issue 33, the spec's `team.*` events): a `coordinate` step with `team` runs a
coordinator agent that spawns members (agent tasks of their own on the worker pool), mails
them and is mailed back through durable mailboxes in Postgres, and dismisses them; the team
ends with the step. The store (`_store`), the wait for mail (`_mailbox`), the tools and the
team's life around its coordinator's run (`_tools`), the end of a team a lost coordinator
left open (`_ending`, written by the workflow engine's transitions).

Exports are imported on first use (PEP 562): the workflow shards import `_ending`, which
runs this file, and must not load the agent loop and the providers that `_tools` and
`_model` import (tests/unit/test_actor_imports.py)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.teams._mailbox import MailWaker
    from orchestrator.teams._model import (
        COORDINATOR,
        ID_PATTERN,
        MAX_MEMBERS,
        Mail,
        Member,
        Team,
        TeamRefused,
    )
    from orchestrator.teams._store import TeamStore
    from orchestrator.teams._tools import TeamHub, TeamLimits

_WHERE = {
    "MailWaker": "_mailbox",
    "COORDINATOR": "_model",
    "ID_PATTERN": "_model",
    "MAX_MEMBERS": "_model",
    "Mail": "_model",
    "Member": "_model",
    "Team": "_model",
    "TeamRefused": "_model",
    "TeamStore": "_store",
    "TeamHub": "_tools",
    "TeamLimits": "_tools",
}

__all__ = [
    "COORDINATOR",
    "ID_PATTERN",
    "MAX_MEMBERS",
    "Mail",
    "MailWaker",
    "Member",
    "Team",
    "TeamHub",
    "TeamLimits",
    "TeamRefused",
    "TeamStore",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
