"""Context parallelism for long prefill and DCP for decode (docs/concepts/parallelism.md).

Ring, Ulysses and split + all-gather: per-card traffic, activation and head limits; causal
balance of contiguous, zigzag and interleaved chunks.
"""
from __future__ import annotations

from dataclasses import dataclass

from dualpath.plan.dtypes import dtype_bytes
from dualpath.presets import ModelArch

SCHEMES = ("contiguous", "zigzag", "interleave")


@dataclass(frozen=True)
class CPInputs:
    cards: int  # N
    seq: int  # T
    act_dtype: str = "bf16"
    tp: int = 0  # decode TP group for the DCP limit (0 = cards)
    batch: int = 1  # decode batch for DCP traffic

    def __post_init__(self) -> None:
        for name in ("cards", "seq", "batch"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.tp < 0:
            raise ValueError(f"tp must be >= 0, got {self.tp}")


@dataclass(frozen=True)
class Route:
    name: str
    comm_elems: float  # per card per layer
    comm_bytes: float
    act_elems: float  # hidden-state activation per card
    act_bytes: float
    head_limit: str
    allowed: bool


@dataclass(frozen=True)
class Balance:
    scheme: str
    work: tuple[int, ...]  # causal (query, key) pairs per card
    max_over_mean: float


@dataclass(frozen=True)
class DCP:
    tp: int
    max_degree: int  # 1 = DCP not possible
    limit: str
    kv_bytes_per_card_bf16: float  # one request of `seq` tokens, at the max degree
    q_gather_elems: float  # per decode step per card: all-gather of Q
    merge_elems: float  # per step per card: outputs + LSE exchanged for the merge


@dataclass(frozen=True)
class CPPlan:
    model: str
    inputs: CPInputs
    routes: tuple[Route, ...]
    recommended: str
    partition: str  # zigzag, or interleave for sparse attention
    balance: tuple[Balance, ...]
    dcp: DCP


def _range_work(a: int, b: int) -> int:
    """Causal pairs of queries at positions [a, b): sum of (p + 1)."""
    return (b * (b + 1) - a * (a + 1)) // 2


def causal_work(seq: int, cards: int, scheme: str) -> tuple[int, ...]:
    if scheme == "contiguous":
        cuts = [seq * r // cards for r in range(cards + 1)]
        return tuple(_range_work(cuts[r], cuts[r + 1]) for r in range(cards))
    if scheme == "zigzag":
        cuts = [seq * j // (2 * cards) for j in range(2 * cards + 1)]
        return tuple(_range_work(cuts[r], cuts[r + 1])
                     + _range_work(cuts[2 * cards - 1 - r], cuts[2 * cards - r])
                     for r in range(cards))
    if scheme == "interleave":
        out = []
        for r in range(cards):
            n = len(range(r, seq, cards))
            out.append(n * (r + 1) + cards * n * (n - 1) // 2)
        return tuple(out)
    raise ValueError(f"unknown scheme {scheme!r} (choose from {', '.join(SCHEMES)})")


def _balance(seq: int, cards: int) -> tuple[Balance, ...]:
    out = []
    for s in SCHEMES:
        w = causal_work(seq, cards, s)
        out.append(Balance(s, w, max(w) * cards / sum(w)))
    return tuple(out)


def _routes(arch: ModelArch, inp: CPInputs) -> tuple[Route, ...]:
    n, t, d = inp.cards, inp.seq, arch.hidden
    c, b = (n - 1) / n, dtype_bytes(inp.act_dtype)
    h = arch.num_heads
    uly_ok = not arch.is_mla and n <= h and h % n == 0
    uly_limit = "MLA: no head axis" if arch.is_mla else f"N <= H={h}, H % N == 0"
    rows = [("ring", 2 * c * t * d, t * d / n, "none", True),
            ("ulysses", 4 * c * t * d / n, t * d / n, uly_limit, uly_ok),
            ("all-gather", c * t * d, t * d, "none", True)]
    return tuple(Route(nm, cm, cm * b, ac, ac * b, lim, ok) for nm, cm, ac, lim, ok in rows)


def _dcp(arch: ModelArch, inp: CPInputs) -> DCP:
    tp = inp.tp or inp.cards
    if arch.is_mla:
        deg, limit = tp, f"MLA: N <= TP={tp}"
    else:
        deg, limit = max(1, tp // arch.num_kv_heads), f"GQA: N <= TP/n_kv = {tp}/{arch.num_kv_heads}"
    q_dim = arch.num_heads * arch.qk_head_dim
    v_dim = arch.num_heads * ((arch.v_head_dim or arch.head_dim) + 1)  # outputs + LSE
    c = (deg - 1) / deg
    return DCP(tp, deg, limit, inp.seq * arch.kv_bytes_per_token(2.0) / deg,
               c * inp.batch * q_dim, c * inp.batch * v_dim)


def plan_cp(arch: ModelArch, inp: CPInputs) -> CPPlan:
    routes = _routes(arch, inp)
    uly = next(r for r in routes if r.name == "ulysses")
    rec = "ulysses" if uly.allowed and inp.cards > 1 else "ring"
    part = "interleave" if arch.is_sparse else "zigzag"
    return CPPlan(arch.name, inp, routes, rec, part, _balance(inp.seq, inp.cards), _dcp(arch, inp))
