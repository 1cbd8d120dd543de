"""docs/request-lifecycle.md names every state machine's states and moves as the code has them."""
from __future__ import annotations

import pytest

from dualpath.lifecycle_doc import DOC, spliced

pytestmark = pytest.mark.unit


def test_the_generated_states_in_the_doc_are_current():
    text = DOC.read_text()
    assert spliced(text) == text, "docs/request-lifecycle.md is stale: python -m dualpath.lifecycle_doc --write"
