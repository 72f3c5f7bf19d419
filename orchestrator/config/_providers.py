"""The model providers' part of the settings: the provider kinds, the environment variable
holding each one's API key, and the two shapes of provider configuration (`providers`, one
entry per kind; `custom_providers`, declarative adapters).

Separate from `Settings` because the loading reads it too (`<PROVIDER>_API_KEY` is a source
of its own), and the gateway reads the kinds without the rest of the settings.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr

__all__ = ["PROVIDER_KEY_ENV", "PROVIDER_KINDS", "CustomProvider", "ProviderSettings"]

# Provider kind -> environment variable holding its API key.
PROVIDER_KEY_ENV: dict[str, str] = {
    "anthropic": "ANTHROPIC_API_KEY",
    "openai": "OPENAI_API_KEY",
    "zhipu": "ZHIPU_API_KEY",
    "ollama": "OLLAMA_API_KEY",
    "gemini": "GEMINI_API_KEY",
    "deepseek": "DEEPSEEK_API_KEY",
    "qwen": "DASHSCOPE_API_KEY",
}
# Azure OpenAI's key is read with its endpoint (AZURE_OPENAI_API_KEY + AZURE_OPENAI_ENDPOINT,
# the openai SDK's pair); Bedrock and Vertex authenticate with their cloud's credentials.
PROVIDER_KINDS: tuple[str, ...] = (*PROVIDER_KEY_ENV, "azure_openai", "bedrock", "vertex")


class ProviderSettings(BaseModel):
    """Connection settings of one provider kind."""

    model_config = ConfigDict(extra="forbid")

    api_key: SecretStr | None = Field(None, description="API key; else <PROVIDER>_API_KEY")
    base_url: str | None = Field(None, description="Override of the provider's endpoint")
    models: list[str] = Field(default_factory=list, description="Models served by it")
    region: str | None = Field(None, description="Cloud-runtime region (Bedrock)")
    access_key_id: SecretStr | None = Field(None, description="Cloud-runtime access key id")
    secret_access_key: SecretStr | None = Field(None, description="Cloud-runtime secret key")
    session_token: SecretStr | None = Field(
        None, description="Cloud-runtime session token of temporary keys (AWS_SESSION_TOKEN)"
    )
    model_id: str | None = Field(None, description="Cloud-runtime default model id")
    # Azure OpenAI (base_url is the resource endpoint, https://{resource}.openai.azure.com)
    api_version: str | None = Field(
        None, description="Azure OpenAI `api-version` query parameter (default 2024-10-21)"
    )
    deployments: dict[str, str] = Field(
        default_factory=dict,
        description="Azure OpenAI: model name -> deployment name (default: the same name)",
    )
    tenant_id: str | None = Field(None, description="Azure: Entra ID tenant (with client_id)")
    client_id: str | None = Field(None, description="Azure: Entra ID application (client) id")
    client_secret: SecretStr | None = Field(None, description="Azure: Entra ID client secret")
    authority: str | None = Field(
        None, description="Azure: Entra ID authority (default https://login.microsoftonline.com)"
    )
    # Vertex AI (credentials from Google's default chain: GOOGLE_APPLICATION_CREDENTIALS, ...)
    project: str | None = Field(None, description="Vertex AI: Google Cloud project id")
    location: str | None = Field(
        None, description="Vertex AI: location, e.g. us-central1 or global (default us-central1)"
    )


class CustomProvider(BaseModel):
    """A declarative adapter for an endpoint that speaks one of two wire formats."""

    model_config = ConfigDict(extra="forbid")

    id: str
    format: Literal["openai", "anthropic"]
    base_url: str
    api_key: SecretStr | None = None
    models: list[str] = Field(default_factory=list)
    alias: str | None = None
