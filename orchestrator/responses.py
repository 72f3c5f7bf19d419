"""Stored responses of the Responses API (issue 34): the `responses` table (migration 0032).

`POST /responses` with `store` not false keeps what it answered, per owner, for
`response_retention_s`: the Response object (output and usage in it), the request's input
items (normalised, each with its id) and its instructions. From them:

- `get`, `delete`, `input_items` serve `GET/DELETE /responses/{id}` and
  `GET /responses/{id}/input_items` (OpenAI's cursor paging);
- `history` rebuilds the conversation `previous_response_id` continues: the chain of
  responses, oldest first, each one's input items then its output items. Instructions are
  not part of it (OpenAI: a previous response's instructions are not carried over).

Every statement names the caller's user_uuid: another owner's id is a 404 like a missing
one. Expired rows are deleted by the replicas' heartbeat loop (deployments/api.py, as for
idempotency keys); every read checks expiry too, so a late purge changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import asyncpg

from orchestrator._json import loads
from orchestrator.db import DB_NOW_MS
from orchestrator.errors import NotFound, ValidationFailed

__all__ = ["MAX_CHAIN", "ItemPage", "ResponseStore"]

JSON = dict[str, Any]
# The longest chain `previous_response_id` follows (a bound on the recursive read).
MAX_CHAIN = 1000


def _not_found(response_id: str) -> NotFound:
    return NotFound(f"response {response_id!r} not found", extra={"response_id": response_id})


@dataclass(frozen=True, slots=True)
class ItemPage:
    """One page of a response's input items (OpenAI's list object)."""

    data: list[JSON]
    has_more: bool

    def body(self) -> JSON:
        return {
            "object": "list",
            "data": self.data,
            "first_id": self.data[0]["id"] if self.data else None,
            "last_id": self.data[-1]["id"] if self.data else None,
            "has_more": self.has_more,
        }


class ResponseStore:
    """The `responses` table: saved answers, their chains, expiry."""

    def __init__(self, pool: asyncpg.Pool, retention_s: int) -> None:
        self._pool = pool
        self.retention_s = int(retention_s)

    async def save(
        self,
        user_uuid: str,
        response: JSON,
        input_items: list[JSON],
        *,
        instructions: str | None,
        previous_response_id: str | None,
        client_metadata: dict[str, str] | None = None,
    ) -> None:
        await self._pool.execute(
            "INSERT INTO responses (user_uuid, id, model, status, previous_response_id,"
            " instructions, input_items, response, client_metadata, created_at, expires_at)"
            " SELECT $1, $2, $3, $4, $5, $6, $7::jsonb, $8::jsonb, $10::jsonb, n,"
            f" n + $9::bigint FROM (SELECT {DB_NOW_MS} AS n) AS now",
            user_uuid,
            response["id"],
            response["model"],
            response["status"],
            previous_response_id,
            instructions,
            json.dumps(input_items, ensure_ascii=False),
            json.dumps(response, ensure_ascii=False),
            self.retention_s * 1000,
            json.dumps(client_metadata) if client_metadata else None,
        )

    async def get(self, user_uuid: str, response_id: str) -> JSON:
        raw = await self._pool.fetchval(
            "SELECT response::text FROM responses"
            f" WHERE user_uuid = $1 AND id = $2 AND expires_at > {DB_NOW_MS}",
            user_uuid,
            response_id,
        )
        if raw is None:
            raise _not_found(response_id)
        found: JSON = loads(raw)
        return found

    async def delete(self, user_uuid: str, response_id: str) -> None:
        gone = await self._pool.fetchval(
            "DELETE FROM responses"
            f" WHERE user_uuid = $1 AND id = $2 AND expires_at > {DB_NOW_MS} RETURNING true",
            user_uuid,
            response_id,
        )
        if not gone:
            raise _not_found(response_id)

    async def history(self, user_uuid: str, response_id: str) -> list[JSON]:
        """The items of the chain ending at `response_id`, oldest first: each response's
        input items, then its output items. A link deleted or expired ends the chain there;
        the named response itself missing is a 404."""
        rows = await self._pool.fetch(
            "WITH RECURSIVE chain (id, previous, input_items, output, depth) AS ("
            " SELECT id, previous_response_id, input_items, response->'output', 0"
            f" FROM responses WHERE user_uuid = $1 AND id = $2 AND expires_at > {DB_NOW_MS}"
            " UNION ALL"
            " SELECT r.id, r.previous_response_id, r.input_items, r.response->'output',"
            " c.depth + 1 FROM chain c JOIN responses r ON r.user_uuid = $1"
            f" AND r.id = c.previous WHERE r.expires_at > {DB_NOW_MS} AND c.depth < $3)"
            " SELECT input_items::text AS input_items, output::text AS output FROM chain"
            " ORDER BY depth DESC",
            user_uuid,
            response_id,
            MAX_CHAIN,
        )
        if not rows:
            raise _not_found(response_id)
        items: list[JSON] = []
        for row in rows:
            items.extend(loads(row["input_items"]))
            items.extend(loads(row["output"]))
        return items

    async def input_items(
        self,
        user_uuid: str,
        response_id: str,
        *,
        limit: int = 20,
        order: str = "desc",
        after: str | None = None,
        before: str | None = None,
    ) -> ItemPage:
        """A page of the response's input items in `order` (desc: newest first, OpenAI's
        default), starting after the item `after` and/or ending before `before`."""
        if not 1 <= limit <= 100:
            raise _bad("limit", "must be between 1 and 100")
        if order not in ("asc", "desc"):
            raise _bad("order", "must be asc or desc")
        raw = await self._pool.fetchval(
            "SELECT input_items::text FROM responses"
            f" WHERE user_uuid = $1 AND id = $2 AND expires_at > {DB_NOW_MS}",
            user_uuid,
            response_id,
        )
        if raw is None:
            raise _not_found(response_id)
        items: list[JSON] = loads(raw)
        if order == "desc":
            items.reverse()
        ids = [item["id"] for item in items]
        start, end = 0, len(items)
        if after is not None:
            if after not in ids:
                raise _bad("after", f"no input item {after!r} in this response")
            start = ids.index(after) + 1
        if before is not None:
            if before not in ids:
                raise _bad("before", f"no input item {before!r} in this response")
            end = ids.index(before)
        window = items[start:end]
        if before is not None and after is None:  # the page just before the cursor
            return ItemPage(window[-limit:], len(window) > limit)
        return ItemPage(window[:limit], len(window) > limit)

    async def purge_expired(self, batch: int = 5000) -> int:
        """Delete up to `batch` expired rows; how many. Rows another replica's purge holds
        are skipped: the next round takes them."""
        done = await self._pool.execute(
            "DELETE FROM responses AS r USING (SELECT user_uuid, id FROM responses"
            f" WHERE expires_at <= {DB_NOW_MS} LIMIT $1 FOR UPDATE SKIP LOCKED) AS gone"
            " WHERE r.user_uuid = gone.user_uuid AND r.id = gone.id",
            batch,
        )
        return int(done.split()[-1])


def _bad(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(
        f"invalid request: {field}: {message}",
        extra={"fields": [{"field": field, "message": message}]},
    )
