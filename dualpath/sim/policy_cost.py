"""Decision cost of the policy per request, measured on synthetic states of N engines."""
from __future__ import annotations

import random
import time
from collections import deque

from shared.sched.policy import (EngineReport, PeThresholds, Request, assign_decode,
                                       assign_prefill, choose_path, pick_de_group, split_read)


def measure(engines: int = 1000, requests: int = 1000, repeat: int = 5, seed: int = 0) -> dict[str, float]:
    rng = random.Random(seed)
    reqs = [Request(i, rng.randint(1000, 60000), rng.randint(1000, 60000)) for i in range(requests)]
    pe = [EngineReport(i, i // 8, rng.randint(0, 9), rng.randint(0, 10**6), rng.randint(0, 4 * 10**6))
          for i in range(engines)]
    de = [EngineReport(i, i // 8, rng.randint(0, 60), rng.randint(0, 10**6), 0, rng.randint(10**5, 10**6))
          for i in range(engines)]
    groups = {g: rng.randint(0, 10**7) for g in range(max(1, engines // 8))}
    th = PeThresholds(alpha=3 * 10**6, beta=10**9)
    out = {}
    out["pe_assign_us"] = _time(lambda: assign_prefill(deque(reqs), pe, th), repeat) / requests
    out["de_assign_one_group_us"] = _time(
        lambda: assign_decode(deque(reqs), de, lookahead=requests), repeat) / requests
    per = 8  # realistic: one node per group -> level 1 over engines/8 groups, level 2 in 8
    chunks = [de[i:i + per] for i in range(0, engines, per)]

    def grouped():
        for k, rep in enumerate(chunks):
            pick_de_group(groups)
            assign_decode(deque(reqs[k * per:(k + 1) * per]), rep)
    out["de_assign_groups_of_8_us"] = _time(grouped, repeat) / min(requests, engines)
    pe_chunks = [pe[i:i + per] for i in range(0, engines, per)]

    def pe_grouped():
        q = deque(reqs)
        for rep in pe_chunks:
            assign_prefill(q, rep, PeThresholds(th.alpha, 2 * 10**6))
    out["pe_assign_groups_of_8_us"] = _time(pe_grouped, repeat) / requests
    qs = [(rng.randint(0, 10**6), rng.randint(0, 10**6)) for _ in range(requests)]
    out["path_us"] = _time(lambda: [(choose_path(a, b), split_read(500, a, b)) for a, b in qs], repeat) / requests
    return out


def _time(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e6


if __name__ == "__main__":
    for k, v in measure().items():
        print(f"{k}: {v:.2f} us/request")
