import hashlib

from orchestrator.auth import JwtVerifier, generate_token, hash_token, token_prefix


def test_hash_is_sha256_hex() -> None:
    assert hash_token("orch_abc") == hashlib.sha256(b"orch_abc").hexdigest()


def test_tokens_are_random_and_prefixed() -> None:
    tokens = {generate_token() for _ in range(200)}
    assert len(tokens) == 200
    for token in tokens:
        assert token.startswith("orch_") and len(token) >= 40
        assert token_prefix(token) == token[:12]


def test_jwt_shape_detection() -> None:
    assert JwtVerifier.looks_like_jwt("eyJhbGciOi.eyJzdWIiOi.sig")
    assert not JwtVerifier.looks_like_jwt(generate_token())
