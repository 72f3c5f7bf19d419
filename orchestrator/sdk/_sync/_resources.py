# Generated from orchestrator/sdk/_async/_resources.py by scripts/unasync_sdk.py: do not edit.
"""Channels, the skills marketplace, agent memory and workspace files."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

from orchestrator.sdk._base import Call, model_of
from orchestrator.sdk._requests import (
    as_dict,
    as_list,
    comma_list,
    given,
    idempotency,
    memory_path,
    seg,
)
from orchestrator.sdk._sync._core import SyncCore, offset_pages
from orchestrator.wire import (
    Channel,
    ChannelCreated,
    ChannelDeleted,
    ChannelList,
    ChannelUpdated,
    DirectoryListing,
    Encoding,
    FileContent,
    FileEdited,
    FileSearch,
    FileWritten,
    MemoryCleared,
    MemoryCopied,
    MemoryEntries,
    MemoryEntry,
    MemoryForgotten,
    MemoryOk,
    MemoryPinned,
    MemoryResults,
    MemoryStats,
    Reflections,
    ReportFiled,
    ReportPage,
    ReportsDismissed,
    SimilarResults,
    Skill,
    SkillDeleted,
    SkillDetail,
    SkillPage,
    SkillPublished,
    SkillReport,
    WebhookAck,
)

__all__ = ["SyncResources"]


class SyncResources(SyncCore):
    # --- channels --------------------------------------------------------------------------

    def channels(self) -> ChannelList:
        return self._send(Call("GET", "/channels", model_of(ChannelList)))

    def create_channel(
        self,
        type: Literal["slack", "teams", "telegram", "webhook"],
        name: str,
        config: Mapping[str, Any] | None = None,
    ) -> ChannelCreated:
        """The answer's `data.webhook_token` is shown only once."""
        body = {"type": type, "name": name, "config": dict(config or {})}
        return self._send(Call("POST", "/channels", model_of(ChannelCreated), body=body))

    def channel(self, channel_id: str) -> Channel:
        return self._send(Call("GET", f"/channels/{seg(channel_id)}", model_of(Channel)))

    def update_channel(
        self,
        channel_id: str,
        *,
        name: str | None = None,
        config: Mapping[str, Any] | None = None,
        status: Literal["active", "paused"] | None = None,
        rotate_token: bool = False,
    ) -> ChannelUpdated:
        """`config` is merged into the current one (a None value removes a key)."""
        body = given(
            name=name, config=as_dict(config), status=status, rotate_token=rotate_token or None
        )
        path = f"/channels/{seg(channel_id)}"
        return self._send(Call("PUT", path, model_of(ChannelUpdated), body=body))

    def delete_channel(self, channel_id: str) -> ChannelDeleted:
        path = f"/channels/{seg(channel_id)}"
        return self._send(Call("DELETE", path, model_of(ChannelDeleted)))

    def channel_webhook(
        self,
        token: str,
        payload: Mapping[str, Any],
        *,
        sync: bool = False,
        headers: Mapping[str, str] | None = None,
    ) -> WebhookAck:
        """Deliver a platform's payload to a channel (what Slack, Teams, Telegram or a generic
        webhook sender POSTs); `headers` carries their signatures."""
        call = Call(
            "POST",
            f"/channels/webhook/{seg(token)}",
            model_of(WebhookAck),
            body=dict(payload),
            params={"sync": "true"} if sync else None,
            headers=dict(headers) if headers else None,
        )
        return self._send(call)

    # --- marketplace -----------------------------------------------------------------------

    def browse_skills(
        self,
        sort: Literal["newest", "popular"] = "newest",
        *,
        tags: Sequence[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> SkillPage:
        params = given(sort=sort, tags=comma_list(tags), limit=limit, offset=offset)
        call = Call("GET", "/marketplace/browse", model_of(SkillPage), params=params)
        return self._send(call)

    def search_skills(
        self,
        q: str,
        *,
        tags: Sequence[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> SkillPage:
        params = given(q=q, tags=comma_list(tags), limit=limit, offset=offset)
        call = Call("GET", "/marketplace/search", model_of(SkillPage), params=params)
        return self._send(call)

    def iter_skills(
        self,
        q: str | None = None,
        *,
        sort: Literal["newest", "popular"] = "newest",
        tags: Sequence[str] | None = None,
        page_size: int = 50,
    ) -> Iterator[Skill]:
        """Search results when `q` is given, else the browse order."""

        def fetch(offset: int) -> list[Skill]:
            if q is not None:
                found = self.search_skills(q, tags=tags, limit=page_size, offset=offset)
            else:
                found = self.browse_skills(sort, tags=tags, limit=page_size, offset=offset)
            return found.items

        return offset_pages(fetch, page_size)

    def skill(self, name: str, *, author: str | None = None) -> SkillDetail:
        path = f"/marketplace/detail/{seg(name)}"
        call = Call("GET", path, model_of(SkillDetail), params=given(author=author))
        return self._send(call)

    def publish_skill(
        self,
        name: str,
        body: str,
        *,
        description: str = "",
        tags: Sequence[str] = (),
        idempotency_key: str | None = None,
    ) -> SkillPublished:
        """With `idempotency_key`, sending it again answers the first publish (no new
        version)."""
        payload = {"name": name, "description": description, "tags": list(tags), "body": body}
        call = Call(
            "POST",
            "/marketplace/publish",
            model_of(SkillPublished),
            body=payload,
            headers=idempotency(idempotency_key),
        )
        return self._send(call)

    def delete_skill(self, name: str, *, author: str | None = None) -> SkillDeleted:
        path = f"/marketplace/delete/{seg(name)}"
        call = Call("DELETE", path, model_of(SkillDeleted), params=given(author=author))
        return self._send(call)

    def report_skill(self, name: str, reason: str, *, author: str | None = None) -> ReportFiled:
        path = f"/marketplace/report/{seg(name)}"
        body = given(reason=reason, author=author)
        call = Call("POST", path, model_of(ReportFiled), body=body, params=given(author=author))
        return self._send(call)

    def skill_reports(self, limit: int = 100, offset: int = 0) -> ReportPage:
        """Admin: pending reports."""
        params = {"limit": limit, "offset": offset}
        return self._send(Call("GET", "/marketplace/reports", model_of(ReportPage), params=params))

    def iter_skill_reports(self, *, page_size: int = 100) -> Iterator[SkillReport]:
        def fetch(offset: int) -> list[SkillReport]:
            return (self.skill_reports(page_size, offset)).reports

        return offset_pages(fetch, page_size)

    def dismiss_reports(self, name: str, *, author: str | None = None) -> ReportsDismissed:
        """Admin."""
        path = f"/marketplace/dismiss/{seg(name)}"
        call = Call("POST", path, model_of(ReportsDismissed), params=given(author=author))
        return self._send(call)

    # --- memory ----------------------------------------------------------------------------

    def memory_stats(self) -> MemoryStats:
        return self._send(Call("GET", "/memory/stats", model_of(MemoryStats)))

    def memory_decay(self) -> MemoryForgotten:
        return self._send(Call("POST", "/memory/decay", model_of(MemoryForgotten)))

    def memory_share(self, source: str, target: str, *, pattern: str | None = None) -> MemoryCopied:
        """Copy entries from agent namespace `source` to `target` (the body's from/to)."""
        body = given(pattern=pattern) | {"from": source, "to": target}
        return self._send(Call("POST", "/memory/share", model_of(MemoryCopied), body=body))

    def memory_store(
        self,
        agent_id: str,
        key: str,
        value: str,
        *,
        ttl: int | None = None,
        embedding: Sequence[float] | None = None,
        idempotency_key: str | None = None,
    ) -> MemoryOk:
        """With `idempotency_key`, sending it again answers the first write (not written
        again)."""
        body = given(key=key, value=value, ttl=ttl, embedding=as_list(embedding))
        path = memory_path(agent_id, "store")
        headers = idempotency(idempotency_key)
        return self._send(Call("POST", path, model_of(MemoryOk), body=body, headers=headers))

    def memory_vector_search(
        self,
        agent_id: str,
        text: str | None = None,
        *,
        embedding: Sequence[float] | None = None,
        limit: int | None = None,
        threshold: float | None = None,
    ) -> SimilarResults:
        body = given(text=text, embedding=as_list(embedding), limit=limit, threshold=threshold)
        path = memory_path(agent_id, "vector-search")
        return self._send(Call("POST", path, model_of(SimilarResults), body=body))

    def memory_search(self, agent_id: str, q: str, *, limit: int | None = None) -> MemoryResults:
        params = given(q=q, limit=limit)
        path = memory_path(agent_id, "search")
        return self._send(Call("GET", path, model_of(MemoryResults), params=params))

    def memory_list(
        self, agent_id: str, *, limit: int | None = None, offset: int = 0
    ) -> MemoryEntries:
        """One page; `iter_memory` walks them all."""
        params = given(limit=limit, offset=offset or None)
        path = memory_path(agent_id, "list")
        return self._send(Call("GET", path, model_of(MemoryEntries), params=params))

    def iter_memory(self, agent_id: str, *, page_size: int = 100) -> Iterator[MemoryEntry]:
        def fetch(offset: int) -> list[MemoryEntry]:
            return (self.memory_list(agent_id, limit=page_size, offset=offset)).entries

        return offset_pages(fetch, page_size)

    def memory_reflections(self, agent_id: str) -> Reflections:
        path = memory_path(agent_id, "reflections")
        return self._send(Call("GET", path, model_of(Reflections)))

    def memory_clear(self, agent_id: str) -> MemoryCleared:
        return self._send(Call("DELETE", memory_path(agent_id, "clear"), model_of(MemoryCleared)))

    def memory_get(self, agent_id: str, key: str, *, user_uuid: str | None = None) -> MemoryEntry:
        """`user_uuid`: admins reading another owner's entry."""
        params = given(user_uuid=user_uuid)
        path = memory_path(agent_id, key)
        return self._send(Call("GET", path, model_of(MemoryEntry), params=params))

    def memory_delete(self, agent_id: str, key: str, *, user_uuid: str | None = None) -> MemoryOk:
        params = given(user_uuid=user_uuid)
        path = memory_path(agent_id, key)
        return self._send(Call("DELETE", path, model_of(MemoryOk), params=params))

    def memory_pin(
        self, agent_id: str, key: str, pinned: bool = True, *, user_uuid: str | None = None
    ) -> MemoryPinned:
        path = memory_path(agent_id, key, "pin")
        call = Call(
            "POST",
            path,
            model_of(MemoryPinned),
            body={"pinned": pinned},
            params=given(user_uuid=user_uuid),
        )
        return self._send(call)

    # --- workspace files -------------------------------------------------------------------

    def read_file(self, path: str) -> FileContent:
        body = {"path": path}
        return self._send(Call("POST", "/workspace/read", model_of(FileContent), body=body))

    def write_file(self, path: str, content: str, encoding: Encoding = "utf-8") -> FileWritten:
        """`encoding="base64"`: `content` is base64 of the bytes."""
        body = {"path": path, "content": content, "encoding": encoding}
        return self._send(Call("POST", "/workspace/write", model_of(FileWritten), body=body))

    def edit_file(self, path: str, old_text: str, new_text: str) -> FileEdited:
        """Replace the one occurrence of `old_text` (none or several: an ApiError)."""
        body = {"path": path, "old_text": old_text, "new_text": new_text}
        return self._send(Call("POST", "/workspace/edit", model_of(FileEdited), body=body))

    def search_files(self, pattern: str, *, max_results: int = 100) -> FileSearch:
        """Glob relative to the workspace root (`**/*.py`)."""
        body = {"query": pattern, "max_results": max_results}
        return self._send(Call("POST", "/workspace/search", model_of(FileSearch), body=body))

    def list_files(self, path: str = "", *, recursive: bool = False) -> DirectoryListing:
        params = {"path": path, "recursive": "true" if recursive else "false"}
        call = Call("GET", "/workspace/list", model_of(DirectoryListing), params=params)
        return self._send(call)
