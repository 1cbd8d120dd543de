"""The mesh's overhead: TTFT and decode tokens/s through the mesh beside the same model in one process.

    .venv/bin/python -m dualpath.bench.overhead [--model smollm2] [--prompt-tokens 1000] [--decode 48]

Prints TTFT for one prompt, decode tokens/s at batch 1 and 8, the ratios (mesh / one
process), and the peak resident memory (VmHWM) of every service process. Medians of
--repeat runs; each run uses a fresh prompt so no stored KV is reused. Progress goes to
stderr as each phase starts; the whole run takes a few minutes with smollm2 on 2 cores.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import statistics
import sys
import time
import uuid

import httpx

from dualpath.bench.procstat import status_mb


_T0 = time.monotonic()


def say(what: str) -> None:
    """One progress line on stderr, with the time since the start."""
    print(f"[{time.monotonic() - _T0:5.0f} s] {what}", file=sys.stderr, flush=True)


def _prompt(tok, n: int) -> list[int]:
    words = f"{uuid.uuid4().hex} " + "the agent reads the tool output and plans the next step " * (n // 8 + 2)
    return tok.encode(words)[:n]


def in_process(model: str, n_prompt: int, n_decode: int, repeat: int) -> dict:
    import torch

    from shared.model.batch import ForwardBatch, SeqSlice
    from shared.model.kv_cache import PagedKVCache
    from shared.model.loader import load_model

    torch.set_num_threads(1)
    say(f"one process: loading {model}")
    lm = load_model(model)
    bs = 64
    per_seq = -(-(n_prompt + n_decode + 1) // bs)

    def run(batch: int, n: int = n_prompt) -> tuple[float, float]:
        kv = PagedKVCache.allocate(lm.config, per_seq * batch, bs)
        seqs = [(_prompt(lm.tokenizer, n), list(range(i * per_seq, (i + 1) * per_seq))) for i in range(batch)]
        with torch.inference_mode():
            t0 = time.perf_counter()
            logits = lm.model.forward(ForwardBatch([SeqSlice(p, 0, b) for p, b in seqs]), kv)
            ttft = time.perf_counter() - t0
            last = logits.argmax(-1).tolist()
            t1 = time.perf_counter()
            for step in range(n_decode):
                fb = ForwardBatch([SeqSlice([t], n + step, b) for t, (_, b) in zip(last, seqs)])
                last = lm.model.forward(fb, kv).argmax(-1).tolist()
            tps = batch * n_decode / (time.perf_counter() - t1)
        return ttft, tps

    say(f"one process: TTFT, {repeat} runs")
    ttft = statistics.median(run(1)[0] for _ in range(repeat))
    say(f"one process: decode at batch 1, {repeat} runs of {n_decode} tokens")
    tps1 = statistics.median(run(1)[1] for _ in range(repeat))
    say("one process: decode at batch 8")
    tps8 = statistics.median(run(8, BATCH_PROMPT)[1] for _ in range(max(1, repeat // 2)))
    return {"ttft_s": ttft, "decode_tps_b1": tps1, "decode_tps_b8": tps8}


BATCH_PROMPT = 128  # prompt length of the batch-8 decode runs (decode-bound, not prefill-bound)


def _stream(url: str, prompt: list[int], n: int) -> tuple[float, float, int]:
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    first = last = 0.0
    count = 0
    _stream.windows = getattr(_stream, "windows", [])
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                now = time.perf_counter()
                first = first or now
                last = now
                count += 1
    _stream.windows.append((first, last, count))
    return first - t0, last - first, count


def through_mesh(model: str, n_prompt: int, n_decode: int, repeat: int) -> tuple[dict, dict]:
    from dualpath.mesh import Mesh, MeshSpec
    from shared.model.tokenizer import load_tokenizer

    tok = load_tokenizer(model)
    mesh = Mesh(MeshSpec(model=model, port=0, kv_blocks=-(-(n_prompt + n_decode) // 64) * 8 + 8, threads=1))
    say("mesh: starting (nats-server + 7 service processes)")
    mesh.start(timeout=300, progress=say)
    try:
        _stream(mesh.url, _prompt(tok, 64), 4)  # warm-up
        say(f"mesh: TTFT, {repeat} runs")
        ttft = statistics.median(_stream(mesh.url, _prompt(tok, n_prompt), 1)[0] for _ in range(repeat))
        say(f"mesh: decode at batch 1, {repeat} runs of {n_decode} tokens")
        runs = [_stream(mesh.url, _prompt(tok, n_prompt), n_decode) for _ in range(repeat)]
        tps1 = statistics.median((c - 1) / span for _, span, c in runs if span > 0)
        say("mesh: decode at batch 8")
        _stream.windows = []
        with cf.ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda _: _stream(mesh.url, _prompt(tok, BATCH_PROMPT), n_decode), range(8)))
        # decode rate while all 8 stream: tokens after each first token, over the common window
        end = max(w[1] for w in _stream.windows)
        tps8 = sum(w[2] - 1 for w in _stream.windows) / (end - min(w[0] for w in _stream.windows))
        rss = {p.name: status_mb(p.popen.pid, "VmHWM") for p in mesh.procs}
    finally:
        mesh.stop()
    return {"ttft_s": ttft, "decode_tps_b1": tps1, "decode_tps_b8": tps8}, rss


def main(argv: list[str] | None = None) -> int:
    from dualpath.cli import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    ap.add_argument("--model", default="smollm2", help="preset (smollm2, tiny), a .gguf file or an HF directory")
    ap.add_argument("--prompt-tokens", type=int, default=1000, help="prompt length of the TTFT and batch-1 runs")
    ap.add_argument("--decode", type=int, default=48, help="tokens generated per decode run")
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure (the median is printed)")
    ap.add_argument("--json", default="", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    one = in_process(args.model, args.prompt_tokens, args.decode, args.repeat)
    mesh, rss = through_mesh(args.model, args.prompt_tokens, args.decode, args.repeat)
    print(f"model {args.model}, prompt {args.prompt_tokens} tokens (batch 8: {BATCH_PROMPT}), "
          f"decode {args.decode} tokens, medians of {args.repeat}")
    print(f"{'':22}{'one process':>14}{'mesh':>12}{'mesh/one':>10}")
    for key, label in (("ttft_s", "TTFT (s)"), ("decode_tps_b1", "decode tok/s, batch 1"),
                       ("decode_tps_b8", "decode tok/s, batch 8")):
        print(f"{label:22}{one[key]:>14.3f}{mesh[key]:>12.3f}{mesh[key] / one[key]:>10.2f}")
    print("peak resident memory (MiB):")
    for name, mb in rss.items():
        print(f"  {name:24} {mb:8.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"one_process": one, "mesh": mesh, "peak_rss_mb": rss}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
