"""Single-process reference generation: the mesh's greedy output must match it token for token."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.model.batch import ForwardBatch, SeqSlice
from shared.model.kv_cache import PagedKVCache
from shared.model.loader import LoadedModel
from shared.model.sampling import TokenLogprobs, make_generator, sample, token_logprobs


@dataclass
class Generation:
    ids: list[int] = field(default_factory=list)  # generated ids (the eos id that ended generation included)
    logprobs: list[TokenLogprobs] = field(default_factory=list)  # one per id; empty when not asked for


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
    return _run(loaded, prompt_ids, max_tokens, temperature, top_p, seed, ignore_eos, block_size, None).ids


def generate_detailed(
    loaded: LoadedModel,
    prompt_ids: list[int],
    max_tokens: int,
    *,
    top_logprobs: int = 0,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int | None = 0,
    ignore_eos: bool = False,
    block_size: int = 64,
) -> Generation:
    return _run(loaded, prompt_ids, max_tokens, temperature, top_p, seed, ignore_eos, block_size, top_logprobs)


def _run(loaded: LoadedModel, prompt_ids: list[int], max_tokens: int, temperature: float, top_p: float,
         seed: int | None, ignore_eos: bool, block_size: int, top_n: int | None) -> Generation:
    total = len(prompt_ids) + max_tokens
    kv = PagedKVCache.allocate(loaded.config, -(-total // block_size), block_size)
    table = list(range(kv.num_blocks))
    gen = make_generator(seed)
    out = Generation()
    step = SeqSlice(list(prompt_ids), 0, table)
    while len(out.ids) < max_tokens:
        logits = loaded.model.forward(ForwardBatch([step]), kv)
        token = sample(logits, [temperature], [top_p], [gen])[0]
        out.ids.append(token)
        if top_n is not None:
            out.logprobs.append(token_logprobs(logits, [token], [top_n])[0])
        if token in loaded.config.eos_ids and not ignore_eos:
            break
        step = SeqSlice([token], step.end_pos, table)
    return out
