"""docs/structures.md (beside the four kinds: the maintainers' map): one line per module, its docstring's first sentence, under its directory.

The preamble and the service-name table are structures_head.md; the module lines come from the
modules' own docstrings (read with `ast`, nothing imported), directories and modules sorted.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

from dualpath.docgen.common import REFERENCE, ROOT, heading

PAGE = REFERENCE.parent / "structures.md"
TOPS = ("services", "shared", "dualpath", "kernels", "deploy")
ABBREVIATIONS = ("e.g", "i.e", "vs", "cf", "etc", "incl", "approx")
_END = re.compile(r"[.!?](?=\s|$)")
NO_DOCSTRING = "(no module docstring)"
PREAMBLE = (Path(__file__).parent / "structures_head.md").read_text(encoding="utf-8")  # hand-written


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
    lines[2] = lines[2].replace("../../README.md", "../README.md")  # one folder up from the reference pages
    by_dir: dict[str, list[str]] = {}
    for path in modules():
        by_dir.setdefault(path.rsplit("/", 1)[0], []).append(path)
    for directory in sorted(by_dir):
        lines += [f"## {directory}", *(f"- `{p}` — {summary(p)}" for p in sorted(by_dir[directory])), ""]
    return "\n".join(lines).rstrip() + "\n"


PAGES = {PAGE: render}
