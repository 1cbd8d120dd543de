"""The prefill engine's direct copy of blocks prefetched into its own traffic-manager's buffer: no message on the way.

When a session's stored prefix was staged during its tool call in the buffer of this engine's
own traffic-manager (same host: the buffer is POSIX shared memory), the assignment carries where
(`StagedSlots`: the buffer's and the stamp table's names, the entry's record and stamp, its
slots). The engine maps both once, copies each block's bytes (every layer of a block is one
contiguous span, in the buffer as in KV memory; consecutive slots to consecutive blocks go in
one copy), then checks the stamp (shared/kv/staged_table.py): still there, the bytes are the
staged blocks'; gone (the entry was dropped: TTL, release, buffer pressure, adoption, a restart),
the copy is discarded and the caller fetches the usual way. Owns the mappings, not the entry:
the traffic-manager frees it when told it was used (`Release(used=n)`, sent by the caller).
"""
from __future__ import annotations

import logging

import numpy as np

from shared.engine.kv_memory import KVMemory
from shared.kv.staged_table import StagedTable
from shared.messages.work import StagedSlots
from shared.transport.shm_region import ShmRegion

log = logging.getLogger("prefill_engine.staged_copy")


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
        self.buffer: ShmRegion | None = None  # the TM buffer mapped last
        self.table: StagedTable | None = None

    @property
    def block_nbytes(self) -> int:
        return self.kv.layout().block_nbytes

    def copy(self, grant: StagedSlots, dst_blocks: list[int]) -> bool:
        """Copy the leading `len(dst_blocks)` staged blocks into those KV blocks; False: not usable
        (the entry is gone, or its buffer cannot be mapped): what was copied is to be overwritten."""
        n = len(dst_blocks)
        if n > len(grant.slots) or not self._map(grant):
            return False
        if not self.table.valid(grant.record, grant.stamp):
            return False
        bn = self.block_nbytes
        src, dst = np.frombuffer(self.buffer.buf, dtype=np.uint8), np.frombuffer(self.kv.region.buf, dtype=np.uint8)
        for s, d, nbytes in runs(grant.slots[:n], [b * bn for b in dst_blocks], bn):
            if s + nbytes > len(src) or d + nbytes > len(dst):
                return False
            dst[d:d + nbytes] = src[s:s + nbytes]
        del src, dst  # no view outlives the copy (a mapping closes only once its views are gone)
        return self.table.valid(grant.record, grant.stamp)  # after the copy: nothing freed the slots meanwhile

    def _map(self, grant: StagedSlots) -> bool:
        """Map the buffer and the table the grant names (again when the traffic-manager restarted)."""
        try:
            if self.table is None or self.table.name != grant.table:
                old, self.table = self.table, StagedTable.attach(grant.table)
                if old is not None:
                    old.close()
            if self.buffer is None or self.buffer.name != grant.buffer:
                old_buf, self.buffer = self.buffer, ShmRegion.attach(grant.buffer)
                if old_buf is not None:
                    old_buf.close()
        except (FileNotFoundError, PermissionError, ValueError) as exc:
            log.info("prefetch buffer %s not mapped (%s): fetching the usual way", grant.buffer, exc)
            return False
        return True

    def close(self) -> None:
        if self.table is not None:
            self.table.close()
        if self.buffer is not None:
            self.buffer.close()
        self.table = self.buffer = None
