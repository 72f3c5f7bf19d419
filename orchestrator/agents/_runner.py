"""The agent loop: LLM turns through the provider gateway, tool calls, until a final answer,
the task's timeout or the turn limit.

- System prompt per mode (`MODES`); the first user message holds the context (the original
  prompt and earlier step results, each labelled) and then the task's prompt.
- Tools: those of the task's `tools` list (all registered ones when it has none) are offered,
  none when the model's server takes no tools and the task names none (naming some for such a
  model fails the task);
  a call to any other tool is refused to the model (an error tool result) and recorded as
  `audit.tool_denied`; an executed call is `audit.tool_executed` (with `ok` and duration).
- Tool calls: at most `agent_max_tool_calls` in all; a turn asking for more fails the task
  before any of its calls runs.
- Loops: the same tool with the same arguments `agent_loop_warn` times -> `agent.loop_warning`
  (and the model is told); `agent_loop_limit` times -> `agent.loop_detected`, the task fails.
- Context: when the conversation's estimate (4 characters a token) passes `agent_ctx_tokens`,
  `agent.context_overflow` is recorded and the oldest tool results are cut down first; the
  prompt and context are never cut.
- Events (all with the task's `user_uuid`): task.dispatched and worker.task_started on
  start, agent.turn_started/turn_completed per turn, then task.completed +
  worker.task_completed, or task.failed + worker.task_failed (timeout: status `timeout`).
- Parking (issue 32): a call under an `ask` policy rule, in a task that can wait (a
  workflow's task step), stops the run: the conversation is sealed (_checkpoint.py) and an
  intervention created with it, in one event transaction; the run returns status
  `waiting` (worker.task_completed says so; no task.completed), freeing its worker. Once a
  person decided, a run with `task.resume` (any worker) restores the conversation: the
  approved call runs (once: the engine takes the continuation once), a rejected or expired
  one answers the model "refused by a person: <reason>"; then the turn's other calls (each
  may ask again) and the next turns. The step's `timeout` bounds each run, not the wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

import asyncpg

from orchestrator.agents._checkpoint import Checkpoint, CheckpointUnreadable, seal, unseal
from orchestrator.agents._diagnostics import DiagnosticKind, diagnostic, malformed_arguments
from orchestrator.agents._emitter import Emitter
from orchestrator.agents._task import (
    MODES,
    AgentTask,
    TaskResult,
    TaskStatus,
    created_event,
    tools_refused,
)
from orchestrator.agents._tools import (
    FixedTools,
    Gate,
    TeamRoom,
    Tool,
    ToolContext,
    ToolFailed,
    ToolOutcome,
    ToolRegistry,
    ToolSource,
    Verdict,
    cut_utf8,
)
from orchestrator.config import Settings
from orchestrator.errors import OrchestratorError
from orchestrator.events import EventStore
from orchestrator.interventions import AttemptSuperseded
from orchestrator.observability import mask_secrets
from orchestrator.providers import (
    ChatRequest,
    Gateway,
    Message,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)

if TYPE_CHECKING:
    from cryptography.fernet import Fernet

    from orchestrator.interventions import InterventionStore

log = logging.getLogger(__name__)

# The id field of audit.tool_executed for a tool that has one (a user's MCP server or tool).
_ORIGIN = {"mcp": "mcp_server_id", "http": "http_tool_id"}
TRUNCATED = "[truncated: {n} characters of an older tool result, to fit the context]"
# Why a call under an `ask` rule is refused where nobody can be waited for.
NEEDS_A_PERSON = "needs a person's approval; only a workflow step can wait for one"


class TaskFailed(Exception):
    """Ends a task as failed with this message."""


class TaskParked(Exception):
    """Ends this run of a task as waiting for intervention `intervention_id`."""

    def __init__(self, intervention_id: str) -> None:
        super().__init__(intervention_id)
        self.intervention_id = intervention_id


class _Ask(Exception):
    """A call meets an `ask` rule in a task that can wait: park the run here."""

    def __init__(self, note: str) -> None:
        super().__init__(note)
        self.note = note


# What `_refusal` answers for a call that waits for a person.
_ASK = object()


class AgentRunner:
    def __init__(
        self,
        settings: Settings,
        gateway: Gateway,
        events: EventStore,
        tools: ToolRegistry | ToolSource,
        services: dict[str, Any] | None = None,
        *,
        interventions: InterventionStore | None = None,
        box: Fernet | None = None,
    ) -> None:
        """`interventions` and `box` (the deployment's secret box): where a task that can
        wait parks a call under an `ask` rule, and what seals its conversation. Without
        them, such a call is refused as everywhere else."""
        self._settings = settings
        self._interventions = interventions
        self._box = box
        self._gateway = gateway
        self._events = events
        self._tools: ToolSource = FixedTools(tools) if isinstance(tools, ToolRegistry) else tools
        self._services = dict(services or {})

    async def announce(self, task: AgentTask) -> None:
        """task.created: the task exists (dispatchers call it once, before the first run)."""
        await self._events.append([created_event(task, self._settings)])

    async def run(self, task: AgentTask, worker_id: str) -> TaskResult:
        """Run the task to its end; never raises for the task's own failure."""
        started = time.monotonic()
        status: TaskStatus = "completed"
        result: str | None = None
        error: str | None = None
        timeout = task.timeout_s or self._settings.agent_task_timeout_s
        emitter = Emitter(self._events, task)
        # A continuation after a person's decision says what it resumes.
        emitter.add(
            "task.dispatched", worker_id=worker_id, model=task.model, resumed_from=task.resume
        )
        emitter.add("worker.task_started", worker_id=worker_id, resumed_from=task.resume)
        emitter.flush_soon()
        loop = _Loop(self, task, emitter)
        waits_for: str | None = None
        try:
            async with asyncio.timeout(timeout), self._team(task, worker_id) as loop.team:
                result = await loop.run()
        except TaskParked as parked:
            status, waits_for = "waiting", parked.intervention_id
        except TimeoutError:
            status, error = "timeout", f"timed out after {timeout:g}s"
        except TaskFailed as exc:
            status, error = "failed", str(exc)
        except OrchestratorError as exc:  # the gateway's (ProviderError included)
            status, error = "failed", f"model call failed: {exc.message}"
        except BaseException:
            emitter.abandon()
            raise
        duration_ms = int((time.monotonic() - started) * 1000)
        outcome = TaskResult(
            task.task_id, status, result, error, duration_ms, worker_id, loop.turns, waits_for
        )
        common = {"worker_id": worker_id, "duration_ms": duration_ms}
        if status == "waiting":
            # Not an end of the task: only the worker's part of it ended.
            emitter.add("worker.task_completed", status="waiting", **common)
        elif outcome.ok:
            emitter.add("task.completed", status="completed", **common)
            emitter.add("worker.task_completed", status="completed", **common)
        else:
            failure = outcome.error or outcome.status
            emitter.add("task.failed", error=failure, status=outcome.status, **common)
            emitter.add("worker.task_failed", error=failure, status=outcome.status, **common)
        await emitter.flush()  # the outcome is durable (with everything before it)
        return outcome

    def _team(
        self, task: AgentTask, worker_id: str
    ) -> contextlib.AbstractAsyncContextManager[TeamRoom | None]:
        """Its agent team while it runs (issue 33): a coordinator's run opens it and, ending,
        stops its members (orchestrator/teams)."""
        host = self._services.get("teams")
        if task.team is None or host is None:
            return contextlib.nullcontext()
        return host.session(task, worker_id)  # type: ignore[no-any-return]


class _Loop:
    """One run of one task: the conversation and the counters."""

    def __init__(self, runner: AgentRunner, task: AgentTask, emitter: Emitter) -> None:
        self.runner = runner
        self.task = task
        self.emit = emitter.add
        self.emitter = emitter
        self.settings = runner._settings
        self.turns = 0
        self.tool_calls = 0
        self.calls: Counter[str] = Counter()
        self.warned: set[str] = set()
        self.messages: list[Message] = [Message("user", (TextBlock(self._opening()),))]
        self.registry = ToolRegistry()
        self.gate: Gate | None = None
        self.offered: list[Tool] = []
        self.allowed: set[str] = set()
        self.model = ""
        self.max_tokens = 0
        self.team: TeamRoom | None = None

    def _opening(self) -> str:
        parts = [f"## {label}\n{text}" for label, text in self.task.context]
        parts.append(f"## Task\n{self.task.prompt}" if parts else self.task.prompt)
        return "\n\n".join(parts)

    def _system(self) -> str:
        parts = [MODES.get(self.task.mode, MODES["general"])]
        # Marketplace skills pinned to the step: instructions after the mode's.
        parts.extend(f"## Skill: {label}\n{body}" for label, body in self.task.skills)
        if self.team is not None:
            parts.append(self.team.note)
        parts.append("When you are done, reply with the final answer only, no tool call.")
        return "\n\n".join(parts)

    async def _load_tools(self) -> None:
        """The task's tools: its user's (MCP, HTTP) with the service's, those of its step's
        list and its team's (issue 33), less what the policy denies (a denied tool is not
        offered; a call of it is still refused and audited)."""
        try:
            tools = await self.runner._tools.for_task(self.task.user_uuid)
        except (OrchestratorError, OSError, asyncpg.PostgresError) as exc:
            # The user's tools could not be read (the database is away): this task fails,
            # as its other database work would, with a reason.
            raise TaskFailed(f"could not read the task's tools: {exc}") from exc
        self.registry, self.gate = tools.registry, tools.gate
        offered = self.registry.offered(self.task.tools)
        if self.team is not None:
            own = [t for t in self.team.tools() if self.registry.get(t.name) is None]
            self.registry = self.registry.extended(own)
            offered.extend(own)
        if self.gate is not None:
            offered = [t for t in offered if self.gate.decide(t.name).allowed]
        self.offered = offered
        self.allowed = {t.name for t in offered}

    async def run(self) -> str:
        model = self.task.model or self.settings.default_model
        if not model:
            raise TaskFailed("no model: give the step a model or set default_model")
        await self._load_tools()
        if self.offered and await self.runner._gateway.takes_tools(model) is False:
            if self.task.tools:
                raise TaskFailed(tools_refused(model))
            # The step named no tools: its model's server takes none, so it gets none
            # rather than a call its server refuses.
            self.offered, self.allowed = [], set()
        max_tokens = self.settings.agent_max_tokens
        window = await self.runner._gateway.context_window(model)
        if window is not None:
            # A local server's window holds the prompt and the answer: one answer may fill
            # at most half of it, so that a later step given this result still fits (a
            # small model rambling to the limit made the next step's prompt overflow).
            max_tokens = max(1, min(max_tokens, window // 2))
        self.model, self.max_tokens = model, max_tokens
        first = 1
        if self.task.resume is not None:
            first = await self._resume()
            model, max_tokens = self.model, self.max_tokens
        for turn in range(first, self.settings.agent_max_turns + 1):
            self.turns = turn
            await self._fit_context()
            self.emit("agent.turn_started", turn=turn, model=model)
            # The model call as it starts, in the same batch, off the call's path (its id:
            # the task's turn; the upstream's own id is in audit.llm_decision).
            calling = {"model": model, "turn": turn, "messages": len(self.messages)}
            self.emit("inference.request", request_id=f"{self.task.task_id}:turn-{turn}", **calling)
            self.emitter.flush_soon()
            request = ChatRequest(
                model=model,
                messages=tuple(self.messages),
                system=self._system(),
                tools=tuple(t.definition() for t in self.offered),
                max_tokens=max_tokens,
                user=self.task.user_uuid,
            )
            response, route = await self.runner._gateway.complete(request)
            uses = [b for b in response.content if isinstance(b, ToolUseBlock)]
            self.emit(
                "agent.turn_completed",
                turn=turn,
                tokens_in=response.usage.input_tokens,
                tokens_out=response.usage.output_tokens,
                tool_calls=len(uses),
            )
            # Why the model did what it did: which tools it chose (names only), or the end.
            self.emit(
                "audit.llm_decision",
                request_id=response.id or f"{self.task.task_id}:turn-{turn}",
                model=response.model or model,
                provider=route.provider,
                decision="tool_calls" if uses else "final",
                tools=[u.name for u in uses],
                finish_reason=str(response.stop_reason),
                tokens_in=response.usage.input_tokens,
                tokens_out=response.usage.output_tokens,
                turn=turn,
                workflow_id=self.task.workflow_id,
                step=self.task.step,
                user_uuid=self.task.user_uuid,
            )
            if response.stop_reason == "max_tokens":
                self._diagnose("output_truncated", f"cut at the token limit ({max_tokens})")
            if not uses:
                return "".join(b.text for b in response.content if isinstance(b, TextBlock))
            self.tool_calls += len(uses)
            if self.tool_calls > self.settings.agent_max_tool_calls:
                # One turn may ask for any number of calls: bounded before any runs.
                raise TaskFailed(
                    f"tool call limit reached ({self.tool_calls} asked, at most "
                    f"{self.settings.agent_max_tool_calls}: agent_max_tool_calls)"
                )
            self.messages.append(Message("assistant", response.content))
            results = await self._calls(uses, turn, [], 0)
            self.emitter.flush_soon()
            self.messages.append(Message("user", tuple(results)))
        raise TaskFailed(f"turn limit reached ({self.settings.agent_max_turns} turns)")

    async def _calls(
        self, uses: list[ToolUseBlock], turn: int, done: list[ToolResultBlock], start: int
    ) -> list[ToolResultBlock]:
        """The turn's calls from `start` on, in order, after `done` (the results so far); a
        call that must wait for a person parks the run there."""
        for index in range(start, len(uses)):
            try:
                done.append(await self._call(uses[index], turn))
            except _Ask as ask:
                await self._park(uses, index, done, turn, ask.note)
        return done

    async def _call(self, use: ToolUseBlock, turn: int) -> ToolResultBlock:
        arguments = use.input if isinstance(use.input, dict) else {}
        if (bad := malformed_arguments(use.input)) is not None:
            self._diagnose("malformed_arguments", bad, tool=use.name)
        note = self._account(use, arguments, turn)
        masked = mask_secrets(arguments)
        tool = self.registry.get(use.name)
        refusal = self._refusal(use.name, tool, masked)
        if refusal is _ASK:
            raise _Ask(note)
        if refusal is not None:
            return _result(use, f"tool {use.name!r} refused: {refusal}{note}", error=True)
        assert tool is not None
        return await self._execute(use, tool, arguments, masked, note)

    def _account(self, use: ToolUseBlock, arguments: dict[str, Any], turn: int) -> str:
        """Count the call against the loop limits (the task fails at `agent_loop_limit`);
        the warning to append to its result, once `agent_loop_warn` is reached."""
        emit = self.emit
        key = f"{use.name}:{json.dumps(arguments, sort_keys=True, default=str)}"
        self.calls[key] += 1
        repeats = self.calls[key]
        if repeats >= self.settings.agent_loop_limit:
            emit(
                "agent.loop_detected",
                turn=turn,
                tool=use.name,
                repeats=repeats,
                action="task_failed",
            )
            raise TaskFailed(
                f"loop detected: {use.name} called {repeats} times with the same arguments"
            )
        note = ""
        if repeats >= self.settings.agent_loop_warn and key not in self.warned:
            self.warned.add(key)
            emit("agent.loop_warning", turn=turn, tool=use.name, repeats=repeats)
            note = (
                f"\n[warning: you called {use.name} {repeats} times with the same arguments; "
                "change approach or give the final answer]"
            )
        return note

    async def _execute(
        self,
        use: ToolUseBlock,
        tool: Tool,
        arguments: dict[str, Any],
        masked: dict[str, Any],
        note: str,
    ) -> ToolResultBlock:
        task, emit = self.task, self.emit
        ctx = ToolContext(task, self.settings, self.runner._services)
        started = time.monotonic()
        try:
            answer = await tool.handler(ctx, arguments)
            if isinstance(answer, ToolOutcome):
                text, ok = answer.text, not answer.is_error
            else:
                text, ok = answer, True
        except (ToolFailed, OrchestratorError) as exc:
            text, ok = f"error: {exc}", False
        except (ValueError, TypeError, KeyError, OSError) as exc:
            text, ok = f"error: {type(exc).__name__}: {exc}", False
        origin = {_ORIGIN.get(tool.source, "origin"): tool.origin} if tool.origin else {}
        emit(
            "audit.tool_executed",
            tool=use.name,
            source=tool.source,
            arguments=masked,
            ok=ok,
            duration_ms=int((time.monotonic() - started) * 1000),
            user_uuid=task.user_uuid,
            **origin,
        )
        return _result(
            use, cut_utf8(text, self.settings.tool_result_max_bytes) + note, error=not ok
        )

    def _refusal(
        self, name: str, tool: Tool | None, masked: dict[str, Any], *, approved: bool = False
    ) -> str | object | None:
        """Why a call may not run (recorded as audit.tool_denied; a policy refusal also as
        audit.permission_deny), `_ASK` when it waits for a person, or None. `approved`: a
        person approved it (an `ask` rule lets it run; a deny added since still refuses)."""
        verdict = self.gate.decide(name) if self.gate is not None and tool is not None else None
        if tool is None:
            reason = "no such tool"
            self._diagnose(
                "unknown_tool", "the model asked for a tool that does not exist", tool=name
            )
        elif verdict is not None and not verdict.allowed:
            return self._policy_refusal(name, tool, masked, verdict, verdict.reason)
        elif name not in self.allowed:
            reason = "not in this step's tools"
        elif verdict is not None and verdict.needs_approval and not approved:
            # An `ask` rule: only a task that can wait for a person's decision may run the
            # call once approved (a workflow step parks here: issue 32); every other task
            # refuses it as a deny.
            if self._can_park():
                return _ASK
            return self._policy_refusal(name, tool, masked, verdict, NEEDS_A_PERSON)
        else:
            return None
        self.emit("audit.tool_denied", tool=name, arguments=masked, reason=reason)
        return reason

    def _can_park(self) -> bool:
        runner, task = self.runner, self.task
        return (
            task.can_wait
            and task.workflow_id is not None
            and task.step is not None
            and runner._interventions is not None
            and runner._box is not None
        )

    async def _park(
        self,
        uses: list[ToolUseBlock],
        index: int,
        done: list[ToolResultBlock],
        turn: int,
        note: str,
    ) -> NoReturn:
        """Seal the conversation and create the intervention call `index` waits for, with
        `audit.intervention_pending`, in one transaction, after this task's queued events
        (the aggregate's order); then end the run as waiting."""
        task, runner, use = self.task, self.runner, uses[index]
        assert runner._interventions is not None and runner._box is not None
        assert task.workflow_id is not None and task.step is not None
        checkpoint = Checkpoint(
            messages=tuple(self.messages),
            done=tuple(done),
            index=index,
            turn=turn,
            tool_calls=self.tool_calls,
            model=self.model,
            max_tokens=self.max_tokens,
            calls=dict(self.calls),
            warned=tuple(sorted(self.warned)),
            note=note,
        )
        sealed = seal(checkpoint, runner._box)
        await self.emitter.flush()
        question = f"Run the tool {use.name}?\n\nStep {task.step}: {cut_utf8(task.prompt, 1000)}"
        try:
            async with runner._events.transaction() as tx:
                iv = await runner._interventions.create_in(
                    tx,
                    task_id=task.task_id,
                    workflow_id=task.workflow_id,
                    step=task.step,
                    user_uuid=task.user_uuid,
                    kind="tool",
                    tool=use.name,
                    arguments=use.input if isinstance(use.input, dict) else {},
                    question=question,
                    notify_channel=task.notify_channel,
                    timeout_s=task.approval_timeout_s,
                    checkpoint=sealed,
                )
        except AttemptSuperseded as exc:
            raise TaskFailed(f"attempt superseded: {exc.message}") from exc
        raise TaskParked(iv.id)

    async def _resume(self) -> int:
        """Restore the parked conversation of `task.resume`, settle its waiting call as the
        person decided, run the turn's remaining calls; the next turn's number."""
        runner, task = self.runner, self.task
        assert task.resume is not None
        if runner._interventions is None or runner._box is None:
            raise TaskFailed("cannot resume: this runner has no interventions store")
        try:
            held = await runner._interventions.for_resume(task.resume, task.task_id)
            if held.checkpoint is None:
                raise CheckpointUnreadable("no checkpoint")
            checkpoint = unseal(held.checkpoint, runner._box)
        except (OrchestratorError, CheckpointUnreadable) as exc:
            raise TaskFailed(f"cannot resume from {task.resume}: {exc}") from exc
        self.messages = list(checkpoint.messages)
        self.turns = checkpoint.turn
        self.tool_calls = checkpoint.tool_calls
        self.calls = Counter(checkpoint.calls)
        self.warned = set(checkpoint.warned)
        self.model, self.max_tokens = checkpoint.model, checkpoint.max_tokens
        uses = checkpoint.uses
        if not 0 <= checkpoint.index < len(uses):
            raise TaskFailed(f"cannot resume from {task.resume}: no call {checkpoint.index}")
        use, iv, note = uses[checkpoint.index], held.intervention, checkpoint.note
        arguments = use.input if isinstance(use.input, dict) else {}
        masked = mask_secrets(arguments)
        if iv.status == "approved":
            tool = self.registry.get(use.name)
            refusal = self._refusal(use.name, tool, masked, approved=True)
            if refusal is None:
                assert tool is not None
                result = await self._execute(use, tool, arguments, masked, note)
            else:
                text = f"tool {use.name!r} refused: {refusal}{note}"
                result = _result(use, text, error=True)
        else:
            reason = iv.reason or iv.status
            if iv.status == "expired":
                reason = "nobody decided in time (expired)"
            self.emit(
                "audit.tool_denied",
                tool=use.name,
                arguments=masked,
                reason=f"{iv.status}: {reason}",
                intervention_id=iv.id,
            )
            text = f"tool {use.name!r} refused by a person: {reason}{note}"
            result = _result(use, text, error=True)
        done = [*checkpoint.done, result]
        results = await self._calls(uses, checkpoint.turn, done, checkpoint.index + 1)
        self.emitter.flush_soon()
        self.messages.append(Message("user", tuple(results)))
        return checkpoint.turn + 1

    def _policy_refusal(
        self, name: str, tool: Tool, masked: dict[str, Any], verdict: Verdict, reason: str
    ) -> str:
        self.emit(
            "audit.tool_denied",
            tool=name,
            source=tool.source,
            arguments=masked,
            reason=reason,
            scope=verdict.scope,
        )
        self.emit(
            "audit.permission_deny",
            user_uuid=self.task.user_uuid,
            permission=f"tool:{name}",
            reason=reason,
            denied_by=f"{verdict.scope} tool policy",
            task_id=self.task.task_id,
            workflow_id=self.task.workflow_id,
        )
        return reason

    async def _fit_context(self) -> None:
        limit = self.settings.agent_ctx_tokens
        tokens = _estimate(self.messages)
        if tokens <= limit:
            return
        # Oldest tool results first; the opening message (prompt and context) is never cut.
        for i, message in enumerate(self.messages[1:], start=1):
            if _estimate(self.messages) <= limit:
                break
            if message.role != "user":
                continue
            blocks = tuple(_cut(b) for b in message.content)
            self.messages[i] = Message("user", blocks)
        after = _estimate(self.messages)
        self.emit(
            "agent.context_overflow",
            turn=self.turns,
            tokens=tokens,
            limit=limit,
            action=f"truncated older tool results to {after} tokens",
        )
        trimmed = f"older tool results cut from about {tokens} to {after} tokens (limit {limit})"
        self._diagnose("context_trimmed", trimmed, level="info")

    def _diagnose(self, kind: DiagnosticKind, detail: str, **more: Any) -> None:
        self.emit("agent.diagnostic", **diagnostic(kind, detail, self.turns, **more))


def _result(use: ToolUseBlock, text: str, *, error: bool) -> ToolResultBlock:
    return ToolResultBlock(use.id, (TextBlock(text),), is_error=error)


def _cut(block: Any) -> Any:
    if not isinstance(block, ToolResultBlock):
        return block
    size = sum(len(b.text) for b in block.content if isinstance(b, TextBlock))
    if size <= len(TRUNCATED) + 20:
        return block
    return ToolResultBlock(
        block.tool_use_id, (TextBlock(TRUNCATED.format(n=size)),), is_error=block.is_error
    )


def _estimate(messages: list[Message]) -> int:
    chars = 0
    for message in messages:
        for block in message.content:
            if isinstance(block, TextBlock):
                chars += len(block.text)
            elif isinstance(block, ToolResultBlock):
                chars += sum(len(b.text) for b in block.content if isinstance(b, TextBlock))
            elif isinstance(block, ToolUseBlock):
                chars += len(json.dumps(block.input, default=str)) + len(block.name)
    return chars // 4


class LocalDispatcher:
    """Runs tasks in this process (tests, and the HTTP app served without Ray)."""

    def __init__(
        self,
        runner: AgentRunner,
        worker_id: str = "local",
        on_busy: Callable[[int], None] | None = None,
    ) -> None:
        self._runner = runner
        self.worker_id = worker_id
        self.active = 0
        self._on_busy = on_busy  # called with 1 while a task runs, 0 when none does

    async def run(self, task: AgentTask) -> TaskResult:
        if not task.announced:
            await self._runner.announce(task)
        self.active += 1
        if self._on_busy is not None:
            self._on_busy(1)
        try:
            return await self._runner.run(task, self.worker_id)
        finally:
            self.active -= 1
            if self._on_busy is not None and self.active == 0:
                self._on_busy(0)
