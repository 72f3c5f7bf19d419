"""Processes the service starts and owns: embedded Postgres and Redis."""

from orchestrator.runtime._embedded import EmbeddedPostgres, EmbeddedRedis

__all__ = ["EmbeddedPostgres", "EmbeddedRedis"]
