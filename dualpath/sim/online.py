"""The online run's SLO judge and stop rule: TTFT and TPOT per window, checked as the run goes.

A window over the SLO stops the run as failed; one within `steady_tol` of the window
`steady_lag_s` earlier stops it as steady; `max_s` caps it. O(1) per check.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Window:
    arrived: int = 0
    arrive_sum: float = 0.0  # sum of arrival times
    firsts: int = 0  # arrivals of this window with a first token
    first_arrive_sum: float = 0.0
    ttft_sum: float = 0.0
    done: int = 0  # requests finished in this window (TPOT)
    tpot_sum: float = 0.0


@dataclass(frozen=True)
class Verdict:
    stop_s: float  # simulated time the run stopped
    reason: str  # "ttft over SLO", "tpot over SLO", "steady", "cap"
    ok: bool  # the arrival rate meets the SLO
    ttft_s: float  # the deciding window's TTFT
    tpot_s: float
    windows: tuple[tuple[float, float, float], ...]  # (end, TTFT, TPOT) of each judged window


class StopRule:
    def __init__(self, window_s: float, lag_s: float, tol: float, slo_ttft_s: float, slo_tpot_s: float,
                 max_s: float) -> None:
        if window_s <= 0 or lag_s < 0 or max_s <= 0:
            raise ValueError(f"window {window_s}, lag {lag_s}, cap {max_s}: need window, cap > 0 and lag >= 0")
        self.w, self.lag, self.tol = window_s, lag_s, tol
        self.slo_ttft, self.slo_tpot, self.max_s = slo_ttft_s, slo_tpot_s, max_s
        self.win: dict[int, Window] = {}
        self.judged: list[tuple[float, float, float]] = []
        self.verdict: Verdict | None = None

    def _at(self, t: float) -> Window:
        k = int(t // self.w)
        got = self.win.get(k)
        if got is None:
            got = self.win[k] = Window()
        return got

    # what the simulation reports ---------------------------------------------------------
    def arrived(self, t: float) -> None:
        w = self._at(t)
        w.arrived += 1
        w.arrive_sum += t

    def first_token(self, t_arrive: float, ttft: float) -> None:
        w = self._at(t_arrive)
        w.firsts += 1
        w.first_arrive_sum += t_arrive
        w.ttft_sum += ttft

    def finished(self, t: float, tpot: float) -> None:
        w = self._at(t)
        w.done += 1
        w.tpot_sum += tpot

    # the rule -----------------------------------------------------------------------------
    def check(self, t: float) -> Verdict | None:
        """Judge the window ending at `t` (a multiple of the window length); a verdict stops the run."""
        k = round(t / self.w) - 1
        ttft, tpot = self._ttft(k, t), self._tpot(k)
        self.judged.append((t, ttft, tpot))
        v = None
        if ttft > self.slo_ttft:
            v = self._stop(t, "ttft over SLO", False, ttft, tpot)
        elif tpot > self.slo_tpot:
            v = self._stop(t, "tpot over SLO", False, ttft, tpot)
        else:
            back = k - round(self.lag / self.w)
            if self.lag and back >= 0:
                before = self._ttft(back, t)
                if before == before and abs(ttft - before) <= self.tol * before:
                    v = self._stop(t, "steady", True, ttft, tpot)
            if v is None and t >= self.max_s - 1e-9:  # a window without arrivals proves nothing
                v = self._stop(t, "cap", ttft == ttft, ttft, tpot)
        self.verdict = v
        return v

    def _stop(self, t: float, reason: str, ok: bool, ttft: float, tpot: float) -> Verdict:
        return Verdict(t, reason, ok, ttft, tpot, tuple(self.judged))

    def _ttft(self, k: int, now: float) -> float:
        w = self.win.get(k)
        if w is None or not w.arrived:
            return float("nan")
        waiting = w.arrived - w.firsts
        wait_sum = waiting * now - (w.arrive_sum - w.first_arrive_sum)
        return (w.ttft_sum + wait_sum) / w.arrived

    def _tpot(self, k: int) -> float:
        w = self.win.get(k)
        return w.tpot_sum / w.done if w is not None and w.done else float("nan")
