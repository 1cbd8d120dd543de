"""The `dualpath` command: one argparse tree; each tool registers its own subcommand.

Each tool module exposes `register(subparsers)` which adds its parser and sets
`func=<callable(args) -> int>`. Tool modules are imported only when listed here,
and each keeps its heavy imports inside its `func`, so `dualpath --help` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import sys

# subcommand -> module that defines register(subparsers)
TOOLS = {
    "up": "dualpath.up",
    "service": "dualpath.service_cli",
    "plan": "dualpath.plan.cli",
    "sim": "dualpath.sim.cli",
    "bench": "dualpath.bench.cli",
}


class CliError(Exception):
    """A bad command-line value; printed as `dualpath: error: ...` with exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dualpath", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, module in TOOLS.items():
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):
                continue  # tool not installed in this build
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        parser.exit(2, f"dualpath: error: {exc}\n")
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
