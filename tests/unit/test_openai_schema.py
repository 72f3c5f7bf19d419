"""The shared OpenAI schema helper accepts OpenAI's own examples and names what is wrong."""

from __future__ import annotations

import pytest

from tests.openai_schema import SchemaMismatch, errors, schema_names, validate

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1700000000,
    "model": "m",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": None, "refusal": None},
            "finish_reason": "stop",
            "logprobs": None,
        }
    ],
    "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
}


def test_every_schema_compiles() -> None:
    for name in schema_names():
        errors({}, name)  # a broken $ref or schema raises here, a mismatch does not


def test_nullable_fields_accept_null() -> None:
    validate(COMPLETION, "CreateChatCompletionResponse")


def test_mismatch_names_the_path() -> None:
    bad = {**COMPLETION, "choices": [{**COMPLETION["choices"][0], "finish_reason": "done"}]}
    with pytest.raises(SchemaMismatch, match=r"\$\.choices\[0\]\.finish_reason"):
        validate(bad, "CreateChatCompletionResponse")


def test_missing_required_field_fails() -> None:
    with pytest.raises(SchemaMismatch, match="owned_by"):
        validate({"id": "m", "object": "model", "created": 0}, "Model")


def test_unknown_schema_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        validate({}, "NoSuchSchema")
