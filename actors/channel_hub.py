"""`ChannelHub` actors (k per generation): each relays the messages of the
channels whose number is `i` modulo k (answer by an agent task on the AgentWorker pool, then
delivery to the platform with retries), and on (re)start picks up whatever its channels left
in the inbox. Beside the relay, the same shard's intervention questions are posted with
their buttons and updated once decided (orchestrator/channels/_approvals.py, issue 32).
`RayChannels` is how the HTTP replicas hand a just-received message to its hub; the message
is already in Postgres, so a hub that cannot be reached loses nothing."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import ray
from ray.exceptions import RayActorError

from actors import Generation, Shards
from actors.dispatch import RayDispatcher
from actors.host import ActorHost
from orchestrator.channels import ChannelRelay, InterventionPoster, PostStore, channel_shard
from orchestrator.config import Settings
from orchestrator.interventions import InterventionStore
from orchestrator.interventions._links import LinkSigner, link_key
from orchestrator.runtime.supervisor import cancel_and_wait
from orchestrator.services import ChannelHubServices, build_services

log = logging.getLogger(__name__)

CALL_TIMEOUT_S = 10.0
KIND = "ChannelHub"


def hub_name(index: int) -> str:
    return f"channel-hub-{index}"


@ray.remote(  # type: ignore[call-overload]
    num_cpus=0, max_restarts=-1, max_task_retries=0, max_concurrency=1000
)
class ChannelHub(ActorHost):
    def __init__(self, settings: Settings, index: int, shards: int, generation: Generation) -> None:
        super().__init__(hub_name(index), settings, generation)
        self._generation = generation
        self._index = index
        self._shards = shards
        self._relay: ChannelRelay | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._posts_task: asyncio.Task[None] | None = None
        self._poster: InterventionPoster | None = None
        self._booted = self._boot(self._start)

    def __repr__(self) -> str:
        done = self._relay.processed if self._relay is not None else "booting"
        return f"ChannelHub(index={self._index}/{self._shards}, processed={done})"

    async def _start(self, opened: contextlib.AsyncExitStack) -> ChannelRelay:
        s = self._settings
        services = await build_services(s, ChannelHubServices, opened, recorder=self._recorder)
        relay = ChannelRelay(
            services.channels,
            RayDispatcher(s, services.events, self._generation),
            s,
            services.egress,
            shard=self._index,
            shards=self._shards,
            name=hub_name(self._index),
        )
        self._relay = relay
        self._loop_task = self._supervisor.spawn("channel-relay", relay.run_forever)
        poster = InterventionPoster(
            PostStore(services.db.pool),
            InterventionStore(services.db.pool, services.events),
            services.channels,
            s,
            services.egress,
            signer=LinkSigner(link_key(s)),
            shard=self._index,
            shards=self._shards,
            name=hub_name(self._index),
        )
        self._poster = poster
        self._posts_task = self._supervisor.spawn("intervention-posts", poster.run_forever)
        log.info("%s: relaying", hub_name(self._index))
        return relay

    async def ready(self) -> str:
        await self._booted
        return repr(self)

    async def drain(self) -> None:
        """Relay nothing more (the generation is being replaced): items in flight stay in the
        inbox and their claims are released, for the next generation's hubs (which, under
        the same name, would take them back at once anyway, fencing this one off)."""
        relay = await self._booted
        await cancel_and_wait([t for t in (self._loop_task, self._posts_task) if t is not None])
        await relay.close()

    async def submit(self, inbox_id: int) -> None:
        relay = await self._booted
        relay.submit(inbox_id)

    async def answer(self, inbox_id: int, within: float) -> str | None:
        relay = await self._booted
        return await relay.answer(inbox_id, within)

    async def wake_posts(self) -> None:
        await self._booted
        if self._poster is not None:
            self._poster.wake()


class RayChannels:
    """Caller side: hands an inbox item to the hub of its channel (the caller's generation)."""

    def __init__(self, settings: Settings, generation: Generation) -> None:
        self._shards = max(1, settings.channel_hubs)
        self._pool = Shards(generation, KIND, self._shards)

    async def submit(self, channel_id: str, inbox_id: int) -> None:
        index = channel_shard(channel_id, self._shards)
        try:
            await asyncio.wait_for(self._pool.actor(index).submit.remote(inbox_id), CALL_TIMEOUT_S)
        except (RayActorError, TimeoutError) as exc:
            # In the inbox already: the hub picks it up when it is back.
            self._pool.forget(index)
            log.warning("channel hub %d unreachable (%r); item %d waits", index, exc, inbox_id)

    async def answer(self, channel_id: str, inbox_id: int, within: float) -> str | None:
        index = channel_shard(channel_id, self._shards)
        result: str | None = await asyncio.wait_for(
            self._pool.actor(index).answer.remote(inbox_id, within), within + 5
        )
        return result

    async def wake_posts(self, channel_id: str) -> None:
        """Best effort: the hub's poster finds the update at its next poll anyway."""
        index = channel_shard(channel_id, self._shards)
        try:
            await asyncio.wait_for(self._pool.actor(index).wake_posts.remote(), CALL_TIMEOUT_S)
        except (RayActorError, TimeoutError) as exc:
            self._pool.forget(index)
            log.info("channel hub %d unreachable (%r); its poster polls", index, exc)

    async def close(self) -> None:
        """Hubs belong to the generation (actors/generation.py), not to this caller."""
