"""Agent teams (issue 33, the spec's `team.*` events): a `coordinate` step with `team` runs a
coordinator agent that spawns members (agent tasks of their own on the worker pool), mails
them and is mailed back through durable mailboxes in Postgres, and dismisses them; the team
ends with the step. The store (`_store`), the wait for mail (`_mailbox`), the tools and the
team's life around its coordinator's run (`_tools`)."""

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
