"""Which links a byte of KV crosses, stage by stage, on each read path.

One table for the simulator and the P/D-window analysis, so they cannot disagree. A stage is
(side "pe"/"de", link, bytes kind "hit"/"miss"/"persist").
"""
from __future__ import annotations

from shared.sched.policy import ReadPath

Hop = tuple[str, str, str]  # (side, link, bytes kind)

# storage -> node DRAM buffer, on the node chosen by the read path
READ = {
    ReadPath.PE: (("pe", "snic_r", "hit"), ("pe", "dram", "hit")),
    ReadPath.DE: (("de", "snic_r", "hit"), ("de", "dram", "hit")),
}
# layerwise load of the hit KV into the PE's HBM during the forward
LOAD = {
    ReadPath.PE: (("pe", "dram", "hit"), ("pe", "cnic_r", "hit"), ("pe", "cnic_w", "hit")),
    ReadPath.DE: (("de", "dram", "hit"), ("de", "cnic_r", "hit"), ("pe", "cnic_w", "hit")),
}
# PE -> DE buffer after each layer: hit + miss on the PE path, only miss on the DE path
PD = {
    ReadPath.PE: (("pe", "cnic_r", "hit"), ("de", "cnic_w", "hit"), ("de", "dram", "hit"),
                  ("pe", "cnic_r", "miss"), ("de", "cnic_w", "miss"), ("de", "dram", "miss")),
    ReadPath.DE: (("pe", "cnic_r", "miss"), ("de", "cnic_w", "miss"), ("de", "dram", "miss")),
}
# DE buffer -> DE HBM once the whole prompt KV is there (both paths)
H2D = (("de", "dram", "hit"), ("de", "cnic_r", "hit"), ("de", "cnic_w", "hit"),
       ("de", "dram", "miss"), ("de", "cnic_r", "miss"), ("de", "cnic_w", "miss"))
# decode persists full blocks: HBM -> DRAM (CNIC) -> storage (SNIC write)
PERSIST = (("de", "cnic_r", "persist"), ("de", "dram", "persist"), ("de", "dram", "persist"),
           ("de", "snic_w", "persist"))

STAGES = {"read": READ, "load": LOAD, "pd": PD}


def hops(path: ReadPath) -> tuple[Hop, ...]:
    """Every hop of a request on `path`, excluding persistence."""
    return READ[path] + LOAD[path] + PD[path] + H2D


def link_bytes(path: ReadPath, hit: float, miss: float) -> dict[tuple[str, str], float]:
    """Bytes per (side, link) for one request (persistence excluded)."""
    amount = {"hit": hit, "miss": miss, "persist": 0.0}
    out: dict[tuple[str, str], float] = {}
    for side, link, kind in hops(path):
        out[(side, link)] = out.get((side, link), 0.0) + amount[kind]
    return out
