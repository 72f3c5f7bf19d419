"""Per-agent memory (SPEC part 4, memory): what the memory routes answer."""

from __future__ import annotations

from orchestrator.wire._base import ApiModel

__all__ = [
    "MemoryCleared",
    "MemoryCopied",
    "MemoryEntries",
    "MemoryEntry",
    "MemoryForgotten",
    "MemoryOk",
    "MemoryPinned",
    "MemoryResults",
    "MemoryStats",
    "Reflection",
    "Reflections",
    "SimilarEntry",
    "SimilarResults",
]


class MemoryOk(ApiModel):
    status: str = "ok"


class MemoryEntry(ApiModel):
    key: str
    value: str
    created_at: int


class MemoryResults(ApiModel):
    results: list[MemoryEntry]


class MemoryEntries(ApiModel):
    entries: list[MemoryEntry]


class Reflection(ApiModel):
    key: str
    value: str


class Reflections(ApiModel):
    reflections: list[Reflection]


class MemoryCleared(ApiModel):
    status: str = "ok"
    cleared: int


class MemoryStats(ApiModel):
    total_entries: int
    total_agents: int
    pg_enabled: bool
    pgvector_enabled: bool


class SimilarEntry(ApiModel):
    key: str
    value: str
    similarity: float


class SimilarResults(ApiModel):
    results: list[SimilarEntry]


class MemoryForgotten(ApiModel):
    status: str = "ok"
    forgotten: int


class MemoryCopied(ApiModel):
    status: str = "ok"
    copied: int


class MemoryPinned(ApiModel):
    status: str = "ok"
    pinned: bool
