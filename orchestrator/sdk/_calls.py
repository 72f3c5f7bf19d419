"""Every endpoint of the API, described once as a `Call` (method, path, body, query, how to
read the answer). `Client` and `AsyncClient` only send these.

Path segments are escaped here (`_seg`), so an id or a key can never reach another route.
The agent-tools endpoints are described in _tool_calls.py, the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypedDict
from urllib.parse import quote

from orchestrator.sdk._base import Call, model_of, query, text_of
from orchestrator.sdk._models import (
    Channel,
    ChannelCreated,
    ChannelDeleted,
    ChannelList,
    ChannelUpdated,
    ChatCompletion,
    DirectoryListing,
    EmbeddingList,
    Encoding,
    EventPage,
    FileContent,
    FileEdited,
    FileSearch,
    FileWritten,
    Health,
    InstanceDetail,
    InstanceList,
    InstancesStopped,
    InstanceState,
    Job,
    JobCreated,
    JobPage,
    JobStatus,
    MemoryCleared,
    MemoryCopied,
    MemoryEntries,
    MemoryEntry,
    MemoryForgotten,
    MemoryOk,
    MemoryPinned,
    MemoryResults,
    MemoryStats,
    Message,
    Model,
    ModelList,
    ModelsDiscovered,
    ProvidersStatus,
    ProviderStatusDetail,
    Reflections,
    ReportFiled,
    ReportPage,
    ReportsDismissed,
    SchedulePreview,
    SimilarResults,
    SkillDeleted,
    SkillDetail,
    SkillPage,
    SkillPublished,
    Slo,
    TemplateSaved,
    TokenCreated,
    TokenRevoked,
    WebhookAck,
    WhoAmI,
    Workflow,
    WorkflowCancelled,
    WorkflowCreated,
    WorkflowDeleted,
    WorkflowPage,
    WorkflowTemplates,
)


class StepSpec(TypedDict, total=False):
    """One workflow step as POST /workflows and templates take it (SPEC part 4)."""

    name: str
    prompt: str
    mode: str
    tools: list[str]
    timeout: float
    condition: str
    type: Literal["branch", "spawn"]
    conditions: dict[str, Any]
    workflows: list[dict[str, Any]]
    compensate: str | dict[str, Any]


class ScheduleOptions(TypedDict, total=False):
    """`opts` of a scheduled job."""

    mode: Literal["build", "plan", "explore", "review", "general", "coordinate"]
    tools: list[str]
    timeout: float
    tz: str
    overlap: Literal["skip", "allow", "queue"]


def _seg(value: str | int) -> str:
    return quote(str(value), safe="")


def _tags(tags: Sequence[str] | None) -> str | None:
    return None if tags is None else ",".join(tags)


# --- operations and tokens -----------------------------------------------------------------


def health() -> Call[Health]:
    return Call("GET", "/health", model_of(Health), answers=frozenset({503}))


def ready() -> Call[str]:
    return Call("GET", "/ready", text_of)


def metrics() -> Call[str]:
    return Call("GET", "/metrics", text_of)


def slo() -> Call[Slo]:
    return Call("GET", "/slo", model_of(Slo))


def whoami() -> Call[WhoAmI]:
    return Call("GET", "/whoami", model_of(WhoAmI))


def create_token(
    user_uuid: str,
    admin: bool,
    description: str,
    expires_in: int | None = None,
    expires_at: int | None = None,
) -> Call[TokenCreated]:
    body: dict[str, Any] = {"user_uuid": user_uuid, "admin": admin, "description": description}
    if expires_in is not None:
        body["expires_in"] = expires_in
    if expires_at is not None:
        body["expires_at"] = expires_at
    return Call("POST", "/tokens", model_of(TokenCreated), body=body)


def revoke_token(prefix: str) -> Call[TokenRevoked]:
    return Call("DELETE", f"/tokens/{_seg(prefix)}", model_of(TokenRevoked))


# --- workflows -----------------------------------------------------------------------------


def create_workflow(
    name: str | None,
    steps: Sequence[StepSpec] | None,
    template: str | None,
    variables: Mapping[str, Any] | None,
    model: str | None,
) -> Call[WorkflowCreated]:
    body = query(
        name=name,
        steps=None if steps is None else list(steps),
        template=template,
        variables=None if variables is None else dict(variables),
        model=model,
    )
    return Call("POST", "/workflows", model_of(WorkflowCreated), body=body)


def workflow(workflow_id: str) -> Call[Workflow]:
    return Call("GET", f"/workflows/{_seg(workflow_id)}", model_of(Workflow))


def workflows(
    status: str | None, parent: str | None, limit: int | None, offset: int
) -> Call[WorkflowPage]:
    params = query(status=status, parent=parent, limit=limit, offset=offset)
    return Call("GET", "/workflows", model_of(WorkflowPage), params=params)


def cancel_workflow(workflow_id: str) -> Call[WorkflowCancelled]:
    return Call("POST", f"/workflows/{_seg(workflow_id)}/cancel", model_of(WorkflowCancelled))


def delete_workflow(workflow_id: str) -> Call[WorkflowDeleted]:
    return Call("DELETE", f"/workflows/{_seg(workflow_id)}", model_of(WorkflowDeleted))


def save_template(name: str, steps: Sequence[StepSpec], shared: bool) -> Call[TemplateSaved]:
    body = {"name": name, "steps": list(steps), "shared": shared}
    return Call("POST", "/workflows/templates", model_of(TemplateSaved), body=body)


def templates() -> Call[WorkflowTemplates]:
    return Call("GET", "/workflows/templates", model_of(WorkflowTemplates))


# --- schedules -----------------------------------------------------------------------------


def create_schedule(
    prompt: str,
    name: str | None,
    cron: str | None,
    every: int | None,
    at: int | None,
    schedule: str | None,
    tz: str | None,
    model: str | None,
    opts: ScheduleOptions | None,
    delete_after_run: bool,
) -> Call[JobCreated]:
    body = query(
        prompt=prompt,
        name=name,
        cron=cron,
        every=every,
        at=at,
        schedule=schedule,
        tz=tz,
        model=model,
        opts=None if opts is None else dict(opts),
        delete_after_run=delete_after_run or None,
    )
    return Call("POST", "/schedules", model_of(JobCreated), body=body)


def preview_schedule(
    cron: str | None,
    every: int | None,
    at: int | None,
    schedule: str | None,
    tz: str | None,
    count: int | None,
) -> Call[SchedulePreview]:
    body = query(cron=cron, every=every, at=at, schedule=schedule, tz=tz, count=count)
    return Call("POST", "/schedules/preview", model_of(SchedulePreview), body=body)


def schedules(page: int, per_page: int | None) -> Call[JobPage]:
    return Call("GET", "/schedules", model_of(JobPage), params=query(page=page, per_page=per_page))


def schedule(job_id: int) -> Call[Job]:
    return Call("GET", f"/schedules/{int(job_id)}", model_of(Job))


def job_action(
    job_id: int, action: Literal["delete", "pause", "unpause", "run"]
) -> Call[JobStatus]:
    if action == "delete":
        return Call("DELETE", f"/schedules/{int(job_id)}", model_of(JobStatus))
    return Call("POST", f"/schedules/{int(job_id)}/{action}", model_of(JobStatus))


# --- events --------------------------------------------------------------------------------


def events(
    aggregate: str,
    user_uuid: str | None,
    types: Sequence[str] | None,
    from_seq: int,
    limit: int | None,
    offset: int,
) -> Call[EventPage]:
    params = query(
        aggregate=aggregate,
        user_uuid=user_uuid,
        types=_tags(types),
        from_seq=from_seq or None,
        limit=limit,
        offset=offset or None,
    )
    return Call("GET", "/events", model_of(EventPage), params=params)


def sync_events(
    aggregate: str,
    user_uuid: str | None,
    types: Sequence[str] | None,
    from_seq: int,
    last_event_id: int | None,
) -> Call[None]:
    params = query(aggregate=aggregate, user_uuid=user_uuid, types=_tags(types))
    if last_event_id is None and from_seq:
        params["from_seq"] = from_seq
    headers = {"Accept": "text/event-stream", "Cache-Control": "no-cache"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    return Call("GET", "/sync-events", _no_body, params=params, headers=headers)


def _no_body(_: object) -> None:
    return None


# --- inference instances, models, providers, chat ------------------------------------------


def instances() -> Call[InstanceList]:
    return Call("GET", "/inference", model_of(InstanceList))


def start_instance(
    model: str, gpu_layers: int | None, ctx_size: int | None, threads: int | None
) -> Call[InstanceState]:
    body = query(model=model, gpu_layers=gpu_layers, ctx_size=ctx_size, threads=threads)
    return Call("POST", "/inference", model_of(InstanceState), body=body)


def instance(instance_id: str) -> Call[InstanceDetail]:
    return Call("GET", f"/inference/{_seg(instance_id)}", model_of(InstanceDetail))


def stop_instance(instance_id: str) -> Call[InstanceState]:
    return Call("POST", "/stop", model_of(InstanceState), body={"id": instance_id})


def stop_all_instances() -> Call[InstancesStopped]:
    return Call("POST", "/stop-all", model_of(InstancesStopped))


def models() -> Call[ModelList]:
    return Call("GET", "/models", model_of(ModelList))


def model(model_id: str) -> Call[Model]:
    return Call("GET", f"/models/{_seg(model_id)}", model_of(Model))


def discover_models() -> Call[ModelsDiscovered]:
    return Call("POST", "/discover", model_of(ModelsDiscovered))


def providers_health() -> Call[ProvidersStatus]:
    return Call("GET", "/providers/health", model_of(ProvidersStatus))


def provider_health(provider: str) -> Call[ProviderStatusDetail]:
    return Call("GET", f"/providers/health/{_seg(provider)}", model_of(ProviderStatusDetail))


def chat_body(
    model: str | None,
    messages: Sequence[Mapping[str, Any]],
    max_tokens: int | None,
    temperature: float | None,
    tools: Sequence[Mapping[str, Any]] | None,
    extra_body: Mapping[str, Any] | None,
    stream: bool,
) -> dict[str, Any]:
    body: dict[str, Any] = {**(extra_body or {}), "messages": [dict(m) for m in messages]}
    given = query(
        model=model,
        max_tokens=max_tokens,
        temperature=temperature,
        tools=None if tools is None else [dict(t) for t in tools],
    )
    body.update(given)
    if stream:
        body["stream"] = True
    return body


def chat_completion(body: dict[str, Any]) -> Call[ChatCompletion]:
    return Call("POST", "/chat/completions", model_of(ChatCompletion), body=body)


def embeddings(
    model: str, input: str | Sequence[str], encoding_format: str | None, dimensions: int | None
) -> Call[EmbeddingList]:
    body: dict[str, Any] = {
        "model": model,
        "input": input if isinstance(input, str) else list(input),
    }
    if encoding_format is not None:
        body["encoding_format"] = encoding_format
    if dimensions is not None:
        body["dimensions"] = dimensions
    return Call("POST", "/embeddings", model_of(EmbeddingList), body=body)


def message(body: dict[str, Any]) -> Call[Message]:
    return Call("POST", "/messages", model_of(Message), body=body)


def streamed(call: Call[Any]) -> Call[None]:
    """The same request, answered as Server-Sent Events."""
    return Call(
        call.method, call.path, _no_body, body=call.body, headers={"Accept": "text/event-stream"}
    )


# --- channels ------------------------------------------------------------------------------


def channels() -> Call[ChannelList]:
    return Call("GET", "/channels", model_of(ChannelList))


def create_channel(type_: str, name: str, config: Mapping[str, Any] | None) -> Call[ChannelCreated]:
    body = {"type": type_, "name": name, "config": dict(config or {})}
    return Call("POST", "/channels", model_of(ChannelCreated), body=body)


def channel(channel_id: str) -> Call[Channel]:
    return Call("GET", f"/channels/{_seg(channel_id)}", model_of(Channel))


def update_channel(
    channel_id: str,
    name: str | None,
    config: Mapping[str, Any] | None,
    status: Literal["active", "paused"] | None,
    rotate_token: bool,
) -> Call[ChannelUpdated]:
    body: dict[str, Any] = query(
        name=name, config=None if config is None else dict(config), status=status
    )
    if rotate_token:
        body["rotate_token"] = True
    return Call("PUT", f"/channels/{_seg(channel_id)}", model_of(ChannelUpdated), body=body)


def delete_channel(channel_id: str) -> Call[ChannelDeleted]:
    return Call("DELETE", f"/channels/{_seg(channel_id)}", model_of(ChannelDeleted))


def channel_webhook(
    token: str, payload: Mapping[str, Any], sync: bool, headers: Mapping[str, str] | None
) -> Call[WebhookAck]:
    return Call(
        "POST",
        f"/channels/webhook/{_seg(token)}",
        model_of(WebhookAck),
        body=dict(payload),
        params={"sync": "true"} if sync else None,
        headers=dict(headers) if headers else None,
    )


# --- marketplace ---------------------------------------------------------------------------


def browse_skills(
    sort: Literal["newest", "popular"], tags: Sequence[str] | None, limit: int | None, offset: int
) -> Call[SkillPage]:
    params = query(sort=sort, tags=_tags(tags), limit=limit, offset=offset)
    return Call("GET", "/marketplace/browse", model_of(SkillPage), params=params)


def search_skills(
    q: str, tags: Sequence[str] | None, limit: int | None, offset: int
) -> Call[SkillPage]:
    params = query(q=q, tags=_tags(tags), limit=limit, offset=offset)
    return Call("GET", "/marketplace/search", model_of(SkillPage), params=params)


def skill(name: str, author: str | None) -> Call[SkillDetail]:
    path = f"/marketplace/detail/{_seg(name)}"
    return Call("GET", path, model_of(SkillDetail), params=query(author=author))


def publish_skill(
    name: str, body: str, description: str, tags: Sequence[str]
) -> Call[SkillPublished]:
    payload = {"name": name, "description": description, "tags": list(tags), "body": body}
    return Call("POST", "/marketplace/publish", model_of(SkillPublished), body=payload)


def delete_skill(name: str, author: str | None) -> Call[SkillDeleted]:
    path = f"/marketplace/delete/{_seg(name)}"
    return Call("DELETE", path, model_of(SkillDeleted), params=query(author=author))


def report_skill(name: str, reason: str, author: str | None) -> Call[ReportFiled]:
    path = f"/marketplace/report/{_seg(name)}"
    body = query(reason=reason, author=author)
    return Call("POST", path, model_of(ReportFiled), body=body, params=query(author=author))


def skill_reports(limit: int, offset: int) -> Call[ReportPage]:
    params = {"limit": limit, "offset": offset}
    return Call("GET", "/marketplace/reports", model_of(ReportPage), params=params)


def dismiss_reports(name: str, author: str | None) -> Call[ReportsDismissed]:
    path = f"/marketplace/dismiss/{_seg(name)}"
    return Call("POST", path, model_of(ReportsDismissed), params=query(author=author))


# --- memory --------------------------------------------------------------------------------


def _mem(agent_id: str, *rest: str) -> str:
    return "/memory/" + "/".join(_seg(p) for p in (agent_id, *rest))


def memory_stats() -> Call[MemoryStats]:
    return Call("GET", "/memory/stats", model_of(MemoryStats))


def memory_decay() -> Call[MemoryForgotten]:
    return Call("POST", "/memory/decay", model_of(MemoryForgotten))


def memory_share(source: str, target: str, pattern: str | None) -> Call[MemoryCopied]:
    body = query(pattern=pattern) | {"from": source, "to": target}
    return Call("POST", "/memory/share", model_of(MemoryCopied), body=body)


def memory_store(
    agent_id: str, key: str, value: str, ttl: int | None, embedding: Sequence[float] | None
) -> Call[MemoryOk]:
    body = query(
        key=key, value=value, ttl=ttl, embedding=None if embedding is None else list(embedding)
    )
    return Call("POST", _mem(agent_id, "store"), model_of(MemoryOk), body=body)


def memory_vector_search(
    agent_id: str,
    text: str | None,
    embedding: Sequence[float] | None,
    limit: int | None,
    threshold: float | None,
) -> Call[SimilarResults]:
    body = query(
        text=text,
        embedding=None if embedding is None else list(embedding),
        limit=limit,
        threshold=threshold,
    )
    return Call("POST", _mem(agent_id, "vector-search"), model_of(SimilarResults), body=body)


def memory_search(agent_id: str, q: str, limit: int | None) -> Call[MemoryResults]:
    params = query(q=q, limit=limit)
    return Call("GET", _mem(agent_id, "search"), model_of(MemoryResults), params=params)


def memory_list(agent_id: str, limit: int | None, offset: int) -> Call[MemoryEntries]:
    params = query(limit=limit, offset=offset or None)
    return Call("GET", _mem(agent_id, "list"), model_of(MemoryEntries), params=params)


def memory_reflections(agent_id: str) -> Call[Reflections]:
    return Call("GET", _mem(agent_id, "reflections"), model_of(Reflections))


def memory_clear(agent_id: str) -> Call[MemoryCleared]:
    return Call("DELETE", _mem(agent_id, "clear"), model_of(MemoryCleared))


def memory_get(agent_id: str, key: str, user_uuid: str | None) -> Call[MemoryEntry]:
    params = query(user_uuid=user_uuid)
    return Call("GET", _mem(agent_id, key), model_of(MemoryEntry), params=params)


def memory_delete(agent_id: str, key: str, user_uuid: str | None) -> Call[MemoryOk]:
    params = query(user_uuid=user_uuid)
    return Call("DELETE", _mem(agent_id, key), model_of(MemoryOk), params=params)


def memory_pin(agent_id: str, key: str, pinned: bool, user_uuid: str | None) -> Call[MemoryPinned]:
    path = _mem(agent_id, key, "pin")
    params = query(user_uuid=user_uuid)
    return Call("POST", path, model_of(MemoryPinned), body={"pinned": pinned}, params=params)


# --- workspace -----------------------------------------------------------------------------


def read_file(path: str) -> Call[FileContent]:
    return Call("POST", "/workspace/read", model_of(FileContent), body={"path": path})


def write_file(path: str, content: str, encoding: Encoding) -> Call[FileWritten]:
    body = {"path": path, "content": content, "encoding": encoding}
    return Call("POST", "/workspace/write", model_of(FileWritten), body=body)


def edit_file(path: str, old_text: str, new_text: str) -> Call[FileEdited]:
    body = {"path": path, "old_text": old_text, "new_text": new_text}
    return Call("POST", "/workspace/edit", model_of(FileEdited), body=body)


def search_files(pattern: str, max_results: int) -> Call[FileSearch]:
    body = {"query": pattern, "max_results": max_results}
    return Call("POST", "/workspace/search", model_of(FileSearch), body=body)


def list_files(path: str, recursive: bool) -> Call[DirectoryListing]:
    params = {"path": path, "recursive": "true" if recursive else "false"}
    return Call("GET", "/workspace/list", model_of(DirectoryListing), params=params)
