"""Map a raw request path to its route template (`/api/v1/tokens/{prefix}`), so metrics are
labelled by route and their cardinality stays bounded whatever paths clients send."""

from __future__ import annotations

import re
from collections.abc import Iterable

UNMATCHED = "<unmatched>"
_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(:path)?\}")


def _compile(template: str) -> re.Pattern[str]:
    out, last = [], 0
    for match in _PARAM.finditer(template):
        out.append(re.escape(template[last : match.start()]))
        out.append(".+" if match.group(2) else "[^/]+")
        last = match.end()
    out.append(re.escape(template[last:]))
    return re.compile("^" + "".join(out) + "$")


class RouteTemplates:
    """Matches paths against templates; literal routes win over parameterised ones."""

    def __init__(self, templates: Iterable[str], cache_size: int = 4096) -> None:
        unique = sorted(set(templates), key=lambda t: (len(_PARAM.findall(t)), -len(t), t))
        self._patterns = [(_compile(t), t) for t in unique]
        self._cache: dict[str, str] = {}
        self._cache_size = cache_size

    def match(self, path: str) -> str:
        found = self._cache.get(path)
        if found is not None:
            return found
        found = next((t for pattern, t in self._patterns if pattern.match(path)), UNMATCHED)
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        self._cache[path] = found
        return found
