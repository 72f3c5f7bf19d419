"""SPEC part 4, marketplace: publishing and discovery of agent skills. Every authenticated
caller reads every skill; a skill's author is its publisher, who alone (with admins) deletes
it. Reports and dismissals are admin-only. Rules live in `orchestrator.marketplace`."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from deployments.deps import AdminUser, CurrentUser, Idempotent, Market, Offset
from orchestrator import wire
from orchestrator.errors import ValidationFailed
from orchestrator.idempotency import Answer
from orchestrator.marketplace import Published, Skill, SkillDraft, SkillReport

router = APIRouter(tags=["marketplace"])

Name = Annotated[str, Path(min_length=1, max_length=256, description="Skill name")]
Author = Annotated[
    str | None,
    Query(
        min_length=1,
        max_length=256,
        description="The author's user_uuid; needed when several authors publish the name",
    ),
]
Limit = Annotated[
    int | None, Query(ge=1, le=1000, description="Page size (marketplace_browse_limit: 50)")
]
Tags = Annotated[
    str | None,
    Query(max_length=2000, description="Comma-separated; skills carrying all of them"),
]


class PublishBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Exact rules (and their messages) are the domain's; these bounds only refuse the absurd.
    name: str = Field(
        max_length=256,
        description="1-64 characters of any script, case kept, spaces allowed; no control"
        " characters or '/', not ending in @<digits>; not one of search, reports, dismiss,"
        " feature, rate, ratings, browse, detail, publish, delete, report",
    )
    description: str = Field(
        "", max_length=100_000, description="At most skill_description_max (1000) characters"
    )
    tags: list[Annotated[str, Field(max_length=256)]] = Field(
        default_factory=list,
        max_length=256,
        description="At most 16, each 1-32 characters without control characters, '/'"
        " or ','; lowercased",
    )
    body: str = Field(
        max_length=1_000_000, description="Skill content, 1 to skill_body_max (4096) characters"
    )


class ReportBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    reason: str = Field(max_length=100_000, description="1-1000 characters")
    author: str | None = Field(
        None, min_length=1, max_length=256, description="Which author's skill of that name"
    )


def _tags(raw: str | None) -> list[str]:
    return [t for t in (raw or "").split(",") if t.strip()]


def _page(
    items: tuple[Skill, ...], total: int, limit: int, offset: int, more: bool
) -> wire.SkillPage:
    return wire.SkillPage(
        items=[wire.Skill(**s.item()) for s in items],
        total=total,
        limit=limit,
        offset=offset,
        has_more=more,
    )


def _report(r: SkillReport) -> wire.SkillReport:
    return wire.SkillReport(
        id=r.id,
        name=r.name,
        author=r.author,
        reporter=r.reporter,
        reason=r.reason,
        created_at=r.created_at,
    )


@router.get("/marketplace/browse", response_model=wire.SkillPage)
async def browse(
    marketplace: Market,
    _: CurrentUser,
    sort: Literal["newest", "popular"] = "newest",
    tags: Tags = None,
    limit: Limit = None,
    offset: Offset = 0,
) -> wire.SkillPage:
    """`newest`: most recently first published first; `popular`: most downloaded first."""
    page = await marketplace.browse(sort=sort, tags=_tags(tags), limit=limit, offset=offset)
    return _page(page.items, page.total, page.limit, page.offset, page.has_more)


@router.get("/marketplace/search", response_model=wire.SkillPage)
async def search(
    marketplace: Market,
    _: CurrentUser,
    q: Annotated[str, Query(min_length=1, max_length=500, description="Web-search syntax")],
    tags: Tags = None,
    limit: Limit = None,
    offset: Offset = 0,
) -> wire.SkillPage:
    """Full-text over name and description (English stemming), best rank first; name
    matches rank above description matches."""
    page = await marketplace.search(q, tags=_tags(tags), limit=limit, offset=offset)
    return _page(page.items, page.total, page.limit, page.offset, page.has_more)


@router.get("/marketplace/detail/{name}", response_model=wire.SkillDetail)
async def detail(
    name: Name, marketplace: Market, _: CurrentUser, author: Author = None
) -> wire.SkillDetail:
    """Counts a download. A name several authors publish needs `author` (else 409 with
    `authors`)."""
    return wire.SkillDetail(**(await marketplace.detail(name, author)).detail())


def _published(done: Published) -> wire.SkillPublished:
    return wire.SkillPublished(
        name=done.skill.name,
        author=done.skill.author,
        version=str(done.skill.version),
        created=done.created,
    )


@router.post("/marketplace/publish", response_model=wire.SkillPublished)
async def publish(
    body: PublishBody, marketplace: Market, caller: CurrentUser, once: Idempotent
) -> wire.SkillPublished | Response:
    """Publish as the caller (the author); publishing your skill again bumps its version.
    400 reserved or invalid name, body too long; 429 (Retry-After) over
    marketplace_publish_per_hour. With an `Idempotency-Key`, a retry answers the first
    publish again (no new version, not counted toward the limit)."""
    draft = SkillDraft(
        name=body.name, body=body.body, description=body.description, tags=tuple(body.tags)
    )

    async def publish_once(answer: Answer) -> wire.SkillPublished:
        done = await marketplace.publish(
            draft, caller, before_commit=answer.in_transaction(_published)
        )
        return _published(done)

    return await once.run(publish_once)


@router.delete("/marketplace/delete/{name}", response_model=wire.SkillDeleted)
async def delete(
    name: Name, marketplace: Market, caller: CurrentUser, author: Author = None
) -> wire.SkillDeleted:
    """Author or admin (403 otherwise). Without `author`: your own skill of that name."""
    gone = await marketplace.delete(name, caller, author)
    return wire.SkillDeleted(name=gone.name, author=gone.author)


@router.post("/marketplace/report/{name}", response_model=wire.ReportFiled)
async def report(
    name: Name, body: ReportBody, marketplace: Market, caller: CurrentUser, author: Author = None
) -> wire.ReportFiled:
    """Report a skill for moderation (`author` in the body or the query picks among
    several authors); reporting it again while pending replaces the reason."""
    if body.author is not None and author is not None and body.author != author:
        raise ValidationFailed(
            "author: the body and the query name different authors",
            extra={"fields": [{"field": "author", "message": "conflicting values"}]},
        )
    filed = await marketplace.report(name, body.reason, caller, body.author or author)
    return wire.ReportFiled(id=filed.id, name=filed.name, author=filed.author)


@router.get("/marketplace/reports", response_model=wire.ReportPage)
async def reports(
    marketplace: Market,
    _: AdminUser,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Offset = 0,
) -> wire.ReportPage:
    """Admin: pending reports, oldest first."""
    page = await marketplace.reports(limit=limit, offset=offset)
    return wire.ReportPage(
        reports=[_report(r) for r in page.reports],
        total=page.total,
        limit=page.limit,
        offset=page.offset,
        has_more=page.has_more,
    )


@router.post("/marketplace/dismiss/{name}", response_model=wire.ReportsDismissed)
async def dismiss(
    name: Name, marketplace: Market, caller: AdminUser, author: Author = None
) -> wire.ReportsDismissed:
    """Admin: dismiss every pending report of the skill."""
    owner, count = await marketplace.dismiss(name, caller, author)
    return wire.ReportsDismissed(name=name, author=owner, dismissed=count)
