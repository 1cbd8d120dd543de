"""`make mutants`: mutmut over the data path, the policy and the planner, then the score per module.

Runs under the bench lock (it takes every core); mutants named in tests/mutants_equivalent.toml are
left out of the score, each with its reason. Writes docs/results/data/mutants.json for the results.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tomllib
from pathlib import Path

from shared.benchrun import alone

ROOT = Path(__file__).resolve().parents[1]
EQUIVALENT = ROOT / "tests" / "mutants_equivalent.toml"
REPORT = ROOT / "docs" / "results" / "data" / "mutants.json"
KILLED = {"killed", "timeout", "caught by type check", "segfault"}  # the tests noticed
UNCOUNTED = {"skipped", "not checked"}


def statuses(tree: Path) -> dict[str, dict[str, str]]:
    """Module path -> {mutant name: status} from mutmut's result files under `tree` (mutants/)."""
    from mutmut.stats import status_by_exit_code  # installed by `make mutants` only
    out = {}
    for meta in sorted(tree.rglob("*.py.meta")):
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        out[meta.relative_to(tree).as_posix().removesuffix(".meta")] = {
            name: status_by_exit_code[code] for name, code in codes.items()}
    return out


def equivalent() -> dict[str, str]:
    """Mutant name -> why no test can tell it from the original."""
    return tomllib.loads(EQUIVALENT.read_text())["equivalent"] if EQUIVALENT.exists() else {}


def score(found: dict[str, dict[str, str]], same: dict[str, str]) -> tuple[list[dict], list[dict]]:
    """(a row per module, the survivors): killed over mutants counted, equivalent ones left out."""
    rows, survivors = [], []
    for module, mutants in found.items():
        counted = {n: s for n, s in mutants.items() if s not in UNCOUNTED and n not in same}
        killed = sum(s in KILLED for s in counted.values())
        survivors += [{"module": module, "mutant": n, "status": s} for n, s in counted.items() if s not in KILLED]
        rows.append({"module": module, "mutants": len(mutants), "counted": len(counted), "killed": killed,
                     "equivalent": sum(n in same for n in mutants),
                     "score": killed / len(counted) if counted else 1.0})
    return rows, survivors


def summary(rows: list[dict]) -> float:
    counted = sum(r["counted"] for r in rows)
    return sum(r["killed"] for r in rows) / counted if counted else 1.0


def show(rows: list[dict], survivors: list[dict]) -> None:
    print(f"{'module':46} {'mutants':>7} {'checked':>7} {'killed':>7} {'equiv':>6} {'score':>6}")
    for r in rows:
        print(f"{r['module']:46} {r['mutants']:7d} {r['counted']:7d} {r['killed']:7d} {r['equivalent']:6d} "
              f"{r['score']:6.1%}")
    print(f"{'all':46} {sum(r['mutants'] for r in rows):7d} {sum(r['counted'] for r in rows):7d} "
          f"{sum(r['killed'] for r in rows):7d} {sum(r['equivalent'] for r in rows):6d} {summary(rows):6.1%}")
    for s in survivors:
        print(f"survived: {s['mutant']} ({s['status']})  see: mutmut show {s['mutant']}")


def run(args: argparse.Namespace, cond) -> int:
    if not args.no_run:
        done = subprocess.run([str(Path(sys.executable).parent / "mutmut"), "run", "--max-children",
                               str(args.children)], cwd=ROOT)
        if done.returncode:
            print(f"mutants: mutmut run exited with {done.returncode}", file=sys.stderr)
            return done.returncode
    same = equivalent()
    rows, survivors = score(statuses(ROOT / "mutants"), same)
    show(rows, survivors)
    cond.measure()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"modules": rows, "survivors": survivors, "score": summary(rows),
                                     "equivalent": same, "conditions": cond.report()}, indent=1) + "\n")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dualpath.mutants", description=__doc__.splitlines()[0])
    p.add_argument("--no-run", action="store_true", help="only score the last run's results under mutants/")
    p.add_argument("--children", type=int, default=2, help="mutants tested at once (mutmut --max-children)")
    p.add_argument("--json", type=Path, default=REPORT, help="where the report goes (the results pages read it)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return alone("mutants", lambda cond: run(args, cond))


if __name__ == "__main__":
    raise SystemExit(main())
