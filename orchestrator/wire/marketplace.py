"""The skills marketplace (SPEC parts 2 and 4, marketplace)."""

from __future__ import annotations

from pydantic import Field

from orchestrator.wire._base import ApiModel

__all__ = [
    "ReportFiled",
    "ReportPage",
    "ReportsDismissed",
    "Skill",
    "SkillDeleted",
    "SkillDetail",
    "SkillPage",
    "SkillPublished",
    "SkillReport",
]


class Skill(ApiModel):
    name: str
    author: str
    description: str
    tags: list[str]
    downloads: int
    version: str = Field(description="Starts at 1; each republish adds one")


class SkillPage(ApiModel):
    items: list[Skill]
    total: int
    limit: int
    offset: int
    has_more: bool


class SkillDetail(Skill):
    body: str
    created_at: int = Field(description="Unix ms of the first publish")
    updated_at: int = Field(description="Unix ms of the latest publish")


class SkillPublished(ApiModel):
    ok: bool = True
    name: str
    author: str
    version: str
    created: bool = Field(description="False when an existing skill was republished")


class SkillDeleted(ApiModel):
    ok: bool = True
    name: str
    author: str
    deleted: bool = True


class ReportFiled(ApiModel):
    ok: bool = True
    id: int
    name: str
    author: str


class SkillReport(ApiModel):
    id: int
    name: str
    author: str
    reporter: str
    reason: str
    created_at: int


class ReportPage(ApiModel):
    ok: bool = True
    reports: list[SkillReport]
    total: int
    limit: int
    offset: int
    has_more: bool


class ReportsDismissed(ApiModel):
    ok: bool = True
    name: str
    author: str
    dismissed: int = Field(description="Pending reports now dismissed")
