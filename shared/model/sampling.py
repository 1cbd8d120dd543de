"""Choosing the next token from logits (greedy, temperature, top-p, seeded), and its log-probabilities.

Log-probabilities are of the raw fp32 logits, before temperature and top-p.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch


class TokenLogprobs(NamedTuple):
    logprob: float  # of the token actually chosen, whether or not it is among the top
    top_ids: list[int]  # the most likely ids, most likely first (as many as asked for)
    top_logprobs: list[float]  # their log-probabilities, same order


def make_generator(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero all but the smallest set of most likely tokens whose mass reaches top_p; renormalized."""
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
    """One token per row of logits, drawn on the host (CPU generators: a seed draws alike on any device)."""
    logits = logits.float().cpu()
    out = logits.argmax(-1).tolist()  # greedy for every row; sampled rows overwritten
    for i, t in enumerate(temperature):
        if t > 0.0:
            # a tiny t must not give NaN: shift so the top logit is 0 (logits / t would overflow
            # to inf), and keep t a normal float32 (a smaller one rounds to 0 and 0 / 0 is NaN)
            t = max(t, torch.finfo(torch.float32).tiny)
            probs = top_p_filter(torch.softmax((logits[i] - logits[i].max()) / t, -1), top_p[i])
            out[i] = int(torch.multinomial(probs, 1, generator=generators[i]).item())
    return out


def token_logprobs(logits: torch.Tensor, chosen: Sequence[int],
                   top_n: Sequence[int | None]) -> list[TokenLogprobs | None]:
    """Per row: the chosen token's log-probability and the top_n[i] likeliest ids (None: not asked)."""
    out: list[TokenLogprobs | None] = [None] * len(top_n)
    rows = [i for i, n in enumerate(top_n) if n is not None]
    if not rows:
        return out
    lp = torch.log_softmax(logits[rows].float(), -1)  # (r, vocab)
    picked = lp.gather(1, torch.tensor([[chosen[i]] for i in rows], device=lp.device))[:, 0].tolist()
    k = min(max(top_n[i] for i in rows), lp.shape[-1])
    vals, ids = lp.topk(k, -1) if k else (lp[:, :0], lp[:, :0].long())  # sorted, most likely first
    vals, ids = vals.tolist(), ids.tolist()
    for j, i in enumerate(rows):
        n = top_n[i]
        out[i] = TokenLogprobs(picked[j], ids[j][:n], vals[j][:n])
    return out
