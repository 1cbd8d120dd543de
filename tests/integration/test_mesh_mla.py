"""The whole mesh on DeepSeek-V3's architecture (`tiny-mla`: MLA latent cache, MoE): exact
against the single-process reference at the logprob level, with the engines' device path on.

One mesh (two decode nodes) runs both engines with `kv_mirror` (the model's KV cache apart
from the host region the traffic-managers reach, every copy made as on a GPU) and a small
compute quota (long prompts are prefilled in chunks). On it: an empty store; a second turn
loaded on the PE path (`basic`) and split across both paths (`dualpath`); a stored block
whose header names the GQA layout (same byte count, re-signed) refused as a miss; the
store's files holding latent rows of the MLA size; and a request resumed after its decode
engine was killed. A second mesh (tcp data plane, every hit on the DE path) shows the check's
teeth on this model: bytes flipped after the checksum on the DE side fail it, the PE path
stays exact. (GQA: test_mesh_exactness.py, test_mesh_chunked.py, test_mesh_logprobs.py.)
"""
from __future__ import annotations

import json
import signal
import struct
import uuid
from pathlib import Path

import httpx
import pytest
import xxhash

from tests.integration.exactness import TOLERANCE, ask, assert_exact, block_file, logprob_diff, wait_stored
from tests.integration.meshutil import Announcements, tiny_mesh, wait_until
from tests.integration.test_mesh_dualpath import Probe

pytestmark = pytest.mark.integration
READ = "dualpath_storage_gateway_read_bytes_total"
MIRROR = {"kv-mirror": "true"}


@pytest.fixture(scope="module")
def mla_reference():
    import torch

    from shared.model.loader import load_model

    torch.set_num_threads(1)
    return load_model("tiny-mla", seed=0)


def _mesh(tmp_path_factory, name: str, extra: dict, **kw):
    # second turns read their hits from the store, not from the last turn's blocks its DE kept
    sched = {"liveness-timeout-s": "2", "serve-pending-saves": "false", **extra.get("scheduler", {})}
    m = tiny_mesh(tmp_path_factory.mktemp(name), model="tiny-mla", kv_blocks=128,
                  extra={**extra, "scheduler": sched}, **kw)
    m.store_root = Path(m.spec.store)
    m.start(timeout=120)
    return m


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    m = _mesh(tmp_path_factory, "mla", {"prefill_engine": {**MIRROR, "compute-quota-s": "0.25"},
                                        "decode_engine": MIRROR}, decode=2)
    yield m
    m.stop()


def _turn1(mesh, reference, tag: str, n: int = 70) -> list[int]:
    """A first turn on an empty store (checked exact); the second turn's prompt once every block
    the first one filled is stored. `mesh.turn1_forwards`: the prefill forwards it took."""
    p1 = f"[{tag} {uuid.uuid4().hex[:8]}] agent log: " + "read file ok; ran tests, 2 passed; " * 14
    steps = _steps(mesh)
    r1 = ask(mesh.url, p1, n)
    mesh.turn1_forwards = _steps(mesh) - steps
    assert r1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert_exact(r1, reference, what=f"mla {tag}: empty store")
    ids = r1["choices"][0]["prompt_token_ids"] + r1["choices"][0]["token_ids"]
    wait_stored(mesh.store_root, reference, ids, (len(ids) - 1) // 64)
    return ids + reference.tokenizer.encode(" tool: done, 3 files changed. " * 4)


def _steps(mesh) -> float:
    body = httpx.get(mesh.url + "/v1/mesh", timeout=5).json()
    url = next(e["metrics_url"] for e in body["engines"] if e["role"] == "prefill")
    line = next(x for x in httpx.get(url, timeout=5).text.splitlines()
                if x.startswith("dualpath_prefill_engine_step_seconds_count"))
    return float(line.split()[-1])


@pytest.mark.parametrize("mode", ["basic", "dualpath-split"])
def test_second_turn_is_exact_on_the_pe_path_and_split_and_chunked(mesh, mla_reference, mode):
    prompt = _turn1(mesh, mla_reference, mode)
    assert mesh.turn1_forwards >= 3  # its 570-odd prompt tokens were prefilled in chunks
    probe = Probe(mesh.url)
    before, steps = probe.snap(), _steps(mesh)
    body = ask(mesh.url, prompt, 24, dualpath_mode=mode)
    after = probe.snap()
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= 8 * 64
    assert_exact(body, mla_reference, prompt, what=f"mla {mode}")
    pe = probe.delta(before, after, ("gateway", "p0"), READ)
    de = sum(probe.delta(before, after, k, READ) for k in before if k[0] == "gateway" and k[1] != "p0")
    if mode == "basic":
        assert pe > 0 and de == 0
    else:
        assert pe > 0 and de > 0
    assert _steps(mesh) - steps >= 2  # the 80-odd computed tokens of the second turn took more than one forward


def test_stored_blocks_hold_latent_rows_and_name_the_mla_layout(mesh, mla_reference):
    from shared.kv.full_block import HEADER_SIZE, decode_header

    prompt = _turn1(mesh, mla_reference, "layout")
    cfg = mla_reference.config
    data = block_file(mesh.store_root, mla_reference, prompt, 0).read_bytes()
    hdr = decode_header(data[:HEADER_SIZE])
    width = cfg.mla.kv_lora_rank + cfg.mla.qk_rope_head_dim
    assert (hdr.layout.kind.value, hdr.layout.latent_rank, hdr.layout.rope_dim) == ("mla", 64, 16)
    assert hdr.payload_length == len(data) - HEADER_SIZE == 64 * cfg.n_layers * width * 4 == 64 * cfg.kv_bytes_per_token


def _as_gqa(path: Path) -> None:
    """Rewrite a block's header to say GQA planes of one head (the same byte count), re-signed:
    a header consistent on its own, naming another layout."""
    data = bytearray(path.read_bytes())
    struct.pack_into("<HHIII", data, 80, 1, 0, 0, 0, 0)
    struct.pack_into("<Q", data, 4088, xxhash.xxh3_64_intdigest(bytes(data[:4088])))
    path.write_bytes(bytes(data))


def test_a_stored_block_of_another_layout_is_a_miss_and_stays_exact(mesh, mla_reference):
    prompt = _turn1(mesh, mla_reference, "gqa-block")
    victim = block_file(mesh.store_root, mla_reference, prompt, 3)
    good = victim.read_bytes()
    _as_gqa(victim)
    bad = victim.read_bytes()
    body = ask(mesh.url, prompt, 24, dualpath_mode="basic")
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 3 * 64  # the chain stops at it
    assert_exact(body, mla_reference, prompt, what="mla, a GQA-layout 4th block")
    # the block of another layout is removed, and the prompt's block computed in its place is stored anew
    wait_until(lambda: victim.exists() and victim.read_bytes() != bad, "the 4th block stored again")
    assert victim.read_bytes()[80:96] == good[80:96]  # an MLA block again (its header's layout fields)


def test_a_resumed_request_stays_exact(mesh, mla_reference):
    """Its decode engine is killed mid-stream; the other one resumes it (prompt plus the tokens
    already streamed, prefilled again) and every token and logprob equals the reference's."""
    from shared.model.reference import generate_detailed

    n = 600
    prompt = mla_reference.tokenizer.encode(f"[resume {uuid.uuid4().hex[:8]}] resume with logprobs " * 6)
    want = generate_detailed(mla_reference, prompt, n, top_logprobs=0, ignore_eos=True)
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "logprobs": 0, "stream": True}
    events = []
    with Announcements(mesh) as ann, httpx.stream("POST", mesh.url + "/v1/completions", json=body,
                                                   timeout=120) as r:
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == 20:
                busy = lambda a: [e for e in a.engines.values() if e.role == "decode" and e.seq > 0]  # noqa: E731
                assert ann.wait_for(lambda a: len(busy(a)) == 1, 10)
                mesh.kill(next(p for p in mesh.procs if p.name == f"decode-{busy(ann)[0].engine}"), signal.SIGKILL)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("error" not in c for c in chunks), chunks[-1]
    assert "".join(c["choices"][0]["text"] for c in chunks) == mla_reference.tokenizer.decode(want.ids)
    got = [v for c in chunks for v in c["choices"][0]["logprobs"]["token_logprobs"]]
    diff = max(abs(a - b.logprob) for a, b in zip(got, want.logprobs, strict=True))
    print(f"EXACTNESS mla resumed: {len(got)} tokens, max |logprob diff| {diff:.2e}")
    assert diff <= TOLERANCE
    assert "dualpath_scheduler_request_resumes_total 1.0" in httpx.get(mesh.url + "/metrics", timeout=5).text


@pytest.fixture(scope="module")
def faulty_mesh(tmp_path_factory):
    m = _mesh(tmp_path_factory, "mla-fault", {"scheduler": {"liveness-timeout-s": "2", "read-path": "de"},
                                              "traffic_manager": {"fault-flip-de-bytes": "true"}},
              transport="tcp", env={"DUALPATH_ALLOW_FAULTS": "1"})
    yield m
    m.stop()


def test_flipped_latent_bytes_on_the_de_path_are_detected_and_the_pe_path_stays_exact(faulty_mesh, mla_reference):
    prompt = _turn1(faulty_mesh, mla_reference, "fault")
    body = ask(faulty_mesh.url, prompt, 16, dualpath_mode="dualpath")
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= 8 * 64  # served as hits, wrongly
    got, want, diff = logprob_diff(body, mla_reference, prompt)
    print(f"EXACTNESS mla fault injected: max |logprob diff| {diff:.3g}, tokens equal: {got == want}")
    assert diff > TOLERANCE
    clean = _turn1(faulty_mesh, mla_reference, "fault-basic")
    assert_exact(ask(faulty_mesh.url, clean, 16, dualpath_mode="basic"), mla_reference, clean,
                 what="mla fault mesh, basic (tcp)")
