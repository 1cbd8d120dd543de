"""The network-fault bench's token check (dualpath/bench/netfaults.py) sees a repeated or stale token."""
import pytest

from dualpath.bench.netfaults import bad_tokens
from shared.model.reference import generate_detailed

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def reference_tiny():
    import torch

    from shared.model.loader import load_model

    torch.set_num_threads(1)
    return load_model("tiny", seed=0)


def test_a_repeated_a_stale_and_a_missing_token_are_each_counted(reference_tiny):
    ids = reference_tiny.tokenizer.encode("agent 3: tool output line; tool output line; ")
    want = generate_detailed(reference_tiny, ids, 6, top_logprobs=0, ignore_eos=True).ids
    assert bad_tokens(reference_tiny, (ids, 6, want, 6)) == 0
    repeated = want[:2] + [want[1]] + want[2:5]  # token 1 streamed twice, the stream still 6 long
    assert repeated != want and bad_tokens(reference_tiny, (ids, 6, repeated, 6)) > 0
    stale = want[:3] + [(want[3] + 1) % 50] + want[4:]
    assert bad_tokens(reference_tiny, (ids, 6, stale, 6)) == 1
    assert bad_tokens(reference_tiny, (ids, 6, want + [want[-1]], 7)) > 0  # one too many
    assert bad_tokens(reference_tiny, (ids, 6, want[:5], 5)) > 0  # one missing
    assert bad_tokens(reference_tiny, (ids, 6, want, 7)) > 0  # the stream carried a token the ids do not
