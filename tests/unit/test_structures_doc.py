"""docs/structures.md: every module once, under its package, sorted, as its docstring's first sentence.

Each entry is a line "- <path in backticks> — <the whole first sentence of the module's
docstring>" under a "## <directory>" heading; headings, and the entries under each, are in
sorted order. The service-name table lists each service package once.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "structures.md"
TOPS = ("services", "shared", "dualpath", "kernels", "deploy")
ABBREVIATIONS = ("e.g", "i.e", "vs", "cf", "etc", "incl", "approx")
_END = re.compile(r"[.!?](?=\s|$)")
_ENTRY = re.compile(r"^- `([^`]+)` — (.*)$")


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
    return sorted(p.relative_to(ROOT).as_posix() for top in TOPS for p in (ROOT / top).rglob("*.py"))


def sections(text: str) -> dict[str, list[tuple[str, str]]]:
    """Heading -> its (path, text) entries, in document order."""
    out: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for line in text.splitlines():
        if line.startswith("## "):
            current = out.setdefault(line[3:].strip(), [])
        elif (m := _ENTRY.match(line)) and current is not None:
            current.append((m.group(1), m.group(2)))
    return out


def entries() -> dict[str, list[tuple[str, str]]]:
    return {h: e for h, e in sections(DOC.read_text()).items() if e}


# --- the sentence rule itself --------------------------------------------------------------

@pytest.mark.parametrize("doc, sentence", [
    ("One line. Another.", "One line."),
    ("A sentence that runs\n    over two lines. Then more.", "A sentence that runs over two lines."),
    ("No period at all\n\nSecond paragraph.", "No period at all"),
    ("Names, e.g. `x` and i.e. y, vs. z. Rest.", "Names, e.g. `x` and i.e. y, vs. z."),
    ("Version 1.5 of page.md#a-b (see it). More", "Version 1.5 of page.md#a-b (see it)."),
    ("Is it? Yes.", "Is it?"),
])
def test_first_sentence_is_whole_and_stops_at_the_first_end(doc, sentence):
    assert first_sentence(doc) == sentence


# --- the document ----------------------------------------------------------------------------

def test_every_module_is_listed_once_and_nothing_else():
    listed = [path for found in entries().values() for path, _ in found]
    assert modules()
    missing = sorted(set(modules()) - set(listed))
    assert not missing, f"add to docs/structures.md: {missing}"
    stale = sorted(set(listed) - set(modules()))
    assert not stale, f"remove from docs/structures.md: {stale}"
    twice = sorted({p for p in listed if listed.count(p) > 1})
    assert not twice, f"listed more than once in docs/structures.md: {twice}"


def test_entries_sit_under_their_directory_in_sorted_order():
    found = entries()
    headings = list(found)
    assert headings == sorted(headings), f"sort the headings of docs/structures.md: {sorted(headings)}"
    for heading, items in found.items():
        misplaced = [p for p, _ in items if p.rsplit("/", 1)[0] != heading]
        assert not misplaced, f"under '## {heading}' but not in that directory: {misplaced}"
        paths = [p for p, _ in items]
        assert paths == sorted(paths), f"sort the entries under '## {heading}': {sorted(paths)}"


def test_each_entry_is_its_modules_first_docstring_sentence():
    wrong = []
    for items in entries().values():
        for path, text in items:
            if not (ROOT / path).exists():
                continue  # reported as stale above
            doc = ast.get_docstring(ast.parse((ROOT / path).read_text(encoding="utf-8")))
            want = first_sentence(doc) if doc else "<module has no docstring>"
            if text != want:
                wrong.append(f"- `{path}` — {want}")
    assert not wrong, "docs/structures.md entries that differ from the docstring; expected:\n" + "\n".join(wrong)


def test_service_table_lists_each_service_once():
    text = DOC.read_text()
    services = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "app.py").exists())
    rows = [line.split("|")[1].strip().strip("`") for line in text.splitlines() if line.startswith("| `")]
    assert sorted(rows) == services, f"one row per service package in the name table: {services}"
