"""Memory: per-agent key-value entries with full-text search, ownership and a Redis cache."""

from orchestrator.memory._store import REFLECTION_PREFIX, Entry, MemoryStore

__all__ = ["REFLECTION_PREFIX", "Entry", "MemoryStore"]
