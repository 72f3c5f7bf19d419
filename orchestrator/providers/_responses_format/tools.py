"""The tools of a Responses request, as providers get them and as the Response echoes them.

Function tools pass as they are; a custom (freeform) tool, Codex's `apply_patch`, is a
function of one string argument (`{input}`), its grammar given to the model as text; a
namespace's functions and custom tools are flattened to `<namespace>__<name>`
(`items.flat_name`) and their calls answered namespaced. Hosted tools (web search, file
search, computer use...) nobody here runs are a 400 naming them, or with
`drop_unsupported_params` dropped and listed.
"""

from __future__ import annotations

from typing import Any

from orchestrator.providers._responses_format.items import PROVIDER_NAME, flat_name, invalid
from orchestrator.providers._types import ToolDef

__all__ = ["CUSTOM_PARAMETERS", "Tools", "tool_choice"]

JSON = dict[str, Any]


# A custom (freeform) tool reaches providers as a function of one string argument.
CUSTOM_PARAMETERS: JSON = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
}


class Tools:
    """The request's tools: what providers get (`defs`), what is echoed (`wire`), the
    custom tools' and namespaced functions' names, and hosted tools dropped (listed)."""

    def __init__(self, drop: bool) -> None:
        self.drop = drop
        self.wire: list[JSON] = []
        self.defs: list[ToolDef] = []
        self.custom: set[str] = set()
        self.namespaced: dict[str, tuple[str, str]] = {}  # provider name -> (namespace, name)
        self.dropped: list[str] = []

    def read(self, raw: Any) -> None:
        if raw is None:
            return
        if not isinstance(raw, list):
            invalid("tools", "must be an array")
        for k, tool in enumerate(raw):
            where = f"tools[{k}]"
            if not isinstance(tool, dict):
                invalid(where, "must be an object")
            kind = tool.get("type")
            if kind == "namespace":
                self.wire.append(self._namespace(tool, where))
            elif kind in ("function", "custom"):
                self.wire.append(self._tool(tool, where, None))
            elif self.drop and isinstance(kind, str):
                self.dropped.append(f"{where}:{kind}")  # a hosted tool nobody here runs
            else:
                invalid(
                    f"{where}.type",
                    f"{kind!r} tools are not supported (function, custom and namespace tools"
                    " only; drop_unsupported_params drops the others)",
                )

    def _namespace(self, tool: JSON, where: str) -> JSON:
        """A namespace's functions reach providers flattened: `<namespace>__<name>` (in
        their name charset, at most 64 characters); calls come back namespaced."""
        name, inner = tool.get("name"), tool.get("tools")
        if not isinstance(name, str) or not PROVIDER_NAME.fullmatch(name):
            invalid(f"{where}.name", "must be 1-64 of A-Z a-z 0-9 _ -")
        if not isinstance(inner, list) or not inner:
            invalid(f"{where}.tools", "must be a non-empty array")
        tools = []
        for k, member in enumerate(inner):
            at = f"{where}.tools[{k}]"
            if not isinstance(member, dict) or member.get("type") not in ("function", "custom"):
                invalid(f"{at}.type", "a namespace holds function and custom tools")
            tools.append(self._tool(member, at, name))
        echoed: JSON = {"type": "namespace", "name": name, "tools": tools}
        echoed["description"] = str(tool.get("description") or "")
        return echoed

    def _tool(self, tool: JSON, where: str, namespace: str | None) -> JSON:
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            invalid(f"{where}.name", "is required")
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            invalid(f"{where}.description", "must be a string")
        flat = name if namespace is None else flat_name(namespace, name)
        if namespace is not None:
            self.namespaced[flat] = (namespace, name)
        if tool.get("type") == "custom":
            self.custom.add(flat)
            fmt = _custom_format(tool.get("format"), f"{where}.format")
            self.defs.append(ToolDef(flat, _with_grammar(description, fmt), CUSTOM_PARAMETERS))
            echoed: JSON = {"type": "custom", "name": name, "format": fmt}
            if description is not None:
                echoed["description"] = description
            return echoed
        params = tool.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        elif not isinstance(params, dict):
            invalid(f"{where}.parameters", "must be a JSON Schema object")
        strict = tool.get("strict")
        self.defs.append(ToolDef(flat, description, params))
        return {
            "type": "function",
            "name": name,
            "description": description,
            "parameters": params,
            "strict": strict if isinstance(strict, bool) else True,
        }


def _custom_format(value: Any, where: str) -> JSON:
    if value is None:
        return {"type": "text"}
    if not isinstance(value, dict) or value.get("type") not in ("text", "grammar"):
        invalid(where, "must be {type: text} or {type: grammar, syntax, definition}")
    if value["type"] == "text":
        return {"type": "text"}
    syntax, definition = value.get("syntax"), value.get("definition")
    if syntax not in ("lark", "regex") or not isinstance(definition, str):
        invalid(where, "a grammar needs syntax (lark or regex) and a definition")
    return {"type": "grammar", "syntax": syntax, "definition": definition}


def _with_grammar(description: str | None, fmt: JSON) -> str | None:
    if fmt["type"] != "grammar":
        return description
    rule = f"The `input` argument must follow this {fmt['syntax']} grammar:\n{fmt['definition']}"
    return f"{description}\n\n{rule}" if description else rule


def tool_choice(raw: Any) -> str | dict[str, str] | None:
    if raw is None:
        return None
    if raw in ("auto", "none"):
        return str(raw)
    if raw == "required":
        return "any"
    if isinstance(raw, dict) and raw.get("type") in ("function", "custom"):
        name = raw.get("name")
        if isinstance(name, str) and name:
            return {"name": name}
        invalid("tool_choice.name", "is required")
    invalid("tool_choice", "must be 'auto', 'none', 'required' or {type: function|custom, name}")
