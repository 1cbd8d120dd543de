"""Attention over the paged KV cache, and the cache-free reference attention."""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernels import decode_attention, paged_decode
from kernels.paged_decode import gather_blocks
from shared.kv.window import HitWindow
from shared.model.batch import ForwardBatch, SeqSlice


SPLIT_KV_THRESHOLD = 4096  # decode contexts longer than this use split-KV attention + LSE merge
SPLIT_KV_SIZE = 2048  # tokens per KV split


@dataclass(frozen=True)
class DecodeGroup:
    rows: torch.Tensor  # (B,) long: index into the step's N tokens
    tables: torch.Tensor  # (B, max_blocks) long: block tables, padded with block 0
    lens: list[int]  # (B,) context length of each sequence, its new token included


@dataclass(frozen=True)
class PrefillSlice:
    first: int  # index into N of its first new token
    count: int  # new tokens
    start_pos: int  # cached tokens before them
    table: torch.Tensor  # (n_blocks,) long: blocks covering positions [0, end)
    mask: torch.Tensor | None  # (count, end) bool, None when start_pos == 0 (plain causal)


@dataclass(frozen=True)
class StepIndex:
    tokens: torch.Tensor  # (N,) long: all new tokens, sequences concatenated
    positions: torch.Tensor  # (N,) long: position of each new token
    write_blocks: torch.Tensor  # (N,) long: cache block each new K/V goes to
    write_rows: torch.Tensor  # (N,) long: row inside that block
    last_index: torch.Tensor  # (n_seqs,) long: index into N of each sequence's last token
    decode: DecodeGroup | None
    prefills: list[PrefillSlice]
    windows: tuple[HitWindow | None, ...] = ()  # per prefill slice; any set: layers index Layer Blocks

    def layer(self, kv, layer: int) -> tuple[torch.Tensor, StepIndex]:
        """(cache tensor, index) that layer `layer` computes against (every Layer Block with hit windows)."""
        if not any(self.windows):
            return kv.layer_view(layer), self
        n = kv.n_layers
        prefills = [dataclasses.replace(p, table=_layer_table(p.table, w, layer, n))
                    for p, w in zip(self.prefills, self.windows)]
        decode = self.decode and dataclasses.replace(self.decode, tables=self.decode.tables * n + layer)
        return kv.layer_blocks(), dataclasses.replace(self, write_blocks=self.write_blocks * n + layer,
                                                      decode=decode, prefills=prefills)

    @staticmethod
    def build(batch: ForwardBatch, block_size: int, device: torch.device | str | None = None) -> StepIndex:
        tokens: list[int] = []
        positions: list[int] = []
        blocks: list[int] = []
        for s in batch:
            s.check(block_size)
            pos = range(s.start_pos, s.end_pos)
            tokens.extend(s.token_ids)
            positions.extend(pos)
            blocks.extend(s.block_table[p // block_size] for p in pos)
        counts = [len(s.token_ids) for s in batch]
        ends = list(itertools.accumulate(counts))
        firsts = [e - c for e, c in zip(ends, counts)]
        pos_t = torch.tensor(positions, dtype=torch.long, device=device)
        return StepIndex(
            tokens=torch.tensor(tokens, dtype=torch.long, device=device),
            positions=pos_t,
            write_blocks=torch.tensor(blocks, dtype=torch.long, device=device),
            write_rows=pos_t % block_size,
            last_index=torch.tensor([e - 1 for e in ends], dtype=torch.long, device=device),
            decode=_decode_group(list(batch), firsts, block_size, device),
            prefills=[_prefill_slice(s, f, block_size, device) for s, f in zip(batch, firsts) if not _decodes(s)],
            windows=tuple(s.window for s in batch if not _decodes(s)),
        )


def _decodes(s: SeqSlice) -> bool:
    return len(s.token_ids) == 1 and s.window is None


def _layer_table(table: torch.Tensor, window: HitWindow | None, layer: int, n_layers: int) -> torch.Tensor:
    out = table * n_layers + layer
    if window is not None:
        hits = min(window.in_ring, len(out))
        out[:hits] = torch.tensor([window.layer_block(j, layer) for j in range(hits)], dtype=out.dtype,
                                  device=out.device)
    return out


def _decode_group(seqs: list[SeqSlice], firsts: list[int], block_size: int, device) -> DecodeGroup | None:
    picked = [(s, f) for s, f in zip(seqs, firsts) if _decodes(s)]
    if not picked:
        return None
    n_blocks = [-(-s.end_pos // block_size) for s, _ in picked]
    width = max(n_blocks)
    tables = [s.block_table[:n] + [0] * (width - n) for (s, _), n in zip(picked, n_blocks)]  # padded with block 0
    return DecodeGroup(rows=torch.tensor([f for _, f in picked], dtype=torch.long, device=device),
                       tables=torch.tensor(tables, dtype=torch.long, device=device),
                       lens=[s.end_pos for s, _ in picked])


def _prefill_slice(s: SeqSlice, first: int, block_size: int, device) -> PrefillSlice:
    n_blocks = -(-s.end_pos // block_size)
    mask = None
    if s.start_pos > 0:
        q_pos = torch.arange(s.start_pos, s.end_pos, device=device)
        mask = torch.arange(s.end_pos, device=device)[None, :] <= q_pos[:, None]  # (T, S)
    table = torch.tensor(s.block_table[:n_blocks], dtype=torch.long, device=device)
    return PrefillSlice(first, len(s.token_ids), s.start_pos, table, mask)


def write_kv(layer_kv: torch.Tensor, idx: StepIndex, k: torch.Tensor, v: torch.Tensor) -> None:
    layer_kv[:, 0][idx.write_blocks, idx.write_rows] = k
    layer_kv[:, 1][idx.write_blocks, idx.write_rows] = v


def paged_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_kv: torch.Tensor, idx: StepIndex
) -> torch.Tensor:
    """Causal attention of the new tokens over the cache, their K/V already written to it -> (N, nh, hd)."""
    out = torch.empty_like(q)
    if idx.decode is not None:
        out[idx.decode.rows] = _decode_attention(q, layer_kv, idx.decode)
    for p in idx.prefills:
        out[p.first : p.first + p.count] = _prefill_attention(q, k, v, layer_kv, p)
    return out


def _gather(layer_kv: torch.Tensor, kv: int, blocks: torch.Tensor) -> torch.Tensor:
    return gather_blocks(layer_kv, kv, blocks.reshape(-1))


def _decode_attention(q: torch.Tensor, layer_kv: torch.Tensor, g: DecodeGroup) -> torch.Tensor:
    qd = q[g.rows]  # (B, nh, hd)
    long = [i for i, t in enumerate(g.lens) if t > SPLIT_KV_THRESHOLD]
    if not long:
        return paged_decode(qd, layer_kv, g.tables, g.lens)
    out = torch.empty_like(qd)
    long_set = set(long)
    short = [i for i in range(len(g.lens)) if i not in long_set]
    if short:
        sel = torch.tensor(short, device=qd.device)
        out[sel] = paged_decode(qd[sel], layer_kv, g.tables[sel], [g.lens[i] for i in short])
    for i in long:
        t = g.lens[i]
        k = _gather(layer_kv, 0, g.tables[i])[:t]  # (T, n_kv, hd)
        v = _gather(layer_kv, 1, g.tables[i])[:t]
        out[i] = decode_attention(qd[i], k, v, split_size=SPLIT_KV_SIZE)  # (nh, hd)
    return out


def _prefill_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_kv: torch.Tensor, p: PrefillSlice
) -> torch.Tensor:
    qs = q[p.first : p.first + p.count].transpose(0, 1)  # (nh, T, hd)
    if p.mask is None:  # nothing cached: the whole context is the new tokens
        ks = k[p.first : p.first + p.count].transpose(0, 1)  # (n_kv, T, hd)
        vs = v[p.first : p.first + p.count].transpose(0, 1)
    else:
        end = p.start_pos + p.count
        ks = _gather(layer_kv, 0, p.table)[:end].transpose(0, 1)  # (n_kv, S, hd)
        vs = _gather(layer_kv, 1, p.table)[:end].transpose(0, 1)
    o = F.scaled_dot_product_attention(
        qs.unsqueeze(0), ks.unsqueeze(0), vs.unsqueeze(0),
        attn_mask=p.mask, is_causal=p.mask is None, enable_gqa=True,
    )  # (1, nh, T, hd)
    return o[0].transpose(0, 1)  # (T, nh, hd)


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The oracle: causal attention by explicit softmax, no cache; q (T, nh, hd), k and v (T, n_kv, hd)."""
    t, nh, hd = q.shape
    rep = nh // k.shape[1]
    kr = k.repeat_interleave(rep, dim=1).transpose(0, 1)  # (nh, T, hd)
    vr = v.repeat_interleave(rep, dim=1).transpose(0, 1)
    scores = q.transpose(0, 1) @ kr.transpose(1, 2) / math.sqrt(hd)  # (nh, T, T)
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return (scores.softmax(-1) @ vr).transpose(0, 1)  # (T, nh, hd)
