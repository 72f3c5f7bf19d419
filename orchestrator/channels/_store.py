"""Channels in Postgres: secrets encrypted at rest (Fernet), the webhook token kept as a
hash, the inbox of inbound messages (deduplicated by the platform's delivery id) and each
conversation's turns. The config is checked by type in _config.py.

A channel belongs to its creator (`user_uuid`): others get a 404, admins see every channel.
Secrets (`signing_secret`, `bot_token`, `secret_token`, `app_password`) are never returned:
reads show them as `"***"`; `webhook_url`, sealed too, is shown as set (issue 33). The
webhook token is shown once, when the channel is created (or its token rotated).
"""

from __future__ import annotations

import hashlib
import json
import secrets as pysecrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from cryptography.fernet import Fernet, InvalidToken

from orchestrator.auth import Principal
from orchestrator.channels._config import bad_config, check_type, validate_config
from orchestrator.egress import EgressPolicy
from orchestrator.errors import NotFound, ValidationFailed
from orchestrator.runtime.claims import ClaimStore, Fence

STATUSES = ("active", "paused", "error")
# `webhook_url` too: a Slack or Teams incoming-webhook URL lets anyone post to the channel.
# `app_password`: a Teams bot's client secret (issue 32: it posts and updates approval cards).
SECRET_KEYS = frozenset(
    {"signing_secret", "bot_token", "secret_token", "webhook_url", "app_password"}
)
# Kept sealed at rest like a secret, but shown as set on reads (SPEC part 4 lists it with the
# channel's config; issue 33): `channel_mask_webhook_url` masks it instead.
SHOWN_SECRETS = frozenset({"webhook_url"})
REDACTED = "***"
# A Teams channel without a token audience (its `app_id`, else the `teams_audience` setting)
# is created, but its inbound activities are refused until one is set (issue 33).
NO_AUDIENCE = (
    "inbound activities are refused: no token audience to check them against;"
    " set config.app_id (the bot's app id) or the teams_audience setting"
)
TOKEN_PREFIX = "chw_"
# The claim a relay holds on an inbox item while handling it (orchestrator/runtime/claims.py),
# keyed by the item's id.
CLAIM_KIND = "channel_item"
MAX_NAME = 200


def now_ms() -> int:
    return int(time.time() * 1000)


def channel_shard(channel_id: str, shards: int) -> int:
    """The hub of a channel (`ch-<n>`: n modulo the hub count), as the inbox queries it."""
    return int(channel_id[3:]) % max(1, shards)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


# --- records -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Channel:
    id: str
    user_uuid: str
    type: str
    name: str
    config: dict[str, Any]  # plain settings, no secrets
    secrets: dict[str, str] = field(repr=False)
    status: str
    failures: int
    last_error: str | None
    created_at: int
    updated_at: int

    def wire(self, *, mask_webhook_url: bool = False) -> dict[str, Any]:
        """As the API shows it: secrets redacted (`webhook_url` shown as set unless
        `mask_webhook_url`), the receiver path without its token."""
        shown = dict(self.config)
        for key, value in self.secrets.items():
            visible = key in SHOWN_SECRETS and not mask_webhook_url
            shown[key] = value if visible else REDACTED
        return {
            "id": self.id,
            "type": self.type,
            "name": self.name,
            "status": self.status,
            "config": shown,
            "user_uuid": self.user_uuid,
            "failures": self.failures,
            "last_error": self.last_error,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


@dataclass(frozen=True)
class InboxItem:
    id: int
    channel_id: str
    delivery_id: str | None
    conversation: str
    text: str
    sender: str | None
    reply: dict[str, Any]
    state: str
    answer: str | None
    task_id: str | None
    attempts: int
    error: str | None


_CHANNEL_COLUMNS = (
    "id, user_uuid, type, name, config, secrets, status, failures, last_error, created_at,"
    " updated_at"
)
_INBOX_COLUMNS = (
    "id, channel_id, delivery_id, conversation, text, sender, reply, state, answer, task_id,"
    " attempts, error"
)


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


class ChannelStore:
    def __init__(
        self,
        pool: asyncpg.Pool,
        box: Fernet,
        *,
        teams_audience: str | None = None,
        egress: EgressPolicy | None = None,
    ) -> None:
        self._pool = pool
        self._box = box
        self._teams_audience = teams_audience
        self._egress = egress or EgressPolicy()

    def _check_destinations(self, config: Mapping[str, Any]) -> None:
        """A URL that names a refused address is a clear 400 now (names are checked on every
        connect, where rebinding cannot pass: orchestrator/channels/_egress.py)."""
        for key in ("webhook_url", "callback_url", "service_url"):
            url = config.get(key)
            if isinstance(url, str) and self._egress.literal_refused(url):
                raise bad_config(
                    key,
                    "a private, loopback, link-local or metadata address is not allowed "
                    "(outbound_allowed_cidrs)",
                )

    def _audience_missing(self, kind: str, config: Mapping[str, Any]) -> bool:
        """A Teams channel with no token audience: created, its inbound refused."""
        return kind == "teams" and not config.get("app_id") and not self._teams_audience

    @property
    def pool(self) -> asyncpg.Pool:
        return self._pool

    # --- secrets ---------------------------------------------------------------------------

    def _seal(self, values: Mapping[str, str]) -> bytes | None:
        return self._box.encrypt(json.dumps(dict(values)).encode()) if values else None

    def _open(self, sealed: bytes | None) -> dict[str, str]:
        if not sealed:
            return {}
        try:
            data: dict[str, str] = json.loads(self._box.decrypt(bytes(sealed)))
        except InvalidToken as exc:
            raise RuntimeError(
                "channel secrets cannot be decrypted: channel_secret_key (or"
                " <data_dir>/channel_key) is not the key they were stored with"
            ) from exc
        return data

    def _channel(self, row: asyncpg.Record) -> Channel:
        return Channel(
            id=row["id"],
            user_uuid=row["user_uuid"],
            type=row["type"],
            name=row["name"],
            config=_json(row["config"]),
            secrets=self._open(row["secrets"]),
            status=row["status"],
            failures=row["failures"],
            last_error=row["last_error"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )

    @staticmethod
    def _split(config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
        plain = {k: v for k, v in config.items() if k not in SECRET_KEYS}
        hidden = {k: str(v) for k, v in config.items() if k in SECRET_KEYS}
        return plain, hidden

    # --- CRUD ------------------------------------------------------------------------------

    async def create(
        self, principal: Principal, kind: Any, name: Any, config: Any
    ) -> tuple[Channel, str]:
        """The new channel and its webhook token (shown this once)."""
        kind = check_type(kind)
        name = _name(name)
        checked = validate_config(kind, config)
        self._check_destinations(checked)
        plain, hidden = self._split(checked)
        token = TOKEN_PREFIX + pysecrets.token_urlsafe(32)
        ts = now_ms()
        row = await self._pool.fetchrow(
            "INSERT INTO channels (id, user_uuid, type, name, config, secrets, token_hash,"
            " created_at, updated_at, last_error) VALUES ('ch-' || nextval('channel_seq'), $1,"
            f" $2, $3, $4::jsonb, $5, $6, $7, $7, $8) RETURNING {_CHANNEL_COLUMNS}",
            principal.user_uuid,
            kind,
            name,
            json.dumps(plain),
            self._seal(hidden),
            hash_token(token),
            ts,
            NO_AUDIENCE if self._audience_missing(kind, checked) else None,
        )
        return self._channel(row), token

    async def list_for(self, principal: Principal) -> list[Channel]:
        if principal.is_admin:
            rows = await self._pool.fetch(
                f"SELECT {_CHANNEL_COLUMNS} FROM channels ORDER BY created_at, id"
            )
        else:
            rows = await self._pool.fetch(
                f"SELECT {_CHANNEL_COLUMNS} FROM channels WHERE user_uuid = $1"
                " ORDER BY created_at, id",
                principal.user_uuid,
            )
        return [self._channel(r) for r in rows]

    async def load(self, channel_id: str) -> Channel | None:
        row = await self._pool.fetchrow(
            f"SELECT {_CHANNEL_COLUMNS} FROM channels WHERE id = $1", channel_id
        )
        return self._channel(row) if row is not None else None

    async def get(self, channel_id: str, principal: Principal) -> Channel:
        channel = await self.load(channel_id)
        if channel is None or not (principal.is_admin or channel.user_uuid == principal.user_uuid):
            raise NotFound(f"channel {channel_id} not found")
        return channel

    async def update(
        self,
        channel_id: str,
        principal: Principal,
        *,
        name: Any = None,
        config: Any = None,
        status: Any = None,
        rotate_token: bool = False,
    ) -> tuple[Channel, str | None]:
        """Name, config (merged key by key; `null` removes a key; secrets given again are
        replaced, `"***"` keeps them), status (`active` or `paused`; `active` also clears an
        `error`), and a new webhook token on request."""
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"SELECT {_CHANNEL_COLUMNS} FROM channels WHERE id = $1 FOR UPDATE", channel_id
            )
            current = self._channel(row) if row is not None else None
            if current is None or not (
                principal.is_admin or current.user_uuid == principal.user_uuid
            ):
                raise NotFound(f"channel {channel_id} not found")
            merged: dict[str, Any] = {**current.config, **current.secrets}
            if config is not None:
                if not isinstance(config, dict):
                    raise ValidationFailed(
                        "config: an object",
                        extra={"fields": [{"field": "config", "message": "an object"}]},
                    )
                for key, value in config.items():
                    if value is None:
                        merged.pop(key, None)
                    elif not (key in SECRET_KEYS and value == REDACTED):
                        merged[key] = value
            checked = validate_config(current.type, merged)
            self._check_destinations(checked)
            last_error = current.last_error
            if self._audience_missing(current.type, checked):
                last_error = NO_AUDIENCE
            elif last_error == NO_AUDIENCE:
                last_error = None  # an audience is configured now
            plain, hidden = self._split(checked)
            new_status = current.status
            failures = current.failures
            if status is not None:
                if status not in ("active", "paused"):
                    raise ValidationFailed(
                        "status: active or paused",
                        extra={"fields": [{"field": "status", "message": "active or paused"}]},
                    )
                new_status = status
                if status == "active":
                    failures = 0
            token = TOKEN_PREFIX + pysecrets.token_urlsafe(32) if rotate_token else None
            row = await conn.fetchrow(
                "UPDATE channels SET name = $2, config = $3::jsonb, secrets = $4, status = $5,"
                " failures = $6, token_hash = coalesce($7, token_hash), updated_at = $8,"
                f" last_error = $9 WHERE id = $1 RETURNING {_CHANNEL_COLUMNS}",
                channel_id,
                current.name if name is None else _name(name),
                json.dumps(plain),
                self._seal(hidden),
                new_status,
                failures,
                hash_token(token) if token else None,
                now_ms(),
                last_error,
            )
        return self._channel(row), token

    async def delete(self, channel_id: str, principal: Principal) -> None:
        await self.get(channel_id, principal)
        await self._pool.execute("DELETE FROM channels WHERE id = $1", channel_id)

    async def by_token(self, token: str) -> Channel | None:
        row = await self._pool.fetchrow(
            f"SELECT {_CHANNEL_COLUMNS} FROM channels WHERE token_hash = $1", hash_token(token)
        )
        return self._channel(row) if row is not None else None

    # --- delivery health -------------------------------------------------------------------

    async def inbound_refused(self, channel_id: str, error: str) -> None:
        """Say on the channel why its inbound deliveries are refused (`last_error`); its
        status and failure count are the outbound side's."""
        await self._pool.execute(
            "UPDATE channels SET last_error = $2, updated_at = $3"
            " WHERE id = $1 AND last_error IS DISTINCT FROM $2",
            channel_id,
            error[:1000],
            now_ms(),
        )

    async def inbound_verified(self, channel_id: str, error: str) -> None:
        """An inbound delivery was verified: `last_error` no longer says `error` (what
        `inbound_refused` wrote, e.g. NO_AUDIENCE once an audience is configured); an
        outbound error written since is kept."""
        await self._pool.execute(
            "UPDATE channels SET last_error = NULL, updated_at = $3"
            " WHERE id = $1 AND last_error = $2",
            channel_id,
            error[:1000],
            now_ms(),
        )

    async def delivered(self, channel_id: str) -> None:
        await self._pool.execute(
            "UPDATE channels SET failures = 0, last_error = NULL,"
            " status = CASE WHEN status = 'error' THEN 'active' ELSE status END,"
            " updated_at = $2 WHERE id = $1 AND (failures <> 0 OR status = 'error')",
            channel_id,
            now_ms(),
        )

    async def delivery_failed(self, channel_id: str, error: str, error_after: int) -> str:
        """Count a failed delivery; the channel's status afterwards (`error` after
        `error_after` in a row)."""
        status: str | None = await self._pool.fetchval(
            "UPDATE channels SET failures = failures + 1, last_error = $2,"
            " status = CASE WHEN failures + 1 >= $3 AND status = 'active' THEN 'error'"
            " ELSE status END, updated_at = $4 WHERE id = $1 RETURNING status",
            channel_id,
            error[:1000],
            error_after,
            now_ms(),
        )
        return status or "deleted"

    # --- the inbox -------------------------------------------------------------------------

    async def enqueue(
        self,
        channel_id: str,
        *,
        delivery_id: str | None,
        conversation: str,
        text: str,
        sender: str | None,
        reply: Mapping[str, Any],
    ) -> int | None:
        """The inbox id of a new message; None when that delivery was seen before."""
        ts = now_ms()
        inbox_id: int | None = await self._pool.fetchval(
            "INSERT INTO channel_inbox (channel_id, delivery_id, conversation, text, sender,"
            " reply, next_attempt_at, created_at, updated_at)"
            " VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7, $7, $7)"
            " ON CONFLICT (channel_id, delivery_id) DO NOTHING RETURNING id",
            channel_id,
            delivery_id,
            conversation[:512],
            text,
            sender,
            json.dumps(dict(reply)),
            ts,
        )
        return inbox_id

    async def item(self, inbox_id: int) -> InboxItem | None:
        row = await self._pool.fetchrow(
            f"SELECT {_INBOX_COLUMNS} FROM channel_inbox WHERE id = $1", inbox_id
        )
        return _item(row) if row is not None else None

    async def due(self, shard: int, shards: int, me: str, limit: int = 100) -> list[int]:
        """Inbox items of this shard's channels waiting to be answered or (re)sent now, and
        not claimed by another relay (`me`'s own claims, a predecessor's, do not count)."""
        rows = await self._pool.fetch(
            "SELECT id FROM channel_inbox WHERE state IN ('pending', 'sending')"
            " AND next_attempt_at <= $1 AND substr(channel_id, 4)::bigint % $2 = $3 AND "
            + ClaimStore.unclaimed_sql(CLAIM_KIND, "id::text", "$5")
            + " ORDER BY id LIMIT $4",
            now_ms(),
            max(1, shards),
            shard,
            limit,
            me,
        )
        return [r["id"] for r in rows]

    async def next_due(self, shard: int, shards: int) -> int | None:
        """When the next item falls due. Items under a live claim (being handled, here or
        by another relay) do not count: the relay does not poll for what it cannot take."""
        value: int | None = await self._pool.fetchval(
            "SELECT min(next_attempt_at) FROM channel_inbox WHERE state IN ('pending', 'sending')"
            " AND substr(channel_id, 4)::bigint % $1 = $2 AND "
            + ClaimStore.unclaimed_sql(CLAIM_KIND, "id::text"),
            max(1, shards),
            shard,
        )
        return value

    async def answered(
        self, item: InboxItem, answer: str, task_id: str, *, deliver: bool, fence: Fence
    ) -> None:
        """Record the answer and the conversation's two turns (one transaction, while
        `fence` holds: StaleClaim and nothing written otherwise). Without a delivery to
        make, the item is done and its claim released in the same commit."""
        answer = answer.replace("\x00", "")  # Postgres text cannot hold NUL
        ts = now_ms()
        async with self._pool.acquire() as conn, conn.transaction():
            await fence.check(conn)
            await conn.execute(
                "UPDATE channel_inbox SET answer = $2, task_id = $3, state = $4,"
                " updated_at = $5 WHERE id = $1",
                item.id,
                answer,
                task_id,
                "sending" if deliver else "done",
                ts,
            )
            await conn.executemany(
                "INSERT INTO channel_turns (channel_id, conversation, role, text, created_at)"
                " VALUES ($1, $2, $3, $4, $5)",
                [
                    (item.channel_id, item.conversation, "user", item.text, ts),
                    (item.channel_id, item.conversation, "assistant", answer, ts),
                ],
            )
            if not deliver:
                await fence.release_in(conn)

    async def _fenced(self, fence: Fence, sql: str, *args: Any) -> None:
        """One write of an item while `fence` holds, releasing the claim in the same
        commit (the relay's handling of the item ends with it): StaleClaim otherwise."""
        async with self._pool.acquire() as conn, conn.transaction():
            await fence.check(conn)
            await conn.execute(sql, *args)
            await fence.release_in(conn)

    async def sent(self, inbox_id: int, *, fence: Fence) -> None:
        await self._fenced(
            fence,
            "UPDATE channel_inbox SET state = 'done', updated_at = $2, error = NULL WHERE id = $1",
            inbox_id,
            now_ms(),
        )

    async def retry_later(self, inbox_id: int, error: str, delay_s: float, *, fence: Fence) -> None:
        """Try again after `delay_s`, by whichever relay then claims it."""
        ts = now_ms()
        await self._fenced(
            fence,
            "UPDATE channel_inbox SET attempts = attempts + 1, error = $2,"
            " next_attempt_at = $3, updated_at = $4 WHERE id = $1",
            inbox_id,
            error[:1000],
            ts + int(delay_s * 1000),
            ts,
        )

    async def give_up(self, inbox_id: int, error: str, *, fence: Fence) -> None:
        await self._fenced(
            fence,
            "UPDATE channel_inbox SET state = 'failed', attempts = attempts + 1, error = $2,"
            " updated_at = $3 WHERE id = $1",
            inbox_id,
            error[:1000],
            now_ms(),
        )

    async def history(
        self, channel_id: str, conversation: str, turns: int
    ) -> list[tuple[str, str]]:
        """The conversation's last `turns` turns, oldest first: (role, text)."""
        if turns <= 0:
            return []
        rows = await self._pool.fetch(
            "SELECT role, text FROM channel_turns WHERE channel_id = $1 AND conversation = $2"
            " ORDER BY id DESC LIMIT $3",
            channel_id,
            conversation,
            turns,
        )
        return [(r["role"], r["text"]) for r in reversed(rows)]


def _name(name: Any) -> str:
    if (
        not isinstance(name, str)
        or not name.strip()
        or len(name) > MAX_NAME
        or not name.isprintable()
    ):
        raise ValidationFailed(
            f"name: a non-empty string of at most {MAX_NAME} characters",
            extra={"fields": [{"field": "name", "message": "required"}]},
        )
    return name.strip()


def _item(row: asyncpg.Record) -> InboxItem:
    return InboxItem(
        id=row["id"],
        channel_id=row["channel_id"],
        delivery_id=row["delivery_id"],
        conversation=row["conversation"],
        text=row["text"],
        sender=row["sender"],
        reply=_json(row["reply"]),
        state=row["state"],
        answer=row["answer"],
        task_id=row["task_id"],
        attempts=row["attempts"],
        error=row["error"],
    )
