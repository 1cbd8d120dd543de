"""`python -m kernels.bench`: kernel errors per dtype, split-KV and paged decode timings."""
from __future__ import annotations

import argparse
import random
import time

import torch
import torch.nn.functional as F

from kernels import attention as attn
from kernels import dcp, decode, partition, ring
from kernels.paged_decode import gather_blocks, paged_decode


def _rand(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def errors(dtype: torch.dtype) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    h, hkv, t, d = 16, 4, 1000, 64
    q, k, v = (_rand(s, dtype, g) for s in ((4, h, d), (t, hkv, d), (t, hkv, d)))
    oracle = decode.reference(q.double(), k.double(), v.double())
    qf = _rand((t, h, d), dtype, g)  # a full causal sequence for the ring
    qb, kb, vb = (x.transpose(0, 1)[None] for x in (qf, k, v))  # (1, H, T, D) layouts
    pos = partition.positions(t, 4, "zigzag")
    outs, _, _ = ring.ring_attention(*(partition.split(x, pos, 2) for x in (qb, kb, vb)), pos)
    ring_ref = attn.reference(*(x.double() for x in (qb, kb, vb)), causal=True)[0]
    return {
        "attention": _err(decode.reference(q, k, v), oracle),
        "split-KV decode": _err(decode.split_kv(q, k, v, split_size=128)[0], oracle),
        "DCP (N=8)": _err(dcp.dcp_attention(q, dcp.shard(k, 8), dcp.shard(v, 8))[0], oracle),
        "ring (N=4, zigzag)": _err(partition.unsplit(outs, pos, 2), ring_ref),
    }


def _err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).abs().max())


def _time(fn, repeats: int) -> float:
    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def timings(contexts: list[int], repeats: int, split: int) -> list[tuple[int, float, float]]:
    """(ctx, single-pass ms, split-KV ms) for one decode query, 32 q heads, 8 kv heads."""
    g = torch.Generator().manual_seed(1)
    rows = []
    for t in contexts:
        q, k, v = (_rand(s, torch.float32, g) for s in ((1, 32, 128), (t, 8, 128), (t, 8, 128)))
        single = _time(lambda: decode.reference(q, k, v), repeats)
        split_ms = _time(lambda: decode.split_kv(q, k, v, split_size=split), repeats)
        rows.append((t, single, split_ms))
    return rows


def padded_sdpa(q: torch.Tensor, layer_kv: torch.Tensor, tables: torch.Tensor, lens: list[int]) -> torch.Tensor:
    b, bs = q.shape[0], layer_kv.shape[2]
    k = gather_blocks(layer_kv, 0, tables.reshape(-1)).view(b, -1, *layer_kv.shape[-2:]).transpose(1, 2)
    v = gather_blocks(layer_kv, 1, tables.reshape(-1)).view(b, -1, *layer_kv.shape[-2:]).transpose(1, 2)
    mask = torch.arange(tables.shape[1] * bs)[None, :] < torch.tensor(lens)[:, None]
    o = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask[:, None, None, :], enable_gqa=True)
    return o.squeeze(2)


def paged_timings(batches: list[int], repeats: int) -> list[tuple[int, int, float, float, float]]:
    """(batch, summed context, padded-SDPA ms, paged_decode ms, max abs diff) for one layer."""
    rows = []
    for b in batches:
        rnd = random.Random(b)
        lens = [rnd.randint(300, 2000) for _ in range(b)]
        need = [-(-t // 64) for t in lens]
        order = torch.randperm(sum(need) + 8, generator=torch.Generator().manual_seed(b))
        layer = torch.randn(len(order), 2, 64, 3, 64)
        tables = torch.zeros(b, max(need), dtype=torch.long)
        at = 0
        for i, n in enumerate(need):
            tables[i, :n] = order[at:at + n]
            at += n
        q = torch.randn(b, 9, 64)
        diff = _err(paged_decode(q, layer, tables, lens), padded_sdpa(q, layer, tables, lens).double())
        rows.append((b, sum(lens), _time(lambda: padded_sdpa(q, layer, tables, lens), repeats),
                     _time(lambda: paged_decode(q, layer, tables, lens), repeats), diff))
    return rows


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--quick", action="store_true",
                    help="3 timing repeats instead of 10 (about 15 s on 2 cores, a third of the full run)")
    ap.add_argument("--split", type=int, default=decode.DEFAULT_SPLIT, help="split-KV decode: keys per split")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("max abs error vs fp64 oracle (H=16, Hkv=4, T=1000, D=64, 4 queries, causal)")
    for dtype in (torch.float32, torch.bfloat16):
        errs = errors(dtype)
        print(f"  {str(dtype):15s} " + "  ".join(f"{k}: {v:.2e}" for k, v in errs.items()))
    print(f"decode time, 1 query, H=32, Hkv=8, D=128, fp32, split {args.split} (best of runs)")
    print(f"  {'ctx':>6s}  {'single-pass ms':>14s}  {'split-KV ms':>11s}  {'ratio':>5s}")
    for t, a, b in timings([4096, 16384, 65536], 3 if args.quick else 10, args.split):
        print(f"  {t:>6d}  {a:>14.2f}  {b:>11.2f}  {b / a:>5.2f}")
    print("ragged decode batch, one layer, H=9, Hkv=3, D=64, fp32, contexts 300-2000 (best of runs)")
    print(f"  {'batch':>5s}  {'tokens':>6s}  {'padded SDPA ms':>14s}  {'paged_decode ms':>15s}  {'speed-up':>8s}  max diff")
    for b, toks, a, c, diff in paged_timings([1, 8, 24, 64], 3 if args.quick else 10):
        print(f"  {b:>5d}  {toks:>6d}  {a:>14.2f}  {c:>15.2f}  {a / c:>7.2f}x  {diff:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
