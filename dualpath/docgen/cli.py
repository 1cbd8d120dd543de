"""docs/reference/cli.md: every `dualpath` subcommand and `python -m` tool with each flag's default and help.

Read from the argparse parsers themselves (built, walked, never run): `dualpath.cli.build_parser`
and each tool module's `build_parser()`. `dualpath service NAME` points to settings.md.
"""
from __future__ import annotations

import argparse
import importlib

from dualpath.docgen.common import REFERENCE, cell, code, heading, table

PAGE = REFERENCE / "cli.md"
TOOLS = (  # `python -m` modules users run, each with a side-effect-free build_parser()
    "dualpath.bench.chaos", "dualpath.bench.device", "dualpath.bench.fleet", "dualpath.bench.layerwise",
    "dualpath.bench.netfaults", "dualpath.bench.overhead", "dualpath.bench.sensitivity", "dualpath.bench.soak",
    "dualpath.sim.speed", "kernels.bench", "services.storage_gateway.bench", "shared.transport.bench",
)
INTRO = [
    "Every command also takes `-h`/`--help`, which prints the same. A default left blank is none (a",
    "switch is off, a value unset: the help says what that means); \"one required\": give one flag of",
    "those so marked in that command.",
    "",
]
SERVICE_NOTE = ("Each service's flags are its settings, one per setting (`--kv-blocks`, ...): see "
                "[settings.md](settings.md); `--config FILE` reads a TOML file ([configuration.md](configuration.md)).")


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each subcommand of `parser`, in the order they were added."""
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            out += [(name, helps.get(name, ""), sub) for name, sub in action.choices.items()]
    return out


def default(action: argparse.Action) -> str:
    value = action.default
    if action.required and action.option_strings:
        return "required"
    if value is None or value is False or value is argparse.SUPPRESS or value in ("", [], ()):
        return ""
    if isinstance(value, (list, tuple)):
        return code(" ".join(str(v) for v in value))
    return code(getattr(value, "value", value))


def help_text(action: argparse.Action, prog: str) -> str:
    """The action's help as --help prints it (`%(default)s` filled in), plus its choices."""
    text = action.help or ""
    params = {k: v for k, v in dict(vars(action), prog=prog).items() if v is not argparse.SUPPRESS}
    if isinstance(params.get("choices"), (list, tuple, dict, set, frozenset)):
        params["choices"] = ", ".join(str(c) for c in params["choices"])
    try:
        text = text % params
    except (KeyError, TypeError, ValueError):
        pass
    if action.choices and not isinstance(action, argparse._SubParsersAction):
        shown = [str(c) for c in action.choices]
        if not all(c in text for c in shown):
            text += f" (one of: {', '.join(shown)})"
    return cell(text)


def flag_rows(parser: argparse.ArgumentParser) -> list[tuple[str, str, str]]:
    """(flag, default, help) of each argument; one of a required group's says so."""
    rows = []
    either = {id(a) for g in parser._mutually_exclusive_groups if g.required for a in g._group_actions}
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._SubParsersAction)) or a.help is argparse.SUPPRESS:
            continue
        name = ", ".join(code(o) for o in a.option_strings) or code((a.metavar or a.dest).upper())
        rows.append((name, "one required" if id(a) in either else default(a), help_text(a, parser.prog)))
    return rows


def command(title: str, about: str, parser: argparse.ArgumentParser, depth: int = 2) -> list[str]:
    """The section of one command and, below it, of each of its subcommands."""
    lines = [f"{'#' * depth} {code(title)}", "", cell(about), ""]
    rows = flag_rows(parser)
    lines += table(("flag", "default", "help"), rows) if rows else []
    if title == "dualpath service":
        lines += [SERVICE_NOTE, ""]
    for name, about_sub, sub in subcommands(parser):
        lines += command(f"{title} {name}", about_sub or first_line(sub.description), sub, min(depth + 1, 4))
    return lines


def first_line(text: str | None) -> str:
    return " ".join((text or "").strip().split("\n\n")[0].split())


def render() -> str:
    from dualpath.cli import build_parser

    lines = heading("Command line", "the argparse parsers (`dualpath.cli.build_parser` and each tool's "
                    "`build_parser()`)", INTRO)
    top = build_parser()
    lines += ["## `dualpath`", "", cell(first_line(top.description)), ""]
    for name, about, sub in subcommands(top):
        lines += command(f"dualpath {name}", about, sub, 3)
    lines += ["## `python -m` tools", ""]
    for module in TOOLS:
        parser = importlib.import_module(module).build_parser()
        lines += command(f"python -m {module}", first_line(parser.description), parser, 3)
    return "\n".join(lines).rstrip() + "\n"


PAGES = {PAGE: render}
