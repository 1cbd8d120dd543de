"""The prefill engine's direct copy of blocks prefetched into a TM buffer on its host.

The copy is kept only if the entry's stamp is still there afterwards. Owns the mappings, never
the entry: the traffic manager frees or adopts it."""
from __future__ import annotations

import logging
import os

import numpy as np

from shared.engine.kv_memory import KVMemory
from shared.kv.staged_table import StagedTable
from shared.messages.work import StagedSlots
from shared.transport.shm_region import SHM_DIR, ShmRegion

log = logging.getLogger("prefill_engine.staged_copy")
MAPPED = 4  # buffers (and stamp tables) kept mapped: this engine's own TM's, its DEs' on the host


def runs(src: list[int], dst: list[int], nbytes: int) -> list[tuple[int, int, int]]:
    """(source offset, destination offset, bytes) spans: consecutive pairs merged."""
    out: list[list[int]] = []
    for s, d in zip(src, dst):
        if out and out[-1][0] + out[-1][2] == s and out[-1][1] + out[-1][2] == d:
            out[-1][2] += nbytes
        else:
            out.append([s, d, nbytes])
    return [(s, d, n) for s, d, n in out]


class StagedCopier:
    def __init__(self, kv: KVMemory):
        self.kv = kv
        self.buffers: dict[str, ShmRegion] = {}  # name -> a TM buffer mapped (oldest first)
        self.tables: dict[str, StagedTable] = {}

    @property
    def block_nbytes(self) -> int:
        return self.kv.layout().block_nbytes

    def copy(self, grant: StagedSlots, dst_blocks: list[int]) -> bool:
        """Copy the leading staged blocks into `dst_blocks`; False: not usable (overwrite the copy)."""
        n = len(dst_blocks)
        if n > len(grant.slots) or not self._map(grant):
            return False
        table, buffer = self.tables[grant.table], self.buffers[grant.buffer]
        if not table.valid(grant.record, grant.stamp):
            return False
        bn = self.block_nbytes
        src, dst = np.frombuffer(buffer.buf, dtype=np.uint8), np.frombuffer(self.kv.region.buf, dtype=np.uint8)
        for s, d, nbytes in runs(grant.slots[:n], [b * bn for b in dst_blocks], bn):
            if s + nbytes > len(src) or d + nbytes > len(dst):
                return False
            dst[d:d + nbytes] = src[s:s + nbytes]
        del src, dst  # no view outlives the copy (a mapping closes only once its views are gone)
        return table.valid(grant.record, grant.stamp)  # after the copy: nothing freed the slots meanwhile

    def _map(self, grant: StagedSlots) -> bool:
        """Map the buffer and table the grant names; close mappings whose segment is gone, and the oldest."""
        try:
            for name, maps, attach in ((grant.table, self.tables, StagedTable.attach),
                                       (grant.buffer, self.buffers, ShmRegion.attach)):
                if name not in maps:
                    for gone in [n for n in maps if not os.path.exists(os.path.join(SHM_DIR, n))]:
                        maps.pop(gone).close()  # its traffic-manager restarted (new names) or left
                    maps[name] = attach(name)
                    while len(maps) > MAPPED:
                        maps.pop(next(iter(maps))).close()
        except (FileNotFoundError, PermissionError, ValueError) as exc:
            log.info("prefetch buffer %s not mapped (%s): fetching the usual way", grant.buffer, exc)
            return False
        return True

    def close(self) -> None:
        for maps in (self.tables, self.buffers):
            for m in maps.values():
                m.close()
            maps.clear()
