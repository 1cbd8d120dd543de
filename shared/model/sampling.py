"""Choosing the next token from logits: greedy, temperature, nucleus (top-p), seeded.

Owns per-row sampling of one step. Each request brings its own torch.Generator (made
from its seed by `make_generator`), so its tokens do not depend on which other
requests share the batch. temperature == 0 means greedy (argmax, no randomness).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator seeded with `seed` (or from OS entropy when None)."""
    g = torch.Generator()
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero all but the smallest set of most likely tokens whose mass reaches top_p.

    probs: (vocab,) summing to 1 -> (vocab,) renormalized.
    """
    if top_p >= 1.0:
        return probs
    sorted_p, order = probs.sort(descending=True)
    before = sorted_p.cumsum(0) - sorted_p  # mass of strictly more likely tokens
    drop = before >= top_p
    drop[0] = False  # the top token always stays (also when top_p rounds to 0 in float32)
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    kept = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return kept / kept.sum()


def sample(
    logits: torch.Tensor,
    temperature: Sequence[float],
    top_p: Sequence[float],
    generators: Sequence[torch.Generator | None],
) -> list[int]:
    """One token per row of logits (n, vocab); per-row temperature, top_p, generator."""
    logits = logits.float()
    out = logits.argmax(-1).tolist()  # greedy for every row; sampled rows overwritten
    for i, t in enumerate(temperature):
        if t > 0.0:
            # a tiny t must not give NaN: shift so the top logit is 0 (logits / t would overflow
            # to inf), and keep t a normal float32 (a smaller one rounds to 0 and 0 / 0 is NaN)
            t = max(t, torch.finfo(torch.float32).tiny)
            probs = top_p_filter(torch.softmax((logits[i] - logits[i].max()) / t, -1), top_p[i])
            out[i] = int(torch.multinomial(probs, 1, generator=generators[i]).item())
    return out
