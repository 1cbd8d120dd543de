"""Engines and traffic managers execute KV plans: no load-mode name appears in their source
(comments included). The modes are plan builders in the scheduling policy (shared/sched/plan.py)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DIRS = ("services/prefill_engine", "services/decode_engine", "services/traffic_manager")
NAMES = re.compile(r"LoadMode|(?i:oracle)|dualpath-split|DUALPATH_SPLIT|[\"']basic[\"']|[\"']dualpath[\"']")


def mode_names(root: Path = ROOT) -> list[str]:
    """`path:line: text` of every mention of a load mode in the three services."""
    out = []
    for d in DIRS:
        for path in sorted((root / d).rglob("*.py")):
            for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if NAMES.search(line):
                    out.append(f"{path.relative_to(root).as_posix()}:{i}: {line.strip()}")
    return out


def test_the_scan_sees_each_name(tmp_path):
    for i, text in enumerate(("if work.mode == LoadMode.BASIC:", "# the Oracle's bound", 'm = "basic"',
                              "x = 'dualpath-split'")):
        f = tmp_path / DIRS[i % 3] / f"m{i}.py"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"a = 1\n{text}\n")
    assert [s.split(":")[1] for s in mode_names(tmp_path)] == ["2"] * 4


def test_no_load_mode_name_in_the_engines_or_traffic_managers():
    assert mode_names() == []
