"""The generated reference pages (docs/reference/), each written from its definitions: `python -m dualpath.docgen`.

One module per page: settings.py (and deploy/compose/dualpath.toml), cli.py, metrics.py,
structures.py; each exposes `PAGES`, {path: render()}. `--check` names each stale page.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

MODULES = ("settings", "cli", "metrics", "structures")


def pages() -> dict[Path, Callable[[], str]]:
    """Every generated file -> the function that renders it."""
    out: dict[Path, Callable[[], str]] = {}
    for name in MODULES:
        out.update(importlib.import_module(f"dualpath.docgen.{name}").PAGES)
    return out


def stale() -> dict[Path, str]:
    """The generated files whose text differs from what their definitions give now -> that text."""
    wanted = {path: render() for path, render in pages().items()}
    return {path: text for path, text in wanted.items() if not path.exists() or path.read_text() != text}
