"""Log-probabilities through the whole mesh (tiny model): the first token's from the prefill
engine, the rest from the decode engine, equal to the single-process reference's; streamed
and whole, completions and chat; a sampled token reports its pre-temperature value; a
request resumed after its decode engine died keeps reporting them."""
from __future__ import annotations

import json
import signal

import httpx
import pytest

from tests.integration.meshutil import Announcements, complete, stream, tiny_mesh

pytestmark = pytest.mark.integration

TOL = 1e-4
N = 20  # tokens per request
TOP = 4


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    m = tiny_mesh(tmp_path_factory.mktemp("mesh"), kv_blocks=80)
    m.start(timeout=120)
    yield m
    m.stop()


@pytest.fixture(scope="module")
def texts(reference):
    from shared.model.token_text import TokenText

    return TokenText(reference.tokenizer)


def _want(reference, prompt: list[int], n: int = N):
    from shared.model.reference import generate_detailed

    return generate_detailed(reference, prompt, n, top_logprobs=TOP, ignore_eos=True)


def _raw_logprobs(reference, prompt: list[int], ids: list[int], temperature: float = 1.0) -> list[float]:
    """log_softmax(logits / temperature) of each generated id, from the cache-free forward."""
    import torch

    logits = reference.model.forward_reference(prompt + ids).float()[len(prompt) - 1:-1]
    lp = torch.log_softmax(logits / temperature, -1)
    return lp[torch.arange(len(ids)), torch.tensor(ids)].tolist()


def _close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and all(abs(a - b) <= TOL for a, b in zip(got, want))


def _joined(chunks: list[dict], key: str) -> list:
    return [v for c in chunks for v in c["choices"][0]["logprobs"][key]]


def _check_completion(lp: dict, want, texts) -> None:
    assert lp["tokens"] == [texts(t)[0] for t in want.ids]
    assert _close(lp["token_logprobs"], [x.logprob for x in want.logprobs])
    for top, ref in zip(lp["top_logprobs"], want.logprobs, strict=True):
        assert list(top) == [texts(t)[0] for t in ref.top_ids]  # most likely first, as the reference ranks them
        assert _close(list(top.values()), ref.top_logprobs)


def test_greedy_completion_logprobs_equal_the_reference(mesh, reference, texts):
    prompt = reference.tokenizer.encode("log-probabilities through the mesh " * 4)
    want = _want(reference, prompt)
    r = complete(mesh.url, {"prompt": prompt, "max_tokens": N, "temperature": 0, "ignore_eos": True,
                            "logprobs": TOP, "return_token_ids": True})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["token_ids"] == want.ids
    _check_completion(choice["logprobs"], want, texts)
    offsets = choice["logprobs"]["text_offset"]
    assert offsets == sorted(offsets) and offsets[-1] < len(choice["text"])


def test_streamed_completion_logprobs_equal_the_reference(mesh, reference, texts):
    prompt = reference.tokenizer.encode("streamed log-probabilities " * 4)
    want = _want(reference, prompt)
    events = stream(mesh.url, {"prompt": prompt, "max_tokens": N, "temperature": 0, "ignore_eos": True,
                               "logprobs": TOP})
    chunks = events[:-1]
    assert len(chunks) > 1
    joined = {k: _joined(chunks, k) for k in ("tokens", "token_logprobs", "top_logprobs", "text_offset")}
    _check_completion(joined, want, texts)
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert all(o < len(text) for o in joined["text_offset"])


def _chat_prompt(reference, content: str) -> list[int]:
    return reference.tokenizer.encode(reference.tokenizer.apply_chat_template([{"role": "user", "content": content}]))


def _check_chat(content: list[dict], want, texts) -> None:
    assert [e["token"] for e in content] == [texts(t)[0] for t in want.ids]
    assert [bytes(e["bytes"]) for e in content] == [texts(t)[1] for t in want.ids]
    assert _close([e["logprob"] for e in content], [x.logprob for x in want.logprobs])
    for e, ref in zip(content, want.logprobs):
        assert [a["token"] for a in e["top_logprobs"]] == [texts(t)[0] for t in ref.top_ids]
        assert _close([a["logprob"] for a in e["top_logprobs"]], ref.top_logprobs)


def test_chat_logprobs_equal_the_reference_whole_and_streamed(mesh, reference, texts):
    msg = "say something with log-probabilities"
    want = _want(reference, _chat_prompt(reference, msg))
    body = {"messages": [{"role": "user", "content": msg}], "max_tokens": N, "temperature": 0,
            "ignore_eos": True, "logprobs": True, "top_logprobs": TOP}
    r = complete(mesh.url, body, path="/v1/chat/completions")
    assert r.status_code == 200, r.text
    _check_chat(r.json()["choices"][0]["logprobs"]["content"], want, texts)
    chunks = stream(mesh.url, body, path="/v1/chat/completions")[:-1]
    _check_chat([e for c in chunks for e in c["choices"][0]["logprobs"]["content"]], want, texts)


def test_sampled_tokens_report_the_pre_temperature_logprob(mesh, reference):
    prompt = reference.tokenizer.encode("a seeded hot sample")
    r = complete(mesh.url, {"prompt": prompt, "max_tokens": N, "temperature": 1.5, "top_p": 0.9, "seed": 11,
                            "ignore_eos": True, "logprobs": 0, "return_token_ids": True})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    ids, lp = choice["token_ids"], choice["logprobs"]
    assert _close(lp["token_logprobs"], _raw_logprobs(reference, prompt, ids))
    assert not _close(lp["token_logprobs"], _raw_logprobs(reference, prompt, ids, temperature=1.5))
    assert lp["top_logprobs"] == [{}] * N  # logprobs=0: the chosen token only


def test_without_logprobs_the_choice_says_null(mesh):
    r = complete(mesh.url, {"prompt": "plain", "max_tokens": 3})
    assert r.json()["choices"][0]["logprobs"] is None
    r = complete(mesh.url, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3},
                 path="/v1/chat/completions")
    assert r.json()["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "logprobs": True,
                              "top_logprobs": 99}, "top_logprobs"),
])
def test_bad_logprob_fields_are_a_400_naming_the_field(mesh, path, body, param):
    r = httpx.post(mesh.url + path, json=body, timeout=30)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param


def test_a_resumed_request_keeps_reporting_logprobs(tmp_path, reference):
    """The decode engine serving the request dies mid-stream; a second one resumes it from the
    prompt plus the tokens already streamed (its prefill samples the next token)."""
    n = 1500  # long enough to be still running when its engine is killed
    prompt = reference.tokenizer.encode("resume with logprobs " * 6)
    want = _want(reference, prompt, n)
    mesh = tiny_mesh(tmp_path, kv_blocks=80, decode=2)
    mesh.start(timeout=120)
    try:
        body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "logprobs": 1,
                "stream": True}
        events = []
        with Announcements(mesh) as ann, httpx.stream("POST", mesh.url + "/v1/completions", json=body,
                                                       timeout=60) as r:
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                events.append(line[6:])
                if len(events) == 20:
                    busy = lambda a: [e for e in a.engines.values() if e.role == "decode" and e.seq > 0]  # noqa: E731
                    assert ann.wait_for(lambda a: len(busy(a)) == 1, 10)
                    mesh.kill(next(p for p in mesh.procs if p.name == f"decode-{busy(ann)[0].engine}"),
                              signal.SIGKILL)
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert all("error" not in c for c in chunks), chunks[-1]
        text = "".join(c["choices"][0]["text"] for c in chunks)
        assert text == reference.tokenizer.decode(want.ids)  # every token once, in order, across the failure
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert _close(_joined(chunks, "token_logprobs"), [x.logprob for x in want.logprobs])
        assert "dualpath_scheduler_request_resumes_total 1.0" in httpx.get(mesh.url + "/metrics", timeout=5).text
    finally:
        mesh.stop()
