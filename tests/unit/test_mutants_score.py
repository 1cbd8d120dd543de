"""`make mutants`' score: killed over the mutants counted, equivalent and skipped ones left out."""
from __future__ import annotations

import pytest

from dualpath.mutants import score, summary

pytestmark = pytest.mark.unit


def test_the_score_counts_kills_and_timeouts_and_leaves_out_equivalents():
    found = {"a.py": {"a.x_f__mutmut_1": "killed", "a.x_f__mutmut_2": "survived", "a.x_f__mutmut_3": "timeout",
                      "a.x_f__mutmut_4": "skipped"},
             "b.py": {"b.x_g__mutmut_1": "no tests", "b.x_g__mutmut_2": "survived"}}
    rows, survivors = score(found, {"b.x_g__mutmut_2": "the branch it flips cannot be reached"})
    a, b = rows
    assert (a["mutants"], a["counted"], a["killed"], a["score"]) == (4, 3, 2, 2 / 3)
    assert (b["counted"], b["killed"], b["equivalent"], b["score"]) == (1, 0, 1, 0.0)
    assert [s["mutant"] for s in survivors] == ["a.x_f__mutmut_2", "b.x_g__mutmut_1"]  # no tests: not killed
    assert summary(rows) == 2 / 4


def test_a_module_with_nothing_counted_scores_full():
    rows, survivors = score({"c.py": {"c.x_h__mutmut_1": "skipped"}}, {})
    assert rows[0]["score"] == 1.0 and summary(rows) == 1.0 and not survivors
