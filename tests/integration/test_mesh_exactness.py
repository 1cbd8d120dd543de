"""Every load path is exact: tokens identical to the single-process reference and every
token's logprob within 1e-4 (fp32), on a model whose logprobs move when any one KV block
is wrong (tests/model/test_tiny_sensitivity.py).

Paths (stored hits in a window of two layers, reads landing layer by layer, the hand-off layer by
layer): empty store; a second turn loaded on the PE path (`basic`), on the DE path only
(scheduler `read_path=de`), split across both (`dualpath-split`, idle queues); the same over the
tcp data plane instead of the shm shortcut; a stored block corrupted on disk on the DE side
(a miss, recomputed); and the check's teeth: with `fault_flip_de_bytes` the DE traffic
manager corrupts bytes after the checksum passed, and the comparison must see it.
(Chunked prefill: test_mesh_chunked.py; resume after a killed decode engine:
test_mesh_logprobs.py; SmolLM2: test_mesh_smollm2.py.)
"""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.integration.exactness import TOLERANCE, ask, ask_stream, assert_exact, block_file, logprob_diff, \
    wait_stored
from tests.integration.meshutil import tiny_mesh
from tests.integration.test_mesh_dualpath import Probe

pytestmark = pytest.mark.integration
READ = "dualpath_storage_gateway_read_bytes_total"
PULLED = 'dualpath_traffic_manager_bytes_total{kind="de_path_pull"}'


def _mesh(tmp_path_factory, name: str, scheduler: dict | None = None, tm: dict | None = None, **kw):
    tmp = tmp_path_factory.mktemp(name)
    # every second turn reads its hits from the store (not from the last turn's blocks its DE kept:
    # test_mesh_pending_saves.py); the stored hits of a second turn live two of the model's four layers at a time (a hit window),
    # and reads land one layer at a time (the TM's default groups: 8, at most one layer each)
    extra = {"scheduler": {"liveness-timeout-s": "2", "serve-pending-saves": "false", **(scheduler or {})},
             "prefill_engine": {"hit-window-layers": "2"}}
    if tm:
        extra["traffic_manager"] = tm
    m = tiny_mesh(tmp, kv_blocks=128, extra=extra, **kw)
    m.store_root = Path(m.spec.store)
    m.start(timeout=120)
    return m


def _turn1(mesh, reference, tag: str, n: int = 70) -> list[int]:
    """A first turn (empty store for this prefix, checked exact); returns the second turn's prompt ids
    once every block the first turn filled is in the store."""
    p1 = f"[{tag} {uuid.uuid4().hex[:8]}] agent log: " + "read file ok; ran tests, 2 passed; " * 14
    r1 = ask(mesh.url, p1, n)
    assert r1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert_exact(r1, reference, what=f"{tag}: empty store")
    ids = r1["choices"][0]["prompt_token_ids"] + r1["choices"][0]["token_ids"]
    wait_stored(mesh.store_root, reference, ids, (len(ids) - 1) // 64)
    return ids + reference.tokenizer.encode(" tool: done, 3 files changed. " * 4)


@pytest.fixture(scope="module")
def shm_mesh(tmp_path_factory):
    m = _mesh(tmp_path_factory, "auto")
    yield m
    m.stop()


@pytest.fixture(scope="module")
def tcp_de_mesh(tmp_path_factory):
    """Hits of dualpath-mode requests all on the DE path; KV between engines over real TCP."""
    m = _mesh(tmp_path_factory, "tcp-de", scheduler={"read-path": "de"}, transport="tcp")
    yield m
    m.stop()


@pytest.mark.parametrize("mode", ["basic", "dualpath-split"])
def test_second_turn_is_exact_on_the_pe_path_and_split(shm_mesh, reference, mode):
    prompt = _turn1(shm_mesh, reference, mode)
    probe = Probe(shm_mesh.url)
    before = probe.snap()
    body = ask(shm_mesh.url, prompt, 24, dualpath_mode=mode)
    after = probe.snap()
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= 8 * 64
    assert_exact(body, reference, prompt, what=f"shm {mode}")
    pe = probe.delta(before, after, ("gateway", "p0"), READ)
    de = probe.delta(before, after, ("gateway", "d1"), READ)
    if mode == "basic":
        assert pe > 0 and de == 0
    else:
        assert pe > 0 and de > 0 and probe.delta(before, after, ("tm", "p0-e0"), PULLED) == de


def test_streamed_logprobs_equal_the_reference(shm_mesh, reference):
    prompt = _turn1(shm_mesh, reference, "stream")
    body = ask_stream(shm_mesh.url, prompt, 24)
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= 8 * 64
    assert_exact(body, reference, prompt, what="shm dualpath, streamed")


@pytest.mark.parametrize("mode", ["dualpath", "basic"])
def test_de_path_only_and_pe_path_over_tcp(tcp_de_mesh, reference, mode):
    prompt = _turn1(tcp_de_mesh, reference, f"tcp-{mode}")
    probe = Probe(tcp_de_mesh.url)
    before = probe.snap()
    body = ask(tcp_de_mesh.url, prompt, 24, dualpath_mode=mode)
    after = probe.snap()
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= 8 * 64
    assert_exact(body, reference, prompt, what=f"tcp {'DE path only' if mode == 'dualpath' else 'basic'}")
    pe = probe.delta(before, after, ("gateway", "p0"), READ)
    de = probe.delta(before, after, ("gateway", "d1"), READ)
    if mode == "dualpath":  # every hit block through the decode node's storage NIC
        assert pe == 0 and de > 0 and probe.delta(before, after, ("tm", "p0-e0"), PULLED) == de
    else:
        assert pe > 0 and de == 0
    pushed = probe.delta(before, after, ("tm", "p0-e0"), "dualpath_traffic_manager_bytes_total")
    assert pushed > 0


def test_a_corrupt_block_read_on_the_de_side_is_a_miss_and_stays_exact(tcp_de_mesh, reference):
    prompt = _turn1(tcp_de_mesh, reference, "corrupt-de")
    victim = block_file(tcp_de_mesh.store_root, reference, prompt, 3)
    data = bytearray(victim.read_bytes())
    data[-100] ^= 0xFF
    victim.write_bytes(bytes(data))
    body = ask(tcp_de_mesh.url, prompt, 24, dualpath_mode="dualpath")
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 3 * 64  # the chain stops at the bad block
    assert_exact(body, reference, prompt, what="tcp DE path, corrupt 4th block")
    # removed, or already replaced by the block the resumed prefill recomputed and persisted
    assert not victim.exists() or victim.read_bytes() != bytes(data), "the corrupt block was not removed"


@pytest.fixture(scope="module")
def faulty_mesh(tmp_path_factory):
    m = _mesh(tmp_path_factory, "fault", scheduler={"read-path": "de"}, tm={"fault-flip-de-bytes": "true"},
              env={"DUALPATH_ALLOW_FAULTS": "1"})
    yield m
    m.stop()


def test_bytes_flipped_after_the_checksum_are_detected(faulty_mesh, reference):
    """The check has teeth: one layer of one block wrong on the DE side fails the comparison."""
    prompt = _turn1(faulty_mesh, reference, "fault")
    body = ask(faulty_mesh.url, prompt, 16, dualpath_mode="dualpath")
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] >= 8 * 64  # served as hits, wrongly
    got, want, diff = logprob_diff(body, reference, prompt)
    print(f"EXACTNESS fault injected: max |logprob diff| {diff:.3g}, tokens equal: {got == want}")
    assert diff > TOLERANCE
    with pytest.raises(AssertionError, match="differ|logprob"):
        assert_exact(body, reference, prompt, what="fault injected")
    # the same mesh's basic mode (PE path) is untouched by the DE-side fault (a fresh prompt: the
    # wrong KV above also made the prompt's computed blocks wrong, and those were persisted)
    clean = _turn1(faulty_mesh, reference, "fault-basic")
    probe = Probe(faulty_mesh.url)
    before = probe.snap()
    got = ask(faulty_mesh.url, clean, 16, dualpath_mode="basic")
    after = probe.snap()
    pe = probe.delta(before, after, ("gateway", "p0"), READ)
    de = probe.delta(before, after, ("gateway", "d1"), READ)
    print(f"EXACTNESS fault mesh, basic: bytes read by the PE gateway {pe}, by the DE gateway {de}")
    assert pe > 0 and de == 0, "basic mode read on the DE side"  # the faulty side must not be on this path
    assert_exact(got, reference, clean, what="fault mesh, basic")

