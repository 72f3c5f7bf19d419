from pathlib import Path

import pytest

from orchestrator.config import ConfigError, Settings


def test_defaults_match_the_spec() -> None:
    s = Settings.load(environ={})
    assert (s.inference_bin, s.inference_gpu_layers, s.inference_ctx_size, s.inference_threads) == (
        "./llama-server",
        99,
        4096,
        4,
    )
    assert (
        s.max_scheduled_jobs,
        s.max_consecutive_errors,
        s.max_catchup_runs,
        s.catchup_stagger_ms,
        s.timer_clamp_ms,
        s.max_dispatch_per_tick,
    ) == (1000, 10, 5, 5000, 60000, 5)
    assert (
        s.memory_agent_id_max,
        s.memory_list_limit,
        s.memory_search_limit,
        s.memory_vector_threshold,
    ) == (128, 50, 20, 0.75)
    assert (s.host, s.port, s.rate_limit_per_minute) == ("127.0.0.1", 8000, 600)
    assert s.data_dir == Path("./.orchestrator").resolve()
    assert s.database_url is None and s.redis_url is None
    assert "/api/v1/health" in s.exempt_paths and "/api/v1/slo" in s.exempt_paths


def test_every_setting_has_a_description() -> None:
    missing = [n for n, f in Settings.model_fields.items() if not f.description]
    assert missing == []


def test_env_prefix_and_types() -> None:
    s = Settings.load(
        environ={
            "ORCH_PORT": "9001",
            "ORCH_HAPROXY": "false",
            "ORCH_EXEMPT_PATHS": '["/api/v1/ready"]',
        }
    )
    assert s.port == 9001 and s.haproxy is False and s.exempt_paths == ["/api/v1/ready"]


def test_yaml_file_below_env_below_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "orch.yaml"
    cfg.write_text("port: 7000\nhost: 0.0.0.0\ninference_threads: 8\n")
    s = Settings.load(environ={"ORCH_CONFIG": str(cfg), "ORCH_HOST": "10.0.0.1"}, port=7100)
    assert (s.port, s.host, s.inference_threads) == (7100, "10.0.0.1", 8)
    assert Settings.load(cfg, environ={}).port == 7000


def test_provider_keys_from_environment() -> None:
    s = Settings.load(
        environ={
            "OPENAI_API_KEY": "sk-env",
            "ANTHROPIC_API_KEY": "ak",
            "AWS_ACCESS_KEY_ID": "AKIA",
            "AWS_SECRET_ACCESS_KEY": "secret",
            "AWS_REGION": "eu-west-1",
        },
        providers={"openai": {"base_url": "http://127.0.0.1:9/v1"}},
    )
    assert s.providers["openai"].api_key.get_secret_value() == "sk-env"
    assert s.providers["openai"].base_url == "http://127.0.0.1:9/v1"
    assert s.providers["anthropic"].api_key.get_secret_value() == "ak"
    bedrock = s.providers["bedrock"]
    # Configured by the AWS variables, whose keys botocore's chain reads (with the session
    # token, refreshed) where the adapter runs: not copied into the settings.
    assert bedrock.region == "eu-west-1"
    assert bedrock.access_key_id is None and bedrock.session_token is None


def test_configured_key_wins_over_environment() -> None:
    s = Settings.load(
        environ={"OPENAI_API_KEY": "sk-env"}, providers={"openai": {"api_key": "sk-file"}}
    )
    assert s.providers["openai"].api_key.get_secret_value() == "sk-file"


@pytest.mark.parametrize(
    "bad",
    [
        {"port": 0},
        {"memory_agent_id_max": 129},  # SPEC part 8: 128 at most
        {"no_such_key": 1},
        {"providers": {"nosuch": {}}},
        {"workspace_isolation": "everyone"},
        {"custom_providers": [{"id": "x", "format": "grpc", "base_url": "http://x"}]},
    ],
)
def test_invalid_settings_are_refused(bad: dict) -> None:
    with pytest.raises(ConfigError):
        Settings.load(environ={}, **bad)


def test_unreadable_or_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        Settings.load(tmp_path / "missing.yaml", environ={})
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        Settings.load(bad, environ={})


def test_secrets_are_not_shown_and_survive_pickling() -> None:
    import pickle

    token = "orch_" + "s" * 40
    s = Settings.load(environ={"ORCH_ADMIN_TOKEN": token})
    assert token not in repr(s)
    assert pickle.loads(pickle.dumps(s)).admin_token.get_secret_value() == token


def test_json_values_in_the_environment() -> None:
    # Lists and maps in ORCH_ variables are JSON (what pydantic-settings parses); YAML-style
    # text is refused (test_bad_json_in_the_environment_names_the_variable).
    s = Settings.load(
        environ={
            "ORCH_EXEMPT_PATHS": '["/api/v1/health", "/api/v1/ready"]',
            "ORCH_PROVIDERS": '{"openai": {"base_url": "http://127.0.0.1:9/v1"}}',
        }
    )
    assert s.exempt_paths == ["/api/v1/health", "/api/v1/ready"]
    assert s.providers["openai"].base_url == "http://127.0.0.1:9/v1"


def test_load_reads_only_the_environment_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_PORT", "9999")
    assert Settings.load(environ={}).port == 8000
    assert Settings.load().port == 9999


@pytest.mark.parametrize("weak", ["changeme", "x" * 31])
def test_weak_admin_tokens_are_refused(weak: str) -> None:
    with pytest.raises(ConfigError, match="at least 32"):
        Settings.load(environ={"ORCH_ADMIN_TOKEN": weak})


def test_connection_urls_stay_out_of_the_repr() -> None:
    s = Settings.load(
        environ={}, database_url="postgresql://u:hunter2@db/x", redis_url="redis://:hunter3@cache/0"
    )
    assert "hunter2" not in repr(s) and "hunter3" not in repr(s)


# --- pydantic-settings' own sources: init > ORCH_ env > YAML > <PROVIDER>_API_KEY > defaults ---


def test_nested_environment_variables() -> None:
    s = Settings.load(
        environ={
            "ORCH_PROVIDERS__OPENAI__API_KEY": "sk-nested",
            "ORCH_PROVIDERS__OPENAI__MODELS": '["a", "b"]',
            "ORCH_FALLBACK_MODELS": '{"a": ["b"]}',
        }
    )
    assert s.providers["openai"].api_key is not None
    assert s.providers["openai"].api_key.get_secret_value() == "sk-nested"
    assert s.providers["openai"].models == ["a", "b"]
    assert s.fallback_models == {"a": ["b"]}


def test_priority_across_all_five_sources(tmp_path: Path) -> None:
    cfg = tmp_path / "orch.yaml"
    cfg.write_text(
        "port: 7000\nhost: 10.0.0.2\ninference_threads: 8\n"
        "providers:\n"
        "  openai: {base_url: 'http://127.0.0.1:9/v1'}\n"
        "  anthropic: {api_key: ak-file}\n"
    )
    s = Settings.load(
        environ={
            "ORCH_CONFIG": str(cfg),
            "ORCH_PORT": "7001",
            "ORCH_HOST": "10.0.0.1",
            "ORCH_PROVIDERS__OPENAI__MODELS": '["gpt-x"]',
            "ORCH_PROVIDERS__ZHIPU__API_KEY": "zk-orch",
            "OPENAI_API_KEY": "sk-env",
            "ANTHROPIC_API_KEY": "ak-env",
            "ZHIPU_API_KEY": "zk-env",
        },
        port=7002,
    )
    assert s.port == 7002  # init (CLI) > env > file
    assert s.host == "10.0.0.1"  # env > file
    assert s.inference_threads == 8  # file > default
    assert s.agent_workers == 2  # default
    openai = s.providers["openai"]  # file, env and provider key merged, not replaced
    assert openai.base_url == "http://127.0.0.1:9/v1" and openai.models == ["gpt-x"]
    assert openai.api_key is not None and openai.api_key.get_secret_value() == "sk-env"
    anthropic, zhipu = s.providers["anthropic"].api_key, s.providers["zhipu"].api_key
    assert anthropic is not None and anthropic.get_secret_value() == "ak-file"  # file > KEY
    assert zhipu is not None and zhipu.get_secret_value() == "zk-orch"  # ORCH_ > KEY


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ORCH_EXEMPT_PATHS", "[/api/v1/health, /api/v1/ready]"),  # YAML, not JSON
        ("ORCH_EXEMPT_PATHS", '["/api/v1/health"'),
        ("ORCH_PROVIDERS__OPENAI__MODELS", "a,b"),
    ],
)
def test_bad_json_in_the_environment_names_the_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"{name}\\b") as caught:
        Settings.load(environ={name: value})
    # Older pydantic-settings (2.3.4 to 2.7.1 checked) pass a nested list's bad JSON on to
    # validation, which names the variable too.
    assert "not valid JSON" in str(caught.value) or "valid list" in str(caught.value)


def test_errors_name_the_field_and_its_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"ORCH_PORT \(environment\).*integer"):
        Settings.load(environ={"ORCH_PORT": "abc"})
    cfg = tmp_path / "orch.yaml"
    cfg.write_text("port: abc\n")
    with pytest.raises(ConfigError, match=rf"port \(config file {cfg}\).*integer"):
        Settings.load(cfg, environ={})
    with pytest.raises(ConfigError, match=r"port \(overrides\)"):
        Settings.load(environ={}, port=0)


def test_yaml_syntax_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("port: [1\n")
    with pytest.raises(ConfigError, match=f"config file {bad} is not valid YAML"):
        Settings.load(bad, environ={})
    with pytest.raises(ConfigError, match="cannot read"):
        Settings.load(tmp_path, environ={})  # a directory


def test_unknown_keys_are_refused_in_yaml_and_environment(tmp_path: Path) -> None:
    cfg = tmp_path / "orch.yaml"
    cfg.write_text("prot: 7000\n")
    with pytest.raises(ConfigError, match=rf"prot \(config file {cfg}\).*not permitted"):
        Settings.load(cfg, environ={})
    with pytest.raises(ConfigError, match=r"ORCH_PROT \(environment\).*not a setting.*ORCH_PORT"):
        Settings.load(environ={"ORCH_PROT": "7000"})
    with pytest.raises(ConfigError, match=r"ORCH_PROVIDERS__OPENAI__APIKEY \(environment\)"):
        Settings.load(environ={"ORCH_PROVIDERS__OPENAI__APIKEY": "sk"})
    # The variables of the CLI and the SDK share the prefix: not settings, not refused.
    s = Settings.load(
        environ={"ORCH_API_KEY": "orch_x", "ORCH_BASE_URL": "http://x", "ORCH_APP_NAME": "a"}
    )
    assert s.port == 8000


def test_empty_environment_values_are_unset() -> None:
    assert Settings.load(environ={"ORCH_PORT": "", "ORCH_EXEMPT_PATHS": ""}).port == 8000


def test_direct_construction_reads_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_PORT", "9999")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    s = Settings(port=9000)
    assert s.port == 9000 and s.providers == {}
    assert Settings().port == 8000
