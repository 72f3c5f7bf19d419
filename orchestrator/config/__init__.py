"""The service's one settings object.

Sources (pydantic-settings' own), highest priority first: explicit overrides (CLI flags),
`ORCH_<KEY>` environment variables (nested keys joined by `__`, lists and maps as JSON), the
YAML file (`--config FILE` or `ORCH_CONFIG`), `<PROVIDER>_API_KEY` (Bedrock: the AWS
variables) merged under `providers`, then the defaults. Settings are read once, by
`Settings.load` in the process that starts the service, and passed down (pickled to Ray
actors and replicas); nothing else reads the environment.

`Settings` (every key, its default and its check) is in `_settings`, its first keys (where it
runs, auth) in its base class in `_groups`, the providers' part in `_providers`, the loading
and its error messages in `_sources`.
"""

from __future__ import annotations

from orchestrator.config._providers import (
    PROVIDER_KEY_ENV,
    PROVIDER_KINDS,
    CustomProvider,
    ProviderSettings,
)
from orchestrator.config._settings import MIN_ADMIN_TOKEN_LEN, TELEGRAM_WEBHOOK_CIDRS, Settings
from orchestrator.config._sources import NOT_SETTINGS_ENV, ConfigError

__all__ = [
    "MIN_ADMIN_TOKEN_LEN",
    "NOT_SETTINGS_ENV",
    "PROVIDER_KEY_ENV",
    "PROVIDER_KINDS",
    "TELEGRAM_WEBHOOK_CIDRS",
    "ConfigError",
    "CustomProvider",
    "ProviderSettings",
    "Settings",
]
