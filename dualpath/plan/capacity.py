"""Usable HBM per card and the batch it holds (docs/concepts/parallelism.md#memory-capacity-and-batch).

usable = HBM - weights - buffers - margin; B_memory = usable / (state + KV per request);
B_run = min(B_memory, B_SLO, available concurrency).
"""
from __future__ import annotations

from dataclasses import dataclass

from dualpath.plan.attention import kv_copies
from dualpath.plan.dtypes import dtype_bytes, part_bytes
from dualpath.presets import ModelArch

GB = 1e9


@dataclass(frozen=True)
class CapInputs:
    cards: int  # P, also the EP size for MoE models
    hbm_gb: float
    ctx: int  # tokens of KV per request
    attn_tp: int = 1  # t (divides cards)
    kv_dtype: str = "fp8"
    weight_dtype: str = "fp8"
    buffers_gb: float = 4.0  # CUDA graphs, communication buffers, scratch
    margin: float = 0.05  # fraction of HBM held back
    state_mb: float = 0.0  # per-request state besides KV
    b_slo: int = 0  # 0 = not given
    concurrency: int = 0  # 0 = not given

    def __post_init__(self) -> None:
        for name in ("cards", "hbm_gb", "ctx", "attn_tp"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.cards % self.attn_tp:
            raise ValueError(f"attn_tp {self.attn_tp} does not divide cards {self.cards}")
        if not 0 <= self.margin < 1:
            raise ValueError(f"margin must be in [0, 1), got {self.margin}")


@dataclass(frozen=True)
class Capacity:
    model: str
    inputs: CapInputs
    weights_by_part: dict[str, float]  # bytes on one card
    weights_per_card: float
    buffers: float
    margin: float
    usable: float  # may be negative: the model does not fit
    kv_per_request: float  # bytes on one card
    state_per_request: float
    b_memory_per_group: float  # requests one attention group (t cards) holds
    b_memory: int  # requests in the whole domain
    b_run: int

    @property
    def fits(self) -> bool:
        return self.usable > 0


def weights_on_card(arch: ModelArch, inp: CapInputs) -> dict[str, float]:
    parts = part_bytes(arch.params(), inp.weight_dtype)
    split = {"routed_experts": inp.cards, "attention": inp.attn_tp,
             "dense_mlp": inp.attn_tp, "shared_experts": inp.attn_tp}
    return {name: b / split.get(name, 1) for name, b in parts.items()}


def plan_capacity(arch: ModelArch, inp: CapInputs) -> Capacity:
    parts = weights_on_card(arch, inp)
    weights = sum(parts.values())
    hbm = inp.hbm_gb * GB
    usable = hbm - weights - inp.buffers_gb * GB - inp.margin * hbm
    kvb = dtype_bytes(inp.kv_dtype)
    per_token = arch.kv_bytes_per_token(kvb) + arch.index_bytes_per_token(kvb)
    kv_req = inp.ctx * per_token * kv_copies(arch, inp.attn_tp) / inp.attn_tp
    state = inp.state_mb * 1e6
    per_group = max(0.0, usable) / (kv_req + state)
    # every card of a TP group holds a slice of each of the group's requests
    b_mem = int(per_group) * (inp.cards // inp.attn_tp)
    limits = [b_mem] + [x for x in (inp.b_slo, inp.concurrency) if x > 0]
    return Capacity(arch.name, inp, parts, weights, inp.buffers_gb * GB, inp.margin * hbm,
                    usable, kv_req, state, per_group, b_mem, min(limits))
