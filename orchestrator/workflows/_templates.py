"""Workflow templates: named step lists with `{{variables}}`, a user's own or
shared by an admin; a user's own template of a name hides a shared one. Mixed into
`WorkflowStore` (_store.py), whose pool it uses."""

from __future__ import annotations

import json
from typing import Any

import asyncpg

from orchestrator.auth import Principal
from orchestrator.workflows._records import now_ms
from orchestrator.workflows._spec import template_variables


class WorkflowTemplates:
    _pool: asyncpg.Pool

    async def save_template(
        self, name: str, steps: list[dict[str, Any]], principal: Principal, *, shared: bool
    ) -> list[str]:
        variables = template_variables(steps)
        ts = now_ms()
        await self._pool.execute(
            "INSERT INTO workflow_templates (owner, name, steps, variables, created_by,"
            " created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $6)"
            " ON CONFLICT (owner, name) DO UPDATE SET steps = EXCLUDED.steps,"
            " variables = EXCLUDED.variables, updated_at = EXCLUDED.updated_at",
            "" if shared else principal.user_uuid,
            name,
            json.dumps(steps),
            variables,
            principal.user_uuid,
            ts,
        )
        return variables

    async def get_template(self, name: str, user_uuid: str) -> dict[str, Any] | None:
        """The user's own template of that name, else a shared one."""
        row = await self._pool.fetchrow(
            "SELECT owner, name, steps, variables, created_by, created_at FROM"
            " workflow_templates WHERE name = $1 AND owner IN ($2, '')"
            " ORDER BY owner = '' LIMIT 1",
            name,
            user_uuid,
        )
        return _template(row) if row is not None else None

    async def list_templates(self, principal: Principal) -> list[dict[str, Any]]:
        rows = await self._pool.fetch(
            "SELECT owner, name, steps, variables, created_by, created_at FROM"
            f" workflow_templates WHERE {'TRUE' if principal.is_admin else 'owner IN ($1, %s)'}"
            " AND $1::text IS NOT NULL ORDER BY name, owner".replace("%s", "''"),
            principal.user_uuid,
        )
        return [_template(r) for r in rows]


def _template(row: asyncpg.Record) -> dict[str, Any]:
    return {
        "name": row["name"],
        "steps": json.loads(row["steps"]),
        "variables": list(row["variables"]),
        "shared": row["owner"] == "",
        "owner": row["owner"] or None,
        "created_at": row["created_at"],
    }
