"""Can an exactness test see one wrong KV block?

Perturbs one block of the stored KV at a time (zeroed, swapped or noised) and takes the largest
logprob difference over a teacher-forced decode; detected when past the mesh tests' tolerance.
"""
from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass

import torch

from shared.model.batch import ForwardBatch, SeqSlice
from shared.model.kv_cache import PagedKVCache
from shared.model.loader import LoadedModel
from shared.model.reference import generate

KINDS = ("zero", "swap", "noise")
TOLERANCE = 1e-4  # the fp32 logprob tolerance of the mesh's exactness tests
PROMPTS = (  # fixed texts; each is cut or repeated to the length asked for
    "agent log: step 1 read the file; step 2 ran the tests; 3 passed, 1 failed. tool: pytest -x. ",
    "Once upon a time a small robot walked to the harbour and counted the ships, one by one. ",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))  # the answer is five\n",
)


@dataclass(frozen=True)
class Perturbation:
    block: int  # which full block of the prompt
    layer: int
    kv: int  # 0 = K, 1 = V
    kind: str  # zero | swap | noise


def perturbations(n_blocks: int, n_layers: int, kinds=KINDS) -> list[Perturbation]:
    return [Perturbation(b, layer, kv, k) for layer in range(n_layers) for kv in (0, 1)
            for b in range(n_blocks) for k in kinds]


def prompt_ids(loaded: LoadedModel, text: str, n_blocks: int, block_size: int) -> list[int]:
    """`text` repeated and cut to n_blocks full blocks plus one token (the first decode input)."""
    ids = loaded.tokenizer.encode(text)
    want = n_blocks * block_size + 1
    return (ids * (want // len(ids) + 1))[:want]


def _apply(p: Perturbation, data: torch.Tensor, blocks: list[int], gen: torch.Generator) -> None:
    """Perturb `data` (cache, [block, layer, kv, ...]) in the prompt blocks `blocks`."""
    dst = data[blocks[p.block], p.layer, p.kv]
    if p.kind == "zero":
        dst.zero_()
    elif p.kind == "swap":
        other = data[blocks[(p.block + 1) % len(blocks)], p.layer, p.kv]
        tmp = dst.clone()
        dst.copy_(other)
        other.copy_(tmp)
    elif p.kind == "noise":
        scale = dst.float().pow(2).mean().sqrt() * 0.01
        dst.add_((torch.randn(dst.shape, generator=gen) * scale).to(dst.dtype))
    else:
        raise ValueError(f"unknown perturbation kind {p.kind!r}")


def measure(loaded: LoadedModel, ids: list[int], block_size: int, n_tokens: int,
            perts: list[Perturbation], batch: int = 64) -> tuple[list[int], list[float]]:
    """Greedy continuation of `ids`, and per perturbation the max |delta logprob| over it."""
    want = generate(loaded, ids, n_tokens, ignore_eos=True, block_size=block_size)
    n_prompt_blocks = (len(ids) - 1) // block_size
    per_seq = -(-(len(ids) + n_tokens) // block_size)
    cfg = loaded.config
    base_kv = PagedKVCache.allocate(cfg, per_seq, block_size)
    table = list(range(per_seq))
    loaded.model.forward(ForwardBatch([SeqSlice(ids[:-1], 0, table)]), base_kv)
    prompt_blocks = base_kv.data[:n_prompt_blocks].clone()
    base = _decode(loaded, [None], prompt_blocks, ids, want, per_seq, block_size)[0]
    diffs: list[float] = []
    for start in range(0, len(perts), batch):
        group = perts[start:start + batch]
        got = _decode(loaded, group, prompt_blocks, ids, want, per_seq, block_size)
        diffs += [float((g - base).abs().max()) for g in got]
    return want, diffs


def _decode(loaded, group, prompt_blocks, ids, want, per_seq, block_size) -> list[torch.Tensor]:
    """Teacher-forced decode of `want` for each perturbation of the group (None = none)."""
    n = len(group)
    kv = PagedKVCache.allocate(loaded.config, n * per_seq, block_size)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(n)]
    nb = prompt_blocks.shape[0]
    gen = torch.Generator().manual_seed(0)
    for p, t in zip(group, tables):
        kv.data[t[0]:t[0] + nb] = prompt_blocks
        if p is not None:
            _apply(p, kv.data, t[:nb], gen)
    out = torch.empty(n, len(want), dtype=torch.float64)
    inputs, pos = [ids[-1]] * n, len(ids) - 1
    for step, tok in enumerate(want):
        logits = loaded.model.forward(ForwardBatch([SeqSlice([x], pos, t) for x, t in zip(inputs, tables)]), kv)
        out[:, step] = torch.log_softmax(logits.double(), -1)[:, tok]
        inputs, pos = [tok] * n, pos + 1
    return list(out)


@dataclass(frozen=True)
class Table:
    rows: list[tuple[str, int, int, float]]  # (what, tried, detected, smallest max-diff)

    def render(self) -> str:
        lines = ["| perturbation | tried | detected | share | smallest max |dlogprob| |", "|---|---|---|---|---|"]
        for what, tried, det, low in self.rows:
            lines.append(f"| {what} | {tried} | {det} | {det / tried:.3f} | {low:.2e} |")
        return "\n".join(lines)


def table(perts: list[Perturbation], diffs: list[float], tol: float = TOLERANCE) -> Table:
    rows = []
    for what, sel in [("all", lambda p: True)] + [(k, lambda p, k=k: p.kind == k) for k in KINDS] + \
                     [("K", lambda p: p.kv == 0), ("V", lambda p: p.kv == 1)]:
        ds = [d for p, d in zip(perts, diffs) if sel(p)]
        if ds:
            rows.append((what, len(ds), sum(d > tol for d in ds), min(ds)))
    return Table(rows)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dualpath.bench.sensitivity", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--model", default="tiny", help="model spec (tiny, smollm2, a .gguf, an HF directory)")
    ap.add_argument("--blocks", type=int, default=8, help="full blocks per prompt")
    ap.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    ap.add_argument("--tokens", type=int, default=16, help="decoded tokens compared")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"prompts used (at most {len(PROMPTS)})")
    ap.add_argument("--sample", type=int, default=0, help="perturbations per prompt, drawn at random (0 = all)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    from shared.model.loader import load_model

    if args.model == "smollm2":
        from shared.model.fetch import ensure_default_model

        ensure_default_model()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    all_p, all_d = [], []
    for i, text in enumerate(PROMPTS[:args.prompts]):
        ids = prompt_ids(loaded, text, args.blocks, args.block_size)
        perts = perturbations(args.blocks, loaded.config.n_layers)
        if args.sample:
            perts = random.Random(i).sample(perts, min(args.sample, len(perts)))
        t0 = time.perf_counter()
        want, diffs = measure(loaded, ids, args.block_size, args.tokens, perts)
        print(f"prompt {i}: {len(perts)} perturbations in {time.perf_counter() - t0:.1f} s; greedy continuation "
              f"{loaded.tokenizer.decode(want)!r}", flush=True)
        all_p += perts
        all_d += diffs
    print(f"\n{args.model}: {args.blocks} blocks of {args.block_size} tokens, {args.tokens} tokens compared, "
          f"tolerance {TOLERANCE:g}\n")
    print(table(all_p, all_d).render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
