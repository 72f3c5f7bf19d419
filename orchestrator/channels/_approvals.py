"""Interventions on channels (issue 32): the poster that puts each question on its channel
with Approve/Reject buttons and, once decided, updates it; and the desk that turns a
verified button press (or a webhook's signed link) into a decision.

**The poster** (`InterventionPoster.run_forever`) runs beside the channel relay: in each
ChannelHub actor for its shard of channels, or in the API process when served without Ray.
It sends the due rows of the outbox (orchestrator/channels/_posts.py) under their claims,
retries a failure with the house Backoff like the relay's deliveries
(`channel_retry_base_s`, up to `channel_delivery_attempts`), keeps the question's `ref`,
and edits that message when the decision's outcome post falls due. It polls at least every
5 s; nothing is lost in between, the rows are in Postgres.

**The desk** (`InterventionDesk`) decides for a platform user only when the channel lists
them in `approvers` (anyone else is told no, and nothing is written), and only an
intervention whose question went to this channel (the store checks). The store decides
once: a second press is told who decided, a platform's replay of the same press (its
interaction id) decides nothing twice. A decision that releases a parked workflow starts
it (else the engines' sweep would, within a period). `settled` is also what the API's
approve/reject call after deciding (deployments/routers/interventions.py): one way to wake
the channel's poster, so the question's update goes out at once whoever decided.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from orchestrator.channels._asks import TeamsTokens, send_ask, send_outcome, send_teams_note
from orchestrator.channels._interactive import Press
from orchestrator.channels._platforms import DeliveryFailed, _post
from orchestrator.channels._posts import POST_CLAIM, Post, PostStore
from orchestrator.channels._store import Channel, ChannelStore
from orchestrator.config import Settings
from orchestrator.errors import Conflict, Forbidden, NotFound
from orchestrator.interventions import Decided, Decider, InterventionStore
from orchestrator.interventions._links import Link, LinkSigner
from orchestrator.runtime.backoff import Backoff
from orchestrator.runtime.claims import ClaimStore, Fence, StaleClaim

__all__ = ["Answer", "InterventionDesk", "InterventionPoster"]

log = logging.getLogger(__name__)

POLL_CLAMP_S = 5.0
MAX_RETRY_S = 300.0
LEASE_S = 120.0  # longer than one post's calls (token + send, 30 s timeouts each)


class Starter(Protocol):
    async def start(self, workflow_id: str) -> None: ...


class InterventionPoster:
    def __init__(
        self,
        posts: PostStore,
        interventions: InterventionStore,
        channels: ChannelStore,
        settings: Settings,
        http: httpx.AsyncClient,
        *,
        signer: LinkSigner | None = None,
        shard: int = 0,
        shards: int = 1,
        name: str = "local",
    ) -> None:
        self._posts = posts
        self._interventions = interventions
        self._channels = channels
        self._settings = settings
        self._http = http
        self._signer = signer
        self._shard, self._shards = shard, shards
        self._name = f"{name}/posts"
        self._claims = ClaimStore(channels.pool, int(LEASE_S * 1000))
        self._backoff = Backoff(base=settings.channel_retry_base_s, cap=MAX_RETRY_S, jitter=0)
        self._tokens = TeamsTokens()
        self._wake = asyncio.Event()
        self.sent = 0

    def wake(self) -> None:
        self._wake.set()

    async def run_forever(self) -> None:
        while True:
            try:
                for post in await self._posts.due(self._shard, self._shards, self._name):
                    await self.handle(post)
                nxt = await self._posts.next_due(self._shard, self._shards)
            except Exception as exc:  # noqa: BLE001 - the database may be restarting
                log.warning("intervention posts %s: %r", self._shard, exc)
                nxt = None
            delay = POLL_CLAMP_S
            if nxt is not None:
                delay = max(0.05, min(POLL_CLAMP_S, (nxt - time.time() * 1000) / 1000))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    async def handle(self, post: Post) -> None:
        """Send one post under its claim (skipped when another poster holds it)."""
        fence = await self._claims.acquire(POST_CLAIM, post.key, self._name)
        if fence is None:
            return
        try:
            await self._send(post, fence)
        except StaleClaim as exc:
            log.info("intervention post %s: no longer ours (%s)", post.key, exc)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("intervention post %s", post.key)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._claims.release(fence))

    async def _send(self, post: Post, fence: Fence) -> None:
        fresh = await self._posts.load(post.intervention_id, post.kind)
        if fresh is None or fresh.state != "pending":
            return
        iv = await self._interventions.load(post.intervention_id)
        channel = await self._channels.load(post.channel_id)
        if iv is None or channel is None:
            await self._posts.drop(fresh, "intervention or channel deleted", fence=fence)
            return
        config = {**channel.config, **channel.secrets}
        bases = self._settings.channel_api_base_urls
        ref: dict[str, Any] | None = None
        try:
            if fresh.kind == "ask":
                ref = await send_ask(
                    self._http,
                    channel.type,
                    config,
                    iv,
                    bases=bases,
                    tokens=self._tokens,
                    signer=self._signer,
                    public_url=self._settings.public_url,
                )
            else:
                ask = await self._posts.load(post.intervention_id, "ask")
                if ask is None or ask.state != "sent" or ask.ref is None:
                    await self._posts.drop(fresh, "its question was never posted", fence=fence)
                    return
                await send_outcome(
                    self._http, channel.type, config, iv, ask.ref, bases=bases, tokens=self._tokens
                )
        except DeliveryFailed as exc:
            await self._charge(fresh, exc, fence)
            return
        await self._posts.sent(fresh, ref, fence=fence)
        await self._channels.delivered(channel.id)
        self.sent += 1

    async def _charge(self, post: Post, exc: DeliveryFailed, fence: Fence) -> None:
        attempt = post.attempts + 1
        if exc.retryable and attempt < self._settings.channel_delivery_attempts:
            delay = self._backoff.delay(attempt)
            if exc.retry_after is not None:
                delay = max(delay, min(MAX_RETRY_S, exc.retry_after))
            await self._posts.retry_later(post, str(exc), delay, fence=fence)
            log.warning("intervention post %s: %s; retry in %.1fs", post.key, exc, delay)
        else:
            await self._posts.give_up(post, str(exc), fence=fence)
            log.warning("intervention post %s not sent: %s", post.key, exc)
        # Counted like an answer's failed delivery: repeated failures put the channel in
        # `error`, where its owner sees `last_error`.
        s = self._settings
        await self._channels.delivery_failed(post.channel_id, str(exc), s.channel_error_after)


@dataclass(frozen=True)
class Answer:
    """What to tell the person who pressed: `decided` when this press (or its replay)
    decided; `text` for them (an ephemeral message, an alert, an invoke's answer)."""

    decided: bool
    text: str
    result: Decided | None = None


class InterventionDesk:
    """Decisions from channels, in the API process."""

    def __init__(
        self,
        interventions: InterventionStore,
        channels: ChannelStore,
        runner: Starter,
        http: httpx.AsyncClient,
        signer: LinkSigner,
        *,
        bases: Mapping[str, str] | None = None,
        on_decided: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        """`bases`: the platforms' API base URLs (settings.channel_api_base_urls);
        `on_decided(channel_id)`: after each decision (wakes the channel's poster, so the
        question's update goes out at once rather than at its next poll)."""
        self._interventions = interventions
        self._channels = channels
        self._runner = runner
        self._http = http
        self.signer = signer
        self._bases = dict(bases or {})
        self._on_decided = on_decided
        self._tokens = TeamsTokens()
        self._background: set[asyncio.Task[None]] = set()

    async def decide_from_channel(self, channel: Channel, press: Press) -> Answer:
        approvers = channel.config.get("approvers") or []
        if press.user not in approvers:
            return Answer(False, "You are not an approver on this channel: nothing was decided.")
        decider = Decider.on_platform(channel.type, press.user, channel.id)
        try:
            decided = await self._interventions.decide(
                press.intervention_id,
                decider,
                approve=press.approve,
                interaction_id=press.interaction_id,
            )
        except NotFound:
            return Answer(False, "This request no longer exists.")
        except Forbidden:
            return Answer(False, "This request is not decided on this channel.")
        except Conflict as exc:
            who = exc.extra.get("decided_by")
            status = exc.extra.get("status", "decided")
            return Answer(False, f"Already {status}" + (f" by {who}." if who else "."))
        if decided.replayed:
            return Answer(True, f"Already {decided.intervention.status}.", decided)
        # In the background: the press is acknowledged at once (Slack wants it within 3 s,
        # a Teams invoke soon too), while waking a hub or a shard may take longer.
        self._spawn(self.settled(decided), f"settle {decided.intervention.id}")
        verb = "Approved" if press.approve else "Rejected"
        return Answer(True, f"{verb}: {decided.intervention.question[:150]}", decided)

    async def decide_link(self, link: Link) -> Decided:
        """A webhook's signed link, POSTed: NotFound unless its intervention went to a
        webhook channel that still lists the link's approver; Conflict once decided."""
        iv = await self._interventions.load(link.intervention_id)
        channel = None
        if iv is not None and iv.notify_channel is not None:
            channel = await self._channels.load(iv.notify_channel)
        if iv is None or channel is None or channel.type != "webhook":
            raise NotFound(f"intervention {link.intervention_id} not found")
        if link.approver not in (channel.config.get("approvers") or []):
            raise Forbidden(f"{link.approver} is no longer an approver of {channel.id}")
        decider = Decider.on_platform("webhook", link.approver, channel.id)
        reason = None if link.approve else f"rejected by {link.approver} (webhook link)"
        decided = await self._interventions.decide(
            link.intervention_id, decider, approve=link.approve, reason=reason
        )
        await self.settled(decided)
        return decided

    async def settled(self, decided: Decided) -> None:
        """After a decision (a press, a link, or the API's): wake the poster of the
        question's channel (its outcome post is due now) and start the workflow it released.
        Best effort: the decision is committed; the poster polls and the sweep starts."""
        channel_id = decided.intervention.notify_channel
        if self._on_decided is not None and channel_id and not decided.replayed:
            try:
                await self._on_decided(channel_id)
            except Exception as exc:  # noqa: BLE001 - the poster polls anyway
                log.info("waking the poster of %s: %r", channel_id, exc)
        if not decided.woke:
            return
        workflow_id = decided.intervention.workflow_id
        try:
            await self._runner.start(workflow_id)
        except Exception as exc:  # noqa: BLE001 - the sweep starts it within a period
            log.warning("starting %s after a channel decision: %r", workflow_id, exc)

    def tell_slack(self, response_url: str | None, text: str) -> None:
        """An ephemeral message to the Slack user who pressed (in the background: the
        interaction is acknowledged at once, as Slack wants within 3 s)."""
        if not response_url:
            return
        payload = {"response_type": "ephemeral", "replace_original": False, "text": text}

        async def send() -> None:
            try:
                response = await _post(self._http, response_url, payload, "slack response_url")
                if not response.is_success:
                    log.warning("slack response_url answered %s", response.status_code)
            except DeliveryFailed as exc:
                log.warning("slack response_url: %s", exc)

        self._spawn(send(), "slack response_url")

    def tell_teams(self, channel: Channel, press: Press, text: str) -> None:
        """A Teams user whose card submit (a message activity, which has no answer of its
        own) was refused: the bot says so in the conversation, in the background."""
        conversation = press.reply.get("conversation_id")
        if not isinstance(conversation, str) or not conversation:
            return
        config = {**channel.config, **channel.secrets}

        async def send() -> None:
            try:
                await send_teams_note(
                    self._http, config, conversation, text, bases=self._bases, tokens=self._tokens
                )
            except DeliveryFailed as exc:
                log.warning("teams refusal note on %s: %s", channel.id, exc)

        self._spawn(send(), "teams refusal note")

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        for task in list(self._background):
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(task, 5)
