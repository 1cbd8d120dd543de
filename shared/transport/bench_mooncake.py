"""`python -m shared.transport.bench_mooncake`: Mooncake's transfer engine beside our tcp backend."""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from .bench_throughput import LAYOUTS, MIB, RawSocket, Rig, Tally, drop_pair, loadavg, shm_pair, slots


class Mooncake:
    def __init__(self, total: int) -> None:
        from mooncake.engine import TransferEngine

        self.a, self.b = TransferEngine(), TransferEngine()
        for e in (self.a, self.b):
            if e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
                raise RuntimeError("mooncake: initialize failed")
        self.regions = shm_pair(total)  # page-aligned, as every mover's (bench_throughput.shm_pair)
        self.src, self.dst = (np.frombuffer(r.buf, np.uint8) for r in self.regions)
        if self.a.register_memory(self.src.ctypes.data, total) or self.b.register_memory(self.dst.ctypes.data, total):
            raise RuntimeError("mooncake: register_memory failed")
        self.peer = f"127.0.0.1:{self.b.get_rpc_port()}"

    def seconds(self, block: int, dst: list[int]) -> float:
        srcs = [self.src.ctypes.data + i * block for i in range(len(dst))]
        dsts = [self.dst.ctypes.data + j * block for j in dst]
        t = time.perf_counter()
        if self.a.batch_transfer_sync_write(self.peer, srcs, dsts, [block] * len(dst)) != 0:
            raise RuntimeError("mooncake: batch_transfer_sync_write failed")
        return time.perf_counter() - t

    def close(self) -> None:
        self.a.unregister_memory(self.src.ctypes.data)
        self.b.unregister_memory(self.dst.ctypes.data)
        del self.src, self.dst
        drop_pair(self.regions)

    def check(self, block: int, dst: list[int]) -> None:
        for i, j in enumerate(dst):
            if not np.array_equal(self.src[i * block : (i + 1) * block], self.dst[j * block : (j + 1) * block]):
                raise AssertionError(f"mooncake: piece {i} did not land at slot {j}")


async def compare(total: int, block: int, rounds: int) -> dict:
    n = total // block
    total = n * block
    layouts = {lay: slots(n, lay) for lay in LAYOUTS}
    tally = Tally()  # CPU: this process, every thread (the engine's too)
    times, cpu, note = tally.times, tally.cpu, tally.note
    load0 = loadavg()
    raw, mc = RawSocket(total), Mooncake(total)
    try:
        async with Rig("tcp", total) as tcp:
            ops = {lay: tcp.ops(block, dst) for lay, dst in layouts.items()}
            for lay, dst in layouts.items():  # warm-up
                await tcp.seconds(ops[lay])
                mc.seconds(block, dst)
            raw.seconds(block)
            for _ in range(max(1, rounds)):
                c = time.process_time()
                note("raw", raw.seconds(block), c)
                for lay, dst in layouts.items():
                    c = time.process_time()
                    note(f"tcp_{lay}", await tcp.seconds(ops[lay]), c)
                    c = time.process_time()
                    note(f"mooncake_{lay}", mc.seconds(block, dst), c)
            tcp.check(block, layouts["scattered"])
            mc.check(block, layouts["scattered"])
    finally:
        raw.close()
        mc.close()
    gb = total / 1e9
    out: dict = {"payload_mib": total // MIB, "rounds": len(times["raw"]), "loadavg_before": load0,
                 "loadavg_after": loadavg(), "raw_gb_s": gb / statistics.median(times["raw"])}
    out["cpu_ms"] = {k: 1e3 * statistics.median(v) for k, v in cpu.items()}
    for key in times:
        if key != "raw":
            out[f"{key}_gb_s"] = gb / statistics.median(times[key])
            out[f"{key}_over_raw_time"] = statistics.median(x / y for x, y in zip(times[key], times["raw"]))
    return out


def main() -> None:
    import uvloop

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64, help="MiB moved per mover per round")
    ap.add_argument("--block-kib", type=int, default=96, help="piece size in KiB")
    ap.add_argument("--rounds", type=int, default=7, help="rounds; figures are medians")
    args = ap.parse_args()
    r = uvloop.run(compare(args.mib * MIB, args.block_kib << 10, args.rounds))
    print(f"payload {r['payload_mib']} MiB in {args.block_kib} KiB pieces, medians of {r['rounds']} rounds, load "
          f"average {'/'.join(f'{x:.2f}' for x in r['loadavg_before'])} -> "
          f"{'/'.join(f'{x:.2f}' for x in r['loadavg_after'])}")
    ms = r["cpu_ms"]
    print(f"  raw socket                 {r['raw_gb_s']:6.2f} GB/s | CPU {ms['raw']:6.1f} ms")
    for lay in LAYOUTS:
        for mover in ("tcp", "mooncake"):
            print(f"  {mover + ' ' + lay:<26} {r[f'{mover}_{lay}_gb_s']:6.2f} GB/s | time over raw "
                  f"{r[f'{mover}_{lay}_over_raw_time']:.2f}x | CPU {ms[f'{mover}_{lay}']:6.1f} ms "
                  f"({ms[f'{mover}_{lay}'] / max(ms['raw'], 1e-6):.2f}x raw's)")


if __name__ == "__main__":
    main()
