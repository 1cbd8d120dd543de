"""The prefill engine's direct copy of blocks prefetched into a traffic-manager's buffer on its host: no message on the way.

When a session's stored prefix was staged during its tool call in the buffer of this engine's
own traffic-manager, or of another on its host that shares its memory (the request's decode
engine's, say: the buffer is POSIX shared memory), the assignment carries where
(`StagedSlots`: the buffer's and the stamp table's names, the entry's record and stamp, its
slots). The engine maps both once, copies each block's bytes (every layer of a block is one
contiguous span, in the buffer as in KV memory; consecutive slots to consecutive blocks go in
one copy), then checks the stamp (shared/kv/staged_table.py): still there, the bytes are the
staged blocks'; gone (the entry was dropped: TTL, release, buffer pressure, adoption, a restart),
the copy is discarded and the caller fetches the usual way. Owns the mappings (one per buffer
and table, the last MAPPED of each kept; one whose segment is gone is closed), not the entry:
the traffic-manager frees it when told it was used (`Release(used=n)`, sent by the caller) or
adopts it (the request's DE's, at the push's reservation).
"""
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
        """Copy the leading `len(dst_blocks)` staged blocks into those KV blocks; False: not usable
        (the entry is gone, or its buffer cannot be mapped): what was copied is to be overwritten."""
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
        """Map the buffer and the table the grant names, unless mapped already; a mapping whose segment
        is gone (its traffic-manager restarted with new names, or left) is closed then, and the
        oldest beyond MAPPED."""
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
