"""Skills marketplace: publish, browse, search, read and moderate skills, in Postgres.

A skill is unique per (name, author); `author` is always the publisher's `user_uuid`, so a
caller can only ever write their own skills (admins may also delete anyone's). Every
authenticated caller reads every skill. Publishing a skill again bumps its version and
replaces its description, tags and body; downloads and `created_at` stay.

Every version's body and description are kept (`skill_versions`): `pin` resolves a skill
reference (`name`, `name@<version>`, `<author>/name`, `<author>/name@<version>`) to one
version, which a workflow step then runs for as long as it exists, whatever is published
after it. Pinning is not a download (reading the skill, `detail`, is).

The hourly publish limit is counted in Postgres (`skill_publishes`), under a per-author
advisory lock, so it holds across replicas and while Redis is down. All times come from the
database's clock, so replicas on different hosts agree on the window.
"""

from __future__ import annotations

import logging
import math
import re
import unicodedata
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import asyncpg

from orchestrator.auth import Principal
from orchestrator.db import DB_NOW_MS
from orchestrator.errors import Conflict, Forbidden, NotFound, RateLimited, ValidationFailed

if TYPE_CHECKING:
    from orchestrator.config import Settings

log = logging.getLogger(__name__)

SKILL_BODY_LIMIT = 4096  # SPEC part 8; the table's CHECK holds the same ceiling
DESCRIPTION_MAX = 1000  # skill_description_max's default
NAME_MAX = 64
TAG_MAX = 32
REASON_MAX = 1000
QUERY_MAX = 500
MAX_TAGS = 16
HOUR_MS = 3_600_000
PUBLISH_LOCK = 947740  # with hashtext(author): serialises one author's publishes

# Names and tags are what clients send (issue 33): any letters of any script, mixed case,
# spaces; refused are control characters (Unicode category C*: they corrupt logs and
# terminals), `/` (it separates a reference's author and a path's segments) and, for tags,
# `,` (the browse filter's separator).
_NAME_REFUSED = "/"
_TAG_REFUSED = "/,"
# `name@<digits>` at the end of a reference is its version, so a name may not end so.
_LOOKS_VERSIONED = re.compile(r".*@[0-9]*", re.DOTALL)

# SPEC part 4's reserved names, plus this API's other path words, so that a shorter
# `/marketplace/<name>` route can be added later without any skill shadowing a literal one.
RESERVED_NAMES = frozenset(
    {"search", "reports", "dismiss", "feature", "rate", "ratings"}
    | {"browse", "detail", "publish", "delete", "report"}
)

Sort = Literal["newest", "popular"]

_ITEM = "s.name, s.author, s.description, s.tags, s.downloads, s.version"
_DETAIL = f"{_ITEM}, s.body, s.created_at, s.updated_at"
# A skill reference: author (a user_uuid: no `/`), name, version (a positive integer).
SKILL_REF = re.compile(
    r"(?:(?P<author>[^/\s\x00]{1,200})/)?(?P<name>[^/\x00-\x1f\x7f]{1,64}?)"
    r"(?:@(?P<version>[1-9][0-9]{0,8}))?"
)
REF_GRAMMAR = "name, name@<version>, <author>/name or <author>/name@<version>"
_ORDER: dict[str, str] = {
    "newest": "s.created_at DESC, s.id DESC",
    "popular": "s.downloads DESC, s.created_at DESC, s.id DESC",
}


def _invalid(field: str, message: str) -> ValidationFailed:
    return ValidationFailed(
        f"{field}: {message}", extra={"fields": [{"field": field, "message": message}]}
    )


def _no_nul(field: str, value: str) -> str:
    # Postgres text cannot hold NUL: say so instead of failing in the driver.
    if "\x00" in value:
        raise _invalid(field, "must not contain NUL characters")
    return value


def _text(value: str) -> str:
    """`value` as stored: NFC (one spelling of each accented letter), surrounding
    whitespace trimmed."""
    return unicodedata.normalize("NFC", value).strip()


def _bad_char(value: str, refused: str) -> str | None:
    for ch in value:
        if ch in refused or unicodedata.category(ch).startswith("C"):
            return ch
    return None


def check_name(name: str) -> str:
    """A publishable skill name as the client sent it (NFC, trimmed): 1-64 characters of any
    script, case kept, spaces allowed; no control characters, no `/`, not ending in
    `@<digits>` (a reference's version), not a reserved word (case-insensitive)."""
    name = _text(name)
    if name.casefold() in RESERVED_NAMES:
        raise _invalid("name", f"{name!r} is reserved ({', '.join(sorted(RESERVED_NAMES))})")
    if not 1 <= len(name) <= NAME_MAX:
        raise _invalid("name", f"{len(name)} characters, 1-{NAME_MAX}")
    bad = _bad_char(name, _NAME_REFUSED)
    if bad is not None:
        raise _invalid("name", f"{bad!r} is not allowed (no control characters or '/')")
    if name in (".", ".."):  # a path's dot segments: clients resolve them away
        raise _invalid("name", f"{name!r} is not allowed (a path's dot segment)")
    if _LOOKS_VERSIONED.fullmatch(name):
        raise _invalid("name", "must not end in '@' or @<digits> (a reference's version)")
    return name


def normalize_tags(tags: Sequence[str], field: str = "tags") -> list[str]:
    """Tags trimmed (NFC) and lowercased, so that a filter matches whatever case a client
    used; duplicates dropped (first kept); each 1-32 characters of any script, spaces
    allowed, no control characters, `/` or `,`; at most MAX_TAGS."""
    out: list[str] = []
    for raw in tags:
        tag = _text(raw).lower()
        bad = _bad_char(tag, _TAG_REFUSED)
        if not 1 <= len(tag) <= TAG_MAX or bad is not None:
            raise _invalid(
                field,
                f"tag {raw[:40]!r}: 1-{TAG_MAX} characters, no control characters, '/' or ','",
            )
        if tag not in out:
            out.append(tag)
    if len(out) > MAX_TAGS:
        raise _invalid(field, f"{len(out)} tags, at most {MAX_TAGS}")
    return out


@dataclass(frozen=True, slots=True)
class SkillDraft:
    """What a publisher sends."""

    name: str
    body: str
    description: str = ""
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Skill:
    name: str
    author: str
    description: str
    tags: tuple[str, ...]
    downloads: int
    version: int
    body: str | None = None
    created_at: int | None = None
    updated_at: int | None = None

    def item(self) -> dict[str, Any]:
        """SPEC part 4's listing item (`version` is a string there)."""
        return {
            "name": self.name,
            "author": self.author,
            "description": self.description,
            "tags": list(self.tags),
            "downloads": self.downloads,
            "version": str(self.version),
        }

    def detail(self) -> dict[str, Any]:
        return {
            **self.item(),
            "body": self.body,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
        }


@dataclass(frozen=True, slots=True)
class PinnedSkill:
    """One version of a skill, as a workflow step runs it."""

    name: str
    author: str
    version: int
    body: str

    @property
    def label(self) -> str:
        return f"{self.name} v{self.version} by {self.author}"

    def wire(self) -> dict[str, Any]:
        """As a workflow's spec stores and shows it."""
        return {
            "name": self.name,
            "author": self.author,
            "version": self.version,
            "body": self.body,
        }


@dataclass(frozen=True, slots=True)
class SkillPage:
    items: tuple[Skill, ...]
    total: int
    limit: int
    offset: int

    @property
    def has_more(self) -> bool:
        return self.offset + len(self.items) < self.total


@dataclass(frozen=True, slots=True)
class Published:
    skill: Skill
    created: bool  # False: an existing (name, author) was republished


@dataclass(frozen=True, slots=True)
class SkillReport:
    id: int
    name: str
    author: str
    reporter: str
    reason: str
    created_at: int


@dataclass(frozen=True, slots=True)
class ReportPage:
    reports: tuple[SkillReport, ...]
    total: int
    limit: int
    offset: int

    @property
    def has_more(self) -> bool:
        return self.offset + len(self.reports) < self.total


def _skill(r: asyncpg.Record) -> Skill:
    keys = r.keys()
    return Skill(
        name=r["name"],
        author=r["author"],
        description=r["description"],
        tags=tuple(r["tags"]),
        downloads=int(r["downloads"]),
        version=int(r["version"]),
        body=r["body"] if "body" in keys else None,
        created_at=r["created_at"] if "created_at" in keys else None,
        updated_at=r["updated_at"] if "updated_at" in keys else None,
    )


def _findable(name: str, author: str | None) -> str:
    """`name` as publish stored it (NFC, trimmed: a name typed on macOS arrives in NFD),
    for the lookups by name (detail, delete, report, dismiss)."""
    # No stored skill has a NUL in its key (Postgres text cannot hold one): a plain 404.
    if "\x00" in name or (author is not None and "\x00" in author):
        raise NotFound(f"skill {name!r} not found")
    return _text(name)


def _ambiguous(name: str, authors: Sequence[str], hint: str) -> Conflict:
    return Conflict(
        f"skill {name!r} is published by {len(authors)} authors; {hint}",
        extra={"name": name, "authors": list(authors)},
    )


def _unpinnable(ref: str, message: str, **extra: Any) -> ValidationFailed:
    return ValidationFailed(f"skill {ref!r}: {message}", extra={"skill": ref, **extra})


def parse_skill_ref(ref: str) -> tuple[str | None, str, int | None]:
    """`(author, name, version)` of a skill reference; a ValidationFailed naming it when it
    is not one."""
    found = SKILL_REF.fullmatch(ref) if isinstance(ref, str) else None
    # A name no skill may have (`pdf@`, `pdf@0`): not a reference, rather than "not found".
    if found is not None and _LOOKS_VERSIONED.fullmatch(found.group("name")):
        found = None
    if found is None:
        raise _unpinnable(str(ref)[:300], f"not a skill reference ({REF_GRAMMAR})")
    version = found.group("version")
    return found.group("author"), _text(found.group("name")), int(version) if version else None


class Marketplace:
    """The skills store over the service's asyncpg pool."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        publish_per_hour: int,
        body_max: int = SKILL_BODY_LIMIT,
        browse_limit: int = 50,
        description_max: int = DESCRIPTION_MAX,
    ) -> None:
        if body_max > SKILL_BODY_LIMIT:
            log.warning(
                "skill_body_max %d is above the spec's %d: %d applies",
                body_max,
                SKILL_BODY_LIMIT,
                SKILL_BODY_LIMIT,
            )
        self._pool = pool
        self.publish_per_hour = publish_per_hour
        self.body_max = min(body_max, SKILL_BODY_LIMIT)
        self.browse_limit = browse_limit
        self.description_max = description_max

    @classmethod
    def of(cls, pool: asyncpg.Pool, settings: Settings) -> Marketplace:
        """The marketplace as configured (the API's, and the agent workers' tools')."""
        return cls(
            pool,
            publish_per_hour=settings.marketplace_publish_per_hour,
            body_max=settings.skill_body_max,
            browse_limit=settings.marketplace_browse_limit,
            description_max=settings.skill_description_max,
        )

    # --- reads --------------------------------------------------------------------------

    async def browse(
        self,
        *,
        sort: Sort = "newest",
        tags: Sequence[str] = (),
        limit: int | None = None,
        offset: int = 0,
    ) -> SkillPage:
        """One page, newest first (first publish) or most downloaded first; `tags` keeps
        the skills that carry every one of them."""
        if sort not in _ORDER:
            raise _invalid("sort", "newest or popular")
        return await self._page(_ORDER[sort], tags, limit, offset, query=None)

    async def search(
        self,
        query: str,
        *,
        tags: Sequence[str] = (),
        limit: int | None = None,
        offset: int = 0,
    ) -> SkillPage:
        """Any part of the name (a case-insensitive substring: `zebrafish-d7a2` finds
        `zebrafish-d7a2fd37-skill`, which full-text parsing splits and misses), or full-text
        over name and description (English stemming, web-search syntax: quotes, `or`,
        `-word`). Name matches first, then by rank. The substring test scans names (the
        embedded Postgres has no pg_trgm): fine for a catalogue of thousands of skills."""
        query = _no_nul("q", query).strip()
        if not query or len(query) > QUERY_MAX:
            raise _invalid("q", f"1-{QUERY_MAX} characters")
        order = (
            "(strpos(lower(s.name), lower($1)) > 0) DESC, ts_rank_cd(s.search, q.q) DESC,"
            " s.downloads DESC, s.created_at DESC, s.id DESC"
        )
        return await self._page(order, tags, limit, offset, query=query)

    async def _page(
        self,
        order: str,
        tags: Sequence[str],
        limit: int | None,
        offset: int,
        *,
        query: str | None,
    ) -> SkillPage:
        wanted = normalize_tags(tags)
        limit = self.browse_limit if limit is None else limit
        if limit < 1 or offset < 0:
            raise _invalid("limit" if limit < 1 else "offset", "out of range")
        args: list[Any] = []
        source = "skills AS s"
        where = ["TRUE"]
        if query is not None:
            args.append(query)
            source += f", websearch_to_tsquery('english', ${len(args)}) AS q(q)"
            where.append(f"(s.search @@ q.q OR strpos(lower(s.name), lower(${len(args)})) > 0)")
        if wanted:
            args.append(wanted)
            where.append(f"s.tags @> ${len(args)}::text[]")
        cond = " AND ".join(where)
        async with self._pool.acquire() as conn:
            # One snapshot for the count and the page, so `total` matches the items.
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                total = await conn.fetchval(f"SELECT count(*) FROM {source} WHERE {cond}", *args)
                rows = await conn.fetch(
                    f"SELECT {_ITEM} FROM {source} WHERE {cond} ORDER BY {order}"
                    f" LIMIT ${len(args) + 1} OFFSET ${len(args) + 2}",
                    *args,
                    limit,
                    offset,
                )
        return SkillPage(tuple(_skill(r) for r in rows), int(total), limit, offset)

    async def detail(self, name: str, author: str | None = None) -> Skill:
        """The skill with its body; counts one download (the returned count includes it).
        Without `author`, a name that several authors publish is a 409 listing them."""
        name = _findable(name, author)
        async with self._pool.acquire() as conn:
            owner = author if author is not None else await self._sole_author(conn, name)
            row = await conn.fetchrow(
                f"UPDATE skills AS s SET downloads = s.downloads + 1"
                f" WHERE s.name = $1 AND s.author = $2 RETURNING {_DETAIL}",
                name,
                owner,
            )
        if row is None:
            raise NotFound(f"skill {name!r} not found" + (f" by {author!r}" if author else ""))
        return _skill(row)

    async def pin(self, ref: str) -> PinnedSkill:
        """The version of a skill that `ref` names: the given version, else the current one.
        A bad reference, an unknown skill or version, and a name several authors publish
        given without its author are a ValidationFailed naming `ref` (with `authors` for the
        last). Not a download."""
        author, name, version = parse_skill_ref(ref)
        # One statement: the skills of that name (by that author) and the version asked for,
        # if they have it, seen in one snapshot.
        rows = await self._pool.fetch(
            "SELECT s.author, s.version AS current, v.version, v.body FROM skills s"
            " LEFT JOIN skill_versions v ON v.skill_id = s.id"
            " AND v.version = coalesce($3::integer, s.version)"
            " WHERE s.name = $1 AND ($2::text IS NULL OR s.author = $2)"
            " ORDER BY s.created_at, s.id",
            name,
            author,
            version,
        )
        if not rows:
            by = f" by {author!r}" if author is not None else ""
            raise _unpinnable(ref, f"no skill named {name!r}{by} in the marketplace")
        if len(rows) > 1:
            authors = [r["author"] for r in rows]
            raise _unpinnable(
                ref,
                f"{name!r} is published by {len(authors)} authors ({', '.join(authors)}):"
                " name one, as <author>/name",
                authors=authors,
            )
        row = rows[0]
        if row["version"] is None:
            raise _unpinnable(
                ref, f"{name!r} has no version {version} (the current one is {row['current']})"
            )
        return PinnedSkill(name, row["author"], int(row["version"]), row["body"])

    async def _authors(self, conn: asyncpg.Connection, name: str) -> list[str]:
        rows = await conn.fetch(
            "SELECT author FROM skills WHERE name = $1 ORDER BY created_at, id", name
        )
        return [r["author"] for r in rows]

    async def _sole_author(self, conn: asyncpg.Connection, name: str) -> str:
        authors = await self._authors(conn, name)
        if not authors:
            raise NotFound(f"skill {name!r} not found")
        if len(authors) > 1:
            raise _ambiguous(name, authors, "pass ?author= to choose one")
        return authors[0]

    # --- writes -------------------------------------------------------------------------

    def _check_draft(self, draft: SkillDraft) -> tuple[str, str, list[str], str]:
        name = check_name(draft.name)
        description = _no_nul("description", draft.description)
        if len(description) > self.description_max:
            raise _invalid(
                "description",
                f"{len(description)} characters, at most {self.description_max}"
                " (skill_description_max)",
            )
        body = _no_nul("body", draft.body)
        if not body.strip():
            raise _invalid("body", "must not be empty")
        if len(body) > self.body_max:
            raise _invalid("body", f"{len(body)} characters, at most {self.body_max}")
        return name, description, normalize_tags(draft.tags), body

    async def publish(
        self,
        draft: SkillDraft,
        caller: Principal,
        *,
        before_commit: Callable[[asyncpg.Connection, Published], Awaitable[None]] | None = None,
    ) -> Published:
        """Publish (or republish: version + 1) the caller's skill. Counts toward the caller's
        hourly limit either way; over it: 429 with the seconds until a publish ages out.
        `before_commit(conn, published)` runs in the publish's transaction (an idempotency
        key's answer, orchestrator/idempotency.py): if it raises, nothing is published."""
        name, description, tags, body = self._check_draft(draft)
        author = caller.user_uuid
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))", PUBLISH_LOCK, author
            )
            now = int(await conn.fetchval(f"SELECT {DB_NOW_MS}"))
            await self._within_limit(conn, author, now)
            row = await conn.fetchrow(
                "INSERT INTO skills AS s (name, author, description, tags, body,"
                " created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $6)"
                " ON CONFLICT (name, author) DO UPDATE SET description = EXCLUDED.description,"
                " tags = EXCLUDED.tags, body = EXCLUDED.body, version = s.version + 1,"
                f" updated_at = EXCLUDED.updated_at RETURNING s.id, {_DETAIL}",
                name,
                author,
                description,
                tags,
                body,
                now,
            )
            # Each version is kept: a workflow step pinned to it still runs its body.
            await conn.execute(
                "INSERT INTO skill_versions (skill_id, version, body, description, published_at)"
                " VALUES ($1, $2, $3, $4, $5)",
                row["id"],
                row["version"],
                body,
                description,
                now,
            )
            await conn.execute(
                "INSERT INTO skill_publishes (author, name, version, published_at)"
                " VALUES ($1, $2, $3, $4)",
                author,
                name,
                row["version"],
                now,
            )
            # Version 1 only on a first insert: a conflict always bumps it.
            done = Published(_skill(row), row["version"] == 1)
            if before_commit is not None:
                await before_commit(conn, done)
        return done

    async def _within_limit(self, conn: asyncpg.Connection, author: str, now: int) -> None:
        """Raise RateLimited when `author` has used the hour's budget (0: no limit). Runs
        under the author's lock; drops the author's log rows that left the window."""
        since = now - HOUR_MS
        await conn.execute(
            "DELETE FROM skill_publishes WHERE author = $1 AND published_at <= $2", author, since
        )
        if self.publish_per_hour <= 0:
            return
        stamps = [
            r["published_at"]
            for r in await conn.fetch(
                "SELECT published_at FROM skill_publishes WHERE author = $1"
                " AND published_at > $2 ORDER BY published_at",
                author,
                since,
            )
        ]
        if len(stamps) < self.publish_per_hour:
            return
        # The next publish fits once enough of the window's oldest have aged out.
        frees_at = stamps[len(stamps) - self.publish_per_hour] + HOUR_MS
        raise RateLimited(
            f"publish limit of {self.publish_per_hour} per hour reached",
            retry_after=math.ceil((frees_at - now) / 1000),
            extra={"limit": self.publish_per_hour},
        )

    async def delete(self, name: str, caller: Principal, author: str | None = None) -> Skill:
        """Delete a skill (and its reports). Without `author`: the caller's own skill of that
        name; an admin with no skill of that name deletes the only author's one (several
        authors: 409, pass `author`). Someone else's skill: 403 unless admin."""
        name = _findable(name, author)
        async with self._pool.acquire() as conn, conn.transaction():
            authors = await self._authors(conn, name)
            if author is None:
                if caller.user_uuid in authors:
                    author = caller.user_uuid
                elif not authors:
                    raise NotFound(f"skill {name!r} not found")
                elif not caller.is_admin:
                    raise Forbidden(f"skill {name!r} is not yours; only its author deletes it")
                elif len(authors) > 1:
                    raise _ambiguous(name, authors, "pass ?author= to choose which to delete")
                else:
                    author = authors[0]
            elif author not in authors:
                raise NotFound(f"skill {name!r} by {author!r} not found")
            elif author != caller.user_uuid and not caller.is_admin:
                raise Forbidden(f"skill {name!r} is not yours; only its author deletes it")
            row = await conn.fetchrow(
                f"DELETE FROM skills AS s WHERE s.name = $1 AND s.author = $2 RETURNING {_DETAIL}",
                name,
                author,
            )
        if row is None:  # deleted by a concurrent request since we looked
            raise NotFound(f"skill {name!r} by {author!r} not found")
        return _skill(row)

    # --- moderation ---------------------------------------------------------------------

    async def report(
        self, name: str, reason: str, caller: Principal, author: str | None = None
    ) -> SkillReport:
        """File a report for moderation. A caller's second pending report on the same skill
        replaces the first's reason (one pending report per reporter and skill)."""
        reason = _no_nul("reason", reason).strip()
        if not reason:
            raise _invalid("reason", "required")
        if len(reason) > REASON_MAX:
            raise _invalid("reason", f"{len(reason)} characters, at most {REASON_MAX}")
        name = _findable(name, author)
        async with self._pool.acquire() as conn, conn.transaction():
            owner = author if author is not None else await self._sole_author(conn, name)
            row = await conn.fetchrow(
                "INSERT INTO skill_reports (skill_id, reporter, reason, created_at)"
                f" SELECT id, $3, $4, {DB_NOW_MS} FROM skills WHERE name = $1 AND author = $2"
                " ON CONFLICT (skill_id, reporter) WHERE NOT dismissed"
                " DO UPDATE SET reason = EXCLUDED.reason, created_at = EXCLUDED.created_at"
                " RETURNING id, created_at",
                name,
                owner,
                caller.user_uuid,
                reason,
            )
        if row is None:
            raise NotFound(f"skill {name!r} not found" + (f" by {author!r}" if author else ""))
        return SkillReport(row["id"], name, owner, caller.user_uuid, reason, row["created_at"])

    async def reports(self, *, limit: int = 100, offset: int = 0) -> ReportPage:
        """Pending (not dismissed) reports, oldest first."""
        async with self._pool.acquire() as conn:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                total = await conn.fetchval(
                    "SELECT count(*) FROM skill_reports WHERE NOT dismissed"
                )
                rows = await conn.fetch(
                    "SELECT r.id, s.name, s.author, r.reporter, r.reason, r.created_at"
                    " FROM skill_reports r JOIN skills s ON s.id = r.skill_id"
                    " WHERE NOT r.dismissed ORDER BY r.created_at, r.id LIMIT $1 OFFSET $2",
                    limit,
                    offset,
                )
        reports = tuple(
            SkillReport(
                r["id"], r["name"], r["author"], r["reporter"], r["reason"], r["created_at"]
            )
            for r in rows
        )
        return ReportPage(reports, int(total), limit, offset)

    async def dismiss(
        self, name: str, caller: Principal, author: str | None = None
    ) -> tuple[str, int]:
        """Dismiss every pending report of a skill (admins only).
        Returns the skill's author and how many reports were dismissed."""
        if not caller.is_admin:
            raise Forbidden("admin only")
        name = _findable(name, author)
        async with self._pool.acquire() as conn, conn.transaction():
            owner = author if author is not None else await self._sole_author(conn, name)
            skill_id = await conn.fetchval(
                "SELECT id FROM skills WHERE name = $1 AND author = $2",
                name,
                owner,
            )
            if skill_id is None:
                raise NotFound(f"skill {name!r} by {owner!r} not found")
            done = await conn.fetch(
                f"UPDATE skill_reports SET dismissed = true, dismissed_at = {DB_NOW_MS},"
                " dismissed_by = $2 WHERE skill_id = $1 AND NOT dismissed RETURNING id",
                skill_id,
                caller.user_uuid,
            )
        return owner, len(done)
