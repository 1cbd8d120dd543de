"""The model's own traffic on the compute NICs: EP dispatch / combine and attention TP all-reduce, per token.

Volumes are the planner's, per token; only the share that leaves the node crosses a CNIC,
in both directions. Dense models (attention DP only) have none.
"""
from __future__ import annotations

from dataclasses import dataclass

from dualpath.presets import ModelArch

DISPATCH_BYTES = 1.0 + 4.0 / 128  # FP8 value + its share of a per-128 scale
COMBINE_BYTES = 2.0  # BF16
ALLREDUCE_BYTES = 2.0  # BF16


@dataclass(frozen=True, slots=True)
class Layout:
    """One side's split: EP domains of `ep_nodes` nodes of `gpus` GPUs, attention TP `attn_tp` (1 = DP)."""

    ep_nodes: int
    gpus: int
    attn_tp: int = 1

    def __post_init__(self) -> None:
        if self.ep_nodes < 1 or self.gpus < 1 or self.attn_tp < 1:
            raise ValueError(f"layout needs ep_nodes, gpus, attn_tp >= 1, got {self}")


def remote_copies(k: int, nodes: int, per_node: bool) -> float:
    """Copies of one token that leave its node in one MoE all-to-all."""
    if nodes <= 1 or k <= 0:
        return 0.0
    if per_node:
        return (nodes - 1) * (1.0 - (1.0 - 1.0 / nodes) ** k)
    return k * (nodes - 1) / nodes


def cnic_bytes_per_token(arch: ModelArch, lay: Layout, prefill: bool) -> float:
    """Model bytes one token puts on each direction of its GPU's CNIC per forward pass."""
    ep = 0.0
    if arch.is_moe:
        copies = remote_copies(arch.experts_per_token, lay.ep_nodes, per_node=prefill)
        ep = copies * arch.hidden * (DISPATCH_BYTES + COMBINE_BYTES) * arch.num_moe_layers
    tp = 0.0
    t = lay.attn_tp
    if t > lay.gpus:
        c_t = (t - 1) / t
        tp = 2 * c_t * arch.hidden * ALLREDUCE_BYTES * arch.num_layers * (t - lay.gpus) / t
    return ep + tp
