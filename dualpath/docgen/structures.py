"""docs/reference/structures.md: one line per module, its docstring's first sentence, under its directory.

The preamble and the service-name table are fixed here; the module lines come from the
modules' own docstrings (read with `ast`, nothing imported), directories and modules sorted.
"""
from __future__ import annotations

import ast
import re

from dualpath.docgen.common import REFERENCE, ROOT, heading

PAGE = REFERENCE / "structures.md"
TOPS = ("services", "shared", "dualpath", "kernels", "deploy")
ABBREVIATIONS = ("e.g", "i.e", "vs", "cf", "etc", "incl", "approx")
_END = re.compile(r"[.!?](?=\s|$)")
NO_DOCSTRING = "(no module docstring)"
PREAMBLE = """\
One line per module: the first sentence of its docstring (what the module owns), under the
heading of its directory, in sorted order.

## Service names

Each service has one name, its package's, used everywhere it appears (shared/names.py);
only host names, the command line and the compose file, where `_` cannot go, hyphenate it.

| service | class | `Service.name`, tracer, logger | settings table | subjects | metrics | CLI, compose |
|---|---|---|---|---|---|---|
| `decode_engine` | `DecodeEngineService` | `decode_engine` (`decode_engine.persist`) | `[decode_engine]` | `{ns}.decode_engine.<engine>.*` | `dualpath_decode_engine_*` | `decode-engine` |
| `prefill_engine` | `PrefillEngineService` | `prefill_engine` (`.fetch`, `.handoff`, `.staged_copy`) | `[prefill_engine]` | `{ns}.prefill_engine.<engine>.*` | `dualpath_prefill_engine_*` | `prefill-engine` |
| `scheduler` | `SchedulerService` | `scheduler` (`scheduler.journal`) | `[scheduler]` | `{ns}.scheduler.<instance>.out` (receives) | `dualpath_scheduler_*` | `scheduler` |
| `storage_gateway` | `StorageGatewayService` | `storage_gateway` | `[storage_gateway]` | `{ns}.storage_gateway.<node>.*`, `{ns}.storage_gateway.any.*` | `dualpath_storage_gateway_*` | `storage-gateway` |
| `traffic_manager` | `TrafficManagerService` | `traffic_manager` (`.fetch`, `.store`) | `[traffic_manager]` | `{ns}.traffic_manager.<engine>.*` | `dualpath_traffic_manager_*` | `traffic-manager` |

Mesh-wide subjects belong to no service: `{ns}.hb` (announcements), `{ns}.cancel`. Series the
runtime gives every service alike carry no service part (`dualpath_task_failures_total`,
`dualpath_bus_bad_messages_total`, `dualpath_bus_handler_errors_total`); the scrape's
job/instance labels tell the services apart.
"""


def first_sentence(doc: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line (the whole paragraph if
    it has no sentence end); a period after an abbreviation (e.g., i.e., vs.) ends nothing."""
    para = " ".join(doc.strip().split("\n\n")[0].split())
    for m in _END.finditer(para):
        word = re.search(r"[\w.]+$", para[: m.start()])
        if word and word.group(0).lower().rstrip(".") in ABBREVIATIONS:
            continue
        return para[: m.end()]
    return para


def modules() -> list[str]:
    """Every module's path under TOPS, sorted."""
    return sorted(p.relative_to(ROOT).as_posix() for top in TOPS for p in (ROOT / top).rglob("*.py"))


def summary(path: str) -> str:
    doc = ast.get_docstring(ast.parse((ROOT / path).read_text(encoding="utf-8")))
    return first_sentence(doc) if doc else NO_DOCSTRING


def render() -> str:
    lines = heading("Module map", "the modules' docstrings", [*PREAMBLE.splitlines(), ""])
    by_dir: dict[str, list[str]] = {}
    for path in modules():
        by_dir.setdefault(path.rsplit("/", 1)[0], []).append(path)
    for directory in sorted(by_dir):
        lines += [f"## {directory}", *(f"- `{p}` — {summary(p)}" for p in sorted(by_dir[directory])), ""]
    return "\n".join(lines).rstrip() + "\n"


PAGES = {PAGE: render}
