"""Postgres: the connection pool and the numbered migrations."""

from orchestrator.db._clock import DB_NOW_MS
from orchestrator.db._database import Database, connect
from orchestrator.db._migrations import MIGRATIONS_DIR, MigrationChanged, apply_migrations

__all__ = [
    "DB_NOW_MS",
    "MIGRATIONS_DIR",
    "Database",
    "MigrationChanged",
    "apply_migrations",
    "connect",
]
