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


def test_yaml_style_values_in_the_environment() -> None:
    s = Settings.load(
        environ={
            "ORCH_EXEMPT_PATHS": "[/api/v1/health, /api/v1/ready]",
            "ORCH_PROVIDERS": "openai: {base_url: 'http://127.0.0.1:9/v1'}",
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
