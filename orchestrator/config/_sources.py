"""Where the settings come from and how a bad one is reported: the sources `Settings.load`
reads (the overrides, `ORCH_*` variables of the mapping it was given, the YAML file,
`<PROVIDER>_API_KEY`), in that priority, and the error that names the variable or file and
key of each invalid value (never the value: it may be a secret).

Separate from `Settings` because it is the one place that reads the environment and the
file, on pydantic-settings' source API; the settings class only declares keys.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import ValidationError
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    YamlConfigSettingsSource,
)

from orchestrator.config._providers import PROVIDER_KEY_ENV

__all__ = ["NOT_SETTINGS_ENV", "ConfigError", "load_settings", "loading_sources"]

_S = TypeVar("_S", bound=BaseSettings)

# ORCH_ variables that are not settings: the config file's path, and those of the SDK and the
# examples (a shell may hold both). Any other ORCH_ variable must name a setting.
NOT_SETTINGS_ENV = frozenset({"ORCH_CONFIG", "ORCH_API_KEY", "ORCH_BASE_URL", "ORCH_APP_NAME"})


class ConfigError(ValueError):
    """The configuration file or a setting is invalid."""


def loading_sources(
    settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource
) -> tuple[PydanticBaseSettingsSource, ...]:
    """`Settings.settings_customise_sources`: inside `load_settings`, its sources in
    priority order; constructed directly, only the values given (and the defaults)."""
    loading = _LOADING.get()
    if loading is None:
        return (init_settings,)
    loading.sources = [("overrides", init_settings)]
    loading.sources.append(("environment", _Environment(settings_cls, loading.environ)))
    if loading.config_file is not None:
        path = loading.config_file
        loading.sources.append((f"config file {path}", _YamlFile(settings_cls, path)))
    keys = _ProviderKeys(settings_cls, loading.environ)
    loading.sources.append(("<PROVIDER>_API_KEY / AWS variables", keys))
    return tuple(source for _, source in loading.sources)


def load_settings(
    cls: type[_S],
    config_file: str | Path | None,
    environ: Mapping[str, str] | None,
    overrides: Mapping[str, Any],
) -> _S:
    """`Settings.load`: one construction of `cls` with the sources of `environ` (default
    os.environ) and `config_file` (default `ORCH_CONFIG`); `ConfigError` explains a failure."""
    env = os.environ if environ is None else environ
    path = config_file or env.get("ORCH_CONFIG")
    loading = _Loading(env, Path(path) if path else None)
    given = {k: v for k, v in overrides.items() if v is not None}
    with _loading(loading):
        try:
            return cls(**given)
        except ValidationError as exc:
            raise ConfigError(_explain(exc, loading)) from exc


@dataclass
class _Loading:
    """What one `Settings.load` reads, and the sources built from it (to name in errors)."""

    environ: Mapping[str, str]
    config_file: Path | None
    sources: list[tuple[str, PydanticBaseSettingsSource]] = field(default_factory=list)


# Set by `load` around the one construction: `settings_customise_sources` is a classmethod
# of the library's, with no other way to receive this call's environment and file.
_LOADING: ContextVar[_Loading | None] = ContextVar("settings_loading", default=None)


@contextmanager
def _loading(loading: _Loading) -> Iterator[None]:
    token = _LOADING.set(loading)
    try:
        yield
    finally:
        _LOADING.reset(token)


class _Environment(EnvSettingsSource):
    """The library's environment source over the mapping `load` was given (not os.environ),
    refusing ORCH_ variables that name no setting and naming the variable of bad JSON."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        self._bad_json: tuple[str, ValueError] | None = None
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # What the library does with os.environ: names case-insensitive, empty values unset.
        return {
            (k if self.case_sensitive else k.lower()): v
            for k, v in self._environ.items()
            if not (self.env_ignore_empty and v == "")
        }

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        try:
            return super().decode_complex_value(field_name, field, value)
        except ValueError as exc:
            self._bad_json = (value, exc)  # the library may yet accept it (unions): kept only
            raise

    def prepare_field_value(
        self, field_name: str, field: FieldInfo, value: Any, value_is_complex: bool
    ) -> Any:
        self._bad_json = None
        try:
            return super().prepare_field_value(field_name, field, value, value_is_complex)
        except ValueError as exc:
            raise ConfigError(self._json_error(field_name, exc)) from exc

    def _json_error(self, field_name: str, exc: ValueError) -> str:
        bad, reason = self._bad_json or (None, exc)
        prefix = f"{self.env_prefix}{field_name}".lower()
        names = [
            k
            for k, v in self._environ.items()
            if (k.lower() == prefix or k.lower().startswith(prefix + "__"))
            and (bad is None or v == bad)
        ]
        return (
            f"{', '.join(sorted(names)) or prefix.upper()} (environment): not valid JSON "
            f"({reason}); lists and maps are given as JSON, e.g. "
            """ORCH_EXEMPT_PATHS='["/api/v1/health"]'"""
        )

    def __call__(self) -> dict[str, Any]:
        self._refuse_unknown()
        try:
            return super().__call__()
        except ConfigError:
            raise
        except ValueError as exc:  # SettingsError, wrapping what prepare_field_value raised
            if isinstance(exc.__cause__, ConfigError):
                raise exc.__cause__ from exc.__cause__.__cause__
            raise ConfigError(f"environment: {exc}") from exc

    def _refuse_unknown(self) -> None:
        known = [f"{self.env_prefix}{name}".upper() for name in self.settings_cls.model_fields]
        for var in self._environ:
            upper = var.upper()
            head = upper.split(self.env_nested_delimiter or "__", 1)[0]
            if upper.startswith(self.env_prefix.upper()) and upper not in NOT_SETTINGS_ENV:
                if head not in known:
                    near = difflib.get_close_matches(head, known, n=1)
                    hint = f"; did you mean {near[0]}?" if near else ""
                    raise ConfigError(f"{var} (environment): not a setting{hint}")


class _YamlFile(YamlConfigSettingsSource):
    """The library's YAML source for one file that must exist and hold a mapping."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        self._path = path
        if not path.expanduser().is_file():
            why = "a directory" if path.expanduser().is_dir() else "no such file"
            raise ConfigError(f"cannot read config file {path}: {why}")
        super().__init__(settings_cls, yaml_file=path)

    def _read_file(self, file_path: Any) -> dict[str, Any]:
        try:
            data = super()._read_file(file_path)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {self._path}: {exc}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {self._path} is not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"config file {self._path} must hold a mapping of settings")
        return data


class _ProviderKeys(PydanticBaseSettingsSource):
    """`<PROVIDER>_API_KEY` and the AWS region: the lowest source, deep-merged under
    `providers` by the library, so a key given in the file or an ORCH_ variable wins."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self._environ = environ

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: __call__ builds its one field whole

    def __call__(self) -> dict[str, Any]:
        env = self._environ
        providers: dict[str, dict[str, str]] = {
            kind: {"api_key": env[var]} for kind, var in PROVIDER_KEY_ENV.items() if env.get(var)
        }
        # AWS keys in the environment configure Bedrock, but are not copied: botocore's default
        # chain reads them where the adapter runs, with AWS_SESSION_TOKEN, and refreshes what
        # expires (a copied key pair would drop the token and never refresh).
        if env.get("AWS_ACCESS_KEY_ID") and env.get("AWS_SECRET_ACCESS_KEY"):
            region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
            providers["bedrock"] = {"region": region} if region else {}
        # Azure's key alone says nothing of where the resource is: both, or neither.
        if env.get("AZURE_OPENAI_API_KEY") and env.get("AZURE_OPENAI_ENDPOINT"):
            providers["azure_openai"] = {
                "api_key": env["AZURE_OPENAI_API_KEY"],
                "base_url": env["AZURE_OPENAI_ENDPOINT"],
            }
        return {"providers": providers} if providers else {}


def _explain(exc: ValidationError, loading: _Loading) -> str:
    """Each error as `<field or variable> (<source>): <message>`; values are not repeated
    (they may be secrets)."""
    data = [(label, source()) for label, source in loading.sources]
    lines = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        lines.append(f"{_where(loc, data, loading.environ)}: {error['msg']}")
    return "invalid settings: " + "; ".join(lines)


def _where(
    loc: tuple[int | str, ...], data: list[tuple[str, dict[str, Any]]], environ: Mapping[str, str]
) -> str:
    dotted = ".".join(str(p) for p in loc) or "settings"
    best: tuple[int, str] = (0, "default")
    for label, values in data:  # highest priority first: the first deepest match gave it
        depth = _depth(values, loc)
        if depth > best[0]:
            best = (depth, label)
    depth, label = best
    if label == "environment" and loc:
        upper = {k.upper(): k for k in environ}
        for n in range(len(loc), 0, -1):
            var = "ORCH_" + "__".join(str(p).upper() for p in loc[:n])
            if var in upper:
                inside = ".".join(str(p) for p in loc[n:])
                return f"{upper[var]} (environment)" + (f", at {inside}" if inside else "")
        nested = sorted(v for k, v in upper.items() if k.startswith(f"ORCH_{loc[0]}__".upper()))
        if nested:
            return f"{', '.join(nested)} (environment)"
    return f"{dotted} ({label})"


def _depth(values: Any, loc: tuple[int | str, ...]) -> int:
    """How many leading parts of `loc` lead somewhere in `values`."""
    depth = 0
    for part in loc:
        if isinstance(values, Mapping) and part in values:
            values = values[part]
        elif isinstance(values, list) and isinstance(part, int) and part < len(values):
            values = values[part]
        else:
            break
        depth += 1
    return depth
