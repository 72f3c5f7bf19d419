"""The channel relay: each inbox item is answered by an agent task run as the channel owner
(with the conversation's last turns as context), then delivered back to the platform, with
retries and backoff. A ChannelHub actor runs one relay per shard of channels; without Ray,
the API process runs one for all.

Durable at every step: the item is in Postgres before the webhook was answered; its answer and
the conversation turns are written in one transaction before delivery starts; a relay that
restarts picks up whatever is still `pending` (answer again) or `sending` (deliver again).
Items of one conversation are handled in order, one at a time.

Ownership (orchestrator/runtime/claims.py): a relay handles an item only under its claim
(kind `channel_item`, keyed by the inbox id), and every write of the item checks that claim's
epoch in its transaction. A relay whose claim ran out and was taken over (a paused process,
an old hub generation) gets StaleClaim on its next write or renewal, writes nothing and
stops handling the item; the new holder finishes it. The claim is renewed right before a
delivery, so a message goes out at most once per holder."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import httpx

from orchestrator.agents import AgentTask, TaskDispatcher
from orchestrator.channels._platforms import (
    DeliveryFailed,
    send_slack,
    send_teams,
    send_telegram,
    send_webhook,
)
from orchestrator.channels._store import CLAIM_KIND, Channel, ChannelStore, InboxItem
from orchestrator.config import Settings
from orchestrator.runtime.backoff import Backoff
from orchestrator.runtime.claims import ClaimStore, Fence, StaleClaim
from orchestrator.runtime.supervisor import Supervisor, cancel_and_wait

log = logging.getLogger(__name__)

POLL_CLAMP_S = 5.0
MAX_RETRY_S = 300.0

Sender = Callable[..., Awaitable[None]]
SENDERS: dict[str, Sender] = {
    "slack": send_slack,
    "teams": send_teams,
    "telegram": send_telegram,
    "webhook": send_webhook,
}


class ChannelRunner(Protocol):
    """Where the API hands a just-received inbox item: the ChannelHub actors under Ray, a
    relay in the API process without."""

    async def submit(self, channel_id: str, inbox_id: int) -> None: ...

    async def answer(self, channel_id: str, inbox_id: int, within: float) -> str | None: ...

    async def wake_posts(self, channel_id: str) -> None:
        """An intervention of this channel was decided: send its question's update now
        rather than at the poster's next poll (issue 32)."""

    async def close(self) -> None: ...


class ChannelRelay:
    def __init__(
        self,
        store: ChannelStore,
        dispatcher: TaskDispatcher,
        settings: Settings,
        http: httpx.AsyncClient,
        *,
        shard: int = 0,
        shards: int = 1,
        name: str = "local",
    ) -> None:
        """`name` owns this relay's claims: a relay restarted under the same name takes its
        predecessor's claims back at once (with a new epoch, fencing the predecessor off)."""
        self._store = store
        self._dispatcher = dispatcher
        self._settings = settings
        # Deliveries retried later: exact doublings (the wait is stored with the item).
        self._retry_backoff = Backoff(base=settings.channel_retry_base_s, cap=MAX_RETRY_S, jitter=0)
        self._http = http
        self._shard = shard
        self._shards = shards
        self._name = name
        # Longer than any agent task plus its delivery, so a live claim never runs out while
        # its item is handled (renewed after a wait for the conversation, before a delivery,
        # and by run_forever while held).
        self._lease_s = max(600.0, settings.agent_task_timeout_s + 120.0)
        self._claims = ClaimStore(store.pool, int(self._lease_s * 1000))
        self._fences: dict[int, Fence] = {}
        self._renewed = time.monotonic()
        self._wake = asyncio.Event()
        self._inflight: dict[int, asyncio.Task[str | None]] = {}
        self._conversations: dict[tuple[str, str], asyncio.Lock] = {}
        self._waiting: dict[tuple[str, str], int] = {}
        self.processed = 0

    # --- entry points ----------------------------------------------------------------------

    def submit(self, inbox_id: int) -> None:
        """Handle this item soon (it is already in the inbox)."""
        self._start(inbox_id)

    async def answer(self, inbox_id: int, within: float) -> str | None:
        """Handle the item and wait for its answer (synchronous generic webhooks)."""
        task = self._start(inbox_id)
        return await asyncio.wait_for(asyncio.shield(task), within)

    async def run_forever(self) -> None:
        """Pick up due items (new ones, retries, leftovers of a restart) until cancelled."""
        while True:
            try:
                await self._renew_held()
                for inbox_id in await self._store.due(self._shard, self._shards, self._name):
                    self._start(inbox_id)
                nxt = await self._store.next_due(self._shard, self._shards)
            except Exception as exc:  # noqa: BLE001 - the database may be restarting
                log.warning("channel relay %s: %r", self._shard, exc)
                nxt = None
            delay = POLL_CLAMP_S
            if nxt is not None:
                delay = max(0.05, min(POLL_CLAMP_S, (nxt - time.time() * 1000) / 1000))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    async def _renew_held(self) -> None:
        """Every third of the lease, renew the claims of the items in hand (one may wait
        long for its conversation). A lost one is left to its next write to notice."""
        if time.monotonic() - self._renewed < self._lease_s / 3:
            return
        self._renewed = time.monotonic()
        for fence in list(self._fences.values()):
            with contextlib.suppress(StaleClaim):
                await self._claims.renew(fence)

    async def close(self) -> None:
        tasks = list(self._inflight.values())
        await cancel_and_wait(tasks)

    # --- one item --------------------------------------------------------------------------

    def _start(self, inbox_id: int) -> asyncio.Task[str | None]:
        task = self._inflight.get(inbox_id)
        if task is None:
            task = asyncio.create_task(self._guarded(inbox_id), name=f"channel item {inbox_id}")
            self._inflight[inbox_id] = task
            task.add_done_callback(lambda _t: self._inflight.pop(inbox_id, None))
        return task

    async def _guarded(self, inbox_id: int) -> str | None:
        try:
            return await self._process(inbox_id)
        except asyncio.CancelledError:
            raise
        except StaleClaim as exc:
            # Taken over (our claim ran out): the new holder finishes it. Not a failure.
            log.info("channel item %s: no longer ours, stopping (%s)", inbox_id, exc)
            return None
        except Exception:  # the database itself may be down: picked up again when due
            log.exception("channel item %s", inbox_id)
            return None
        finally:
            self._wake.set()

    async def _process(self, inbox_id: int) -> str | None:
        item = await self._store.item(inbox_id)
        if item is None or item.state in ("done", "failed"):
            return item.answer if item is not None else None
        fence = await self._claims.acquire(CLAIM_KIND, str(inbox_id), self._name)
        if fence is None:
            return None  # another relay has it
        self._fences[inbox_id] = fence
        try:
            return await self._in_order(item, fence)
        except (asyncio.CancelledError, StaleClaim):
            raise
        except Exception as exc:
            # Retried later with backoff and counted like a failed delivery (given up after
            # channel_delivery_attempts): never at once, so a poisoned item cannot spin.
            log.exception("channel item %s", inbox_id)
            fresh = await self._store.item(inbox_id)
            if fresh is not None:
                await self._charge(fresh, DeliveryFailed(type(exc).__name__, retryable=True), fence)
            return None
        finally:
            self._fences.pop(inbox_id, None)
            with contextlib.suppress(Exception):
                # Usually released already, by the write that ended our handling of it.
                # Shielded: a cancelled relay (drain, shutdown) still hands the claim back.
                await asyncio.shield(self._claims.release(fence))

    async def _in_order(self, item: InboxItem, fence: Fence) -> str | None:
        inbox_id = item.id
        key = (item.channel_id, item.conversation)
        lock = self._conversations.setdefault(key, asyncio.Lock())
        self._waiting[key] = self._waiting.get(key, 0) + 1
        try:
            waited = lock.locked()
            async with lock:
                if waited:  # earlier items of the conversation may have taken long
                    await self._claims.renew(fence)
                return await self._process_locked(inbox_id, fence)
        finally:
            self._waiting[key] -= 1
            if not self._waiting[key]:  # nobody else waits on this conversation
                del self._waiting[key]
                self._conversations.pop(key, None)

    async def _process_locked(self, inbox_id: int, fence: Fence) -> str | None:
        item = await self._store.item(inbox_id)  # fresh, now that it is our turn
        if item is None or item.state in ("done", "failed"):
            return item.answer if item is not None else None
        channel = await self._store.load(item.channel_id)
        if channel is None:
            return None  # deleted meanwhile: its inbox went with it
        if item.state == "pending":
            item = await self._answer(channel, item, fence)
        if item.state == "sending":
            await self._deliver(channel, item, fence)
        self.processed += 1
        return item.answer

    async def _answer(self, channel: Channel, item: InboxItem, fence: Fence) -> InboxItem:
        history = await self._store.history(
            channel.id, item.conversation, self._settings.channel_history_turns
        )
        context: list[tuple[str, str]] = []
        if history:
            context.append(
                ("Conversation so far (oldest first)", "\n".join(f"{r}: {t}" for r, t in history))
            )
        who = f" from {item.sender}" if item.sender else ""
        context.append(("Channel", f"{channel.type} channel {channel.name!r}; message{who}"))
        task_id = f"chan-{item.id}"
        result = await self._dispatcher.run(
            AgentTask(
                task_id=task_id,
                user_uuid=channel.user_uuid,
                prompt=item.text,
                context=tuple(context),
                idempotency_key=task_id,
            )
        )
        if result.ok and result.result:
            answer = result.result
        else:
            answer = "Sorry, I could not answer that just now."
            log.warning(
                "channel %s item %s: task %s %s", channel.id, item.id, task_id, result.error
            )
        # A generic webhook without a callback has nowhere to send to: its answers are in the
        # task's events (or, with ?sync=true, in the webhook's own response).
        deliver = not item.reply.get("sync") and not (
            channel.type == "webhook" and not channel.config.get("callback_url")
        )
        await self._store.answered(item, answer, task_id, deliver=deliver, fence=fence)
        fresh = await self._store.item(item.id)
        assert fresh is not None
        return fresh

    async def _deliver(self, channel: Channel, item: InboxItem, fence: Fence) -> None:
        assert item.answer is not None
        sender = SENDERS[channel.type]
        base = self._settings.channel_api_base_urls.get(channel.type)
        # Still ours, for a whole lease from now: no other relay sends this meanwhile.
        await self._claims.renew(fence)
        try:
            # webhook_url is kept with the secrets (it is a credential): senders see it all.
            config = {**channel.config, **channel.secrets}
            await sender(
                self._http, config, channel.secrets, item.reply, item.answer, base_url=base
            )
        except DeliveryFailed as exc:
            await self._charge(item, exc, fence)
            return
        await self._store.sent(item.id, fence=fence)
        await self._store.delivered(channel.id)

    async def _charge(self, item: InboxItem, exc: DeliveryFailed, fence: Fence) -> None:
        """Retry later with backoff, or give up (while `fence` holds: StaleClaim, and no
        charge, otherwise); count it against the channel."""
        s = self._settings
        channel_id = item.channel_id
        message = str(exc)
        attempt = item.attempts + 1
        if exc.retryable and attempt < s.channel_delivery_attempts:
            delay = self._retry_backoff.delay(attempt)
            if exc.retry_after is not None:
                delay = max(delay, min(MAX_RETRY_S, exc.retry_after))
            await self._store.retry_later(item.id, message, delay, fence=fence)
            log.warning(
                "channel %s: delivery of item %s failed (%s); retry %d in %.1fs",
                channel_id,
                item.id,
                message,
                attempt,
                delay,
            )
        else:
            await self._store.give_up(item.id, message, fence=fence)
            log.warning("channel %s: item %s not delivered: %s", channel_id, item.id, message)
        status = await self._store.delivery_failed(channel_id, message, s.channel_error_after)
        if status == "error":
            log.error("channel %s is in error after repeated delivery failures", channel_id)


def reply_of(inbound_reply: Mapping[str, Any], sync: bool) -> dict[str, Any]:
    out = dict(inbound_reply)
    if sync:
        out["sync"] = True
    return out


class Wakeable(Protocol):
    def wake(self) -> None: ...

    async def run_forever(self) -> None: ...


class LocalChannels:
    """Without Ray: one relay in the API process for every channel (and, given one, the
    intervention poster beside it)."""

    def __init__(
        self, relay: ChannelRelay, supervisor: Supervisor, poster: Wakeable | None = None
    ) -> None:
        self._relay = relay
        self._poster = poster
        self._task = supervisor.spawn("channel-relay", relay.run_forever)
        self._posts = (
            supervisor.spawn("intervention-posts", poster.run_forever)
            if poster is not None
            else None
        )

    async def submit(self, channel_id: str, inbox_id: int) -> None:
        self._relay.submit(inbox_id)

    async def answer(self, channel_id: str, inbox_id: int, within: float) -> str | None:
        return await self._relay.answer(inbox_id, within)

    async def wake_posts(self, channel_id: str) -> None:
        if self._poster is not None:
            self._poster.wake()

    async def close(self) -> None:
        await cancel_and_wait([t for t in (self._task, self._posts) if t is not None])
        await self._relay.close()
