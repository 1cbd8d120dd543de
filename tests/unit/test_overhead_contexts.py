"""The overhead bench's like-for-like contexts: what each mesh stream held when all ran."""
import pytest

from dualpath.bench.overhead import window_contexts

pytestmark = pytest.mark.unit


def test_streams_that_started_early_hold_longer_contexts():
    early = [1.0, 2.0, 3.0, 4.0, 5.0]  # 4 tokens by t = 4 (the first from the prefill)
    late = [4.0, 5.0, 6.0]  # its first token opens the window
    assert window_contexts([late, early], start=4.0, prompt=128) == [128, 131]


def test_a_stream_with_one_token_decodes_from_its_prompt():
    assert window_contexts([[2.5, 3.0]], start=2.5, prompt=64) == [64]
