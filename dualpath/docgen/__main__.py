"""`python -m dualpath.docgen [--write | --check]`: print, write or check the generated reference pages."""
from __future__ import annotations

import argparse
import sys

from dualpath.docgen import pages, stale
from dualpath.docgen.common import ROOT


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m dualpath.docgen",
                                 description="Generate the reference pages (docs/reference/) from their definitions; "
                                             "with no flag, list them and say which are stale.")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite every stale page")
    mode.add_argument("--check", action="store_true", help="exit 1 naming each stale page (for CI and tests)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    old = stale()
    for path in pages():
        name = path.relative_to(ROOT)
        if args.write and path in old:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(old[path])
            print(f"wrote {name}")
        elif args.check and path in old:
            print(f"stale: {name} (run: python -m dualpath.docgen --write)", file=sys.stderr)
        elif not args.write and not args.check:
            print(f"{name}: {'stale' if path in old else 'current'}")
    return 1 if args.check and old else 0


if __name__ == "__main__":
    sys.exit(main())
