"""A fetch's `ReadFinished` says where its hits came from: `staged` leading blocks from a buffer
(a prefetch claimed here), `de_read` trailing ones on the DE path, the PE path's in between --
what the prefill engine's prompt-token tiers are made of. A short read on either path counts
only the blocks that were found (the rest is computed)."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from services.traffic_manager.fetch import FetchPath
from services.traffic_manager.parts import TMParts
from services.traffic_manager.progress import LayerState, ReadTrack, Registry
from services.traffic_manager.read_queues import ReadQueues
from services.traffic_manager.slot_grants import GrantsHeld
from shared.messages.registry import KVRegion
from shared.messages.storage_gateway import ReadBlocks, ReadDone, StoreLayout
from shared.messages.subjects import Subjects
from shared.messages.traffic_manager import FetchFailed, FetchKV, ReadFinished, Reserve, Reserved, Stage, Staged
from tests.unit.tm_util import buffer_pool

pytestmark = pytest.mark.unit
LAYERS, LB = 4, 1024
BN = LAYERS * LB
LAYOUT = StoreLayout(b"f" * 16, "m", LAYERS, 1, 8, "float32", 16)
KEYS = [bytes([i]) * 16 for i in range(5)]
PROMPT_BLOCKS = 6


class Mesh:
    """The PE node's gateway (finds `pe_found` of the blocks it is asked for), the DE's traffic-manager
    (reserves the prompt's slots, its gateway finds `de_found`), a copying endpoint and peer."""

    def __init__(self, pe_found: int, de_found: int):
        self.pe_found, self.de_found, self.heard = pe_found, de_found, []

    async def request(self, subject, msg, timeout, abort=None):
        if isinstance(msg, ReadBlocks):
            return ReadDone(blocks=min(self.pe_found, len(msg.block_keys)))
        if isinstance(msg, Reserve):
            return Reserved(slots=[(10 + i) * BN for i in range(msg.n_blocks)])
        assert isinstance(msg, Stage), msg
        return Staged(slots=msg.slots, blocks=min(self.de_found, len(msg.block_keys)))

    async def publish(self, subject, msg, ctx=None):
        self.heard.append(msg)

    async def copy_local(self, ops, cls, *, timeout=None):
        return None

    async def read(self, ops, cls, *, timeout=None, grant=None):
        return None


def _fetch(mesh: Mesh) -> ReadFinished:
    """One fetch of five hits: block 0 prefetched into this TM's buffer, 1-2 on the PE path, 3-4 on the
    DE path; returns its report."""
    region, pool, m = buffer_pool("t-ft", 16 * BN, KVRegion("kv", 16, 16, LAYERS, BN, LB))

    async def reach(engine):
        assert engine == "de-1"
        return mesh
    cfg = SimpleNamespace(transfer_timeout_s=2.0, engine="pe-1", read_layer_groups=8)
    parts = TMParts(cfg, mesh, Subjects("t"), m, pool, mesh, reach, ReadQueues(2.0),
                    m.counter("bytes_total", "b", ("kind",)), lambda coro, name=None: asyncio.ensure_future(coro),
                    None, GrantsHeld(), Registry(ReadTrack), Registry(LayerState),
                    claim_local=lambda owner, keys: [15 * BN][:len(keys)])
    msg = FetchKV("r#0", KEYS, [0, 1, 2, 3, 4], "n0", LAYOUT, pe_blocks=3, de_engine="de-1", de_node="n1",
                  prompt_blocks=PROMPT_BLOCKS, staged_engine="pe-1", staged_owner="pf-1", staged_blocks=1)
    try:
        asyncio.run(asyncio.wait_for(FetchPath(parts).fetch(msg, SimpleNamespace(ctx=None)), 10))
    finally:
        region.close()
        region.unlink()
    assert not [h for h in mesh.heard if isinstance(h, FetchFailed)], mesh.heard
    return next(h for h in mesh.heard if isinstance(h, ReadFinished))


@pytest.mark.parametrize("pe_found, de_found, blocks, de_read", [
    (2, 2, 5, 2),  # every read whole: 1 staged, 2 on the PE path, 2 on the DE path
    (2, 1, 4, 1),  # the DE path found one of its two
    (1, 2, 2, 0),  # the PE path stopped short: the DE path's blocks are not leading hits any more
    (0, 2, 1, 0),  # nothing read on the PE path: only the staged block is a hit
])
def test_the_report_splits_the_hits_between_buffer_pe_path_and_de_path(pe_found, de_found, blocks, de_read):
    done = _fetch(Mesh(pe_found, de_found))
    assert (done.blocks, done.staged, done.de_read) == (blocks, 1, de_read)
    assert done.blocks - done.staged - done.de_read == min(pe_found, 2)  # the PE path's share
