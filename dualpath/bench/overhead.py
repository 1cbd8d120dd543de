"""The mesh's overhead: TTFT and decode tokens/s through the mesh beside the same model in one process.

Decode is also billed in CPU ms per token (from /proc), and each one-process figure is taken
right after the mesh's matching phase, so both see the same machine load. Batch decode is
counted only while all streams run; the one process also decodes from the mesh's contexts.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import statistics
import sys
import threading
import time
import uuid

import httpx

from dualpath.bench.procstat import cpu_seconds, status_mb


_T0 = time.monotonic()


def say(what: str) -> None:
    """One progress line on stderr, with the time since the start."""
    print(f"[{time.monotonic() - _T0:5.0f} s] {what}", file=sys.stderr, flush=True)


def _prompt(tok, n: int) -> list[int]:
    words = f"{uuid.uuid4().hex} " + "the agent reads the tool output and plans the next step " * (n // 8 + 2)
    return tok.encode(words)[:n]


class OneProcess:
    """The same model decoding in this process (one torch thread, like an engine), no service around it."""

    def __init__(self, model: str, n_prompt: int, n_decode: int, n_batch: int) -> None:
        import torch

        from shared.model.loader import load_model

        torch.set_num_threads(1)
        say(f"one process: loading {model}")
        self.lm = load_model(model)
        self.n_prompt, self.n_decode, self.bs = n_prompt, n_decode, 64
        longest = BATCH_PROMPT + 4 * n_batch  # a batch stream's longest context when its window opens
        self.per_seq = -(-(max(n_prompt + n_decode, longest + n_batch) + 1) // self.bs)
        self.cpu_ms = 0.0  # CPU ms per decoded token of the last run

    def run(self, lens: list[int], steps: int) -> tuple[float, float]:
        """(prefill seconds, decode tokens/s) of one sequence per prompt length in `lens`."""
        import torch

        from shared.model.batch import ForwardBatch, SeqSlice
        from shared.model.kv_cache import PagedKVCache

        lm, per_seq, batch = self.lm, self.per_seq, len(lens)
        kv = PagedKVCache.allocate(lm.config, per_seq * batch, self.bs)
        seqs = [(_prompt(lm.tokenizer, m), list(range(i * per_seq, (i + 1) * per_seq))) for i, m in enumerate(lens)]
        with torch.inference_mode():
            t0 = time.perf_counter()
            logits = lm.model.forward(ForwardBatch([SeqSlice(p, 0, b) for p, b in seqs]), kv)
            ttft = time.perf_counter() - t0
            last = logits.argmax(-1).tolist()
            t1, c1 = time.perf_counter(), time.process_time()
            for step in range(steps):
                fb = ForwardBatch([SeqSlice([t], len(p) + step, b) for t, (p, b) in zip(last, seqs)])
                last = lm.model.forward(fb, kv).argmax(-1).tolist()
            tps = batch * steps / (time.perf_counter() - t1)
            self.cpu_ms = (time.process_time() - c1) * 1e3 / (batch * steps)
        return ttft, tps

    def ttft(self, repeat: int) -> dict:
        say(f"one process: TTFT, {repeat} runs")
        return {"ttft_s": statistics.median(self.run([self.n_prompt], 1)[0] for _ in range(repeat))}

    def batch1(self, repeat: int) -> dict:
        say(f"one process: decode at batch 1, {repeat} runs of {self.n_decode} tokens")
        tps = statistics.median(self.run([self.n_prompt], self.n_decode)[1] for _ in range(repeat))
        return {"decode_tps_b1": tps, "decode_cpu_ms_b1": self.cpu_ms}

    def batch(self, batch: int, steps: int, contexts: list[int]) -> dict:
        """Batch `batch` from the batch prompt (flat), then from `contexts` (the mesh's at its window)."""
        say(f"one process: decode at batch {batch}, {steps} tokens, flat and from the window's contexts")
        tps = self.run([BATCH_PROMPT] * batch, steps)[1]
        out = {f"decode_tps_b{batch}": tps, f"decode_cpu_ms_b{batch}": self.cpu_ms}
        if contexts:
            out[f"decode_tps_b{batch}_same"] = self.run(contexts, steps)[1]
            out[f"decode_cpu_ms_b{batch}_same"] = self.cpu_ms
        return out


BATCH_PROMPT = 128  # prompt length of the batch decode runs (decode-bound, not prefill-bound)
BATCHES = (8, 32)  # batch sizes of the batch decode runs


def _stream(url: str, prompt: list[int], n: int, enough=None) -> tuple[float, list[float]]:
    """(time to the first chunk, every chunk's arrival); stops reading (cancels) once `enough(times)`."""
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0, "ignore_eos": True, "stream": True}
    t0 = time.perf_counter()
    times: list[float] = []
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                times.append(time.perf_counter())
                if enough is not None and enough(times):
                    break
    return times[0] - t0, times


def window_contexts(runs: list[list[float]], start: float, prompt: int) -> list[int]:
    """Each stream's context length when the window opened at `start` (sorted), less its newest token."""
    return sorted(prompt + sum(1 for x in t if x <= start) - 1 for t in runs)


def _batch_rates(url: str, tok, batch: int, n: int, cpu: _MeshCpu | None = None) -> tuple:
    """Decode chunks/s of `batch` concurrent streams: while all run, and over the whole window. With
    `cpu`, also the mesh's CPU snapshots at the all-running window's edges and the chunks between them."""
    firsts: list[float] = []
    lock = threading.Lock()
    marks: dict[str, dict[str, float]] = {}

    def enough(times: list[float]) -> bool:
        if len(times) == 1:
            with lock:
                firsts.append(times[0])
                if len(firsts) == batch and cpu is not None:
                    marks["start"] = cpu.snapshot()
        if len(firsts) < batch:
            return False
        start = max(firsts)
        done = sum(1 for t in times if t > start) >= n
        if done and cpu is not None:
            with lock:
                marks.setdefault("end", cpu.snapshot())
        return done

    with cf.ThreadPoolExecutor(batch) as pool:
        runs = list(pool.map(lambda _: _stream(url, _prompt(tok, BATCH_PROMPT), 4 * n, enough)[1], range(batch)))
    start, end = max(t[0] for t in runs), min(t[-1] for t in runs)
    in_window = sum(1 for t in runs for x in t if start < x <= end)
    if end <= start:  # the first streams ended before the last prompt was handed over
        say(f"batch {batch}: no moment when all {batch} streams ran (more than {4 * n} tokens' time to hand over)")
        common = float("nan")
    else:
        common = in_window / (end - start)
    whole = sum(len(t) - 1 for t in runs) / (max(t[-1] for t in runs) - min(t[0] for t in runs))
    return (common, whole, sum(len(t) - 1 for t in runs), in_window, (marks.get("start"), marks.get("end")),
            window_contexts(runs, start, BATCH_PROMPT))


class _MeshCpu:
    """CPU seconds since construction: the decode engines, other non-prefill processes, this client."""

    def __init__(self, mesh) -> None:
        self.pids = {p.name: p.popen.pid for p in mesh.procs if not p.name.startswith(("prefill-", "tm-p", "gateway-p"))}
        self.pids["client"] = os.getpid()
        self.start = self.snapshot()

    def snapshot(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def per_token(self, batch: int, tokens: int, since: dict | None = None, until: dict | None = None,
                  tag: str = "") -> dict:
        """CPU ms per token between two snapshots (default: construction to now), keys suffixed `tag`."""
        since, until = since or self.start, until or self.snapshot()
        used = {name: until[name] - since[name] for name in self.pids}
        engine = sum(v for k, v in used.items() if k.startswith("decode-"))
        client = used["client"]
        rest = sum(used.values()) - engine - client
        n = max(1, tokens)
        return {f"decode_cpu_ms_b{batch}{tag}": engine * 1e3 / n, f"rest_cpu_ms_b{batch}{tag}": rest * 1e3 / n,
                f"client_cpu_ms_b{batch}{tag}": client * 1e3 / n,
                f"procs_cpu_ms_b{batch}{tag}": {k: round(v * 1e3 / n, 3) for k, v in used.items()}}


def through_mesh(model: str, n_prompt: int, n_decode: int, repeat: int, n_batch: int,
                 one: OneProcess) -> tuple[dict, dict, dict]:
    """The mesh's figures, each phase followed by `one`'s: (mesh, one process, peak RSS)."""
    from dualpath.mesh import Mesh, MeshSpec
    from shared.model.tokenizer_build import load_tokenizer

    tok = load_tokenizer(model)
    blocks = max(-(-(n_prompt + n_decode) // 64) * 8, -(-(BATCH_PROMPT + 4 * n_batch + 1) // 64) * max(BATCHES)) + 8
    mesh = Mesh(MeshSpec(model=model, port=0, kv_blocks=blocks, threads=1))
    say("mesh: starting (nats-server + 7 service processes)")
    mesh.start(timeout=300, progress=say)
    try:
        _stream(mesh.url, _prompt(tok, 64), 4)  # warm-up
        say(f"mesh: TTFT, {repeat} runs")
        ttft = statistics.median(_stream(mesh.url, _prompt(tok, n_prompt), 1)[0] for _ in range(repeat))
        own = one.ttft(repeat)
        say(f"mesh: decode at batch 1, {repeat} runs of {n_decode} tokens")
        cpu = _MeshCpu(mesh)
        runs = [_stream(mesh.url, _prompt(tok, n_prompt), n_decode)[1] for _ in range(repeat)]
        out = {"ttft_s": ttft, "decode_tps_b1": statistics.median((len(t) - 1) / (t[-1] - t[0]) for t in runs)}
        out.update(cpu.per_token(1, sum(len(t) - 1 for t in runs)))
        own.update(one.batch1(repeat))
        for batch in BATCHES:
            say(f"mesh: decode at batch {batch}, {n_batch} tokens")
            cpu = _MeshCpu(mesh)
            common, whole, n, n_full, (t0, t1), contexts = _batch_rates(mesh.url, tok, batch, n_batch, cpu)
            out[f"decode_tps_b{batch}"], out[f"decode_tps_b{batch}_whole"] = common, whole
            out[f"contexts_b{batch}"] = contexts
            out.update(cpu.per_token(batch, n))
            if t0 and t1 and n_full:  # all streams running: the one process's condition
                out.update(cpu.per_token(batch, n_full, t0, t1, tag="_full"))
            own.update(one.batch(batch, n_batch, contexts if t0 and t1 and n_full else []))
        rss = {p.name: status_mb(p.popen.pid, "VmHWM") for p in mesh.procs}
    finally:
        mesh.stop()
    return out, own, rss


def build_parser() -> argparse.ArgumentParser:
    from dualpath.cli import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    ap.add_argument("--model", default="smollm2", help="preset (smollm2, tiny), a .gguf file or an HF directory")
    ap.add_argument("--prompt-tokens", type=int, default=1000, help="prompt length of the TTFT and batch-1 runs")
    ap.add_argument("--decode", type=int, default=48, help="tokens generated per decode run")
    ap.add_argument("--batch-decode", type=int, default=128, help="tokens generated per stream in the batch runs")
    ap.add_argument("--repeat", type=int, default=3, help="runs per figure (the median is printed)")
    ap.add_argument("--json", default="", help="also write the figures to this JSON file")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.batch_decode < 2:
        ap.error(f"--batch-decode must be at least 2 (got {args.batch_decode})")
    own = OneProcess(args.model, args.prompt_tokens, args.decode, args.batch_decode)
    mesh, one, rss = through_mesh(args.model, args.prompt_tokens, args.decode, args.repeat, args.batch_decode, own)
    print(f"model {args.model}, prompt {args.prompt_tokens} tokens (batches: {BATCH_PROMPT}), decode "
          f"{args.decode} tokens (batches: {args.batch_decode}), medians of {args.repeat}")
    print(f"{'':22}{'one process':>14}{'mesh':>12}{'mesh/one':>10}")
    rows = [("ttft_s", "TTFT (s)"), ("decode_tps_b1", "decode tok/s, batch 1")]
    for key, label in rows + [(f"decode_tps_b{b}", f"decode tok/s, batch {b}") for b in BATCHES]:
        print(f"{label:22}{one[key]:>14.3f}{mesh[key]:>12.3f}{mesh[key] / one[key]:>10.2f}")
    for b in BATCHES:
        if f"decode_tps_b{b}_same" in one:
            label = f"  same contexts, b{b}"
            print(f"{label:22}{one[f'decode_tps_b{b}_same']:>14.3f}{mesh[f'decode_tps_b{b}']:>12.3f}"
                  f"{mesh[f'decode_tps_b{b}'] / one[f'decode_tps_b{b}_same']:>10.2f}")
    whole = [(b, mesh[f"decode_tps_b{b}_whole"], one[f"decode_tps_b{b}"]) for b in BATCHES]
    print("mesh, whole window (batch still filling, prefills running): "
          + ", ".join(f"batch {b} {w:.3f} tok/s ({w / o:.2f}x)" for b, w, o in whole))
    print("CPU ms per decoded token (load-robust; mesh: decode engine + the rest of the decode side; "
          "the bench's HTTP client apart):")
    for b, tag in [(1, "")] + [(b, t) for b in BATCHES for t in ("", "_full")]:
        if f"decode_cpu_ms_b{b}{tag}" not in mesh:
            continue
        eng, rest, own = mesh[f"decode_cpu_ms_b{b}{tag}"], mesh[f"rest_cpu_ms_b{b}{tag}"], one[f"decode_cpu_ms_b{b}"]
        label = f"batch {b}" + (", all running" if tag else (", ramp incl." if b > 1 else ""))
        print(f"  {label:<22} one process {own:8.1f} | mesh {eng + rest:8.1f} (engine {eng:.1f} + rest {rest:.1f})"
              f" | one/mesh {own / (eng + rest):.2f}x | client {mesh[f'client_cpu_ms_b{b}{tag}']:.1f}")
        if tag and f"decode_cpu_ms_b{b}_same" in one:  # the one process at the window's contexts
            same, ctx = one[f"decode_cpu_ms_b{b}_same"], mesh[f"contexts_b{b}"]
            print(f"  {'':<22} one process {same:8.1f} at the window's contexts ({min(ctx)}..{max(ctx)}, "
                  f"mean {statistics.mean(ctx):.0f}; flat runs start at {BATCH_PROMPT})"
                  f" | one/mesh {same / (eng + rest):.2f}x")
            procs = mesh[f"procs_cpu_ms_b{b}{tag}"]
            rest_by = sorted(((v, k) for k, v in procs.items() if not k.startswith("decode-") and k != "client"),
                             reverse=True)
            print(f"  {'':<22} the rest: " + ", ".join(f"{k} {v:.2f}" for v, k in rest_by))
    print("peak resident memory (MiB):")
    for name, mb in rss.items():
        print(f"  {name:24} {mb:8.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"one_process": one, "mesh": mesh, "peak_rss_mb": rss}, f, indent=2)
    return 0


if __name__ == "__main__":  # one benchmark at a time; its load and CPU said at the end
    from shared.benchrun import alone

    raise SystemExit(alone("dualpath.bench.overhead", lambda conditions: main()))
