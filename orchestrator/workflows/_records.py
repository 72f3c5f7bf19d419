"""A workflow as the engine and the API see it: its row and its steps' rows read back as
frozen records (`WorkflowRecord`, `StepRecord`), with one SELECT that loads both in one
round trip. Kept apart from the writes so that readers (the engine, step tasks) need not
know the transitions."""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import asyncpg

from orchestrator.workflows._spec import WorkflowSpec
from orchestrator.workflows._states import FINISHED, StepState, WorkflowState


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class StepRecord:
    idx: int
    name: str
    status: StepState
    attempt: int
    key: str | None
    result: str | None
    error: str | None
    compensated: bool
    started_at: int | None = None
    finished_at: int | None = None
    # Waiting for its next attempt (a failed one is retried): due then (Unix ms).
    retry_at: int | None = None
    # Earlier attempts of this run that ended without a result (migration 0026).
    attempts: tuple[dict[str, Any], ...] = ()

    @property
    def failures(self) -> int:
        """Failed attempts of this run of the step (lost ones are not the task's failure)."""
        return sum(1 for a in self.attempts if not a.get("lost"))

    @property
    def waiting(self) -> bool:
        """Running, between a failed attempt and the next (due at `retry_at`)."""
        return self.status == StepState.RUNNING and self.retry_at is not None

    def attempt_history(self) -> list[dict[str, Any]]:
        """Every attempt of this run, oldest first: the earlier ones that ended without a
        result, then the current (or last) one, unless it is the failed one waiting."""
        out = [dict(a) for a in self.attempts]
        if self.attempt and not (out and out[-1].get("attempt") == self.attempt):
            current: dict[str, Any] = {"attempt": self.attempt, "started_at": self.started_at}
            if self.status in (StepState.COMPLETED, StepState.FAILED):
                current["ended_at"] = self.finished_at
            if self.status != StepState.COMPLETED and self.error is not None:
                current["error"] = self.error
            out.append(current)
        return out

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "status": str(self.status)}
        if self.status == StepState.COMPLETED and self.result is not None:
            out["result"] = self.result
        if self.error is not None:
            out["error"] = self.error
        if self.attempt:
            out["attempt"] = self.attempt
            out["attempts"] = self.attempt_history()
        if self.waiting:
            out["next_attempt_at"] = self.retry_at
        return out


def _step_wire(step: StepRecord, spec: WorkflowSpec) -> dict[str, Any]:
    """A step as GET /workflows/{id} shows it: with the skills pinned for it, if any."""
    out = step.wire()
    index = spec.step_index.get(step.name)
    if index is not None and spec.steps[index].skills:
        out["skills"] = spec.steps[index].to_json()["skills"]
    return out


@dataclass(frozen=True, slots=True)
class WorkflowRecord:
    id: str
    user_uuid: str
    name: str
    status: WorkflowState
    spec: WorkflowSpec
    parent_id: str | None
    parent_step: str | None
    cursor: int
    executed: int
    ending: str | None
    error: str | None
    created_at: int
    updated_at: int
    steps: tuple[StepRecord, ...]
    # The pending intervention the running step waits for (issue 32): nobody drives the
    # workflow meanwhile (the sweep skips it); cleared by the decision, an expiry or a cancel.
    waiting_for: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    def step(self, name: str) -> StepRecord | None:
        index = self.spec.step_index.get(name)
        return self.steps[index] if index is not None else None

    def lookup(self, step: str, attr: str) -> str:
        """`{{step.result}}` / `{{step.status}}`: "" for a result not there yet."""
        record = self.step(step)
        if record is None:
            return ""
        if attr == "status":
            return str(record.status)
        return record.result or "" if record.status == StepState.COMPLETED else ""

    def last_result(self) -> str | None:
        done = [s for s in self.steps if s.status == StepState.COMPLETED and s.result]
        return done[-1].result if done else None


_SELECT = (
    "SELECT w.id, w.user_uuid, w.name, w.status, w.spec::text AS spec, w.parent_id,"
    " w.parent_step, w.cursor, w.executed, w.ending, w.error, w.created_at, w.updated_at,"
    " w.waiting_for,"
    " (SELECT json_agg(json_build_array(s.idx, s.name, s.status, s.attempt,"
    " s.idempotency_key, s.result, s.error, s.compensated, s.started_at, s.finished_at,"
    " s.retry_at, s.attempts) ORDER BY s.idx)"
    " FROM workflow_steps s WHERE s.workflow_id = w.id)::text AS steps"
    " FROM workflows w"
)
_LOAD = _SELECT + " WHERE w.id = $1"


async def load_record(
    conn: Any, workflow_id: str, *, for_update: bool = False
) -> WorkflowRecord | None:
    """The workflow and its steps in one round trip, on `conn` (a pool or a connection)."""
    row = await conn.fetchrow(_LOAD + (" FOR UPDATE OF w" if for_update else ""), workflow_id)
    return _record(row) if row is not None else None


class _SpecCache:
    """Parsed specs by their text. A workflow's spec never changes after creation: parse
    (and check) it once. Bounded by characters, not entries: a tenant's large specs (up to
    workflow_max_spec_chars each) cannot grow a shard past `max_chars`."""

    def __init__(self, max_chars: int) -> None:
        self._max = max_chars
        self._chars = 0
        self._items: OrderedDict[str, WorkflowSpec] = OrderedDict()

    def get(self, text: str) -> WorkflowSpec:
        spec = self._items.get(text)
        if spec is not None:
            self._items.move_to_end(text)
            return spec
        spec = WorkflowSpec.from_json(json.loads(text))
        if len(text) <= self._max // 8:
            self._items[text] = spec
            self._chars += len(text)
            while self._chars > self._max:
                old, _ = self._items.popitem(last=False)
                self._chars -= len(old)
        return spec


_SPECS = _SpecCache(64 << 20)


def _record(row: asyncpg.Record) -> WorkflowRecord:
    spec = _SPECS.get(row["spec"])
    steps = json.loads(row["steps"] or "[]")
    return WorkflowRecord(
        id=row["id"],
        user_uuid=row["user_uuid"],
        name=row["name"],
        status=WorkflowState(row["status"]),
        spec=spec,
        parent_id=row["parent_id"],
        parent_step=row["parent_step"],
        cursor=row["cursor"],
        executed=row["executed"],
        ending=row["ending"],
        error=row["error"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        waiting_for=row["waiting_for"],
        steps=tuple(
            StepRecord(
                idx=idx,
                name=name,
                status=StepState(status),
                attempt=attempt,
                key=key,
                result=result,
                error=error,
                compensated=compensated,
                started_at=started_at,
                finished_at=finished_at,
                retry_at=retry_at,
                attempts=tuple(attempts or ()),
            )
            for (
                idx,
                name,
                status,
                attempt,
                key,
                result,
                error,
                compensated,
                started_at,
                finished_at,
                retry_at,
                attempts,
            ) in steps
        ),
    )
