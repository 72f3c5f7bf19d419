"""Marketplace: skills unique per (name, author), browse, full-text search, downloads,
versioned republishing, an hourly publish limit and moderation reports."""

from orchestrator.marketplace._store import (
    RESERVED_NAMES,
    SKILL_BODY_LIMIT,
    Marketplace,
    Published,
    ReportPage,
    Skill,
    SkillDraft,
    SkillPage,
    SkillReport,
    Sort,
)

__all__ = [
    "RESERVED_NAMES",
    "SKILL_BODY_LIMIT",
    "Marketplace",
    "Published",
    "ReportPage",
    "Skill",
    "SkillDraft",
    "SkillPage",
    "SkillReport",
    "Sort",
]
