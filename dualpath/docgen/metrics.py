"""docs/reference/metrics.md: every Prometheus series the services export, read from their definitions.

Each `counter`/`gauge`/`histogram`/`live_gauge` call and metric family under services/ and shared/
is read with `ast`, owned by the service whose package holds it (shared/engine: both engines;
`shared=True` and families: every service). The prose above MARK is hand-written and kept.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from dualpath.docgen.common import REFERENCE, ROOT, cell, code, table
from shared.names import SERVICES

PAGE = REFERENCE / "metrics.md"
MARK = "<!-- generated below by python -m dualpath.docgen --write: edit above this line only -->"
EVERY = "every service"
ENGINES = ("prefill_engine", "decode_engine")  # what shared/engine/ registers, both engine services do
HELPERS = ("counter", "gauge", "histogram", "live_gauge")  # shared.metrics.Metrics' methods
FAMILIES = {"CounterMetricFamily": "counter", "GaugeMetricFamily": "gauge"}  # collectors' families


@dataclass(frozen=True)
class Series:
    owner: str  # a service's one name, or EVERY
    name: str  # as scraped: a counter's with `_total`, a histogram's without `_bucket`/`_sum`/`_count`
    kind: str
    labels: tuple[str, ...]
    help: str


def sources() -> list[Path]:
    return sorted([*(ROOT / "services").rglob("*.py"), *(ROOT / "shared").rglob("*.py")])


def owners(path: Path, shared: bool) -> tuple[str, ...]:
    parts = path.relative_to(ROOT).parts
    if shared:
        return (EVERY,)
    if parts[0] == "services" and parts[1] in SERVICES:
        return (parts[1],)
    if parts[:2] == ("shared", "engine"):
        return ENGINES
    raise ValueError(f"{path.relative_to(ROOT)}: which service exports this series? (shared=True: every one)")


def _literal(node: ast.AST | None, where: str, what: str) -> object:
    try:
        return ast.literal_eval(node) if node is not None else None
    except ValueError:
        raise ValueError(f"{where}: the {what} must be written out (a literal) for the reference") from None


def _arg(call: ast.Call, i: int, key: str) -> ast.AST | None:
    return call.args[i] if len(call.args) > i else next((k.value for k in call.keywords if k.arg == key), None)


def series_of(path: Path, call: ast.Call) -> list[Series]:
    """The series one definition call exports (one per owning service); [] if it defines none."""
    func = call.func
    helper = isinstance(func, ast.Attribute) and func.attr in HELPERS
    family = isinstance(func, ast.Name) and func.id in FAMILIES
    if not (helper or family):
        return []
    where = f"{path.relative_to(ROOT)}:{call.lineno}"
    name, doc = _literal(_arg(call, 0, "name"), where, "name"), _literal(_arg(call, 1, "doc"), where, "help")
    labels = tuple(_literal(_arg(call, 2, "labels"), where, "labels") or ())
    flags = {k.arg: _literal(k.value, where, k.arg) for k in call.keywords if k.arg in ("shared", "counter")}
    if family:
        return [Series(EVERY, exported(name, FAMILIES[func.id]), FAMILIES[func.id], labels, doc)]
    kind = "counter" if func.attr == "live_gauge" and flags.get("counter") else func.attr.replace("live_", "")
    out = []
    for owner in owners(path, bool(flags.get("shared"))):
        full = f"dualpath_{name}" if owner == EVERY else f"dualpath_{owner}_{name}"
        out.append(Series(owner, exported(full, kind), kind, labels, doc))
    return out


def exported(name: str, kind: str) -> str:
    """The name Prometheus scrapes: a counter's always ends in `_total`."""
    return name.removesuffix("_total") + "_total" if kind == "counter" else name


def definitions() -> list[Series]:
    """Every series, once per owner, sorted by owner (every service first) then name."""
    found = {s for path in sources() for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Call) for s in series_of(path, node)}
    order = (EVERY, *SERVICES)
    return sorted(found, key=lambda s: (order.index(s.owner), s.name))


def generated() -> str:
    lines, found = [], definitions()
    for owner in (EVERY, *SERVICES):
        rows = [(code(s.name), s.kind, ", ".join(code(x) for x in s.labels), cell(s.help))
                for s in found if s.owner == owner]
        title = EVERY if owner == EVERY else f"{code(owner)} (`dualpath_{owner}_*`)"
        lines += [f"### {title}", "", *table(("series", "type", "labels", "help"), rows)]
    return "\n".join(lines).rstrip() + "\n"


def render() -> str:
    text = PAGE.read_text() if PAGE.exists() else f"# Metrics\n\n{MARK}\n"
    if MARK not in text:
        raise SystemExit(f"{PAGE.relative_to(ROOT)}: the line {MARK!r} is missing")
    return text.split(MARK, 1)[0] + MARK + "\n\n" + generated()


PAGES = {PAGE: render}
