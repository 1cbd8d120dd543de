"""The results pages: each report in docs/results/data/ read, checked and laid out under its kind.

`stale` compares plots by name only: PNG bytes vary with the plotting library.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from dualpath.results import bench, chaos, fleet, index, mutants, sim
from dualpath.results.common import ReportError, check_record, header

KINDS = {"bench": bench, "sim": sim, "fleet": fleet, "chaos": chaos, "mutants": mutants}  # in page order
SHAPES = {"bench": ("runs",), "sim": ("rows", "runs"), "fleet": ("rows",), "chaos": ("cells",), "mutants": ("modules",)}  # any one of
RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results"
GENERATED = "Written by `make results` from the JSON reports in [data/](data/): edit those, not this page."


def reports(data: Path) -> dict[str, list[tuple[str, dict]]]:
    """Kind -> [(report name, its JSON)], sorted by name; ReportError for a report that cannot be used."""
    found: dict[str, list[tuple[str, dict]]] = {}
    for path in sorted(data.glob("*.json")) if data.is_dir() else []:
        kind = path.stem.split("-")[0]
        if kind not in KINDS:
            raise ReportError(f"{path}: a report's name starts with its kind ({', '.join(KINDS)}), as "
                              "bench-tiny.json or fleet.json")
        try:
            doc = json.loads(path.read_text())
        except ValueError as exc:
            raise ReportError(f"{path}: not JSON ({exc})") from None
        check_record(path, doc)
        if not any(isinstance(doc.get(key), list) for key in SHAPES[kind]):
            raise ReportError(f"{path}: no \"{SHAPES[kind][0]}\" list: not a {kind} report")
        found.setdefault(kind, []).append((path.stem, doc))
    return {k: found[k] for k in KINDS if k in found}


def build(results: Path, img: Path) -> dict[str, str]:
    """{page file name: text} from results/data; each report's plots drawn under img/<report name>/."""
    found = reports(results / "data")
    pages = {"README.md": index.page({k: [stem for stem, _ in v] for k, v in found.items()},
                                     {k: KINDS[k].TITLE for k in KINDS})}
    for kind, docs in found.items():
        mod = KINDS[kind]
        lines = [f"# {mod.TITLE}", "", *mod.INTRO, "", GENERATED, ""]
        for stem, doc in docs:
            lines += [f"## {stem}", "", *header(doc["conditions"]), *mod.lines(doc)]
            names = mod.plots(doc, img / stem)
            lines += [f"![{Path(n).stem}](img/{stem}/{n})" for n in names] + ([""] if names else [])
        pages[f"{kind}.md"] = "\n".join(lines).rstrip() + "\n"
    return pages


def write(results: Path = RESULTS) -> list[str]:
    """Write the pages and their plots (img/ rebuilt); a kind's page with no report left is removed."""
    with tempfile.TemporaryDirectory() as tmp:
        pages = build(results, Path(tmp))
        shutil.rmtree(results / "img", ignore_errors=True)
        if any(Path(tmp).rglob("*.png")):
            shutil.copytree(tmp, results / "img")
    for name in (f"{k}.md" for k in KINDS if f"{k}.md" not in pages):
        (results / name).unlink(missing_ok=True)
    for name, text in pages.items():
        (results / name).write_text(text)
    return sorted(pages)


def stale(results: Path = RESULTS) -> list[str]:
    """What differs from what the reports give: a page missing or changed, a page left over, a plot missing."""
    with tempfile.TemporaryDirectory() as tmp:
        pages = build(results, Path(tmp))
        drawn = sorted(p.relative_to(tmp).as_posix() for p in Path(tmp).rglob("*.png"))
    out = [f"{results / name}: missing" if not (results / name).is_file() else f"{results / name}: stale"
           for name, text in pages.items()
           if not (results / name).is_file() or (results / name).read_text() != text]
    out += [f"{results / name}: no report of its kind in data/" for name in (f"{k}.md" for k in KINDS)
            if name not in pages and (results / name).exists()]
    return out + [f"{results / 'img' / png}: missing" for png in drawn if not (results / "img" / png).is_file()]
