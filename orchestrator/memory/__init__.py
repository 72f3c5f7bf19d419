"""Memory: per-agent key-value entries with full-text search, ownership and a Redis cache."""

from orchestrator.memory._store import REFLECTION_PREFIX, Entry, MemoryStore
from orchestrator.memory._tools import MEMORY_TOOLS

__all__ = ["MEMORY_TOOLS", "REFLECTION_PREFIX", "Entry", "MemoryStore"]
