"""The database's clock in SQL: one source of time for every row that several processes
compare (claims' leases, expiries, retry times), whatever each machine's clock says."""

from __future__ import annotations

__all__ = ["DB_NOW_MS"]

# Unix ms now, read when the statement runs (clock_timestamp, not the transaction's start).
DB_NOW_MS = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
