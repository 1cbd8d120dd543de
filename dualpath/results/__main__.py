"""`python -m dualpath.results --write | --check`: the results pages from their reports, or whether they are current."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dualpath.results.common import ReportError
from dualpath.results.pages import RESULTS, stale, write


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dualpath.results",
                                description="the results pages (docs/results/) from the JSON reports in their data/")
    do = p.add_mutually_exclusive_group(required=True)
    do.add_argument("--write", action="store_true", help="write the pages and their plots")
    do.add_argument("--check", action="store_true", help="exit 1 naming each page that is not current")
    p.add_argument("--dir", type=Path, default=RESULTS, help="the results directory (its reports under data/)")
    args = p.parse_args(argv)
    try:
        if args.write:
            print("\n".join(f"wrote {args.dir / name}" for name in write(args.dir)))
            return 0
        problems = stale(args.dir)
    except ReportError as exc:
        print(f"dualpath.results: {exc}", file=sys.stderr)
        return 2
    for line in problems:
        print(f"{line} (make results)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
