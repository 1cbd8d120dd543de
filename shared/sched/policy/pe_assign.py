"""Prefill-engine assignment: Algorithm 1 of the paper (docs/concepts/design.md#prefill-engine-assignment-algorithm-1).

Owns the classification of a pulling PE group's engines and the FIFO hand-out of the
global queue's head. Does not choose the read path (read_path.py) or batch (intra_pe.py).

Example: alpha=100, beta=1000; engines A(tok 0, read_q 0) and B(tok 0, read_q 500).
A is class 2, B class 3. Requests r1(600), r2(600), r3(600) arrive: r1 -> A (class 2
first; A's tok becomes 600), r2 -> A (still class 2, tok 1200 > beta: A is now class 1),
r3 -> B (class 2 is empty, so class 3), and B takes from then on until it exceeds beta.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from shared.sched.policy.types import EngineAssignment, EngineClass, EngineReport, Request


@dataclass(frozen=True, slots=True)
class PeThresholds:
    """alpha: a short read queue (tokens a node reads from storage in ~3 s);
    beta: the token cap of one engine (tokens one GPU processes in ~5 s)."""

    alpha: int
    beta: int


def classify(report: EngineReport, tokens: int, th: PeThresholds) -> EngineClass:
    """Class of an engine whose current tok_e is `tokens`."""
    if tokens > th.beta:
        return EngineClass.OVERLOADED
    if report.read_q <= th.alpha:
        return EngineClass.IDEAL
    return EngineClass.DISK_PRESSURED


def assign_prefill(
    queue: deque[Request], reports: Sequence[EngineReport], th: PeThresholds
) -> list[EngineAssignment]:
    """Hand out requests from the head of `queue` to the pulling group's engines.

    Pops every assigned request from `queue`; the rest stay in order. Each request goes
    to the class-2 engine with the smallest tok_e, else the class-3 one; ties go to the
    engine listed first. Stops when the queue or both classes are empty.
    """
    ideal: list[tuple[int, int]] = []  # (tok_e, position in reports)
    pressured: list[tuple[int, int]] = []
    for i, rep in enumerate(reports):
        cls = classify(rep, rep.tokens, th)
        if cls is EngineClass.IDEAL:
            ideal.append((rep.tokens, i))
        elif cls is EngineClass.DISK_PRESSURED:
            pressured.append((rep.tokens, i))
    heapq.heapify(ideal)
    heapq.heapify(pressured)
    out: list[EngineAssignment] = []
    while queue and (ideal or pressured):
        heap = ideal if ideal else pressured
        tokens, i = heapq.heappop(heap)
        req = queue.popleft()
        out.append(EngineAssignment(req.rid, reports[i].engine))
        tokens += req.tokens
        if tokens <= th.beta:  # read_q is fixed during a pull, so the class is too
            heapq.heappush(heap, (tokens, i))
    return out
