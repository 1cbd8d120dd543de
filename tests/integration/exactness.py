"""Exactness checks for mesh tests: the mesh's tokens and logprobs against the single-process reference.

`check(body, reference)` takes a `/v1/completions` answer made with `return_token_ids` and
`logprobs`, recomputes the same prompt in this process (`generate_detailed`) and returns the
largest |logprob difference|; `assert_exact` fails unless the tokens are identical and that
difference is within TOLERANCE. `wait_stored` waits until a prompt's full blocks are files in
the store (persistence is background work), the condition a second turn's hits depend on.
"""
from __future__ import annotations

import json
from pathlib import Path

import httpx

TOLERANCE = 1e-4  # fp32: every sampled token's logprob within this of the reference's


def ask(url: str, prompt, n: int, **extra) -> dict:
    """A greedy completion with token ids and logprobs (raises on a non-200 answer)."""
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "return_token_ids": True,
            "logprobs": 0, **extra}
    r = httpx.post(url + "/v1/completions", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def ask_stream(url: str, prompt, n: int, **extra) -> dict:
    """The same, streamed: chunks folded into one body of the non-streamed shape."""
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "return_token_ids": True,
            "logprobs": 0, "stream": True, "stream_options": {"include_usage": True}, **extra}
    text, lps, usage, ids = [], [], None, None
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            if chunk.get("usage"):
                usage, ids = chunk["usage"], chunk.get("token_ids")
            for c in chunk["choices"]:
                text.append(c["text"])
                if c.get("logprobs"):
                    lps += c["logprobs"]["token_logprobs"]
    return {"choices": [{"text": "".join(text), "token_ids": ids, "logprobs": {"token_logprobs": lps}}],
            "usage": usage}


def logprob_diff(body: dict, reference, prompt_ids: list[int]) -> tuple[list[int], list[int], float]:
    """(mesh tokens, reference tokens, max |logprob difference| over the common tokens)."""
    from shared.model.reference import generate_detailed

    choice = body["choices"][0]
    got = choice["token_ids"]
    want = generate_detailed(reference, prompt_ids, len(got), top_logprobs=0, ignore_eos=True)
    lp = choice["logprobs"]
    mesh_lp = lp["token_logprobs"] if "token_logprobs" in lp else [x["logprob"] for x in lp["content"]]
    assert len(mesh_lp) == len(got), (len(mesh_lp), len(got))
    diff = max(abs(a - b.logprob) for a, b in zip(mesh_lp, want.logprobs))
    return got, want.ids, diff


def assert_exact(body: dict, reference, prompt_ids: list[int] | None = None, what: str = "") -> float:
    """Tokens identical and logprobs within TOLERANCE of the reference; returns the max difference."""
    prompt_ids = prompt_ids if prompt_ids is not None else body["choices"][0]["prompt_token_ids"]
    got, want, diff = logprob_diff(body, reference, prompt_ids)
    assert got == want, f"{what}: tokens differ from the reference: {got} vs {want}"
    assert diff <= TOLERANCE, f"{what}: max |logprob difference| {diff:.3g} > {TOLERANCE}"
    print(f"EXACTNESS {what}: {len(got)} tokens, max |logprob diff| {diff:.2e}")
    return diff


def wait_stored(store: Path, reference, prompt_ids: list[int], blocks: int, block_size: int = 64,
                timeout: float = 60.0) -> None:
    """Wait until the first `blocks` full blocks of `prompt_ids` are files in the store."""
    from shared.engine.store_layout import prompt_keys, store_layout
    from tests.integration import meshutil

    keys = prompt_keys(store_layout(reference.model_id, reference.config, block_size), prompt_ids)[:blocks]
    assert len(keys) == blocks, f"prompt has {len(keys)} full blocks, not {blocks}"
    meshutil.wait_stored(store, keys, timeout)


def block_file(store: Path, reference, prompt_ids: list[int], index: int, block_size: int = 64) -> Path:
    """The store file of the prompt's block `index`."""
    from shared.engine.store_layout import prompt_keys, store_layout

    key = prompt_keys(store_layout(reference.model_id, reference.config, block_size), prompt_ids)[index]
    return next(store.rglob(key.hex() + ".kvb"))
