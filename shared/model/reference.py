"""Single-process reference generation: the mesh's greedy output must match it token for token.

Owns nothing but a loop: one prefill `forward` of the whole prompt into a locally
allocated PagedKVCache, then one-token decode steps, stopping at max_tokens or an
end-of-sequence id.
"""

from __future__ import annotations

from shared.model.batch import ForwardBatch, SeqSlice
from shared.model.kv_cache import PagedKVCache
from shared.model.loader import LoadedModel
from shared.model.sampling import make_generator, sample


def generate(
    loaded: LoadedModel,
    prompt_ids: list[int],
    max_tokens: int,
    *,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = 0,
    ignore_eos: bool = False,
    block_size: int = 64,
) -> list[int]:
    """Generated ids (the eos id that ended generation included)."""
    total = len(prompt_ids) + max_tokens
    kv = PagedKVCache.allocate(loaded.config, -(-total // block_size), block_size)
    table = list(range(kv.num_blocks))
    gen = make_generator(seed)
    out: list[int] = []
    step = SeqSlice(list(prompt_ids), 0, table)
    while len(out) < max_tokens:
        logits = loaded.model.forward(ForwardBatch([step]), kv)
        token = sample(logits, [temperature], [top_p], [gen])[0]
        out.append(token)
        if token in loaded.config.eos_ids and not ignore_eos:
            break
        step = SeqSlice([token], step.end_pos, table)
    return out
