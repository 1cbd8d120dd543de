"""The prefill-to-decode push, block by block and layer by layer (dp_mesh.py, dp_engines.py):
- only the KV the decode side lacks is pushed to it: on the PE read path every block of the
  prompt, on the DE read path every block but the hits staged in its buffer, split reads in
  between; each (block, layer) once, into that block's own DE-buffer slot, layerwise or whole;
- no layer leaves before the engine reported it computed (`LayersComputed`)."""
from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from services.traffic_manager.progress import LayerState
from shared.messages.endpoints import EP
from shared.messages.traffic_manager import LayersComputed, PushDone, PushKV, ReadFinished
from shared.messages.work import DecodeAdmit
from tests.unit.dp_engines import Prefill, work
from tests.unit.dp_mesh import BS, DE, LAYERS, PE, SUBJECTS, Mesh, Tasks
from tests.unit.tm_util import Reply

pytestmark = pytest.mark.unit
GUARD_S = 60.0  # a hang fails the test instead of the run (no test here waits for it)
HITS = 3  # of PROMPT's five blocks (four full), three are stored


def _run(test) -> tuple[Mesh, object]:
    """(the mesh, what `test(mesh, tasks)` returned)."""
    async def go():
        tasks = Tasks()
        mesh = Mesh(tasks)
        try:
            return mesh, await asyncio.wait_for(test(mesh, tasks), GUARD_S)
        finally:
            mesh.close()
    return asyncio.run(go())


def _pushed(mesh: Mesh, req_id: str) -> Counter:
    """(prompt block index, layer) of every layer written to the decode side, by its DE-buffer slot."""
    slots = mesh.reserved[req_id]
    return Counter((slots.index(m.buf_block), m.layer) for m in mesh.moved if m.kind == "write")


@pytest.mark.parametrize("layerwise", [True, False], ids=["layerwise", "whole"])
@pytest.mark.parametrize(("pe_blocks", "de_holds"), [(HITS, set()), (0, {0, 1, 2}), (1, {1, 2})],
                         ids=["pe-path", "de-path", "split"])
def test_only_the_blocks_the_decode_side_lacks_are_pushed_each_layer_once(pe_blocks, de_holds, layerwise):
    async def test(mesh: Mesh, tasks: Tasks):
        pe = Prefill(mesh, tasks)
        req = await pe.load(work(HITS, pe_blocks))
        assert req.hit_tokens == HITS * BS and not pe.failed
        assert set(req.de_hits) == de_holds  # what the read told the engine sits on the decode side
        await pe.prefill(req, layerwise)
        return req
    mesh, req = _run(test)
    n = len(req.blocks)
    done = [m for _, m in mesh.heard if isinstance(m, ReadFinished)]
    assert done and done[0].de_hits == sorted(de_holds)
    lacks = [i for i in range(n) if i not in de_holds]
    assert _pushed(mesh, "r#0") == Counter((i, layer) for i in lacks for layer in range(LAYERS)), \
        "pushed blocks the decode side holds, or left out some it lacks"
    writes = [m for m in mesh.moved if m.kind == "write"]
    assert all(m.peer == DE and m.kv_block == req.blocks[mesh.reserved["r#0"].index(m.buf_block)] for m in writes)
    admits = [m for _, m in mesh.asked if isinstance(m, DecodeAdmit)]
    assert len(admits) == 1 and admits[0].buf_slots == mesh.reserved["r#0"]  # the DE loads each block from its slot


def test_no_layer_is_pushed_before_the_engine_reported_it_computed():
    marks: dict[int, int] = {}  # layer -> moves made when the engine reported it computed

    async def test(mesh: Mesh, tasks: Tasks):
        msg = PushKV("r#0", [5, 2, 9], DE, 3 * BS, layerwise=True)
        state = mesh.tm.layers.hold("r#0")
        reply = Reply()
        reply.ctx = None
        push = asyncio.ensure_future(mesh.push_path.push(msg, reply, state))
        for layer in range(LAYERS):
            for _ in range(50):  # the push's chance to send layer `layer` before it is computed
                await asyncio.sleep(0)
            marks[layer] = len(mesh.moved)
            await mesh.publish(SUBJECTS.at(EP.TM_COMPUTED, engine=PE), LayersComputed(["r#0"], layer))
        await push
        assert isinstance(reply.msg, PushDone) and reply.msg.ok, reply.msg
        assert state.pushed == LAYERS
    mesh, _ = _run(test)
    early = [(j, m) for j, m in enumerate(mesh.moved) if j < marks[m.layer]]
    assert not early, f"layers sent before they were computed: {early}"
    assert _pushed(mesh, "r#0") == Counter((i, layer) for i in range(3) for layer in range(LAYERS))


def test_a_layer_reported_computed_marks_every_layer_up_to_it_and_never_goes_back():
    state = LayerState()
    state.mark_computed(1)
    assert state.computed == 2  # layers 0 and 1
    state.mark_computed(0)  # a late, older report
    assert state.computed == 2
