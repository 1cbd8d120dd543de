"""wait_until, the tests' one way to wait: it returns what the condition gave, or fails naming it."""
from __future__ import annotations

import pytest

from tests.integration.meshutil import wait_until

pytestmark = pytest.mark.unit


def test_returns_the_first_truthy_value_the_condition_gives():
    answers = iter([0, [], {"engines": 2}])
    assert wait_until(lambda: next(answers), "a mesh view", timeout=60, interval=0) == {"engines": 2}


def test_a_condition_never_met_fails_naming_what_it_waited_for():
    with pytest.raises(AssertionError, match=r"waiting for every engine idle \(last: 0\)"):
        wait_until(lambda: 0, "every engine idle", timeout=0)
