"""Prefill-engine assignment: Algorithm 1 of the paper."""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from typing import Sequence

from shared.sched.policy.types import EngineAssignment, EngineClass, EngineReport, Request


@dataclass(frozen=True, slots=True)
class PeThresholds:
    alpha: int  # a node's read queue at or below this is short (tokens)
    beta: int  # an engine above this tok_e is overloaded


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
    """Hand out requests from the head of `queue` (popped) to the pulling group's engines: each to the
    class-2 engine with the smallest tok_e, else to a class-3 one; ties to the engine listed first."""
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
