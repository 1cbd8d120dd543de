"""`python -m shared.transport.bench`: data-plane figures against their baselines."""

from __future__ import annotations

import argparse
import sys

import numpy as np

from .bench_isolation import isolation, report
from .bench_throughput import MIB, loadavg, throughput, throughput_lines

BLOCK = 96 << 10


def figures(mib: int = 64, block: int = BLOCK, layer_blocks: int = 16, samples: int = 150, rounds: int = 3,
            backends: tuple[str, ...] = ("tcp", "shm"), with_throughput: bool = True, tp_rounds: int = 5,
            floor: bool = False) -> dict:
    """Every figure of this bench as one JSON-able dict (`dualpath bench --data-plane` reports it)."""
    import uvloop

    out: dict = {}
    if with_throughput:
        print(f"throughput: {mib} MiB over tcp, a raw socket, shm and memcpy, {tp_rounds} rounds ...",
              file=sys.stderr, flush=True)
        out["throughput"] = uvloop.run(throughput(mib * MIB, block, tp_rounds))
    out["isolation"] = {}
    for backend in backends:
        print(f"isolation over {backend}: {rounds} idle/busy rounds ...", file=sys.stderr, flush=True)
        load0 = loadavg()
        r = isolation(backend, 64 * MIB, block, layer_blocks, samples, rounds)
        load = f"  (load average {_load(load0)} before, {_load(loadavg())} after)"
        out["isolation"][backend] = {
            "piece_kib": block // 1024, "layer_blocks": layer_blocks,
            "one_block_s": vars(r.single), "one_layer_s": vars(r.layer),
            "bulk_alone_gb_s": r.bulk_alone, "bulk_beside_latency_gb_s": r.bulk_busy,
            "lines": report(r, block, layer_blocks) + [load]}
    if floor:
        from .bench_floor import floor_lines, floors

        print(f"host floor: {rounds} idle/busy rounds ...", file=sys.stderr, flush=True)
        load0 = loadavg()
        f = floors({"one block": block, f"layer of {layer_blocks}": block * layer_blocks}, samples, rounds)
        out["floor"] = {"figures": {k: {n: vars(v) for n, v in rows.items()} for k, rows in f.items()},
                        "lines": floor_lines(f) + [f"  (load average {_load(load0)} before, {_load(loadavg())} after)"]}
    return out


def _load(xs: list[float]) -> str:
    return "/".join(f"{x:.2f}" for x in xs) or "?"


def lines(fig: dict) -> list[str]:
    out = throughput_lines(fig["throughput"]) if "throughput" in fig else []
    for iso in fig["isolation"].values():
        out += iso["lines"]
    return out + (fig["floor"]["lines"] if "floor" in fig else [])


def build_parser() -> argparse.ArgumentParser:
    from dualpath.cli import HelpFormatter

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("--mib", type=int, default=64, help="throughput: MiB moved per backend")
    ap.add_argument("--block-kib", type=int, default=96, help="piece size in KiB (one layer block)")
    ap.add_argument("--samples", type=int, default=150, help="isolation: pulls timed per round")
    ap.add_argument("--layer-blocks", type=int, default=16, help="hit blocks pulled per layer")
    ap.add_argument("--backends", default="tcp,shm", help="comma-separated backends for the isolation figures")
    ap.add_argument("--rounds", type=int, default=3, help="isolation: idle/busy rounds; figures are medians")
    ap.add_argument("--tp-rounds", type=int, default=5, help="throughput: rounds of every variant; figures are medians")
    ap.add_argument("--no-throughput", action="store_true", help="skip the throughput figures")
    ap.add_argument("--floor", action="store_true", help="also time the pulls with no transport code beside bulk")
    return ap


def main() -> None:
    ap = build_parser()
    args = ap.parse_args()
    np.random.seed(0)
    fig = figures(args.mib, args.block_kib << 10, args.layer_blocks, args.samples, args.rounds,
                  tuple(args.backends.split(",")), not args.no_throughput, args.tp_rounds, args.floor)
    print("\n".join(lines(fig)))


if __name__ == "__main__":  # one benchmark at a time; its load and CPU said at the end
    from shared.benchrun import alone

    raise SystemExit(alone("shared.transport.bench", lambda conditions: main()))
