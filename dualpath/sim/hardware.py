"""Node hardware presets: GPUs, NICs, DRAM, HBM (the g, B, s, M of the P/D ratio window).

Bandwidths in bytes/s; `link_eff` is the share of a NIC's line rate bulk transfers reach.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

GBPS = 1e9 / 8  # bytes/s per Gbit/s


@dataclass(frozen=True, slots=True)
class Hardware:
    """One node type. Defaults describe an H800 node."""

    name: str = "h800"
    gpus: int = 8  # g: engines per node, one CNIC each
    cnic_gbps: float = 400.0  # B, per GPU
    snics: int = 1  # storage NICs per node
    snic_gbps: float = 400.0  # per SNIC
    dram_gbs: float = 500.0  # M: node DRAM bandwidth (reads + writes), GB/s
    hbm_gb: float = 80.0
    hbm_tbs: float = 3.35
    peak_fp8_tflops: float = 1979.0  # dense
    peak_bf16_tflops: float = 989.0
    link_eff: float = 0.9

    @property
    def cnic_bw(self) -> float:
        return self.cnic_gbps * GBPS * self.link_eff

    @property
    def snic_bw(self) -> float:
        """Storage bandwidth of one node (all SNICs), bytes/s."""
        return self.snics * self.snic_gbps * GBPS * self.link_eff

    @property
    def dram_bw(self) -> float:
        return self.dram_gbs * 1e9

    @property
    def s(self) -> float:
        """Node SNIC bandwidth in units of one CNIC."""
        return self.snics * self.snic_gbps / self.cnic_gbps



HARDWARE = {
    "h800": Hardware(),
    "dgx-h100": Hardware(name="dgx-h100", snics=2),
}


def load_hardware(name: str) -> Hardware:
    try:
        return HARDWARE[name]
    except KeyError:
        raise ValueError(f"unknown hardware {name!r}; known: {', '.join(HARDWARE)}") from None
