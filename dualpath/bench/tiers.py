"""The bench's prompt-token tiers: each run's prompt tokens by where their KV came from.

Summed from every successful turn's `dualpath_tiers`. Pure: dicts in, lines out.
"""
from __future__ import annotations

from shared.tiers import NAMES


def sums(turns) -> dict[str, int]:
    """Per-tier sums over `turns`, plus `turns_without_tiers` (left out of the sums)."""
    out = {name: 0 for name in NAMES}
    without = 0
    for t in turns:
        if not t.tiers:
            without += 1
            continue
        for name in NAMES:
            out[name] += int(t.tiers.get(name, 0))
    out["turns_without_tiers"] = without
    return out


def markdown(doc: dict) -> list[str]:
    """One row per run: each tier's tokens and its share of the run's prompt tokens."""
    runs = [r for r in doc["runs"] if r.get("tiers")]
    if not runs:
        return []
    lines = ["## Prompt tokens by tier (each turn's usage: where the prompt's KV came from)", "",
             "| mode | kind | APS | repeat | " + " | ".join(NAMES) + " | turns without |",
             "|---" * (len(NAMES) + 5) + "|"]
    for r in runs:
        t = r["tiers"]
        whole = sum(t.get(name, 0) for name in NAMES)
        cells = [f"{t.get(name, 0)} ({t.get(name, 0) / whole:.0%})" if whole else "0" for name in NAMES]
        lines.append(f"| {r['mode']} | {r['kind']} | {r['aps'] if r.get('aps') else '-'} | {r.get('repeat', 0)} | "
                     + " | ".join(cells) + f" | {t.get('turns_without_tiers', 0)} |")
    return lines + [""]
