"""The next token of each request in a batch, from its own generator (imports torch)."""
from __future__ import annotations

import torch

from shared.engine.requests import generator_seed
from shared.messages.stream import TokenLogprob
from shared.messages.work import Sampling
from shared.model.sampling import sample, token_logprobs


def next_tokens(logits: torch.Tensor, samplings: list[Sampling], steps: list[int]
                ) -> tuple[list[int], list[TokenLogprob | None]]:
    """A token per row of `logits` and its log-probabilities if asked; `steps[i]`: row i's token index."""
    gens = []
    for sp, step in zip(samplings, steps):
        seed = generator_seed(sp, step)
        gens.append(torch.Generator().manual_seed(seed) if seed is not None else None)
    toks = sample(logits, [sp.temperature for sp in samplings], [sp.top_p for sp in samplings], gens)
    lps = token_logprobs(logits, toks, [sp.logprobs for sp in samplings])
    return toks, [None if lp is None else TokenLogprob(*lp) for lp in lps]
