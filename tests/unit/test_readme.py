"""README.md is read in five minutes: short, its terms defined before use (there and in docs/), links that resolve."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
WORDS = 800
ABBREVIATIONS = ("PE", "DE", "SNIC", "CNIC", "JCT", "TTFT", "TTST", "TPOT", "APS")
SHAPE = r"\b\d+P\d+D\b"
MODES = ("basic", "dualpath", "dualpath-split", "oracle", "sglang")
SECTIONS = ("Glossary", "Requirements", "Two commands", "First requests", "Where next")
GLOSSARY_LINK = re.compile(r"\]\((?:\.\./)*README\.md#glossary\)")


def first_use(text: str) -> tuple[int, str] | None:
    """Offset and term of the first glossary abbreviation or xPyD shape in the text."""
    pattern = re.compile(r"\b(" + "|".join(ABBREVIATIONS) + r")\b|" + SHAPE)
    m = pattern.search(text)
    return (m.start(), m.group(0)) if m else None


def section(text: str, title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    assert m, f"README.md has no '## {title}' section"
    return m.group(1)


def test_readme_is_at_most_800_words():
    n = len(README.read_text().split())
    assert n <= WORDS, f"README.md has {n} words (at most {WORDS})"


def test_readme_names_the_paper_and_has_each_section():
    text = README.read_text()
    assert "DualPath: Breaking the Storage Bandwidth Bottleneck in Agentic LLM Inference" in " ".join(text.split())
    assert "arXiv 2602.21548" in text
    for title in SECTIONS:
        section(text, title)


def test_the_glossary_defines_every_term_and_comes_before_their_first_use():
    text = README.read_text()
    glossary = section(text, "Glossary")
    for term in (*ABBREVIATIONS, "xPyD", *(f"`{m}`" for m in MODES)):
        assert term in glossary, f"the glossary does not define {term}"
    before = text[: text.index("## Glossary")]
    assert first_use(before) is None, f"README.md uses {first_use(before)[1]} before its glossary"
    for mode in MODES[2:]:
        assert f"`{mode}`" not in before, f"README.md names the mode `{mode}` before its glossary"


def docs_pages() -> list[Path]:
    return sorted((ROOT / "docs").rglob("*.md"))


@pytest.mark.parametrize("page", docs_pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_docs_page_links_the_glossary_before_its_first_term(page):
    text = page.read_text()
    use = first_use(text)
    if use is None:
        return
    link = GLOSSARY_LINK.search(text)
    assert link and link.start() < use[0], (
        f"{page.relative_to(ROOT)} uses {use[1]} (line {text[:use[0]].count(chr(10)) + 1}) "
        "before linking README.md#glossary")


def test_the_glossary_rule_catches_a_page_that_uses_a_term_first():
    assert first_use("the DE reads") == (4, "DE")
    assert first_use("a 2P4D cluster") == (2, "2P4D")
    assert first_use("DEcode and PEople") is None


def test_every_relative_link_in_the_readme_resolves():
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text()):
        if "://" not in target:
            assert (ROOT / target).exists(), f"README.md links {target}, which does not exist"
