"""A prefetch held by a third traffic-manager (2P1D, tiny model): the session's stored prefix is
staged in one prefill node's buffer during the tool call, that node's prefill engine dies, and
the next turn runs on the other prefill engine, whose traffic-manager claims the staged blocks
from the holder (`Claim` -> the slots and a grant of exactly them) and reads them one-sidedly
layer by layer: nothing is read from storage at arrival, the holder gets its slots back, and
the tokens and logprobs are those of the same prompt read from storage (and within 1e-4 of the
single-process reference)."""
from __future__ import annotations

import signal
import uuid
from pathlib import Path

import httpx
import pytest

from tests.integration.exactness import ask, assert_exact
from tests.integration.meshutil import tiny_mesh, wait_until
from tests.integration.test_mesh_agent_hints import BS, READ, STAGED, USED, _block_bytes, _first_turn, _of, _total
from tests.integration.test_mesh_dualpath import Probe

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["tcp", "auto"])
def mesh(tmp_path_factory, request):
    # the prefill side stages (read_path=pe); staged blocks wait a minute past the expected return
    extra = {"scheduler": {"liveness-timeout-s": "2", "prefetch-grace-s": "60", "read-path": "pe"}}
    # tcp: the surviving prefill node's traffic-manager claims the holder's blocks (what hosts apart
    # do). auto (shared memory on one host): the prefill engine may copy them out of the holder's
    # buffer itself and tell the holder they were used; either way the bytes must be exact.
    m = tiny_mesh(tmp_path_factory.mktemp(f"remote-claim-{request.param}"), kv_blocks=128, prefill=2, extra=extra,
                  transport=request.param)
    m.transport = request.param
    m.store_root = Path(m.spec.store)
    m.start(timeout=180)
    yield m
    m.stop()


def _prefill_engines(mesh) -> int:
    return httpx.get(mesh.url + "/health", timeout=10).json().get("prefill_engines", 0)


def test_a_prefetch_in_another_prefill_nodes_buffer_is_claimed_from_there(mesh, reference):
    sid = f"s-{uuid.uuid4().hex[:6]}"
    probe = Probe(mesh.url)
    tms = [who for who in probe.urls if who[0] == "tm" and who[1].startswith("p")]
    assert len(tms) == 2, tms
    p2 = _first_turn(mesh, reference, "remote", {"session_id": sid, "expected_tool_duration_ms": 400})
    hit_blocks, bb = (len(p2) - 1) // BS, _block_bytes(mesh)
    wait_until(lambda: _total(probe, STAGED) >= hit_blocks * bb, "the prefix staged in a buffer")
    holder = next(who for who in tms if _of(probe, who, STAGED) > 0)
    other = next(who for who in tms if who != holder)
    # the holder's prefill engine goes; its traffic-manager (and the staged blocks) stay
    mesh.kill(next(p for p in mesh.procs if p.name == f"prefill-{holder[1]}"), signal.SIGKILL)
    wait_until(lambda: _prefill_engines(mesh) == 1, "the scheduler to drop the dead prefill engine")
    used0 = _of(probe, other, USED), _of(probe, holder, USED)
    before = probe.snap()
    hinted = ask(mesh.url, p2, 24, agent_hints={"session_id": sid})
    after = probe.snap()
    assert hinted["usage"]["prompt_tokens_details"]["cached_tokens"] == hit_blocks * BS
    arrival = sum(Probe.delta(before, after, who, READ) for who in before if who[0] == "gateway")
    assert arrival == 0, f"{arrival} bytes read from storage at arrival although every hit was staged"
    by_claim, by_copy = _of(probe, other, USED) - used0[0], _of(probe, holder, USED) - used0[1]
    if mesh.transport == "tcp":
        assert (by_claim, by_copy) == (hit_blocks * bb, 0), "the turn did not claim its blocks from the holder"
    else:
        assert by_claim + by_copy == hit_blocks * bb, "the turn did not take its blocks from the holder"
    wait_until(lambda: _of(probe, holder, STAGED) == 0, "the holder's claimed slots given back")
    assert_exact(hinted, reference, p2, what="turn 2 claimed from another traffic-manager")
    plain = ask(mesh.url, p2, 24)  # the same prompt, no hints: read from storage at arrival
    assert plain["choices"][0]["token_ids"] == hinted["choices"][0]["token_ids"]
    assert plain["choices"][0]["logprobs"]["token_logprobs"] == hinted["choices"][0]["logprobs"]["token_logprobs"]
