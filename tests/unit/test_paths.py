from orchestrator.observability import UNMATCHED, RouteTemplates


def test_templates_not_raw_paths() -> None:
    t = RouteTemplates(
        [
            "/api/v1/tokens",
            "/api/v1/tokens/{prefix}",
            "/api/v1/memory/{agent_id}/{key}",
            "/api/v1/memory/{agent_id}/search",
            "/api/v1/memory/stats",
            "/api/v1/files/{path:path}",
        ]
    )
    assert t.match("/api/v1/tokens") == "/api/v1/tokens"
    assert t.match("/api/v1/tokens/orch_abc") == "/api/v1/tokens/{prefix}"
    # Literal segments win over parameters.
    assert t.match("/api/v1/memory/stats") == "/api/v1/memory/stats"
    assert t.match("/api/v1/memory/a1/search") == "/api/v1/memory/{agent_id}/search"
    assert t.match("/api/v1/memory/a1/k1") == "/api/v1/memory/{agent_id}/{key}"
    assert t.match("/api/v1/files/a/b/c.txt") == "/api/v1/files/{path:path}"
    assert t.match("/api/v1/tokens/a/b") == UNMATCHED
    assert t.match("/etc/passwd") == UNMATCHED


def test_cache_is_bounded() -> None:
    t = RouteTemplates(["/a/{x}"], cache_size=8)
    for i in range(100):
        assert t.match(f"/a/{i}") == "/a/{x}"
    assert len(t._cache) <= 8
