"""The `dualpath` command: one argparse tree; each tool registers its own subcommand.

A tool module's `register(subparsers)` sets `func`; heavy imports stay inside `func`,
so `dualpath --help` stays fast.
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


class HelpFormatter(argparse.HelpFormatter):
    """Appends `(default: X)` to a flag's help unless the help names it or X is None, False or empty."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if (not action.option_strings or "default" in text or default is None or default is False
                or default is argparse.SUPPRESS or (isinstance(default, (str, list)) and not default)):
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose help shows defaults; subcommand parsers inherit the class."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="dualpath", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
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
