"""A turn's saved blocks still waiting to be written are the next turn's hits (tiny model, 1P1D).

The storage NICs write so slowly (capped at 0.5 Mbit/s: seconds a block) that turn 2 arrives
while turn 1's blocks wait in the decode traffic-manager's buffer to be written. The scheduler
had that buffer keep them (`HoldSaves` at the end of turn 1), so turn 2 counts them as hits and
takes them from there: nothing is read from storage at arrival, and its tokens and logprobs are
those of the single-process reference (within 1e-4) and of the same prompt once it is stored.
The check has teeth: with `fault_flip_pending_bytes` one layer of the first kept block is wrong
when it is offered, and turn 2's logprobs differ from the reference.
"""
from __future__ import annotations

import random
import uuid
from pathlib import Path

import pytest

from shared.engine.store_layout import prompt_keys, store_layout
from tests.integration.exactness import TOLERANCE, ask, assert_exact, logprob_diff, wait_stored
from tests.integration.meshutil import tiny_mesh, wait_until
from tests.integration.test_mesh_agent_hints import BS, READ, _total
from tests.integration.test_mesh_dualpath import Probe

pytestmark = pytest.mark.integration
OFFERED = 'dualpath_traffic_manager_pending_saves_blocks_total{outcome="offered"}'


def _mesh(tmp_path_factory, name: str, tm: dict | None = None, **kw):
    extra = {"scheduler": {"liveness-timeout-s": "2", "pending-ttl-s": "120", "serve-pending-saves": "true"},
             "storage_gateway": {"snic-write-gbps": "0.0005"}}
    if tm:
        extra["traffic_manager"] = tm
    m = tiny_mesh(tmp_path_factory.mktemp(name), kv_blocks=128, extra=extra, **kw)
    m.store_root = Path(m.spec.store)
    m.start(timeout=180)
    return m


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    m = _mesh(tmp_path_factory, "pending", tm={"pending-hold-s": "120"})
    yield m
    m.stop()


@pytest.fixture(scope="module")
def faulty_mesh(tmp_path_factory):
    m = _mesh(tmp_path_factory, "pending-fault", tm={"pending-hold-s": "120", "fault-flip-pending-bytes": "true"},
              env={"DUALPATH_ALLOW_FAULTS": "1"})
    yield m
    m.stop()


def _turns(mesh, reference, tag: str, mode: str) -> tuple[list[int], dict, dict, dict]:
    """Turn 1 (checked exact), then turn 2 as soon as the scheduler indexed turn 1's kept blocks;
    returns turn 2's prompt, its answer and the probe's counters before and after it."""
    words = random.Random(tag).choices(["read", "file", "ok;", "ran", "tests,", "2", "passed;", "diff"], k=90)
    p1 = reference.tokenizer.encode(f"[{tag} {uuid.uuid4().hex[:8]}] agent log: " + " ".join(words))
    n1 = 40 + (10 - len(p1) - 40) % BS  # (prompt + generated) ends 10 tokens into a block
    probe = Probe(mesh.url)
    offered0 = _total(probe, OFFERED)
    r1 = ask(mesh.url, p1, n1, dualpath_mode=mode)
    assert_exact(r1, reference, p1, what=f"{tag}: turn 1")
    ids = p1 + r1["choices"][0]["token_ids"]
    hit_blocks = (len(ids) - 1) // BS
    wait_until(lambda: _total(probe, OFFERED) - offered0 >= hit_blocks, "turn 1's blocks kept for turn 2")
    p2 = ids + reference.tokenizer.encode(" tool: ok, 3 files changed.")[:30]
    last = prompt_keys(store_layout(reference.model_id, reference.config, BS), ids)[hit_blocks - 1]
    assert not any(mesh.store_root.rglob(last.hex() + ".kvb")), "turn 1 written before turn 2: nothing pending"
    before = probe.snap()
    r2 = ask(mesh.url, p2, 24, dualpath_mode=mode)
    after = probe.snap()
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == hit_blocks * BS
    arrival = sum(Probe.delta(before, after, who, READ) for who in before if who[0] == "gateway")
    assert arrival == 0, f"{arrival} bytes read from storage at arrival although every hit was in the buffer"
    return p2, r2, before, after


@pytest.mark.parametrize("mode", ["dualpath", "basic"])
def test_a_turn_arriving_before_the_last_turn_is_written_is_served_from_the_buffer(mesh, reference, mode):
    p2, r2, _, _ = _turns(mesh, reference, f"pending-{mode}", mode)
    assert_exact(r2, reference, p2, what=f"{mode}: turn 2 served from the decode buffer")
    wait_stored(mesh.store_root, reference, p2, (len(p2) - 1) // BS, timeout=300)
    plain = ask(mesh.url, p2, 24, dualpath_mode=mode)  # the same prompt once stored
    assert plain["choices"][0]["token_ids"] == r2["choices"][0]["token_ids"]
    assert plain["choices"][0]["logprobs"]["token_logprobs"] == r2["choices"][0]["logprobs"]["token_logprobs"]


def test_wrong_bytes_in_the_kept_blocks_are_detected(faulty_mesh, reference):
    p2, r2, _, _ = _turns(faulty_mesh, reference, "pending-fault", "dualpath")
    got, want, diff = logprob_diff(r2, reference, p2)
    print(f"EXACTNESS fault injected in a kept block: max |logprob diff| {diff:.3g}, tokens equal: {got == want}")
    assert diff > TOLERANCE
