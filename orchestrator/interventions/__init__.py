"""Interventions (issue 32): a person's decision a workflow step waits for, holding no worker
and no claim meanwhile. A tool call under an `ask` policy rule stops its agent task (the
runner creates one in its transaction, with the sealed conversation); a step of type
`approval` asks directly (the driver creates one). The owner or an admin (or an approval
step's approvers, or a channel's approvers on its platform) approves or rejects it, once;
undecided past its `expires_at`, the engines' sweep rejects it as `expired`. The decided
intervention is then taken, once, by the driver that resumes the step."""

from orchestrator.interventions._links import (
    Link,
    LinkExpired,
    LinkRefused,
    LinkSigner,
    link_key,
)
from orchestrator.interventions._model import (
    ID_PATTERN,
    KINDS,
    MAX_TEXT,
    PLATFORMS,
    STATUSES,
    Decided,
    Decider,
    Intervention,
    Kind,
    Resume,
    Status,
)
from orchestrator.interventions._store import (
    DEFAULT_TIMEOUT_S,
    AttemptSuperseded,
    InterventionStore,
)

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ID_PATTERN",
    "KINDS",
    "MAX_TEXT",
    "PLATFORMS",
    "STATUSES",
    "AttemptSuperseded",
    "Decided",
    "Decider",
    "Intervention",
    "InterventionStore",
    "Kind",
    "Link",
    "LinkExpired",
    "LinkRefused",
    "LinkSigner",
    "Resume",
    "Status",
    "link_key",
]
