"""Decode-engine assignment: the pool to a DE group, then requests to its engines."""
from __future__ import annotations

from collections import deque
from itertools import islice
from typing import Mapping, Sequence

from shared.sched.policy.types import EngineAssignment, EngineReport, Request

Z_FACTOR = 1.05
LOOKAHEAD = 16  # queue entries scanned past |R| for requests that still fit somewhere


def pick_de_group(group_tokens: Mapping[int, int]) -> int:
    """Level 1: the DE group with the smallest total tok (ties: smallest group id)."""
    if not group_tokens:
        raise ValueError("pick_de_group needs at least one DE group")
    return min(group_tokens.items(), key=lambda kv: (kv[1], kv[0]))[0]


def fit_count(queue: deque[Request], free_total: int) -> int:
    """|R|: how many requests from the head would fit if memory had no fragmentation."""
    used = n = 0
    for req in queue:
        if used + req.mem > free_total:
            break
        used += req.mem
        n += 1
    return n


def z_threshold(queue: deque[Request], reports: Sequence[EngineReport], factor: float = Z_FACTOR) -> float:
    """Z = factor * (sum of len(r) over R + sum of tok_e) / |engines|."""
    n = fit_count(queue, sum(r.free_mem for r in reports))
    r_tokens = sum(queue[i].tokens for i in range(n))
    return factor * (r_tokens + sum(r.tokens for r in reports)) / len(reports)


def assign_decode(
    queue: deque[Request],
    reports: Sequence[EngineReport],
    factor: float = Z_FACTOR,
    lookahead: int = LOOKAHEAD,
) -> list[EngineAssignment]:
    """Level 2 for one DE group: removes the placed requests from `queue`, the rest keep their place.
    Prefers fitting engines that stay at or below Z (fewest seq_e first), else the smallest tok_e."""
    if not reports or not queue:
        return []
    tok = [r.tokens for r in reports]
    seq = [r.seq for r in reports]
    free = [r.free_mem for r in reports]
    n_fit = fit_count(queue, sum(free))
    limit = n_fit + lookahead
    roomiest = max(free)
    if all(r.mem > roomiest for r in islice(queue, limit)):
        return []  # nothing in the scan window fits anywhere (the scan below would keep them all)
    z = factor * (sum(queue[i].tokens for i in range(n_fit)) + sum(tok)) / len(reports)
    out: list[EngineAssignment] = []
    kept: list[Request] = []
    scanned = 0
    with_room = sum(1 for f in free if f > 0)
    while queue and scanned < limit and with_room:
        req = queue.popleft()
        scanned += 1
        # a request larger than every engine's free memory fits none (what _choose_engine would
        # find engine by engine): kept without the scan, the common case while memory is full
        i = _choose_engine(req, tok, seq, free, z) if req.mem <= roomiest else -1
        if i < 0:
            kept.append(req)
            continue
        tok[i] += req.tokens
        seq[i] += 1
        if free[i] > 0 and free[i] - req.mem <= 0:
            with_room -= 1
        free[i] -= req.mem
        if free[i] + req.mem == roomiest:
            roomiest = max(free)
        out.append(EngineAssignment(req.rid, reports[i].engine))
    queue.extendleft(reversed(kept))
    return out


def _choose_engine(req: Request, tok: list[int], seq: list[int], free: list[int], z: float) -> int:
    """Index of the engine for `req`, or -1 when no engine's free memory fits it."""
    best_low = best_high = -1
    for i in range(len(tok)):
        if free[i] < req.mem:
            continue
        if tok[i] + req.tokens <= z:
            if best_low < 0 or (seq[i], tok[i]) < (seq[best_low], tok[best_low]):
                best_low = i
        elif best_high < 0 or (tok[i], seq[i]) < (tok[best_high], seq[best_high]):
            best_high = i
    return best_low if best_low >= 0 else best_high
