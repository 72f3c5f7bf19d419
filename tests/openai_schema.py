"""Validate our wire output against OpenAI's published schemas.

tests/reference/openai-openapi-subset.json is a subset of OpenAI's OpenAPI document (MIT,
LICENSE beside it). It is OpenAPI 3.x with `nullable: true` (an OpenAPI 3.0 keyword JSON
Schema ignores), so before validating each `nullable: true` becomes
`anyOf: [schema, {type: null}]`; otherwise a null our server sends legitimately would fail.
`$ref`s (`#/components/schemas/...`) resolve against the document itself.

    from tests.openai_schema import validate
    validate(body, "CreateChatCompletionResponse")  # raises SchemaMismatch naming the path
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

REFERENCE = Path(__file__).resolve().parent / "reference" / "openai-openapi-subset.json"


class SchemaMismatch(AssertionError):
    """An instance does not match the named OpenAI schema."""


def _rewrite_nullable(node: Any) -> Any:
    if isinstance(node, list):
        return [_rewrite_nullable(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _rewrite_nullable(value) for key, value in node.items()}
    if out.pop("nullable", None) is True:
        # Keep annotations outside so the anyOf carries only the constraint.
        description = out.pop("description", None)
        wrapped: dict[str, Any] = {"anyOf": [out, {"type": "null"}]}
        if description is not None:
            wrapped["description"] = description
        return wrapped
    return out


@functools.cache
def _components() -> dict[str, Any]:
    doc = json.loads(REFERENCE.read_text())
    components: dict[str, Any] = _rewrite_nullable(doc["components"])
    return components


def schema_names() -> list[str]:
    return sorted(_components()["schemas"])


@functools.cache
def _validator(schema_name: str) -> Draft202012Validator:
    components = _components()
    if schema_name not in components["schemas"]:
        raise KeyError(f"no schema {schema_name!r} in {REFERENCE.name}")
    # The root carries `components` so '#/components/schemas/X' refs resolve in place.
    root = {"$ref": f"#/components/schemas/{schema_name}", "components": components}
    return Draft202012Validator(root)


def errors(instance: Any, schema_name: str) -> list[str]:
    """Every mismatch as 'path: message' (empty when the instance is valid)."""
    found = sorted(_validator(schema_name).iter_errors(instance), key=lambda e: list(e.path))
    return [f"{e.json_path}: {e.message}" for e in found]


def validate(instance: Any, schema_name: str) -> None:
    """Raise SchemaMismatch naming the JSON path of the (most relevant) mismatch."""
    found = list(_validator(schema_name).iter_errors(instance))
    if not found:
        return
    worst = best_match(found)
    others = len(found) - 1
    raise SchemaMismatch(
        f"{schema_name} mismatch at {worst.json_path}: {worst.message}"
        f" (schema path {'/'.join(str(p) for p in worst.schema_path)})"
        + (f"; and {others} more" if others else "")
        + f"\ninstance: {json.dumps(instance)[:2000]}"
    )
