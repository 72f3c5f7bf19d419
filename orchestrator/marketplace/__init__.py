"""Marketplace: skills unique per (name, author), browse, full-text search, downloads,
versioned republishing (every version kept, pinnable), an hourly publish limit, moderation
reports, and the tools that let an agent search and read skills."""

from orchestrator.marketplace._store import (
    RESERVED_NAMES,
    SKILL_BODY_LIMIT,
    Marketplace,
    PinnedSkill,
    Published,
    ReportPage,
    Skill,
    SkillDraft,
    SkillPage,
    SkillReport,
    Sort,
    parse_skill_ref,
)
from orchestrator.marketplace._tools import MARKETPLACE_TOOLS

__all__ = [
    "MARKETPLACE_TOOLS",
    "RESERVED_NAMES",
    "SKILL_BODY_LIMIT",
    "Marketplace",
    "PinnedSkill",
    "Published",
    "ReportPage",
    "Skill",
    "SkillDraft",
    "SkillPage",
    "SkillReport",
    "Sort",
    "parse_skill_ref",
]
