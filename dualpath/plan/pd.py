"""The bottleneck-free P/D ratio window (docs/concepts/design.md#the-pd-ratio-window).

Each link's load (PE and DE CNIC read and write, DE DRAM) as a share of its capacity at
P/D = x with every SNIC saturated; each gives a bound on x.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True)
class PDInputs:
    gpus_per_node: int  # g
    snic: float  # s: a node's total SNIC bandwidth in units of one CNIC's B
    cnic_gbs: float  # B, GB/s per CNIC
    dram_gbs: float  # M, GB/s per node

    def __post_init__(self) -> None:
        for name in ("gpus_per_node", "snic", "cnic_gbs", "dram_gbs"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class Bound:
    link: str  # which inequality
    ratio: float  # the P/D bound it gives (inf / -inf when it gives none)


@dataclass(frozen=True)
class PDWindow:
    inputs: PDInputs
    pe_read_ok: bool  # 2s <= g
    lower: Bound  # binding lower bound
    uppers: tuple[Bound, ...]  # all upper bounds
    upper: Bound  # binding (smallest) upper bound
    feasible: bool
    examples: tuple[str, ...]  # small P:D node ratios inside the window

    @property
    def binding(self) -> tuple[Bound, ...]:
        """Every upper bound that ties with the smallest (the paper's own example has two)."""
        return tuple(b for b in self.uppers
                     if math.isclose(b.ratio, self.upper.ratio, rel_tol=1e-12, abs_tol=1e-12))


def link_loads(inp: PDInputs, ratio: float) -> dict[str, float]:
    """Each link's load as a fraction of its capacity at P/D = ratio."""
    g, s, x = inp.gpus_per_node, inp.snic, ratio
    return {
        "PE CNIC read": 2 * s / g,
        "PE CNIC write": (s / g) * (1 + 1 / x),
        "DE CNIC read": (s / g) * (x + 2),
        "DE CNIC write": (s / g) * (2 * x + 1),
        "DE DRAM": inp.cnic_gbs * s / inp.dram_gbs * (2 * x + 3),
    }


def window(inp: PDInputs, max_nodes: int = 4) -> PDWindow:
    g, s = inp.gpus_per_node, inp.snic
    lower = Bound("PE CNIC write", s / (g - s) if g > s else math.inf)
    uppers = (
        Bound("DE CNIC read", (g - 2 * s) / s),
        Bound("DE CNIC write", (g - s) / (2 * s)),
        Bound("DE DRAM", (inp.dram_gbs / (inp.cnic_gbs * s) - 3) / 2),
    )
    upper = min(uppers, key=lambda b: b.ratio)
    ok = 2 * s <= g
    feasible = ok and lower.ratio <= upper.ratio
    ex = _examples(lower.ratio, upper.ratio, max_nodes) if feasible else ()
    return PDWindow(inp, ok, lower, uppers, upper, feasible, ex)


def _examples(lo: float, hi: float, max_nodes: int) -> tuple[str, ...]:
    seen: set[Fraction] = set()
    out = []
    for d in range(1, max_nodes + 1):
        for p in range(1, max_nodes + 1):
            f = Fraction(p, d)
            if f not in seen and lo - 1e-12 <= p / d <= hi + 1e-12:
                seen.add(f)
                out.append(f)
    return tuple(f"{f.numerator}P{f.denominator}D" for f in sorted(out))
