"""One `scripts/serve` shared by the e2e modules whose settings agree (issue 34).

The e2e phase runs its modules one at a time and was mostly service starts (~17 s to start,
~4 s to stop, each): test_agent_tools, test_channels, test_data_api, test_gateway,
test_scheduler and the console's package (tests/e2e/ui) each started their own (and
test_agent_clients would have), with settings
that do not conflict.
They now use this one, through the session fixture `shared_service` (tests/e2e/conftest.py),
which starts it the first time a test asks and stops it after the last test that uses it
(the conftest runs those tests together; a module run alone starts it itself).

What a module on it must keep to: its data are its own users' (a name of its own, or a
random suffix: another module may have made `ann` already); what it changes for everyone
(a global tool rule, an admin-registered server, a schedule that keeps firing) it puts back
or deletes before it ends; it counts only what it made (filter events by its job, user or
aggregate; marketplace listings by its own tag or author); it never stops or restarts the
service (a module that does, or that needs other settings, starts its own with `running`).

Using it from a new module (tests/e2e/test_agent_clients.py, for instance):

    def test_x(shared_service: SharedService) -> None:
        orch = shared_service.orch          # an Orchestrator: .url (…/api/v1), .port, .work
        base = shared_service.base_url      # http://127.0.0.1:<port> (no /api/v1)
        admin = shared_service.admin_token  # the admin's bearer token
        token = shared_service.user_token(f"agent-cli-{uuid.uuid4().hex[:8]}")  # a user's

Its upstreams are loopback fakes (tests/fakes/), started for the session, scriptable per test:

- `llm` (OpenAIFake, `providers.openai`): the agents' model `fake-agent` (MODEL), answering
  with tests/fakes/agent_llm.py's `agent_reply` when nothing is scripted;
- `oai` (OpenAIFake, custom provider `fake-openai`, format openai): model `gpt-4o-mini`;
- `ant` (FakeAnthropic, custom provider `fake-anthropic`, format anthropic): model
  `claude-sonnet-4-5`;
- `bedrock` (`nova`, signed with the AWS keys of the service's environment), `llamacpp`
  (custom, `local-llama`) and `ollama` (`llama3.2`): test_gateway's;
- `slack`, `teams` and `telegram`: the platforms' APIs its channels talk to (test_channels').

A test scripts the next answers (`oai.script([FakeReply(...)])`, `ant.enqueue(...)`) and reads
what was sent (`oai.chat_requests`, `ant.requests`); clear them first (`shared_service.reset()`
or a module's autouse fixture, as test_gateway's `fresh_upstreams`), since the fakes outlive
the module. Only the tests of the module running send to `oai`, `ant`, `bedrock`, `llamacpp`
and `ollama` (the agents use `llm`), so what they record is that test's."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import yaml

from orchestrator.config import TELEGRAM_WEBHOOK_CIDRS
from tests.e2e.test_workflows import MODEL, Orchestrator
from tests.fakes import slack_server as slack
from tests.fakes import teams_server as teams
from tests.fakes import telegram_server as telegram
from tests.fakes.agent_llm import agent_reply
from tests.fakes.anthropic_server import FakeAnthropic
from tests.fakes.bedrock_server import ACCESS_KEY, SECRET_KEY, BedrockFake
from tests.fakes.ollama_server import OllamaFake
from tests.fakes.openai_server import OpenAIFake

OPENAI_MODEL, ANTHROPIC_MODEL = "gpt-4o-mini", "claude-sonnet-4-5"
OPENAI_KEY, ANTHROPIC_KEY = "sk-o", "sk-a"
BEDROCK_MODEL, AWS_TOKEN = "nova", "IQoJb3JpZ2luX2VjE2E2ESESSIONTOKEN"
LLAMACPP_MODEL, OLLAMA_MODEL = "local-llama", "llama3.2"
PUBLIC_URL = "https://orch.example.com"
# Small, so test_channels' burst past it is quick (its other tests send a few per channel).
CHANNEL_INBOUND_PER_MINUTE = 10

# The shared service of this session (set by tests/e2e/conftest.py's fixture), for its hooks.
CURRENT: SharedService | None = None


class SharedService:
    """The fakes (started once) and the service (started on demand, stopped by the conftest
    after its last test; started again if a later test asks)."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self._fakes = contextlib.ExitStack()
        self._orch: Orchestrator | None = None
        self.llm = self._fakes.enter_context(
            OpenAIFake(api_key="sk-agent", default_reply=agent_reply)
        )
        self.oai = self._fakes.enter_context(OpenAIFake(api_key=OPENAI_KEY))
        self.ant = self._fakes.enter_context(FakeAnthropic(api_key=ANTHROPIC_KEY))
        self.bedrock = self._fakes.enter_context(BedrockFake(session_token=AWS_TOKEN))
        # llama-server's headers: `text/event-stream`, no charset.
        self.llamacpp = self._fakes.enter_context(
            OpenAIFake(profile="llamacpp", models=[LLAMACPP_MODEL])
        )
        self.ollama = self._fakes.enter_context(OllamaFake())  # `application/x-ndjson`
        self.slack = self._fakes.enter_context(slack.SlackFake())
        self.teams = self._fakes.enter_context(teams.TeamsFake())
        self.telegram = self._fakes.enter_context(telegram.TelegramFake())

    def settings(self) -> dict[str, Any]:
        """The union of its modules' settings (each harmless to the others)."""
        return {
            "providers": {
                "openai": {"base_url": self.llm.base_url, "api_key": "sk-agent", "models": [MODEL]},
                # No keys here: the AWS variables of `env()` sign (botocore's chain).
                "bedrock": {
                    "base_url": self.bedrock.url,
                    "models": [BEDROCK_MODEL],
                    "model_id": "amazon.nova-lite-v1:0",
                },
                "ollama": {"base_url": self.ollama.url, "models": [OLLAMA_MODEL]},
            },
            "custom_providers": [
                {
                    "id": "fake-openai",
                    "format": "openai",
                    "base_url": self.oai.base_url,
                    "api_key": OPENAI_KEY,
                    "models": [OPENAI_MODEL],
                },
                {
                    "id": "fake-anthropic",
                    "format": "anthropic",
                    "base_url": self.ant.url,
                    "api_key": ANTHROPIC_KEY,
                    "models": [ANTHROPIC_MODEL],
                },
                {
                    "id": "llamacpp",
                    "format": "openai",
                    "base_url": self.llamacpp.base_url,
                    "models": [LLAMACPP_MODEL],
                },
            ],
            "default_model": MODEL,
            "rate_limit_per_minute": 0,
            "provider_retries": 0,
            # test_agent_clients: Codex's default config declares a hosted web_search tool
            # no provider behind us runs; an operator serving Codex drops and lists it
            # (docs/openai-compatibility.md). The 400 without it: tests/integration.
            "drop_unsupported_params": True,
            # MCP servers, HTTP tools and the console's tools on loopback.
            "outbound_allowed_cidrs": ["127.0.0.0/8"],
            "mcp_stdio_commands": [sys.executable],
            "mcp_call_timeout_s": 3,
            "marketplace_publish_per_hour": 3,
            # Local inference sized for this machine (the console starts the bundled model).
            "inference_ctx_size": 2048,
            "inference_threads": 2,
            "inference_poll_interval_s": 0.3,
            # Channels (test_channels): the platforms on loopback, retries quick.
            "channel_api_base_urls": {
                "slack": self.slack.api_url,
                "telegram": self.telegram.url,
                "teams_login": self.teams.login_url,
            },
            "channel_retry_base_s": 0.2,
            "public_url": PUBLIC_URL,
            "teams_jwks_url": self.teams.jwks_url,
            "teams_issuer": self.teams.issuer,
            "teams_audience": self.teams.app_id,
            # HAProxy keeps the X-Forwarded-For of a client on loopback: test_channels' relay
            # test plays Telegram's front with it (the others send none).
            "trusted_proxies": ["127.0.0.1/32"],
            "telegram_allowed_cidrs": [*TELEGRAM_WEBHOOK_CIDRS, "127.0.0.0/8"],
            "channel_inbound_per_minute": CHANNEL_INBOUND_PER_MINUTE,
        }

    def env(self) -> dict[str, str]:
        """Temporary AWS keys (session token included), and no AWS file to read instead."""
        return {
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_SESSION_TOKEN": AWS_TOKEN,
            "AWS_REGION": "us-east-1",
            "AWS_CONFIG_FILE": str(self.work / "no-aws-config"),
            "AWS_SHARED_CREDENTIALS_FILE": str(self.work / "no-aws-credentials"),
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    @property
    def orch(self) -> Orchestrator:
        """The running service (started here if it is not)."""
        if self._orch is None:
            config = self.work / "orchestrator.yaml"
            config.write_text(yaml.safe_dump(self.settings()))
            self._orch = Orchestrator(self.work, config, env=self.env())
        if self._orch.proc is None or self._orch.proc.poll() is not None:
            self._orch.start()
        return self._orch

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.orch.port}"

    @property
    def admin_token(self) -> str:
        return self.orch.admin["Authorization"].split()[1]

    def user_token(self, user: str, admin: bool = False) -> str:
        """A bearer token for `user` (issued by the admin through POST /tokens)."""
        with self.orch.client() as c:
            r = c.post("/tokens", json={"user_uuid": user, "admin": admin})
            assert r.status_code == 200, r.text
            return str(r.json()["token"])

    def reset(self) -> None:
        """Forget what the scriptable upstreams were sent and were told to answer."""
        self.oai.reset()
        self.llamacpp.reset()
        self.ant.requests.clear()
        self.bedrock.requests.clear()
        self.ollama.requests.clear()

    def stop(self) -> None:
        if self._orch is not None and self._orch.proc is not None:
            self._orch.stop()
            sys.stdout.write((self.work / "serve.log").read_text(errors="replace")[-3000:])

    def close(self) -> None:
        try:
            self.stop()
        finally:
            self._fakes.close()


__all__ = ["CURRENT", "SharedService"]
