"""A run's figures under `vllm bench serve`'s JSON keys and definitions.

A request is a turn that did not fail; times in ms as vLLM gives them. Pure.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

import numpy as np

GOODPUT_KEYS = ("ttft", "tpot", "e2el")
SECTIONS = (("ttft", "TTFT", "Time to First Token"), ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
            ("itl", "ITL", "Inter-token Latency"), ("e2el", "E2EL", "End-to-end Latency"))


class MeasuredTurn(Protocol):
    prompt_tokens: int
    gen_tokens: int
    ttft: float
    error: str

    @property
    def e2el(self) -> float: ...

    @property
    def itl(self) -> list[float]: ...


@dataclass(frozen=True, slots=True)
class Spec:
    percentiles: tuple[float, ...] = (99.0,)  # --metric-percentiles
    goodput_ms: tuple[tuple[str, float], ...] = ()  # --goodput: (ttft|tpot|e2el, SLO in ms)


def parse_percentiles(text: str) -> tuple[float, ...]:
    """`--metric-percentiles 50,90,99` -> (50.0, 90.0, 99.0); ValueError naming a bad one."""
    out = []
    for word in text.split(","):
        try:
            p = float(word)
        except ValueError:
            p = math.nan
        if not 0 <= p <= 100:
            raise ValueError(f"{word.strip()!r} is not a percentile in [0, 100]")
        out.append(p)
    return tuple(out)


def parse_goodput(pairs: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """`--goodput ttft:500 tpot:50` -> (("ttft", 500.0), ("tpot", 50.0)); ValueError naming a bad pair."""
    slos: dict[str, float] = {}
    for pair in pairs:
        key, sep, value = pair.partition(":")
        if not sep:
            raise ValueError(f"{pair!r} is not KEY:VALUE (KEY one of {', '.join(GOODPUT_KEYS)}, VALUE in ms)")
        if key not in GOODPUT_KEYS:
            raise ValueError(f"{key!r} in {pair!r} is not one of {', '.join(GOODPUT_KEYS)}")
        try:
            ms = float(value)
        except ValueError:
            ms = math.nan
        if not ms >= 0:
            raise ValueError(f"{value!r} in {pair!r} is not a number of ms >= 0")
        slos[key] = ms
    return tuple(slos.items())


def p_word(p: float) -> str:
    """vLLM's name of a percentile in its keys: 99 -> "99", 99.9 -> "99.9"."""
    return str(int(p)) if int(p) == p else str(p)


def stats(name: str, seconds: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    """mean_/median_/std_/pN_<name>_ms of the finite values, in ms."""
    xs = [v for v in seconds if math.isfinite(v)] or [0.0]
    out = {f"mean_{name}_ms": float(np.mean(xs)) * 1000, f"median_{name}_ms": float(np.median(xs)) * 1000,
           f"std_{name}_ms": float(np.std(xs)) * 1000}
    for p in percentiles:
        out[f"p{p_word(p)}_{name}_ms"] = float(np.percentile(xs, p)) * 1000
    return out


def tpot(turn: MeasuredTurn) -> float:
    """(e2el - ttft) / (tokens - 1); nan with one token."""
    n = turn.gen_tokens - 1
    return (turn.e2el - turn.ttft) / n if n > 0 else math.nan


def good(turn: MeasuredTurn, goodput_ms: Iterable[tuple[str, float]]) -> bool:
    """The request meets every SLO given (a one-token request's tpot counts as 0, as in vLLM)."""
    got = {"ttft": turn.ttft, "e2el": turn.e2el, "tpot": tpot(turn) if turn.gen_tokens > 1 else 0.0}
    return all(got[key] <= ms / 1000 for key, ms in goodput_ms)


def figures(turns: Iterable[MeasuredTurn], duration_s: float, spec: Spec = Spec()) -> dict:
    """The run's vLLM-named figures: counts, throughputs and the four latency distributions."""
    ok = [t for t in turns if not t.error]
    n_in, n_out = sum(t.prompt_tokens for t in ok), sum(t.gen_tokens for t in ok)

    def per_s(count: int) -> float:
        return count / duration_s if duration_s > 0 else math.nan

    out: dict = {"duration": duration_s, "completed": len(ok), "total_input_tokens": n_in,
                 "total_output_tokens": n_out, "request_throughput": per_s(len(ok)),
                 "request_goodput": per_s(sum(good(t, spec.goodput_ms) for t in ok)) if spec.goodput_ms else None,
                 "output_throughput": per_s(n_out), "total_token_throughput": per_s(n_in + n_out)}
    values = {"ttft": [t.ttft for t in ok], "tpot": [tpot(t) for t in ok if t.gen_tokens > 1],
              "itl": [gap for t in ok for gap in t.itl], "e2el": [t.e2el for t in ok]}
    for name, _, _ in SECTIONS:
        out.update(stats(name, values[name], spec.percentiles))
    return out
