"""Prefill batching: which chunks the next forward computes, and that forward itself.

`pick` runs on the event loop, `forward` in the model thread."""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from services.prefill_engine.layers import LayerGate
from services.prefill_engine.record import PrefillRequest
from shared.engine.kv_memory import KVMemory
from shared.messages.stream import TokenLogprob
from shared.sched.policy.intra_pe import AttentionModel, plan_batch
from shared.sched.policy.intra_pe import ReadyPrefill as Work


class Chunk(NamedTuple):
    req: PrefillRequest
    cached: int  # prompt tokens whose KV is already in memory
    bsz: int  # prompt tokens this forward computes, from `cached` on


First = tuple[int, TokenLogprob | None]  # a finished prompt's first token (and its log-probabilities)


def attention_model(cfg) -> AttentionModel:
    return AttentionModel(per_pair=cfg.attn_per_pair_s, per_token=cfg.attn_per_token_s, per_batch=cfg.attn_per_batch_s)


def one_forward(cfg, attn: AttentionModel, cached: int, prompt_len: int) -> bool:
    """A prompt's missing part fits one forward (so its hits may live in a window)."""
    miss = prompt_len - cached
    return miss <= cfg.max_batch_tokens and attn.batch_time([(cached, miss)]) <= cfg.compute_quota_s


def pick(queue: list[PrefillRequest], allocate: Callable[[PrefillRequest], bool], attn: AttentionModel,
         quota_s: float, max_tokens: int) -> list[Chunk]:
    """The next forward's chunks, FIFO, KV memory for the head first; empty when the head gets none.
    A request whose hits live in a window is computed whole."""
    ready = []
    for r in queue:
        if not r.blocks and not allocate(r):
            break
        ready.append(r)
    work = [Work(i, r.done, len(r.prompt) - r.done, whole=r.window is not None) for i, r in enumerate(ready)]
    chunks = plan_batch(work, attn, quota_s, align=16, max_tokens=max_tokens)
    return [Chunk(ready[c.rid], c.cached, c.bsz) for c in chunks]


def layerwise_pushes(batch: list[Chunk], expect_s: float, min_s: float) -> list[PrefillRequest]:
    """The batch's finishing prompts whose KV goes to their DE layer by layer while it computes: every one
    when the forward is expected to take `min_s` or more, else only those whose hits live in a window (its
    ring's layers are reused); the others push whole after their first token, which a short forward on
    shared cores computes sooner without the per-layer messages beside it."""
    return [c.req for c in batch if c.cached + c.bsz >= len(c.req.prompt) and c.req.work.plan.push
            and (expect_s >= min_s or c.req.window is not None)]


def written_blocks(batch: list[Chunk], block_size: int) -> list[int]:
    return sorted({b for c in batch for b in c.req.blocks[c.cached // block_size:-(-(c.cached + c.bsz) // block_size)]})


def forward(model, kv: KVMemory, batch: list[Chunk], layer_timeout_s: float,
            on_computed: Callable[[int], None] | None = None) -> tuple[list[First | None], float]:
    """Model thread: one batched forward; per chunk, its first token if it finished its prompt, and the
    seconds it waited for stored KV. `on_computed(l)`: layer l is over."""
    import torch

    from shared.engine.sampling import next_tokens
    from shared.model.batch import ForwardBatch, SeqSlice

    fb = ForwardBatch([SeqSlice(c.req.prompt[c.cached:c.cached + c.bsz], c.cached, c.req.blocks, c.req.window)
                       for c in batch])
    gate = LayerGate([c.req.load for c in batch if c.req.load is not None], layer_timeout_s, kv.copies,
                     written_blocks(batch, kv.block_size), on_computed)
    with torch.inference_mode():
        logits = model.forward(fb, kv.cache, gate)
        gate.finish(kv.cache.n_layers)
    last = [i for i, c in enumerate(batch) if c.cached + c.bsz >= len(c.req.prompt)]
    out: list[First | None] = [None] * len(batch)
    if not last:
        return out, gate.waited_s
    toks, lps = next_tokens(logits[last], [batch[i].req.sampling for i in last], [0] * len(last))
    for i, t, lp in zip(last, toks, lps):
        out[i] = (t, lp)
    return out, gate.waited_s
