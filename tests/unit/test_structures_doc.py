"""docs/structures.md: every module once, under its directory, sorted, as its docstring's first sentence.

The page is generated (dualpath/docgen/structures.py); this checks the sentence rule, that the
committed page is what the generator makes from the modules now, and that every module has a
docstring to make it from.
"""
from __future__ import annotations

import ast

import pytest

from dualpath.docgen.common import ROOT
from dualpath.docgen.structures import NO_DOCSTRING, PAGE, first_sentence, modules, render

pytestmark = pytest.mark.unit


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


# --- the page --------------------------------------------------------------------------------

def test_the_page_is_what_the_modules_docstrings_give_now():
    assert PAGE.read_text() == render(), "docs/structures.md is stale: python -m dualpath.docgen --write"


def test_every_module_is_listed_once_under_its_directory():
    text = render()
    for path in modules():
        assert text.count(f"- `{path}` — ") == 1, path
        assert f"\n## {path.rsplit('/', 1)[0]}\n" in text, path


def test_every_module_has_a_docstring():
    bare = [p for p in modules() if not ast.get_docstring(ast.parse((ROOT / p).read_text(encoding="utf-8")))]
    assert not bare, f"give these modules a docstring (the page would say {NO_DOCSTRING!r}): {bare}"


def test_service_table_lists_each_service_once():
    services = sorted(p.name for p in (ROOT / "services").iterdir() if (p / "app.py").exists())
    rows = [line.split("|")[1].strip().strip("`") for line in render().split("\n## deploy", 1)[0].splitlines()
            if line.startswith("| `")]
    assert sorted(rows) == services, f"one row per service package in the name table: {services}"
