"""docs/reference/: each generated page is what `python -m dualpath.docgen` makes now, and complete.

Current: a new setting, flag, metric or module without a regenerated page fails here. Complete:
every config field is a row of settings.md, every `dualpath` subcommand and flag and every
`python -m` tool has its section in cli.md, every series the services register is in metrics.md
(the registries the cheap parts build, and every definition call the reader could miss).
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import re
from types import SimpleNamespace

import pytest

import dualpath.docgen as docgen
from dualpath.docgen import __main__ as docgen_main
from dualpath.docgen import cli as cli_page
from dualpath.docgen import metrics as metrics_page
from dualpath.docgen import settings as settings_page
from dualpath.docgen.common import ROOT

pytestmark = pytest.mark.unit

PAGES = docgen.pages()


@pytest.mark.parametrize("path", sorted(PAGES), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_each_generated_page_is_current(path):
    assert path.exists() and path.read_text() == PAGES[path](), (
        f"{path.relative_to(ROOT)} is stale: run .venv/bin/python -m dualpath.docgen --write (make docs)")


def test_check_names_a_stale_page_and_write_makes_it_current(tmp_path, monkeypatch, capsys):
    page = tmp_path / "page.md"
    page.write_text("old\n")
    monkeypatch.setattr(docgen, "pages", lambda: {page: lambda: "new\n"})
    monkeypatch.setattr(docgen_main, "pages", docgen.pages)
    monkeypatch.setattr(docgen_main, "ROOT", tmp_path)
    assert docgen_main.main(["--check"]) == 1
    assert "stale: page.md" in capsys.readouterr().err
    assert docgen_main.main(["--write"]) == 0 and page.read_text() == "new\n"
    assert docgen_main.main(["--check"]) == 0


# --- settings.md -------------------------------------------------------------------------------

def test_settings_md_has_every_field_of_every_config_class_with_its_env_and_flag():
    text = settings_page.PAGE.read_text()
    for cls, _ in settings_page.SECTIONS.values():
        for f in dataclasses.fields(cls):
            row = re.search(rf"^\| `{f.name}` \|.*$", text, re.M)
            assert row, f"settings.md has no row for {cls.__name__}.{f.name}"
            assert f"`DUALPATH_{f.name.upper()}`" in row.group(0) and f"`--{f.name.replace('_', '-')}`" in row.group(0)


def test_every_setting_has_a_meaning():
    bare = [f"{cls.__name__}.{f.name}" for cls, _ in settings_page.SECTIONS.values()
            for f in dataclasses.fields(cls) if not settings_page.describe(cls, f.name)]
    assert not bare, f"give these fields a `# comment` (their meaning in --help and settings.md): {bare}"


# --- cli.md ------------------------------------------------------------------------------------

def commands(parser: argparse.ArgumentParser, title: str):
    yield title, parser
    for name, _, sub in cli_page.subcommands(parser):
        yield from commands(sub, f"{title} {name}")


def sections(text: str) -> dict[str, str]:
    """`command` heading -> the text under it (to the next heading)."""
    parts = re.split(r"^#{2,4} `([^`]+)`\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_cli_md_has_every_subcommand_and_tool_with_each_flag():
    from dualpath.cli import build_parser

    found = sections(cli_page.PAGE.read_text())
    tools = [(f"python -m {m}", cli_page.importlib.import_module(m).build_parser()) for m in cli_page.TOOLS]
    for title, parser in [*commands(build_parser(), "dualpath"), *tools]:
        assert title in found, f"cli.md has no section for `{title}`"
        for action in parser._actions:
            for option in action.option_strings:
                if option not in ("-h", "--help"):
                    assert f"`{option}`" in found[title], f"cli.md: `{title}` lacks {option}"


def test_cli_md_points_dualpath_service_to_the_settings():
    assert "[settings.md](settings.md)" in sections(cli_page.PAGE.read_text())["dualpath service"]


# --- metrics.md --------------------------------------------------------------------------------

def registered() -> set[str]:
    """Every family name the cheaply built parts register (as scraped: counters with _total)."""
    from services.prefill_engine.metrics import PrefillMetrics
    from services.scheduler.metrics import SchedulerMetrics
    from services.traffic_manager.transfers import Transfers
    from shared.metrics import Metrics
    from shared.runtime import BusCounters, Service
    from shared.service_config import CommonConfig

    class Bare(Service):
        def announce(self):
            return None

        async def start(self):
            return None

    regs = [Bare(CommonConfig()).metrics, *(Metrics(s) for s in ("scheduler", "prefill_engine", "traffic_manager"))]
    regs[0].registry.register(BusCounters(SimpleNamespace(bad_messages=0, handler_errors=0)))
    SchedulerMetrics.register(regs[1])
    PrefillMetrics(regs[2], "e0")
    Transfers().expose(regs[3])
    return {f.name + ("_total" if f.type == "counter" else "") for m in regs for f in m.registry.collect()}


def test_metrics_md_has_every_registered_series():
    text = metrics_page.PAGE.read_text()
    names = registered()
    assert len(names) > 20
    missing = sorted(n for n in names if f"| `{n}` |" not in text)
    assert not missing, f"metrics.md lacks {missing}"
    for s in metrics_page.definitions():
        assert f"| `{s.name}` | {s.kind} |" in text, s


def test_the_metrics_reader_misses_no_definition():
    """Each line that calls a Metrics helper is a definition the reader turned into series."""
    pattern = re.compile(r"\.(counter|gauge|histogram|live_gauge)\(|\b(Counter|Gauge)MetricFamily\(")
    for path in metrics_page.sources():
        text = path.read_text()
        read = {node.lineno for node in ast.walk(ast.parse(text))
                if isinstance(node, ast.Call) and metrics_page.series_of(path, node)}
        lines = {n for n, line in enumerate(text.splitlines(), 1) if pattern.search(line.split("#")[0])}
        assert lines <= read, f"{path.relative_to(ROOT)}: lines {sorted(lines - read)} define series the reader missed"


def test_the_metrics_page_keeps_its_prose_and_the_tiers_anchor():
    text = metrics_page.PAGE.read_text()
    assert text.index("## Prompt-token tiers") < text.index(metrics_page.MARK)
    assert "../../README.md#glossary" in text.split("\n\n", 2)[1]
