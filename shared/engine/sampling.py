"""The next token of every request of a batch, each drawn from its own generator.

Owns the per-request generators both engines use: a seeded request gets a generator
seeded for the step it samples (`generator_seed`), so its tokens are the same whichever
engine computes each step and whichever requests share the batch. torch is imported here,
so only the model thread's code imports this module.
"""
from __future__ import annotations

import torch

from shared.engine.requests import generator_seed
from shared.messages.stream import TokenLogprob
from shared.messages.work import Sampling
from shared.model.sampling import sample, token_logprobs


def next_tokens(logits: torch.Tensor, samplings: list[Sampling], steps: list[int]
                ) -> tuple[list[int], list[TokenLogprob | None]]:
    """One token per row of `logits` (n, vocab) and its log-probabilities when the request
    asked for them; `steps[i]` is the index of the token row i samples."""
    gens = []
    for sp, step in zip(samplings, steps):
        seed = generator_seed(sp, step)
        gens.append(torch.Generator().manual_seed(seed) if seed is not None else None)
    toks = sample(logits, [sp.temperature for sp in samplings], [sp.top_p for sp in samplings], gens)
    lps = token_logprobs(logits, toks, [sp.logprobs for sp in samplings])
    return toks, [None if lp is None else TokenLogprob(*lp) for lp in lps]
