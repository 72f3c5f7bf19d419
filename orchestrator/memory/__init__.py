"""Memory: per-agent key-value entries with full-text and vector search, ownership, a Redis
cache, and embeddings made after the write."""

from orchestrator.memory._embed import (
    Embedder,
    EmbedderUnavailable,
    LocalEmbedder,
    ProviderEmbedder,
    make_embedder,
)
from orchestrator.memory._store import REFLECTION_PREFIX, Entry, MemoryStore
from orchestrator.memory._tools import MEMORY_TOOLS

__all__ = [
    "MEMORY_TOOLS",
    "REFLECTION_PREFIX",
    "Embedder",
    "EmbedderUnavailable",
    "Entry",
    "LocalEmbedder",
    "MemoryStore",
    "ProviderEmbedder",
    "make_embedder",
]
