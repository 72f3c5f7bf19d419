"""Workflows: state machines, specs (conditions, branches, templates, trees), the store and
the engine. No Ray here: `actors/workflow_shard.py` hosts engines in shards."""

from orchestrator.workflows._engine import WorkflowEngine
from orchestrator.workflows._overrides import Override, WorkflowOverrides
from orchestrator.workflows._resolve import resolve_request, tool_steps, tree_size
from orchestrator.workflows._retry import RetryPolicy
from orchestrator.workflows._skills import SkillSource, pin_skills
from orchestrator.workflows._spec import (
    BranchRule,
    Condition,
    SpecLimits,
    StepSpec,
    WorkflowSpec,
    choose_branch,
    evaluate_condition,
    fill_refs,
    fill_template,
    template_variables,
)
from orchestrator.workflows._states import (
    DELETABLE,
    FINISHED,
    STEP_TRANSITIONS,
    WORKFLOW_TRANSITIONS,
    StepState,
    WorkflowState,
    check_transition,
)
from orchestrator.workflows._store import (
    StepRecord,
    WorkflowRecord,
    WorkflowStore,
    shard_of,
)

__all__ = [
    "DELETABLE",
    "FINISHED",
    "STEP_TRANSITIONS",
    "WORKFLOW_TRANSITIONS",
    "BranchRule",
    "Condition",
    "Override",
    "RetryPolicy",
    "SkillSource",
    "SpecLimits",
    "StepRecord",
    "StepSpec",
    "StepState",
    "WorkflowEngine",
    "WorkflowOverrides",
    "WorkflowRecord",
    "WorkflowSpec",
    "WorkflowState",
    "WorkflowStore",
    "check_transition",
    "choose_branch",
    "evaluate_condition",
    "fill_refs",
    "fill_template",
    "pin_skills",
    "resolve_request",
    "shard_of",
    "template_variables",
    "tool_steps",
    "tree_size",
]
