"""Which links a byte of KV crosses, stage by stage, on each read path.

One table shared by the simulator (to reserve links) and the P/D-window analysis (to
sum demands), so the two cannot disagree. Each stage lists (side, link, bytes kind):
side "pe" / "de" is the node or engine of the request's PE or DE; link is one of
snic_r, snic_w, dram (a node's DRAM, reads + writes), cnic_r, cnic_w (the engine's
CNIC: "read" = bytes the NIC reads from host or device memory and sends, "write" =
bytes it writes into memory). Bytes kind: "hit", "miss" or "persist".

With all-hit traffic this reproduces the per-link sums of docs/concepts/design.md#the-pd-ratio-window:
PE CNIC read 2*Tp, PE CNIC write Tp+Tc, DE CNIC read Tp+2Tc, DE CNIC write 2Tp+Tc,
DE DRAM 2Tp+3Tc (per PE-DE pair; Tp on the PE path, Tc on the DE path).
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
