"""The asyncio client: `Client`'s methods as coroutines, sending the same `Call`s (_calls.py)
with the same retry policy (_base.py) over an httpx.AsyncClient."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import aclosing
from types import TracebackType
from typing import Any, Literal, Self, TypeVar

import httpx

from orchestrator.sdk import _calls, _streams
from orchestrator.sdk._base import (
    ApiError,
    Call,
    RetryPolicy,
    SseFrame,
    SseParser,
    error_of,
    headers_for,
    read,
    reconnect_delay,
    resolve_options,
)
from orchestrator.sdk._calls import ScheduleOptions, StepSpec
from orchestrator.sdk._models import (
    Channel,
    ChannelCreated,
    ChannelDeleted,
    ChannelList,
    ChannelUpdated,
    ChatCompletion,
    ChatCompletionChunk,
    DirectoryListing,
    EmbeddingList,
    Encoding,
    Event,
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
    MessageStreamEvent,
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
    Skill,
    SkillDeleted,
    SkillDetail,
    SkillPage,
    SkillPublished,
    SkillReport,
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
    WorkflowSummary,
    WorkflowTemplates,
)
from orchestrator.sdk._tools import AsyncToolMethods

__all__ = ["AsyncClient"]

T = TypeVar("T")


class AsyncClient(AsyncToolMethods):
    """Asynchronous client: the same methods as `Client`, as coroutines (iterators and
    streams as async iterators). Use with `async with`, or `aclose()`. `http_client` is an
    httpx.AsyncClient."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        token: str | None = None,
        timeout: float = 30.0,
        max_retries: int = 2,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self.base_url, self.api_key = resolve_options(base_url, api_key or token)
        self.timeout = timeout
        self.retry = RetryPolicy(max_retries=max_retries)
        self._headers = headers_for(self.api_key)
        self._owns_http = http_client is None
        self._http = http_client if http_client is not None else httpx.AsyncClient(timeout=timeout)

    @classmethod
    def in_cluster(
        cls,
        token: str | None = None,
        *,
        app_name: str = "orchestrator",
        handle: Any = None,
        timeout: float = 30.0,
        max_retries: int = 2,
    ) -> AsyncClient:
        """From a program on the Ray cluster (a driver joined with `ray.init`, a Ray job):
        requests go over the application's `Api` deployment handle instead of HTTP, acting
        as `token` (default $ORCH_API_KEY) with the same auth, limits and ownership
        (orchestrator/sdk/_in_cluster.py). Imports Ray when called."""
        from orchestrator.sdk._in_cluster import in_cluster_async_client

        return in_cluster_async_client(
            token, app_name=app_name, handle=handle, timeout=timeout, max_retries=max_retries
        )

    @property
    def max_retries(self) -> int:
        return self.retry.max_retries

    async def _request(self, call: Call[Any], *, stream: bool = False) -> httpx.Response:
        attempt = 0
        while True:
            request = self._http.build_request(
                call.method,
                self.base_url + call.path,
                json=call.body,
                params=call.params,
                headers={**self._headers, **(call.headers or {})},
                timeout=self.timeout,
            )
            try:
                response = await self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                if attempt >= self.max_retries or not self.retry.should_retry_error(
                    call.method, exc
                ):
                    raise
                delay = self.retry.delay(attempt, None)
            else:
                if attempt >= self.max_retries or not self.retry.should_retry_status(
                    call, response
                ):
                    return response
                delay = self.retry.delay(attempt, response)
                await response.aclose()
            attempt += 1
            await asyncio.sleep(delay)

    async def _send(self, call: Call[T]) -> T:
        return read(call, await self._request(call))

    async def _sse(self, call: Call[None], parser: SseParser) -> AsyncGenerator[SseFrame, None]:
        response = await self._request(call, stream=True)
        try:
            if not response.is_success:
                await response.aread()
                raise error_of(response)
            async for line in response.aiter_lines():
                frame = parser.line(line)
                if frame is not None:
                    yield frame
        finally:
            await response.aclose()

    # --- operations and tokens ---------------------------------------------------------

    async def health(self) -> Health:
        """Service health; returned (not raised) when degraded: check `.status`."""
        return await self._send(_calls.health())

    async def ready(self) -> str:
        return await self._send(_calls.ready())

    async def metrics(self) -> str:
        """Prometheus text exposition."""
        return await self._send(_calls.metrics())

    async def slo(self) -> Slo:
        return await self._send(_calls.slo())

    async def whoami(self) -> WhoAmI:
        return await self._send(_calls.whoami())

    async def create_token(
        self,
        user_uuid: str,
        admin: bool = False,
        description: str = "",
        *,
        expires_in: int | None = None,
        expires_at: int | None = None,
    ) -> TokenCreated:
        """Issue a token for `user_uuid` (admin only); it expires `expires_in` seconds from
        now or at `expires_at` (Unix ms), never when neither is given."""
        return await self._send(
            _calls.create_token(user_uuid, admin, description, expires_in, expires_at)
        )

    async def revoke_token(self, prefix: str) -> TokenRevoked:
        return await self._send(_calls.revoke_token(prefix))

    # --- workflows -----------------------------------------------------------------------

    async def create_workflow(
        self,
        name: str | None = None,
        steps: Sequence[StepSpec] | None = None,
        *,
        template: str | None = None,
        variables: Mapping[str, Any] | None = None,
        model: str | None = None,
    ) -> WorkflowCreated:
        """Inline (`name`, `steps`) or from a template; it starts at once."""
        return await self._send(_calls.create_workflow(name, steps, template, variables, model))

    async def workflow(self, workflow_id: str) -> Workflow:
        return await self._send(_calls.workflow(workflow_id))

    async def workflows(
        self,
        status: str | None = None,
        parent: str | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> WorkflowPage:
        """One page; `iter_workflows` walks them all."""
        return await self._send(_calls.workflows(status, parent, limit, offset))

    async def cancel_workflow(self, workflow_id: str) -> WorkflowCancelled:
        return await self._send(_calls.cancel_workflow(workflow_id))

    async def delete_workflow(self, workflow_id: str) -> WorkflowDeleted:
        return await self._send(_calls.delete_workflow(workflow_id))

    async def save_template(
        self, name: str, steps: Sequence[StepSpec], shared: bool = False
    ) -> TemplateSaved:
        return await self._send(_calls.save_template(name, steps, shared))

    async def templates(self) -> WorkflowTemplates:
        return await self._send(_calls.templates())

    # --- schedules (admin) -----------------------------------------------------------------

    async def create_schedule(
        self,
        prompt: str,
        *,
        name: str | None = None,
        cron: str | None = None,
        every: int | None = None,
        at: int | None = None,
        schedule: str | None = None,
        tz: str | None = None,
        model: str | None = None,
        opts: ScheduleOptions | None = None,
        delete_after_run: bool = False,
    ) -> JobCreated:
        """One of `cron` (5 fields), `every` (ms), `at` (Unix ms) or `schedule` (a phrase)."""
        call = _calls.create_schedule(
            prompt, name, cron, every, at, schedule, tz, model, opts, delete_after_run
        )
        return await self._send(call)

    async def preview_schedule(
        self,
        *,
        cron: str | None = None,
        every: int | None = None,
        at: int | None = None,
        schedule: str | None = None,
        tz: str | None = None,
        count: int | None = None,
    ) -> SchedulePreview:
        """The next `count` (5) runs of a job with this schedule created now; stores nothing."""
        return await self._send(_calls.preview_schedule(cron, every, at, schedule, tz, count))

    async def schedules(self, page: int = 1, per_page: int | None = None) -> JobPage:
        """One page; `iter_schedules` walks them all."""
        return await self._send(_calls.schedules(page, per_page))

    async def schedule(self, job_id: int) -> Job:
        return await self._send(_calls.schedule(job_id))

    async def delete_schedule(self, job_id: int) -> JobStatus:
        return await self._send(_calls.job_action(job_id, "delete"))

    async def pause_schedule(self, job_id: int) -> JobStatus:
        return await self._send(_calls.job_action(job_id, "pause"))

    async def unpause_schedule(self, job_id: int) -> JobStatus:
        return await self._send(_calls.job_action(job_id, "unpause"))

    async def run_schedule(self, job_id: int) -> JobStatus:
        return await self._send(_calls.job_action(job_id, "run"))

    # --- events ----------------------------------------------------------------------------

    async def events(
        self,
        aggregate: str = "all",
        *,
        user_uuid: str | None = None,
        types: Sequence[str] | None = None,
        from_seq: int = 0,
        limit: int | None = None,
        offset: int = 0,
    ) -> EventPage:
        """One page of stored events, oldest first; `iter_events` walks them all."""
        return await self._send(_calls.events(aggregate, user_uuid, types, from_seq, limit, offset))

    # --- inference instances, models, providers --------------------------------------------

    async def instances(self) -> InstanceList:
        return await self._send(_calls.instances())

    async def start_instance(
        self,
        model: str,
        *,
        gpu_layers: int | None = None,
        ctx_size: int | None = None,
        threads: int | None = None,
    ) -> InstanceState:
        return await self._send(_calls.start_instance(model, gpu_layers, ctx_size, threads))

    async def instance(self, instance_id: str) -> InstanceDetail:
        return await self._send(_calls.instance(instance_id))

    async def stop_instance(self, instance_id: str) -> InstanceState:
        return await self._send(_calls.stop_instance(instance_id))

    async def stop_all_instances(self) -> InstancesStopped:
        return await self._send(_calls.stop_all_instances())

    async def models(self) -> ModelList:
        return await self._send(_calls.models())

    async def embeddings(
        self,
        input: str | Sequence[str],
        *,
        model: str,
        encoding_format: str | None = None,
        dimensions: int | None = None,
    ) -> EmbeddingList:
        """POST /embeddings (OpenAI's shape): `model` is `local` (all-MiniLM-L6-v2) or a
        provider's embedding model."""
        return await self._send(_calls.embeddings(model, input, encoding_format, dimensions))

    async def model(self, model_id: str) -> Model:
        """One model in OpenAI's shape; 404 model_not_found when unknown."""
        return await self._send(_calls.model(model_id))

    async def discover_models(self) -> ModelsDiscovered:
        """Admin: scan for local models again."""
        return await self._send(_calls.discover_models())

    async def providers_health(self) -> ProvidersStatus:
        return await self._send(_calls.providers_health())

    async def provider_health(self, provider: str) -> ProviderStatusDetail:
        return await self._send(_calls.provider_health(provider))

    # --- chat: OpenAI chat completions and Anthropic messages (thin) ----------------------

    async def chat_completion(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> ChatCompletion:
        """POST /chat/completions. Fields not named here go in `extra_body`, as in
        openai-python; `chat_completion_stream` streams."""
        body = _calls.chat_body(model, messages, max_tokens, temperature, tools, extra_body, False)
        return await self._send(_calls.chat_completion(body))

    async def message(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        max_tokens: int = 1024,
        temperature: float | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> Message:
        """POST /messages (Anthropic's shape; `system` etc. go in `extra_body`)."""
        body = _calls.chat_body(model, messages, max_tokens, temperature, tools, extra_body, False)
        return await self._send(_calls.message(body))

    # --- channels --------------------------------------------------------------------------

    async def channels(self) -> ChannelList:
        return await self._send(_calls.channels())

    async def create_channel(
        self,
        type: Literal["slack", "teams", "telegram", "webhook"],
        name: str,
        config: Mapping[str, Any] | None = None,
    ) -> ChannelCreated:
        """The answer's `data.webhook_token` is shown only once."""
        return await self._send(_calls.create_channel(type, name, config))

    async def channel(self, channel_id: str) -> Channel:
        return await self._send(_calls.channel(channel_id))

    async def update_channel(
        self,
        channel_id: str,
        *,
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        status: Literal["active", "paused"] | None = None,
        rotate_token: bool = False,
    ) -> ChannelUpdated:
        """`config` is merged into the current one (a None value removes a key)."""
        call = _calls.update_channel(channel_id, name, config, status, rotate_token)
        return await self._send(call)

    async def delete_channel(self, channel_id: str) -> ChannelDeleted:
        return await self._send(_calls.delete_channel(channel_id))

    async def channel_webhook(
        self,
        token: str,
        payload: Mapping[str, Any],
        *,
        sync: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> WebhookAck:
        """Deliver a platform's payload to a channel (what Slack, Teams, Telegram or a generic
        webhook sender POSTs); `headers` carries their signatures."""
        return await self._send(_calls.channel_webhook(token, payload, sync, headers))

    # --- marketplace -----------------------------------------------------------------------

    async def browse_skills(
        self,
        sort: Literal["newest", "popular"] = "newest",
        *,
        tags: Sequence[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> SkillPage:
        return await self._send(_calls.browse_skills(sort, tags, limit, offset))

    async def search_skills(
        self,
        q: str,
        *,
        tags: Sequence[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> SkillPage:
        return await self._send(_calls.search_skills(q, tags, limit, offset))

    async def skill(self, name: str, *, author: str | None = None) -> SkillDetail:
        return await self._send(_calls.skill(name, author))

    async def publish_skill(
        self, name: str, body: str, *, description: str = "", tags: Sequence[str] = ()
    ) -> SkillPublished:
        return await self._send(_calls.publish_skill(name, body, description, tags))

    async def delete_skill(self, name: str, *, author: str | None = None) -> SkillDeleted:
        return await self._send(_calls.delete_skill(name, author))

    async def report_skill(
        self, name: str, reason: str, *, author: str | None = None
    ) -> ReportFiled:
        return await self._send(_calls.report_skill(name, reason, author))

    async def skill_reports(self, limit: int = 100, offset: int = 0) -> ReportPage:
        """Admin: pending reports."""
        return await self._send(_calls.skill_reports(limit, offset))

    async def dismiss_reports(self, name: str, *, author: str | None = None) -> ReportsDismissed:
        """Admin."""
        return await self._send(_calls.dismiss_reports(name, author))

    # --- memory ----------------------------------------------------------------------------

    async def memory_stats(self) -> MemoryStats:
        return await self._send(_calls.memory_stats())

    async def memory_decay(self) -> MemoryForgotten:
        return await self._send(_calls.memory_decay())

    async def memory_share(
        self, source: str, target: str, *, pattern: str | None = None
    ) -> MemoryCopied:
        """Copy entries from agent namespace `source` to `target` (the body's from/to)."""
        return await self._send(_calls.memory_share(source, target, pattern))

    async def memory_store(
        self,
        agent_id: str,
        key: str,
        value: str,
        *,
        ttl: int | None = None,
        embedding: Sequence[float] | None = None,
    ) -> MemoryOk:
        return await self._send(_calls.memory_store(agent_id, key, value, ttl, embedding))

    async def memory_vector_search(
        self,
        agent_id: str,
        text: str | None = None,
        *,
        embedding: Sequence[float] | None = None,
        limit: int | None = None,
        threshold: float | None = None,
    ) -> SimilarResults:
        call = _calls.memory_vector_search(agent_id, text, embedding, limit, threshold)
        return await self._send(call)

    async def memory_search(
        self, agent_id: str, q: str, *, limit: int | None = None
    ) -> MemoryResults:
        return await self._send(_calls.memory_search(agent_id, q, limit))

    async def memory_list(
        self, agent_id: str, *, limit: int | None = None, offset: int = 0
    ) -> MemoryEntries:
        """One page; `iter_memory` walks them all."""
        return await self._send(_calls.memory_list(agent_id, limit, offset))

    async def memory_reflections(self, agent_id: str) -> Reflections:
        return await self._send(_calls.memory_reflections(agent_id))

    async def memory_clear(self, agent_id: str) -> MemoryCleared:
        return await self._send(_calls.memory_clear(agent_id))

    async def memory_get(
        self, agent_id: str, key: str, *, user_uuid: str | None = None
    ) -> MemoryEntry:
        """`user_uuid`: admins reading another owner's entry."""
        return await self._send(_calls.memory_get(agent_id, key, user_uuid))

    async def memory_delete(
        self, agent_id: str, key: str, *, user_uuid: str | None = None
    ) -> MemoryOk:
        return await self._send(_calls.memory_delete(agent_id, key, user_uuid))

    async def memory_pin(
        self, agent_id: str, key: str, pinned: bool = True, *, user_uuid: str | None = None
    ) -> MemoryPinned:
        return await self._send(_calls.memory_pin(agent_id, key, pinned, user_uuid))

    # --- workspace files -------------------------------------------------------------------

    async def read_file(self, path: str) -> FileContent:
        return await self._send(_calls.read_file(path))

    async def write_file(
        self, path: str, content: str, encoding: Encoding = "utf-8"
    ) -> FileWritten:
        """`encoding="base64"`: `content` is base64 of the bytes."""
        return await self._send(_calls.write_file(path, content, encoding))

    async def edit_file(self, path: str, old_text: str, new_text: str) -> FileEdited:
        """Replace the one occurrence of `old_text` (none or several: an ApiError)."""
        return await self._send(_calls.edit_file(path, old_text, new_text))

    async def search_files(self, pattern: str, *, max_results: int = 100) -> FileSearch:
        """Glob relative to the workspace root (`**/*.py`)."""
        return await self._send(_calls.search_files(pattern, max_results))

    async def list_files(self, path: str = "", *, recursive: bool = False) -> DirectoryListing:
        return await self._send(_calls.list_files(path, recursive))

    # --- iterators over paginated lists ----------------------------------------------------

    def iter_workflows(
        self, status: str | None = None, parent: str | None = None, *, page_size: int = 100
    ) -> AsyncIterator[WorkflowSummary]:
        async def fetch(offset: int) -> list[WorkflowSummary]:
            return (await self.workflows(status, parent, page_size, offset)).data

        return _offset_pages(fetch, page_size)

    async def iter_schedules(self, *, page_size: int = 100) -> AsyncIterator[Job]:
        page = 1
        while True:
            found = await self.schedules(page, page_size)
            for item in found.items:
                yield item
            if len(found.items) < page_size or page * page_size >= found.total:
                return
            page += 1

    def iter_events(
        self,
        aggregate: str = "all",
        *,
        user_uuid: str | None = None,
        types: Sequence[str] | None = None,
        from_seq: int = 0,
        page_size: int = 100,
    ) -> AsyncIterator[Event]:
        """Every stored event that matches, oldest first, a page at a time."""

        async def fetch(offset: int) -> list[Event]:
            page = await self.events(
                aggregate,
                user_uuid=user_uuid,
                types=types,
                from_seq=from_seq,
                limit=page_size,
                offset=offset,
            )
            return page.data

        return _offset_pages(fetch, page_size)

    def iter_skills(
        self,
        q: str | None = None,
        *,
        sort: Literal["newest", "popular"] = "newest",
        tags: Sequence[str] | None = None,
        page_size: int = 50,
    ) -> AsyncIterator[Skill]:
        """Search results when `q` is given, else the browse order."""

        async def fetch(offset: int) -> list[Skill]:
            if q is not None:
                found = await self.search_skills(q, tags=tags, limit=page_size, offset=offset)
            else:
                found = await self.browse_skills(sort, tags=tags, limit=page_size, offset=offset)
            return found.items

        return _offset_pages(fetch, page_size)

    def iter_skill_reports(self, *, page_size: int = 100) -> AsyncIterator[SkillReport]:
        async def fetch(offset: int) -> list[SkillReport]:
            return (await self.skill_reports(page_size, offset)).reports

        return _offset_pages(fetch, page_size)

    def iter_memory(self, agent_id: str, *, page_size: int = 100) -> AsyncIterator[MemoryEntry]:
        async def fetch(offset: int) -> list[MemoryEntry]:
            return (await self.memory_list(agent_id, limit=page_size, offset=offset)).entries

        return _offset_pages(fetch, page_size)

    # --- streams ---------------------------------------------------------------------------

    async def sync_events(
        self,
        aggregate: str = "all",
        *,
        user_uuid: str | None = None,
        types: Sequence[str] | None = None,
        from_seq: int = 0,
        last_event_id: int | None = None,
        reconnect: bool = True,
    ) -> AsyncGenerator[Event, None]:
        """Live events; reconnects with Last-Event-ID as `Client.sync_events` does."""
        last, failures, parser = last_event_id, 0, SseParser()
        while True:
            call = _calls.sync_events(aggregate, user_uuid, types, from_seq, last)
            try:
                async with aclosing(self._sse(call, parser)) as frames:
                    async for frame in frames:
                        failures = 0
                        event = _streams.sync_event(frame)
                        if event is not None:
                            last = _streams.event_position(frame, event)
                            yield event
            except ApiError as exc:
                if exc.code != "subscriber_too_slow":
                    raise
            except httpx.TransportError:
                failures += 1
                if not reconnect or failures > self.max_retries:
                    raise
            if not reconnect:
                return
            await asyncio.sleep(reconnect_delay(self.retry, parser, failures))

    async def chat_completion_stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> AsyncGenerator[ChatCompletionChunk, None]:
        """POST /chat/completions with `stream: true`: the chunks, up to `[DONE]`."""
        body = _calls.chat_body(model, messages, max_tokens, temperature, tools, extra_body, True)
        call = _calls.streamed(_calls.chat_completion(body))
        async with aclosing(self._sse(call, SseParser())) as frames:
            async for frame in frames:
                chunk = _streams.chat_chunk(frame)
                if chunk is None:
                    return
                yield chunk

    async def message_stream(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        model: str | None = None,
        max_tokens: int = 1024,
        temperature: float | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        extra_body: Mapping[str, Any] | None = None,
    ) -> AsyncGenerator[MessageStreamEvent, None]:
        """POST /messages with `stream: true`: message_start ... message_stop."""
        body = _calls.chat_body(model, messages, max_tokens, temperature, tools, extra_body, True)
        call = _calls.streamed(_calls.message(body))
        async with aclosing(self._sse(call, SseParser())) as frames:
            async for frame in frames:
                event = _streams.message_event(frame)
                if event is not None:
                    yield event

    # --- lifetime --------------------------------------------------------------------------

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"AsyncClient({self.base_url!r})"


async def _offset_pages(
    fetch: Callable[[int], Awaitable[Sequence[T]]], page_size: int
) -> AsyncIterator[T]:
    offset = 0
    while True:
        items = await fetch(offset)
        for item in items:
            yield item
        if len(items) < page_size:
            return
        offset += len(items)
