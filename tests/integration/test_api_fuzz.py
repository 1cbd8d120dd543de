"""Bad input on the front door: thousands of generated bodies against one real tiny mesh.

Bodies come from the scheduler's own OpenAPI document (`/openapi.json`): a schema-valid
body, then zero or more fields mutated (wrong types, out-of-range and huge numbers,
NaN/Infinity literals, unicode and lone surrogates, nested garbage, missing required
fields, extra fields, empty and very long strings, out-of-vocab token ids), plus raw
garbage bytes and broken JSON, with `stream` both ways. The contract checked per
response: never a 5xx; a 4xx carries `{"error": {"message": ...}}`; a 200 is a
well-formed completion or an SSE stream of chunks ending in `data: [DONE]`. Afterwards
every service process is alive and the mesh still answers.
"""
from __future__ import annotations

import collections
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.integration.meshutil import complete, tiny_mesh

pytestmark = pytest.mark.integration

BATCH = 25  # bodies per hypothesis example, sent concurrently
EXAMPLES = 60  # per endpoint: 60 * 25 = 1,500 bodies
MAX_TOKENS_CAP = 3  # valid max_tokens are capped here so the accepted requests stay cheap
RAW = "\x00raw:"  # a string value "\x00raw:<text>" is spliced into the JSON as <text> (1e999, NaN, ...)

SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture, HealthCheck.large_base_example])

# Tallies across both endpoints, for the report and the total-count check.
SENT: collections.Counter = collections.Counter()
STATUS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    m = tiny_mesh(tmp_path_factory.mktemp("fuzz"), kv_blocks=96)
    m.start(timeout=120)
    yield m
    m.stop()


@pytest.fixture(scope="module")
def client(mesh):
    limits = httpx.Limits(max_connections=BATCH, max_keepalive_connections=BATCH)
    with httpx.Client(base_url=mesh.url, timeout=60, limits=limits) as c:
        yield c


@pytest.fixture(scope="module")
def facts(client):
    doc = client.get("/openapi.json")
    assert doc.status_code == 200, doc.text
    info = client.get("/v1/mesh").json()
    return {"doc": doc.json(), "vocab": info["vocab_size"], "context": info["max_context"]}


# strategies ---------------------------------------------------------------------------------

def _raw(text: str) -> str:
    return RAW + text


TEXT = st.one_of(
    st.text(max_size=40),
    st.text(st.characters(codec="utf-8"), max_size=20),
    st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3),  # lone surrogates
    st.sampled_from(["", " ", "\x00", "<|im_start|>", "<|endoftext|>", "\u202e", "🙂" * 10, "a\r\n\tb"]),
    st.integers(1_000, 40_000).map(lambda n: "x " * n),  # long: past the context
)
NUMBER_ODD = st.sampled_from([_raw("NaN"), _raw("Infinity"), _raw("-Infinity"), _raw("1e999"), _raw("-1e999"),
                              _raw("1" * 400), _raw("-0"), _raw("1e-400"), _raw("0x10"), _raw("+1"), _raw("01")])
INT_ODD = st.one_of(st.integers(-(2 ** 70), 2 ** 70), st.sampled_from([2 ** 63, 2 ** 64, -(2 ** 63) - 1, -1, 0]))
GARBAGE = st.recursive(
    st.one_of(st.none(), st.booleans(), INT_ODD, st.floats(allow_nan=True, allow_infinity=True), TEXT, NUMBER_ODD),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)


def _valid(schema: dict, comps: dict, facts: dict, name: str = "") -> st.SearchStrategy:
    """A schema-valid value (the API's semantic limits may still reject it)."""
    if "$ref" in schema:
        return _valid(comps[schema["$ref"].rsplit("/", 1)[-1]], comps, facts)
    if "anyOf" in schema:
        return st.one_of([_valid(s, comps, facts, name) for s in schema["anyOf"]])
    if "enum" in schema:  # a closed set (dualpath_mode: the load modes), as the document lists it
        return st.one_of(st.sampled_from(schema["enum"]), TEXT)
    kind = schema.get("type")
    if kind == "object":
        return _object(schema, comps, facts)
    if kind == "array":
        item = schema["items"]
        if name == "prompt" and item.get("type") == "integer":  # token ids, mostly in the vocabulary
            v = facts["vocab"]
            ids = st.one_of(st.integers(0, v - 1), st.integers(0, v - 1), st.sampled_from([v, -1, 2 ** 63, 2 ** 64]))
            return st.lists(ids, max_size=24)
        return st.lists(_valid(item, comps, facts), max_size=4)
    if kind == "integer":
        if name in ("max_tokens", "max_completion_tokens"):
            return st.one_of(st.integers(1, MAX_TOKENS_CAP), INT_ODD)
        return st.one_of(st.integers(-3, 3), INT_ODD)
    if kind == "number":
        return st.one_of(st.floats(0, 2), st.floats(allow_nan=False, allow_infinity=False), st.just(5e-324))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if name == "model":
        return st.one_of(st.just("tiny2@seed0"), TEXT)
    if name == "role":
        return st.one_of(st.sampled_from(["user", "system", "assistant"]), TEXT)
    return TEXT


def _object(schema: dict, comps: dict, facts: dict) -> st.SearchStrategy:
    props, required = schema["properties"], schema.get("required", [])
    fields = {k: _valid(v, comps, facts, k) for k, v in props.items()}
    optional = [k for k in props if k not in required]
    return st.fixed_dictionaries({k: fields[k] for k in required},
                                 optional={k: fields[k] for k in optional})


@st.composite
def _mutated(draw, schema: dict, comps: dict, facts: dict) -> dict:
    body = draw(_object(schema, comps, facts))
    for _ in range(draw(st.integers(0, 3))):
        op = draw(st.sampled_from(["retype", "drop", "extra", "empty", "nest"]))
        key = draw(st.sampled_from(sorted(schema["properties"])))
        if op == "retype":
            body[key] = draw(GARBAGE)
        elif op == "drop":
            body.pop(key, None)
        elif op == "extra":
            body[draw(st.text(max_size=12))] = draw(GARBAGE)
        elif op == "empty":
            body[key] = draw(st.sampled_from(["", [], {}, None, 0]))
        else:
            body[key] = draw(st.sampled_from([{"a": [[[1]]]}, [[{"x": None}]], [body.get(key)] * 3]))
    if draw(st.booleans()):
        body["stream"] = draw(st.booleans())
        if body["stream"] and draw(st.booleans()):
            body["stream_options"] = draw(st.one_of(st.just({"include_usage": True}), GARBAGE))
    return body


def _encode(body, ensure_ascii: bool) -> bytes:
    text = json.dumps(body, ensure_ascii=ensure_ascii)  # allow_nan: NaN/Infinity literals are the point
    while f'"{json.dumps(RAW)[1:-1]}' in text:
        start = text.index(f'"{json.dumps(RAW)[1:-1]}')
        end = text.index('"', start + 1)
        text = text[:start] + text[start + 1 + len(json.dumps(RAW)) - 2:end] + text[end + 1:]
    return text.encode("utf-8", "surrogatepass")  # lone surrogates become invalid UTF-8 when not escaped


def _cap(body):
    """Keep accepted requests cheap: a schema-valid max_tokens above the cap comes down to it, and a
    chat body with none gets the cap (a chat completion's default runs to the end of the context)."""
    if isinstance(body, dict):
        for key in ("max_tokens", "max_completion_tokens"):
            v = body.get(key)
            if type(v) is int and MAX_TOKENS_CAP < v < 1_000_000:
                body[key] = MAX_TOKENS_CAP
        if "messages" in body and body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body["max_completion_tokens"] = MAX_TOKENS_CAP
    return body


@st.composite
def bodies(draw, endpoint: str, facts: dict) -> bytes:
    comps = facts["doc"]["components"]["schemas"]
    schema = comps["ChatRequest" if "chat" in endpoint else "CompletionRequest"]
    kind = draw(st.sampled_from(["mutated"] * 6 + ["garbage-json", "bytes", "broken", "deep"]))
    if kind == "mutated":
        return _encode(_cap(draw(_mutated(schema, comps, facts))), draw(st.booleans()))
    if kind == "garbage-json":
        return _encode(draw(GARBAGE), draw(st.booleans()))
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    if kind == "deep":
        depth = draw(st.one_of(st.integers(900, 1_100), st.sampled_from([5_000, 100_000])))
        return ('{"prompt": "hi", "max_tokens": 1, "x": ' + "[" * depth + "]" * depth + "}").encode()
    raw = _encode(_cap(draw(_mutated(schema, comps, facts))), True)
    cut = draw(st.integers(0, max(0, len(raw) - 1)))
    how = draw(st.sampled_from(["truncate", "flip", "insert"]))
    if how == "truncate":
        return raw[:cut]
    if how == "flip":
        return raw[:cut] + bytes([raw[cut] ^ draw(st.integers(1, 255))]) + raw[cut + 1:] if raw else raw
    return raw[:cut] + draw(st.binary(min_size=1, max_size=4)) + raw[cut:]


# checks -------------------------------------------------------------------------------------

def _send(client: httpx.Client, path: str, body: bytes) -> tuple[int | str, str]:
    """POST one body; returns (status, "200 stream" for SSE; problem or "")."""
    headers = {"Content-Type": "application/json"}
    try:
        with client.stream("POST", path, content=body, headers=headers) as r:
            raw = r.read()
            ctype = r.headers.get("content-type", "")
    except httpx.TransportError as exc:
        return 0, f"connection failed: {exc!r}"
    if r.status_code >= 500:
        return r.status_code, f"{r.status_code}: {raw[:300]!r}"
    if r.status_code >= 400:
        try:
            msg = json.loads(raw)["error"]["message"]
            assert isinstance(msg, str) and msg
        except Exception:  # noqa: BLE001 - any shape problem is the finding
            return r.status_code, f"4xx without error.message: {raw[:300]!r}"
        return r.status_code, ""
    if r.status_code != 200:
        return r.status_code, f"unexpected status {r.status_code}"
    chat = "chat" in path
    if ctype.startswith("text/event-stream"):
        return "200 stream", _check_stream(raw, chat)
    return 200, _check_completion(raw, chat)


def _check_completion(raw: bytes, chat: bool) -> str:
    try:
        body = json.loads(raw)
        choice = body["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        assert body["object"] == ("chat.completion" if chat else "text_completion")
        assert isinstance(text, str) and choice["finish_reason"] in ("stop", "length")
        use = body["usage"]
        assert use["total_tokens"] == use["prompt_tokens"] + use["completion_tokens"] and use["prompt_tokens"] > 0
    except Exception as exc:  # noqa: BLE001
        return f"malformed completion ({exc!r}): {raw[:300]!r}"
    return ""


def _check_stream(raw: bytes, chat: bool) -> str:
    events = [line[6:] for line in raw.decode().split("\n\n") if line.startswith("data: ")]
    if not events or events[-1] != "[DONE]":
        return f"stream does not end in [DONE]: {raw[-300:]!r}"
    try:
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks and not any("error" in c for c in chunks), "error event"
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
        assert finishes[-1] in ("stop", "length") and not any(finishes[:-1])
        want = "chat.completion.chunk" if chat else "text_completion"
        assert all(c["object"] == want for c in chunks)
    except Exception as exc:  # noqa: BLE001
        return f"malformed stream ({exc!r}): {raw[:300]!r}"
    return ""


def _fuzz(client: httpx.Client, pool: ThreadPoolExecutor, path: str, batch: list[bytes]) -> None:
    results = list(pool.map(lambda b: _send(client, path, b), batch))
    SENT[path] += len(batch)
    problems = []
    for body, (status, problem) in zip(batch, results):
        STATUS[path][status] += 1
        if problem:
            problems.append(f"{problem}\n    body: {body[:200]!r}")
    assert not problems, "\n".join(problems[:5])


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_generated_bodies_never_get_a_5xx(mesh, client, facts, path):
    pool = ThreadPoolExecutor(8)

    @SETTINGS
    @given(st.lists(bodies(path, facts), min_size=BATCH, max_size=BATCH))
    def run(batch):
        _fuzz(client, pool, path, batch)

    try:
        run()
    finally:
        pool.shutdown()
        print(f"\n{path}: {SENT[path]} bodies, statuses {dict(sorted(STATUS[path].items(), key=str))}")
    mesh.check_alive()


def test_fuzz_sent_enough_and_the_mesh_still_answers(mesh, client):
    assert sum(SENT.values()) >= 2_000, dict(SENT)
    mesh.check_alive()
    assert client.get("/health").json()["status"] == "ok"
    r = complete(mesh.url, {"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["finish_reason"] in ("stop", "length")
    r = complete(mesh.url, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                 path="/v1/chat/completions")
    assert r.status_code == 200, r.text
