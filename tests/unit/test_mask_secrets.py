"""What audit events show of a tool call's arguments: values under keys named like secrets
are masked at any depth, and keys that only look alike are not."""

from __future__ import annotations

import pytest

from orchestrator.observability import REDACTED, mask_secrets


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "api_key",
        "apiKey",
        "API-KEY",
        "X-Api-Key",
        "accessToken",
        "db_password",
        "Authorization",
        "x-auth",
        "client_secret",
        "refresh_token",
        "cookie",
        "private_key",
        "session_id",
        "credentials",
    ],
)
def test_a_secret_key_is_masked_at_any_depth(key: str) -> None:
    args = {"outer": [{"inner": {key: "s3cret"}}], key: "s3cret", "city": "Lyon"}
    masked = mask_secrets(args)
    assert masked[key] == REDACTED and masked["outer"][0]["inner"][key] == REDACTED
    assert masked["city"] == "Lyon"


@pytest.mark.parametrize(
    "key", ["author", "max_tokens", "session_name", "tokenizer", "authority", "secretary"]
)
def test_keys_that_only_look_alike_are_kept(key: str) -> None:
    assert mask_secrets({key: "v"}) == {key: "v"}


def test_provider_config_repr_shows_no_secret() -> None:
    """A provider's key and kind-specific secrets (Bedrock's keys, Entra's client secret)
    never reach a log line or a traceback through the config's repr."""
    from orchestrator.providers import ProviderConfig

    config = ProviderConfig(
        "azure_openai",
        "azure_openai",
        "https://r.openai.azure.com",
        api_key="sk-SECRET-1",
        extra={"client_secret": "SECRET-2"},
    )
    text = repr(config)
    assert "azure_openai" in text and "https://r.openai.azure.com" in text
    assert "SECRET" not in text
