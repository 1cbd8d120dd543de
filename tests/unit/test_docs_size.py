"""docs/ in four kinds, and the hand-written part of it short: under half of the 32k words it once was."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
KINDS = {"concepts", "guides", "reference", "results"}
HAND_WORDS = 16_000
GENERATED_PAGES = {"reference/settings.md", "reference/cli.md", "structures.md"}
MAP = "structures.md"  # the module map, generated: beside the four kinds, for maintainers
GENERATED_BELOW = "<!-- generated below"
GENERATED_BLOCK = re.compile(r"<!-- generated: (\w+) -->.*?<!-- end generated: \1 -->", re.S)


def hand_written(rel: str, text: str) -> list[str]:
    """The words of page `rel` (under docs/) that a person wrote: generated pages and parts left out."""
    if rel in GENERATED_PAGES or rel.startswith("results/"):  # results: all made by `python -m dualpath.results`
        return []
    return GENERATED_BLOCK.sub("", text.split(GENERATED_BELOW, 1)[0]).split()


def test_every_page_is_one_of_the_four_kinds():
    stray = [p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md") if p.relative_to(DOCS).parts[0] not in KINDS | {MAP}]
    assert not stray, f"pages outside concepts/guides/reference/results: {stray}"


def test_the_hand_written_docs_are_under_half_of_their_old_32k_words():
    words = sum(len(hand_written(p.relative_to(DOCS).as_posix(), p.read_text(encoding="utf-8")))
                for p in DOCS.rglob("*.md"))
    assert words < HAND_WORDS, f"docs/ has {words} hand-written words (under {HAND_WORDS})"


def test_the_count_leaves_out_only_generated_text():
    text = "one two <!-- generated: x -->\nthree\n<!-- end generated: x --> four\n" \
           f"{GENERATED_BELOW} by a tool -->\nfive six"
    assert hand_written("guides/p.md", text) == ["one", "two", "four"]
    assert hand_written("reference/cli.md", text) == [] and hand_written("results/sim.md", text) == []
