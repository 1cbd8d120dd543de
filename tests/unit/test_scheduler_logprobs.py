"""Log-probabilities at the front door: the request fields and their 400s, how logprobs follow
the streamed text (multi-byte characters, held-back text, stop sequences), and the
completions / chat shapes, streamed and whole. The engines' values come from
tests/model/test_model_logprobs.py; the mesh end to end from test_mesh_logprobs.py."""
from __future__ import annotations

import asyncio
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace

from services.scheduler import api
from services.scheduler.inflight import InFlight
from services.scheduler.logprobs import FLOOR, LogprobTrack, Reported, chat_logprobs, completion_logprobs, logprobs_body
from services.scheduler.openapi import openapi_document
from services.scheduler.protocol import ApiError, ChatRequest, CompletionRequest, decode_body, logprob_count
from shared.messages.stream import TokenEvent, TokenLogprob
from shared.messages.work import Sampling
from shared.model.token_text import TokenText
from shared.model.tokenizer import IncrementalDecoder
from shared.model.tokenizer_build import tiny_tokenizer

pytestmark = pytest.mark.unit

TOK = tiny_tokenizer()  # one byte per token: ids 0..255 are bytes, 256.. specials
TEXT = TokenText(TOK)
EOS = 258  # <|im_end|>


def ids(text: str) -> list[int]:
    return list(text.encode())


def lp_of(tid: int) -> TokenLogprob:
    """A recognisable logprob per id (so a test can tell which token an entry belongs to)."""
    return TokenLogprob(-tid / 1000, [tid, tid + 1], [-tid / 1000, -tid / 1000 - 1])


# --- request fields ---------------------------------------------------------------------------

def _rejected(raw: bytes, tp: type) -> ApiError:
    with pytest.raises(ApiError) as info:
        req = decode_body(raw, tp)
        logprob_count(req)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize("value", ["21", "-1", "true", '"3"', "2.5"])
def test_completion_logprobs_out_of_range_or_wrong_type_is_a_400_naming_it(value):
    err = _rejected(b'{"prompt": "a", "logprobs": %s}' % value.encode(), CompletionRequest)
    assert err.param == "logprobs"


@pytest.mark.parametrize("value,want", [("null", None), ("0", 0), ("20", 20)])
def test_completion_logprobs_in_range_is_the_number_of_alternatives(value, want):
    assert logprob_count(decode_body(b'{"prompt": "a", "logprobs": %s}' % value.encode(), CompletionRequest)) == want
    assert logprob_count(decode_body(b'{"prompt": "a"}', CompletionRequest)) is None


@pytest.mark.parametrize("body,param", [
    (b'{"logprobs": true, "top_logprobs": 21}', "top_logprobs"),
    (b'{"logprobs": true, "top_logprobs": -1}', "top_logprobs"),
    (b'{"top_logprobs": 2}', "top_logprobs"),  # OpenAI: top_logprobs needs logprobs=true
    (b'{"logprobs": false, "top_logprobs": 0}', "top_logprobs"),
    (b'{"logprobs": 3}', "logprobs"),
])
def test_chat_logprob_fields_are_checked_naming_the_field(body, param):
    raw = b'{"messages": [{"role": "user", "content": "x"}], ' + body[1:]
    assert _rejected(raw, ChatRequest).param == param


@pytest.mark.parametrize("body,want", [
    (b'{}', None), (b'{"logprobs": false}', None), (b'{"logprobs": null}', None),
    (b'{"logprobs": true}', 0), (b'{"logprobs": true, "top_logprobs": 20}', 20),
])
def test_chat_logprobs_true_asks_for_top_logprobs_alternatives(body, want):
    raw = b'{"messages": [{"role": "user", "content": "x"}]' + (b", " + body[1:] if body != b"{}" else b"}")
    assert logprob_count(decode_body(raw, ChatRequest)) == want


def test_openapi_describes_the_fields_and_the_answer_shapes():
    doc = openapi_document()
    schemas = doc["components"]["schemas"]
    n = next(s for s in schemas["CompletionRequest"]["properties"]["logprobs"]["anyOf"] if s["type"] == "integer")
    assert (n["minimum"], n["maximum"]) == (0, 20)
    assert {"logprobs", "top_logprobs"} <= set(schemas["ChatRequest"]["properties"])
    items = [Reported(104, lp_of(104), 0)]
    assert set(schemas["CompletionLogprobs"]["required"]) == set(completion_logprobs(items, TEXT))
    entry = chat_logprobs(items, TEXT)["content"][0]
    assert set(schemas["ChatLogprobs"]["properties"]["content"]["items"]["required"]) == set(entry)
    for path, name in (("/v1/completions", "CompletionLogprobs"), ("/v1/chat/completions", "ChatLogprobs")):
        ok = doc["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
        refs = ok["properties"]["choices"]["items"]["properties"]["logprobs"]["anyOf"]
        assert {"$ref": f"#/components/schemas/{name}"} in refs


# --- following the text: LogprobTrack ------------------------------------------------------------

def test_a_multibyte_character_reports_its_tokens_with_the_text_that_completes_it():
    track, dec = LogprobTrack(), IncrementalDecoder(TOK)
    c3, a9, bang = ids("é!")
    assert track.push(dec, [c3], [lp_of(c3)]) == ""
    assert track.release(0) == []  # half a character: nothing shown, nothing reported
    assert track.push(dec, [a9], [lp_of(a9)]) == "é"
    got = track.release(1)
    assert [(r.token, r.offset) for r in got] == [(c3, 0), (a9, 0)]
    assert track.push(dec, [bang], [lp_of(bang)]) == "!"
    assert [(r.token, r.offset) for r in track.release(2)] == [(bang, 1)]


def test_text_held_back_holds_its_tokens_back():
    track, dec = LogprobTrack(), IncrementalDecoder(TOK)
    track.push(dec, ids("abc"), [lp_of(t) for t in ids("abc")])
    assert [r.token for r in track.release(1)] == ids("a")  # the stop matcher let one character out
    assert track.release(1) == []
    assert [r.token for r in track.release(3)] == ids("bc")


def test_at_a_stop_the_tokens_spelling_only_the_stop_are_dropped():
    track, dec = LogprobTrack(), IncrementalDecoder(TOK)
    toks = ids("aXY") + ids("é")[:1]  # stop "XY" found: the text is cut at 1; half an "é" still open
    track.push(dec, toks, [lp_of(t) for t in toks])
    assert [r.token for r in track.release(1, stopped=True)] == ids("a")
    assert track.release(10) == []  # nothing after a stop, ever


def test_a_piece_the_stop_cuts_through_is_reported():
    track = LogprobTrack()
    track.closed.append((0, 3, [(1, lp_of(1)), (2, lp_of(2))]))  # one piece of 3 characters (a multi-char token)
    track.closed.append((3, 5, [(3, lp_of(3))]))
    track.end = 5
    assert [r.token for r in track.release(2, stopped=True)] == [1, 2]


def test_end_of_sequence_is_reported_at_the_end_of_the_text():
    track, dec = LogprobTrack(), IncrementalDecoder(TOK)
    track.push(dec, ids("hi") + [EOS], [lp_of(t) for t in ids("hi") + [EOS]])
    assert track.finish(dec) == ""
    assert [(r.token, r.offset) for r in track.release(2)] == [(104, 0), (105, 1), (EOS, 2)]


def test_an_event_without_logprobs_keeps_the_text_in_step():
    track, dec = LogprobTrack(), IncrementalDecoder(TOK)
    assert track.push(dec, ids("ab"), []) == "ab"  # an engine that sent none: the text still flows
    assert track.push(dec, ids("c"), [lp_of(99)]) == "c"
    assert [(r.token, r.offset) for r in track.release(3)] == [(99, 2)]


# --- through the stream: _events and _sse ------------------------------------------------------

class FakeScheduler:
    def __init__(self):
        self.tokenizer = TOK
        self.cancelled: list[str] = []

    def cancel(self, rec, reason: str) -> None:
        self.cancelled.append(reason)

    def finish(self, rec, status: str) -> None:
        pass


def _record(tokens: list[int], splits: list[int], top: int | None, finish: str = "length",
            with_lps: bool = True) -> InFlight:
    rec = InFlight("r", [1, 2], Sampling(max_tokens=len(tokens), logprobs=top))
    cuts = [0, *sorted(set(s for s in splits if 0 < s < len(tokens))), len(tokens)]
    for a, b in zip(cuts, cuts[1:]):
        part = tokens[a:b]
        rec.events.put_nowait(TokenEvent("r", part, a, finish if b == len(tokens) else "",
                                         logprobs=[lp_of(t) for t in part] if with_lps else []))
    return rec


def events(tokens, stops=(), splits=(), top: int | None = 2, **kw) -> list[tuple]:
    rec = _record(tokens, list(splits), top, **kw)

    async def go():
        return [e async for e in api._events(FakeScheduler(), rec, list(stops), trace.INVALID_SPAN)]
    return asyncio.run(go())


def sse(tokens, chat: bool, stops=(), top: int = 2) -> list[dict]:
    rec = _record(tokens, list(range(len(tokens))), top)

    def show(items):
        return logprobs_body(items, TEXT, chat)

    async def go():
        gen = api._events(FakeScheduler(), rec, list(stops), trace.INVALID_SPAN)
        return [line async for line in api._sse(gen, "id", "m", chat, None, show)]
    lines = asyncio.run(go())
    assert lines[-1] == "data: [DONE]\n\n"
    return [json.loads(line[6:]) for line in lines[:-1]]


def test_without_logprobs_nothing_is_reported():
    assert all(e[3] == [] for e in events(ids("hello"), top=None))


def test_every_token_is_reported_once_in_order_without_a_stop():
    toks = ids("né ok") + [EOS]
    got = [r.token for e in events(toks, splits=[1, 2, 4]) for r in e[3]]
    assert got == toks


def test_stop_sequence_cuts_the_logprobs_with_the_text():
    toks = ids("abc STOP tail")
    evs = events(toks, stops=["STOP"], splits=range(len(toks)))
    assert "".join(e[0] for e in evs) == "abc "
    assert evs[-1][1] == "stop"
    assert [r.token for e in evs for r in e[3]] == ids("abc ")


def test_streamed_completion_chunks_carry_the_logprobs_of_their_text():
    chunks = sse(ids("aé b"), chat=False)
    for c in chunks:
        choice = c["choices"][0]
        lp = choice["logprobs"]
        assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
        assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"])
    texts = [c["choices"][0]["text"] for c in chunks]
    tokens = [c["choices"][0]["logprobs"]["tokens"] for c in chunks]
    assert texts[:2] == ["a", "é"] and tokens[:2] == [["a"], ["bytes:\\xc3", "bytes:\\xa9"]]
    offsets = [o for c in chunks for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == [0, 1, 1, 2, 3]  # counted across the whole stream, in characters


def test_streamed_chat_chunks_carry_content_logprobs_with_bytes():
    chunks = sse(ids("aé"), chat=True, top=1)
    content = [e for c in chunks for e in c["choices"][0]["logprobs"]["content"]]
    assert [e["bytes"] for e in content] == [[0x61], [0xC3], [0xA9]]
    assert content[0] == {"token": "a", "logprob": -0.097, "bytes": [0x61],
                          "top_logprobs": [{"token": "a", "logprob": -0.097, "bytes": [0x61]},
                                           {"token": "b", "logprob": -1.097, "bytes": [0x62]}]}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"


def test_whole_answer_logprobs_equal_the_streamed_ones_joined():
    toks = ids("héllo wörld")
    whole = completion_logprobs([r for e in events(toks) for r in e[3]], TEXT)
    chunks = sse(toks, chat=False)
    for key in whole:
        assert whole[key] == [v for c in chunks for v in c["choices"][0]["logprobs"][key]]


# --- shapes ----------------------------------------------------------------------------------------

def test_completion_shape_top_n_and_the_chosen_token_outside_it():
    item = Reported(ord("z"), TokenLogprob(-5.0, [ord("a"), ord("b")], [-0.1, -0.2]), 0)
    body = completion_logprobs([item], TEXT)
    assert body == {"tokens": ["z"], "token_logprobs": [-5.0], "top_logprobs": [{"a": -0.1, "b": -0.2}],
                    "text_offset": [0]}


def test_logprobs_zero_gives_empty_top_dicts_and_lists():
    item = Reported(ord("z"), TokenLogprob(-5.0), 0)
    assert completion_logprobs([item], TEXT)["top_logprobs"] == [{}]
    assert chat_logprobs([item], TEXT)["content"][0]["top_logprobs"] == []


def test_values_json_cannot_carry_are_floored():
    item = Reported(ord("z"), TokenLogprob(-math.inf, [1], [math.nan]), 0)
    body = completion_logprobs([item], TEXT)
    assert body["token_logprobs"] == [FLOOR] and list(body["top_logprobs"][0].values()) == [FLOOR]
    json.dumps(body, allow_nan=False)


def test_two_ids_with_the_same_text_keep_the_more_likely_value():
    same = TOK.token_to_id("<|im_end|>")
    item = Reported(ord("z"), TokenLogprob(-1.0, [same, ord("q"), same], [-0.5, -0.7, -0.9]), 0)
    assert completion_logprobs([item], TEXT)["top_logprobs"] == [{"<|im_end|>": -0.5, "q": -0.7}]


# --- InFlight: a resumed request's overlap keeps tokens and logprobs together ---------------------

def test_duplicate_tokens_are_dropped_with_their_logprobs():
    rec = InFlight("r", [1], Sampling(max_tokens=8, logprobs=0))
    rec.accept(TokenEvent("r", [10, 11], 0, logprobs=[lp_of(10), lp_of(11)]))
    out = rec.accept(TokenEvent("r", [11, 12], 1, logprobs=[lp_of(11), lp_of(12)]))
    assert out.tokens == [12] and out.logprobs == [lp_of(12)]


# --- property: whatever the bytes, splits and stops ----------------------------------------------

@settings(max_examples=150, deadline=None)
@given(text=st.text(alphabet="ab é€😀<>", max_size=14), eos=st.booleans(),
       splits=st.lists(st.integers(0, 60), max_size=6), stop=st.sampled_from([None, "b", "é", "<>", "a €"]))
def test_reported_tokens_cover_exactly_the_returned_text(text, eos, splits, stop):
    toks = ids(text) + ([EOS] if eos else [])
    if not toks:
        return
    evs = events(toks, stops=[stop] if stop else [], splits=splits)
    out = "".join(e[0] for e in evs)
    reported = [r for e in evs for r in e[3]]
    got = [r.token for r in reported]
    assert got == toks[:len(got)]  # a prefix, in order, each token once
    assert [r.lp for r in reported] == [lp_of(t) for t in got]
    if evs[-1][1] != "stop":
        assert got == toks
        return
    # every reported token has text in `out`, and `out` is within the reported tokens' text
    assert all(r.offset < len(out) for r in reported)
    shown = TOK.decode(got)
    assert shown.startswith(out)
