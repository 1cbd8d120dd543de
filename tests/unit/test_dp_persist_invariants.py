"""What one prompt's turn stores (dp_mesh.py, dp_engines.py), per key over every block a gateway
wrote for either side: the prompt's full blocks the store lacks once, whoever ends the request (the
decode engine on admission, from the DE-buffer slots they arrived in; the prefill engine when no
decode engine takes it: one token, refused, a failed push), the stored ones never; each block the
decode engine generates keyed from the one before (`prompt_keys`' chain, across the prompt's
partial block) and saved the step it fills."""
from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from shared.engine.store_layout import prompt_keys
from shared.messages.endpoints import EP
from shared.messages.traffic_manager import SaveKV
from tests.unit.dp_engines import KEYS, PROMPT, Decode, Prefill, work
from tests.unit.dp_mesh import BS, DE, DE_NODE, LAYOUT, PE_NODE, SUBJECTS, Mesh, Tasks

pytestmark = pytest.mark.unit
GUARD_S = 60.0  # a hang fails the test instead of the run (no test here waits for it)
FIRST = 7  # the prefill engine's token
DE_SAVE = SUBJECTS.at(EP.TM_SAVE, engine=DE)


def _turn(hits: int, pe_blocks: int, how: str = "handed-off", steps: tuple[int, ...] = (),
          found: int | None = None):
    """One turn of PROMPT (`hits` stored, `found` of them still there when read), ending `how`, then
    `steps` decode steps: (the mesh, the decode engine's sequence or None, after each step the
    position and the decode engine's saves of generated blocks so far)."""
    async def go():
        tasks = Tasks()
        mesh = Mesh(tasks)
        pe, de = Prefill(mesh, tasks), Decode(mesh, tasks)
        try:
            return await asyncio.wait_for(_play(mesh, tasks, pe, de), GUARD_S)
        finally:
            de.close()
            mesh.close()

    async def _play(mesh: Mesh, tasks: Tasks, pe: Prefill, de: Decode):
        if found is not None:
            mesh.storage.found = {"pe": found, "de": found}  # the rest went from the store since the lookup
        if how == "refused":
            de.svc.cancelled.add("r#0")  # a cancel overtook the admission
        elif how == "claim-refused":
            mesh.refuse_saves.add(DE_SAVE)  # the DE TM's slots went before the decode engine claimed them
        elif how == "push-failed":
            mesh.refuse_writes = "connection to de0 lost"
        req = await pe.load(work(hits, pe_blocks, max_tokens=1 if how == "one-token" else 64))
        await pe.prefill(req, layerwise=True, first=FIRST)
        if "r#0" not in de.svc.held:
            return mesh, None, []
        seq, after = de.join("r#0"), []
        for token in steps:
            await de.step(seq, token)
            after.append((seq.pos, _generated(mesh)))
        return mesh, seq, after
    return asyncio.run(go())


def _saved(mesh: Mesh, node: str | None = None) -> Counter:
    """How often each key was written to the store (by `node`'s gateway: None, any)."""
    return Counter(key for n, key in mesh.storage.written if node in (None, n))


def _generated(mesh: Mesh) -> list[SaveKV]:
    """The decode engine's saves of blocks out of its KV memory (its prompt's come from buffer slots)."""
    return [m for s, m in mesh.asked if s == DE_SAVE and isinstance(m, SaveKV) and m.blocks]


@pytest.mark.parametrize(("hits", "pe_blocks"), [(3, 3), (3, 0), (0, 0)], ids=["pe-path", "de-path", "no-hits"])
@pytest.mark.parametrize("how", ["handed-off", "one-token", "refused", "claim-refused", "push-failed"])
def test_a_prompts_missing_blocks_are_saved_once_by_whichever_side_ends_it(hits, pe_blocks, how):
    mesh, seq, _ = _turn(hits, pe_blocks, how)
    assert _saved(mesh) == Counter(KEYS[hits:]), "a missing block saved twice or never, or a stored one again"
    by = DE_NODE if how == "handed-off" else PE_NODE
    assert _saved(mesh, by) == Counter(KEYS[hits:]) and (seq is not None) == (how == "handed-off")
    if how == "handed-off" and hits < len(KEYS):  # straight from the DE-buffer slots the push filled
        claim = [m for s, m in mesh.asked if s == DE_SAVE]
        assert len(claim) == 1 and claim[0].slots == mesh.reserved["r#0"][hits:len(KEYS)] and not claim[0].blocks


def test_a_prompt_the_read_found_only_partly_stored_saves_the_rest_when_no_decode_engine_takes_it():
    mesh, _, _ = _turn(3, 3, "one-token", found=1)
    assert _saved(mesh) == Counter(KEYS[1:])


def test_a_prompt_the_read_found_only_partly_stored_saves_the_rest_when_handed_off():
    mesh, _, _ = _turn(3, 3, "handed-off", found=1)
    assert _saved(mesh) == Counter(KEYS[1:])


def test_decode_keys_each_generated_block_from_the_one_before_and_saves_it_the_step_it_fills():
    steps = tuple(range(500, 500 + 2 * BS + 3))  # the prompt's partial block fills, then one more, and some
    mesh, seq, after = _turn(3, 3, "handed-off", steps)
    context = PROMPT + [FIRST, *steps]
    n_prompt = len(PROMPT) // BS
    for pos, saves in after:  # after each step: one save per block filled so far, none ahead of it
        want = prompt_keys(LAYOUT, context[:pos])[n_prompt:]
        assert [m.block_keys for m in saves] == [[k] for k in want], f"at position {pos}"
    full = prompt_keys(LAYOUT, context[:seq.pos])
    assert [m.blocks for m in _generated(mesh)] == [[seq.req.blocks[b]] for b in range(n_prompt, len(full))]
    assert seq.keys == full  # what the next block chains on
    assert _saved(mesh) == Counter(KEYS[3:] + full[n_prompt:])  # and the prompt's missing block, once
