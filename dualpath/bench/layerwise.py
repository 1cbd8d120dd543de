"""Stored KV through the mesh: a 90%-hit prompt against recomputing it, and the layerwise overlap.

Turn 1 stores a prompt; turn 2 re-sends 90% of it plus new tokens. Prints the read, layer copy,
prefill and miss-only compute times, and TTFT with and without the store.
"""
from __future__ import annotations

import argparse
import re
import shutil
import statistics
import sys
import tempfile
import time
import uuid

import httpx


def _metrics(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(url, timeout=10).text.splitlines():
        m = re.match(r"^(dualpath_\w+_(?:sum|count))(\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m:
            out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def _delta(after: dict, before: dict, key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def _ttft(url: str, prompt: list[int], n: int = 2) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                   "ignore_eos": True, "stream": False}, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]


def _compute_only(model: str, prompt: list[int], hit: int) -> float:
    """Prefill of the miss tokens with the hit KV already in place (no loading at all)."""
    import torch

    from shared.model.batch import ForwardBatch, SeqSlice
    from shared.model.kv_cache import PagedKVCache
    from shared.model.loader import load_model

    torch.set_num_threads(1)
    lm = load_model(model)
    blocks = list(range(-(-len(prompt) // 64)))
    kv = PagedKVCache.allocate(lm.config, len(blocks), 64)
    with torch.inference_mode():
        lm.model.forward(ForwardBatch([SeqSlice(prompt[:hit], 0, blocks)]), kv)
        times = []
        for _ in range(3):
            t0 = time.perf_counter()
            lm.model.forward(ForwardBatch([SeqSlice(prompt[hit:], hit, blocks)]), kv)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def build_parser() -> argparse.ArgumentParser:
    from dualpath.cli import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=HelpFormatter)
    ap.add_argument("--model", default="smollm2", help="preset (smollm2, tiny), a .gguf file or an HF directory")
    ap.add_argument("--prompt-tokens", type=int, default=1024, help="prompt length of each turn")
    ap.add_argument("--snic-gbps", type=float, default=0.0, help="emulated storage NIC cap per node, Gbit/s; 0 = none")
    ap.add_argument("--repeat", type=int, default=3, help="turn pairs measured (the median is printed)")
    return ap


def main(argv: list[str] | None = None) -> int:
    from dualpath.mesh import Mesh, MeshSpec
    from shared.model.tokenizer_build import load_tokenizer

    ap = build_parser()
    args = ap.parse_args(argv)
    tok = load_tokenizer(args.model)
    extra = {"storage_gateway": {"snic-read-gbps": str(args.snic_gbps)}} if args.snic_gbps else {}
    store = tempfile.mkdtemp(prefix="dualpath-layerwise-")
    mesh = Mesh(MeshSpec(model=args.model, port=0, kv_blocks=64, threads=1, store=store, extra=extra))
    print("starting the mesh ...", file=sys.stderr, flush=True)
    mesh.start(timeout=300, progress=lambda line: print(line, file=sys.stderr, flush=True))
    rows = []
    try:
        time.sleep(1.0)
        pe_metrics = next(p for p in mesh.procs if p.name.startswith("prefill-"))
        urls = _service_urls(mesh)
        for i in range(args.repeat):
            print(f"turn pair {i + 1}/{args.repeat} ...", file=sys.stderr, flush=True)
            words = f"run {uuid.uuid4().hex} " + "the agent reads the tool output and plans the next step " * 200
            base = tok.encode(words)[: args.prompt_tokens]
            _ttft(mesh.url, base)  # turn 1: computes and persists the prompt's blocks
            time.sleep(1.0)
            hit_part = base[: int(0.9 * len(base))]
            turn2 = hit_part + tok.encode(f" new tool output {i} " * 40)[: len(base) - len(hit_part)]
            before = {u: _metrics(u) for u in urls}
            t_hit, cached = _ttft(mesh.url, turn2)
            after = {u: _metrics(u) for u in urls}
            fresh = tok.encode(f"other {uuid.uuid4().hex} " + "a different conversation entirely " * 200)[: len(turn2)]
            t_miss, _ = _ttft(mesh.url, fresh)
            d = {k: sum(_delta(after[u], before[u], k) for u in urls) for k in _KEYS}
            rows.append((t_hit, t_miss, cached, len(turn2), d))
        del pe_metrics
    finally:
        mesh.stop()
        shutil.rmtree(store, ignore_errors=True)
    compute = _compute_only(args.model, turn2, rows[-1][2])
    med = lambda xs: statistics.median(xs)  # noqa: E731
    read = med([r[4]['dualpath_traffic_manager_fetch_seconds_sum{phase="read"}'] for r in rows])
    h2d = med([r[4]['dualpath_traffic_manager_fetch_seconds_sum{phase="h2d"}'] for r in rows])
    step = med([r[4]["dualpath_prefill_engine_step_seconds_sum"] for r in rows])
    t_hit, t_miss = med([r[0] for r in rows]), med([r[1] for r in rows])
    print(f"model {args.model}; prompt {rows[-1][3]} tokens, {rows[-1][2]} from the store "
          f"({rows[-1][2] / rows[-1][3]:.0%}); snic cap {args.snic_gbps or 'none'} Gbps; medians of {len(rows)}")
    print(f"  storage read (gateway -> PE buffer)        {read * 1e3:9.1f} ms")
    print(f"  layer copies (PE buffer -> KV, per layer)  {h2d * 1e3:9.1f} ms")
    print(f"  compute of the miss tokens alone           {compute * 1e3:9.1f} ms")
    print(f"  prefill step (layerwise: waits per layer)  {step * 1e3:9.1f} ms")
    print(f"  copies + compute, if serial                {(h2d + compute) * 1e3:9.1f} ms"
          f"   -> overlap saves {(h2d + compute - step) * 1e3:.1f} ms")
    print(f"  TTFT with the store                        {t_hit * 1e3:9.1f} ms")
    print(f"  TTFT recomputing everything                {t_miss * 1e3:9.1f} ms   -> {t_miss / t_hit:.2f}x")
    return 0


_KEYS = ('dualpath_traffic_manager_fetch_seconds_sum{phase="read"}', 'dualpath_traffic_manager_fetch_seconds_sum{phase="h2d"}',
         "dualpath_prefill_engine_step_seconds_sum")


def _service_urls(mesh) -> list[str]:
    """Metrics URLs of the prefill engine and its traffic-manager, from their announcements."""
    import asyncio

    import msgspec
    import nats

    from shared.messages.endpoints import EP
    from shared.messages.registry import Announce

    async def collect() -> list[str]:
        nc = await nats.connect(mesh.nats_url)
        found: dict[str, str] = {}
        dec = msgspec.msgpack.Decoder(Announce)

        async def on(m):
            a = dec.decode(m.data)
            if getattr(a, "role", "") == "prefill" or (a.__class__.__name__ == "TrafficManagerAnnounce"
                                                       and a.engine.startswith("p")):
                found[a.instance] = a.metrics_url

        await nc.subscribe(EP.HEARTBEAT.at(mesh.spec.namespace), cb=on)
        await asyncio.sleep(1.5)
        await nc.close()
        return list(found.values())

    return asyncio.run(collect())


if __name__ == "__main__":  # one benchmark at a time; its load and CPU said at the end
    from shared.benchrun import alone

    raise SystemExit(alone("dualpath.bench.layerwise", lambda conditions: main()))
