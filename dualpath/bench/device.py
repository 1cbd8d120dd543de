"""Prefill and decode timings of one model on each compute device present, and the KV copy path.

Per device (the CPU, then CUDA) through the engines' own forward and paged cache; on CUDA also
the KV copy between the pinned host region and the device. An absent device is one line saying why.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def _timed(fn, device: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def model_timings(spec: str, device: str, prompt_tokens: int, batch: int, steps: int, repeat: int,
                  block_size: int = 64) -> dict[str, float]:
    """Seconds of one prefill forward and of one decode step, on `device`."""
    from shared.model.batch import ForwardBatch, SeqSlice
    from shared.model.kv_cache import PagedKVCache
    from shared.model.loader import load_model

    loaded = load_model(spec, device=device)
    per_seq = -(-(prompt_tokens + steps * repeat + 1) // block_size)
    kv = PagedKVCache.allocate(loaded.config, per_seq * batch, block_size, device=device)
    tables = [list(range(i * per_seq, (i + 1) * per_seq)) for i in range(batch)]
    ids = [(7 * i) % 90 + 33 for i in range(prompt_tokens)]
    model = loaded.model
    prefill = _timed(lambda: model.forward(ForwardBatch([SeqSlice(ids, 0, tables[0])]), kv), device, repeat)
    for t in tables[1:]:  # every sequence of the decode batch holds the same context
        model.forward(ForwardBatch([SeqSlice(ids, 0, t)]), kv)
    pos = [prompt_tokens]

    def decode() -> None:
        for _ in range(steps):
            model.forward(ForwardBatch([SeqSlice([40], pos[0], t) for t in tables]), kv)
            pos[0] += 1

    step = _timed(decode, device, repeat) / steps
    return {"prefill_s": prefill, "decode_step_s": step, "kv_bytes_per_token": loaded.config.kv_bytes_per_token}


def copy_timings(spec: str, device: str, prompt_tokens: int, repeat: int, block_size: int = 64) -> dict[str, float]:
    """Seconds to move one prompt's KV blocks between the pinned host region and the device cache."""
    from shared.engine.kv_memory import KVMemory
    from shared.model.loader import load_model

    cfg = load_model(spec).config
    n = -(-prompt_tokens // block_size)
    kv = KVMemory(cfg, n, block_size, tag="bench-kv", device=device)
    try:
        blocks = list(range(n))

        def up_all() -> None:
            kv.copies.upload(blocks)
            kv.copies.finish()

        def up_layer() -> None:
            kv.copies.upload(blocks, 0)
            kv.copies.finish()

        def down_all() -> None:
            kv.copies.download(blocks)
            kv.copies.finish()

        return {"bytes": n * kv.host.block_nbytes, "up_s": _timed(up_all, device, repeat),
                "up_layer_s": _timed(up_layer, device, repeat), "down_s": _timed(down_all, device, repeat)}
    finally:
        kv.close()


def devices() -> list[tuple[str, str]]:
    """(device, why absent or "") for the CPU and CUDA."""
    cuda = "" if torch.cuda.is_available() else "not present (torch.cuda.is_available() is False)"
    return [("cpu", ""), ("cuda", cuda)]


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dualpath.bench.device", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-mla", help="model spec (tiny, tiny-mla, smollm2, a .gguf, an HF directory)")
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=16, help="decode batch: sequences of --prompt-tokens context each")
    ap.add_argument("--steps", type=int, default=8, help="decode steps per timed run")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    print(f"model {a.model}: prefill {a.prompt_tokens} tokens; decode batch {a.batch} x {a.prompt_tokens} context "
          f"(medians of {a.repeat})")
    with torch.inference_mode():
        for dev, absent in devices():
            if absent:
                print(f"{dev:5s} {absent}")
                continue
            print(f"{dev:5s} ...", file=sys.stderr, flush=True)
            t = model_timings(a.model, dev, a.prompt_tokens, a.batch, a.steps, a.repeat)
            print(f"{dev:5s} prefill {t['prefill_s'] * 1e3:9.2f} ms ({a.prompt_tokens / t['prefill_s']:9.0f} tok/s)   "
                  f"decode step {t['decode_step_s'] * 1e3:8.2f} ms ({a.batch / t['decode_step_s']:8.0f} tok/s)   "
                  f"KV {t['kv_bytes_per_token']} B/token")
            if dev != "cpu":
                c = copy_timings(a.model, dev, a.prompt_tokens, a.repeat)
                gbs = lambda s: c["bytes"] / s / 1e9  # noqa: E731
                print(f"{dev:5s} KV copies of {c['bytes'] / 1e6:.2f} MB: up {c['up_s'] * 1e3:.3f} ms "
                      f"({gbs(c['up_s']):.1f} GB/s), one layer up {c['up_layer_s'] * 1e3:.3f} ms, "
                      f"down {c['down_s'] * 1e3:.3f} ms ({gbs(c['down_s']):.1f} GB/s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
