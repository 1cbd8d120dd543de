"""The OpenAI-style protocol: body decoding, sampling validation, stop lists, response shapes."""
from __future__ import annotations

import pytest

from services.scheduler.protocol import (ApiError, ChatMessage, ChatRequest, CompletionRequest, check_sampling,
                                         chunk_body, completion_body, decode_body, new_id, stop_list, usage)

pytestmark = pytest.mark.unit


def bad(fn, *args) -> ApiError:
    with pytest.raises(ApiError) as info:
        fn(*args)
    assert info.value.status == 400
    return info.value


# --- decode_body ------------------------------------------------------------------------------

def test_completion_body_decodes_with_defaults():
    req = decode_body(b'{"prompt": "hi"}', CompletionRequest)
    assert req.prompt == "hi"
    assert (req.max_tokens, req.temperature, req.top_p, req.stop, req.seed, req.stream, req.n) == \
        (None, 1.0, 1.0, None, None, False, 1)


def test_completion_prompt_may_be_token_ids():
    assert decode_body(b'{"prompt": [1, 2, 3]}', CompletionRequest).prompt == [1, 2, 3]


def test_chat_body_decodes_messages():
    req = decode_body(b'{"messages": [{"role": "user", "content": "yo"}], "max_completion_tokens": 5}',
                      ChatRequest)
    assert [(m.role, m.content) for m in req.messages] == [("user", "yo")]
    assert req.max_completion_tokens == 5


def test_unknown_fields_are_ignored():
    req = decode_body(b'{"prompt": "x", "logit_bias": {"1": 2}, "user": "u"}', CompletionRequest)
    assert req.prompt == "x"


@pytest.mark.parametrize("raw,param", [
    (b'{"prompt": "a", "max_tokens": "x"}', "max_tokens"),
    (b'{"prompt": "a", "temperature": "hot"}', "temperature"),
    (b'{"prompt": "a", "n": true}', "n"),
    (b'{"prompt": "a", "stop": 5}', "stop"),
    (b'{"prompt": 5}', "prompt"),
])
def test_wrong_type_names_the_param(raw, param):
    err = bad(decode_body, raw, CompletionRequest)
    assert err.param == param
    assert err.message.startswith("invalid request")


def test_wrong_type_in_nested_message_names_the_path():
    err = bad(decode_body, b'{"messages": [{"role": 1, "content": "x"}]}', ChatRequest)
    assert err.param == "messages[0].role"


def test_missing_required_field_names_it():
    assert bad(decode_body, b'{}', CompletionRequest).param == "prompt"
    assert bad(decode_body, b'{"prompt": "x"}', ChatRequest).param == "messages"


def test_missing_nested_field_names_its_full_path():
    err = bad(decode_body, b'{"messages": [{"role": "user"}]}', ChatRequest)
    assert err.param == "messages[0].content"


def test_non_object_body_is_invalid_without_param():
    err = bad(decode_body, b'[1, 2]', CompletionRequest)
    assert err.param is None and err.message.startswith("invalid request")


@pytest.mark.parametrize("raw", [b'{', b'not json', b''])
def test_malformed_json_is_a_400(raw):
    err = bad(decode_body, raw, CompletionRequest)
    assert err.message.startswith("malformed JSON") and err.param is None


def test_api_error_body_is_openai_shaped():
    err = ApiError(400, "nope", "top_p")
    assert err.body() == {"error": {"message": "nope", "type": "invalid_request_error", "param": "top_p",
                                    "code": 400}}
    assert str(err) == "nope"


# --- check_sampling ---------------------------------------------------------------------------

def req(**kw) -> CompletionRequest:
    return CompletionRequest(prompt="x", **kw)


def test_a_completion_without_max_tokens_gets_16_as_openais_legacy_completions():
    assert check_sampling(req(), None, 10, 1000) == 16


def test_default_max_tokens_shrinks_to_the_room_left():
    assert check_sampling(req(), None, 990, 1000) == 10


def test_a_chat_completion_without_max_tokens_may_run_to_the_end_of_the_context_as_openais_chat():
    chat = ChatRequest(messages=[ChatMessage(role="user", content="hi")])
    assert check_sampling(chat, None, 10, 1000) == 990
    assert check_sampling(chat, None, 999, 1000) == 1
    assert check_sampling(chat, 24, 10, 1000) == 24  # a given max_tokens is kept


def test_the_openapi_document_states_each_default():
    from services.scheduler.openapi import openapi_document

    schemas = openapi_document()["components"]["schemas"]
    assert "null = 16" in schemas["CompletionRequest"]["properties"]["max_tokens"]["description"]
    assert "until the context ends" in schemas["ChatRequest"]["properties"]["max_tokens"]["description"]


def test_explicit_max_tokens_is_returned():
    assert check_sampling(req(), 100, 10, 1000) == 100


def test_max_tokens_may_fill_the_context_exactly():
    assert check_sampling(req(), 990, 10, 1000) == 990


@pytest.mark.parametrize("n", [0, -1])
def test_non_positive_max_tokens_is_rejected(n):
    assert bad(check_sampling, req(), n, 10, 1000).param == "max_tokens"


def test_max_tokens_beyond_room_is_rejected_with_numbers():
    err = bad(check_sampling, req(), 991, 10, 1000)
    assert err.param == "max_tokens"
    assert "990" in err.message and "1000" in err.message


@pytest.mark.parametrize("n", [0, 2, 5])
def test_only_n_equal_one_is_supported(n):
    assert bad(check_sampling, req(n=n), None, 10, 1000).param == "n"


def test_negative_temperature_is_rejected_and_zero_is_greedy():
    assert bad(check_sampling, req(temperature=-0.1), None, 10, 1000).param == "temperature"
    assert check_sampling(req(temperature=0.0), None, 10, 1000) == 16


@pytest.mark.parametrize("top_p", [0.0, -0.5, 1.01])
def test_top_p_outside_open_closed_unit_interval_is_rejected(top_p):
    assert bad(check_sampling, req(top_p=top_p), None, 10, 1000).param == "top_p"


def test_top_p_of_one_is_accepted():
    assert check_sampling(req(top_p=1.0), 5, 10, 1000) == 5


def test_empty_prompt_is_rejected():
    assert bad(check_sampling, req(), None, 0, 1000).param == "prompt"


@pytest.mark.parametrize("prompt_len", [1000, 1001])
def test_prompt_filling_the_context_is_rejected(prompt_len):
    err = bad(check_sampling, req(), None, prompt_len, 1000)
    assert err.param == "prompt" and str(prompt_len) in err.message


def test_prompt_one_short_of_context_leaves_one_token():
    assert check_sampling(req(), None, 999, 1000) == 1


def test_sampling_checks_apply_to_chat_requests_too():
    chat = ChatRequest(messages=[], n=3)
    assert bad(check_sampling, chat, None, 10, 1000).param == "n"


# --- stop_list ------------------------------------------------------------------------------

def test_stop_none_is_empty_list():
    assert stop_list(None) == []


def test_single_stop_string_becomes_a_list():
    assert stop_list("###") == ["###"]


def test_stop_list_is_copied():
    stops = ["a", "b"]
    got = stop_list(stops)
    assert got == ["a", "b"] and got is not stops


def test_empty_stop_string_is_rejected():
    assert bad(stop_list, "").param == "stop"
    assert bad(stop_list, ["a", ""]).param == "stop"


def test_more_than_eight_stops_are_rejected():
    assert stop_list([str(i) for i in range(8)]) == [str(i) for i in range(8)]
    assert bad(stop_list, [str(i) for i in range(9)]).param == "stop"


# --- response bodies ---------------------------------------------------------------------------

def test_usage_totals_and_cached_tokens():
    assert usage(10, 5, 4) == {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,
                               "prompt_tokens_details": {"cached_tokens": 4}}


def test_chat_completion_body_shape():
    body = completion_body("id1", "m", True, "hello", "stop", usage(1, 2, 0))
    assert body["object"] == "chat.completion" and body["id"] == "id1" and body["model"] == "m"
    assert body["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "hello"},
                                "logprobs": None, "finish_reason": "stop"}]
    assert body["usage"]["total_tokens"] == 3
    assert isinstance(body["created"], int)


def test_text_completion_body_shape_without_usage():
    body = completion_body("id2", "m", False, "hello", "length", None)
    assert body["object"] == "text_completion"
    assert body["choices"] == [{"index": 0, "text": "hello", "logprobs": None, "finish_reason": "length"}]
    assert "usage" not in body


def test_first_chat_chunk_carries_the_role():
    body = chunk_body("id", "m", True, "he", None, first=True)
    assert body["object"] == "chat.completion.chunk"
    assert body["choices"] == [{"index": 0, "delta": {"content": "he", "role": "assistant"}, "logprobs": None,
                                "finish_reason": None}]


def test_later_chat_chunks_carry_only_content():
    body = chunk_body("id", "m", True, "llo", "stop", first=False)
    assert body["choices"][0]["delta"] == {"content": "llo"}
    assert body["choices"][0]["finish_reason"] == "stop"


def test_text_chunk_shape_ignores_first():
    a = chunk_body("id", "m", False, "x", None, first=True)
    b = chunk_body("id", "m", False, "x", None, first=False)
    assert a["object"] == "text_completion"
    assert a["choices"] == b["choices"] == [{"index": 0, "text": "x", "logprobs": None, "finish_reason": None}]


def test_new_ids_are_prefixed_and_unique():
    a, b = new_id("cmpl"), new_id("cmpl")
    assert a.startswith("cmpl-") and b.startswith("cmpl-") and a != b


# --- the default max_tokens of each endpoint, as the handler prepares a request -----------------

class _Front:
    """What api._prepare asks of the front door: a model, the tiny tokenizer, a context of 512."""

    def __init__(self):
        from shared.model.tokenizer_build import tiny_tokenizer

        self.tokenizer = tiny_tokenizer()

    def model_id(self) -> str:
        return "tiny2@seed0"

    def accepts_model(self, name: str | None) -> bool:
        return name in (None, "tiny2@seed0")

    def max_context(self) -> int:
        return 512


@pytest.mark.parametrize("chat, body, want", [
    (False, b'{"prompt": "hi"}', lambda prompt: 16),
    (True, b'{"messages": [{"role": "user", "content": "hi"}]}', lambda prompt: 512 - prompt),
    (True, b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 7}', lambda prompt: 7),
    (True, b'{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 5, "max_tokens": 7}',
     lambda prompt: 5),
])
def test_each_endpoint_prepares_its_default_max_tokens(chat, body, want):
    from services.scheduler.api import _prepare

    _, prompt, sampling, *_ = _prepare(_Front(), body, chat)
    assert sampling.max_tokens == want(len(prompt))
