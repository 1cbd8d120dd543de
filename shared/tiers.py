"""Prompt-token tiers: where a request's prompt KV came from, cut to a length, shown to clients."""
from __future__ import annotations

from shared.messages.stream import PromptTiers

NAMES: tuple[str, ...] = PromptTiers.__struct_fields__  # computed, engine, buffer, storage_pe, storage_de
PROMPT_ORDER = ("engine", "buffer", "storage_pe", "storage_de", "computed")  # how they lie along a prompt


def total(t: PromptTiers) -> int:
    return sum(getattr(t, name) for name in NAMES)


def clip(t: PromptTiers, n: int) -> PromptTiers:
    """The tiers of the prompt's first `n` tokens (a resumed attempt's prompt is longer than the
    request's); tokens past what `t` covers count as computed."""
    left, out = max(n, 0), {}
    for name in PROMPT_ORDER:
        out[name] = min(getattr(t, name), left)
        left -= out[name]
    out["computed"] += left
    return PromptTiers(**out)


def as_dict(t: PromptTiers) -> dict[str, int]:
    """Every tier by name, zeros included (the client's `dualpath_tiers`)."""
    return {name: getattr(t, name) for name in NAMES}
