"""The model's own traffic on the compute NICs: EP dispatch / combine and attention TP all-reduce, per token.

Volumes are the planner's (docs/concepts/parallelism.md, `dualpath.plan.attention`): per card and
layer the MoE all-to-all moves 2*k*c*B_local*d elements (dispatch + combine) and attention
TP over t cards 2*c_t*B_local*d. Here they are per token (B_local = 1), in bytes (dispatch
in FP8 with one 4-byte scale per 128 values, combine and all-reduce in BF16), and only the
share that leaves the node crosses a CNIC (inside a node it rides NVLink):
- decode (DeepEP's low-latency kernels send per expert): k * (n-1)/n copies of a token
  for an EP domain of n nodes;
- prefill (DeepEP's normal kernels send a token once per remote node and forward it over
  NVLink there): the expected number of other nodes its k experts touch,
  (n-1) * (1 - (1 - 1/n)^k) (the planner's u(B) rule for one token, per node);
- attention TP: the part of a TP group beyond one node, max(0, t - g) / t.
A GPU sends and receives the same volume in expectation, so both directions of its CNIC
carry it. Dense models (attention DP only) have none.

Example: DS-V3.2 660B, d = 7168, k = 8, 58 MoE layers, decode EP over 4 nodes:
8 * 3/4 * 7168 * (1.03 + 2) * 58 = 7.6 MB per token per forward on each CNIC direction.
"""
from __future__ import annotations

from dataclasses import dataclass

from dualpath.presets import ModelArch

DISPATCH_BYTES = 1.0 + 4.0 / 128  # FP8 value + its share of a per-128 scale
COMBINE_BYTES = 2.0  # BF16
ALLREDUCE_BYTES = 2.0  # BF16


@dataclass(frozen=True, slots=True)
class Layout:
    """How one side's engines split the model: an EP domain of `ep_nodes` nodes of
    `gpus` GPUs, attention TP `attn_tp` (1 = attention DP, the paper's layout)."""

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
