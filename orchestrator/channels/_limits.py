"""Inbound channel messages per minute, per channel and per owner (issue 29, item 7).

A webhook delivery carries no bearer token, so the per-token limit of the API never saw it:
a tenant's own generic webhook took 700 messages in 3 s, each an agent task run as the
tenant. Every message a receiver would relay (verified, parsed, channel active) now counts
against its channel (`channel_inbound_per_minute`) and then its owner, over all their
channels (`channel_inbound_per_owner_per_minute`). Over either: 429 with Retry-After (the
platforms retry later: Slack and Telegram re-deliver on a non-2xx), nothing written to the
inbox, no agent task. The counting is the API's own limiter (orchestrator/auth/_ratelimit.py:
a fixed one-minute window in Redis, leased to replicas in shares), under its own key
namespaces; like it, it fails open while Redis is unreachable.

Verification comes first: a forger who knows a channel's URL but not its secret cannot spend
that channel's budget. The channel is counted before its owner, so messages refused for one
busy channel do not use up the owner's other channels; a message the owner's limit refuses
gives its channel's count back. Only a message newly written to the inbox costs anything: a
platform's re-delivery of one already received (Slack and Telegram retry on a timeout or a
non-2xx) is counted, then given back when the inbox finds it a duplicate (`refund`), so
retries cannot spend a budget.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import redis.asyncio as aioredis

from orchestrator.auth import RateLimiter
from orchestrator.channels._store import Channel
from orchestrator.config import Settings
from orchestrator.errors import RateLimited

__all__ = ["Admitted", "InboundLimits"]


@dataclass(frozen=True)
class Admitted:
    """What `admit` counted (a limiter off, or Redis unreachable: nothing), for `refund`."""

    channel: bool = False
    owner: bool = False


class InboundLimits:
    """The two budgets of an inbound message; `admit` counts one or raises RateLimited."""

    def __init__(self, redis: aioredis.Redis, settings: Settings) -> None:
        sync_s = self._sync_s = settings.rate_limit_sync_s
        self._per_channel = settings.channel_inbound_per_minute
        self._per_owner = settings.channel_inbound_per_owner_per_minute
        self._channel = RateLimiter(redis, self._per_channel, "rl-ch", sync_s)
        self._owner = RateLimiter(redis, self._per_owner, "rl-chown", sync_s)

    @property
    def enabled(self) -> bool:
        return self._channel.enabled or self._owner.enabled

    async def admit(self, channel: Channel) -> Admitted:
        """Count one inbound message of `channel`; RateLimited (naming the limit) when its
        channel or its owner has had its minute's budget, and then nothing stays counted."""
        # hit() returns -1 when it could not count (Redis unreachable: fail open).
        by_channel = False
        if self._channel.enabled:
            try:
                by_channel = await self._channel.hit(channel.id) >= 0
            except RateLimited as exc:
                raise _named(
                    exc,
                    f"channel {channel.id} received more than {self._per_channel} messages "
                    "this minute",
                    "channel_inbound_per_minute",
                ) from None
        by_owner = False
        if self._owner.enabled:
            try:
                by_owner = await self._owner.hit(channel.user_uuid) >= 0
            except RateLimited as exc:
                if by_channel:
                    self._channel.refund(channel.id)  # refused: the channel spent nothing
                raise _named(
                    exc,
                    f"this channel's owner received more than {self._per_owner} channel "
                    "messages this minute",
                    "channel_inbound_per_owner_per_minute",
                ) from None
        return Admitted(channel=by_channel, owner=by_owner)

    def refund(self, channel: Channel, admitted: Admitted) -> None:
        """Give back what `admit` counted for a message that was not enqueued (a duplicate
        delivery, or the inbox write failed)."""
        if admitted.channel:
            self._channel.refund(channel.id)
        if admitted.owner:
            self._owner.refund(channel.user_uuid)

    async def run(self) -> None:
        """Both limiters' syncs (leases given back, replicas counted), forever: one loop, not
        a task per limiter (a TaskGroup here once outlived its cancel at shutdown under
        uvloop, holding the app's shutdown past its flushes)."""
        limiters = [limiter for limiter in (self._channel, self._owner) if limiter.enabled]
        while True:
            await asyncio.sleep(self._sync_s)
            for limiter in limiters:
                await limiter.sync()


def _named(exc: RateLimited, message: str, setting: str) -> RateLimited:
    return RateLimited(
        f"{message} ({setting}); retry later",
        retry_after=int(exc.extra.get("retry_after", 1)),
        extra={"limit": setting},
    )
