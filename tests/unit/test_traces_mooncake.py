"""The Mooncake importer: parsing, line-numbered errors, and prefix sharing by hash id."""
import pytest

from dualpath.traces import TraceFormatError
from dualpath.traces.mooncake import MooncakeRequest, block_size_for, prompt_tokens, read_mooncake

pytestmark = pytest.mark.unit

GOOD = [
    '{"timestamp": 0, "input_length": 1100, "output_length": 8, "hash_ids": [1, 2, 3]}',
    '{"timestamp": 250, "input_length": 1500, "output_length": 4, "hash_ids": [1, 2, 4]}',
    '{"timestamp": 900, "input_length": 600, "output_length": 2, "hash_ids": [5, 6]}',
]


def test_reads_requests_in_file_order(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(GOOD[:2]) + "\n\n" + GOOD[2] + "\n")
    reqs = read_mooncake(p)
    assert [r.timestamp_ms for r in reqs] == [0, 250, 900]
    assert reqs[1] == MooncakeRequest(250, 1500, 4, (1, 2, 4))


@pytest.mark.parametrize("bad, reason", [
    ("{not json", "not JSON"),
    ('{"timestamp": 1, "input_length": 0, "output_length": 2, "hash_ids": [1]}', ">= 1 - at `$.input_length`"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 2, "hash_ids": [1, "x"]}', "at `$.hash_ids[1]`"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 2, "hash_ids": [-1]}', ">= 0 - at `$.hash_ids[0]`"),
    ('{"timestamp": -5, "input_length": 10, "output_length": 2, "hash_ids": [1]}', ">= 0 - at `$.timestamp`"),
    ('{"timestamp": 1, "input_length": 10, "output_length": true, "hash_ids": [1]}', "at `$.output_length`"),
    ('{"timestamp": 1, "input_length": 10, "hash_ids": [1]}', "missing required field `output_length`"),
    ('{"timestamp": 1, "input_length": 5000, "output_length": 2, "hash_ids": [1]}', "cannot cover"),
])
def test_a_bad_line_is_reported_with_its_line_number(tmp_path, bad, reason):
    p = tmp_path / "t.jsonl"
    p.write_text(GOOD[0] + "\n" + GOOD[1] + "\n" + bad + "\n")
    with pytest.raises(TraceFormatError) as exc:
        read_mooncake(p)
    assert exc.value.line == 3
    assert f"{p}:3:" in str(exc.value) and reason in str(exc.value)


def test_equal_hash_prefixes_give_equal_token_prefixes_and_nothing_more():
    a = MooncakeRequest(0, 1100, 8, (1, 2, 3))
    b = MooncakeRequest(1, 1500, 8, (1, 2, 4))
    ta, tb = prompt_tokens(a, 0, 32, 127), prompt_tokens(b, 1, 32, 127)
    assert len(ta) == 1100 and len(tb) == 1500
    assert ta[:1024] == tb[:1024]
    assert ta[1024:1100] != tb[1024:1100]
    assert all(32 <= t < 127 for t in ta + tb)
    assert prompt_tokens(a, 0, 32, 127) == ta  # deterministic
    assert prompt_tokens(a, 0, 32, 127, salt=1)[:64] != ta[:64]  # another salt (mode) shares nothing


def test_scaling_keeps_sharing_on_store_block_boundaries():
    assert block_size_for(0.25) == 128 and block_size_for(0.01) == 64
    a = MooncakeRequest(0, 1024, 8, (7, 8))
    b = MooncakeRequest(0, 1024, 8, (7, 9))
    ta, tb = prompt_tokens(a, 0, 100, 900, scale=0.25), prompt_tokens(b, 1, 100, 900, scale=0.25)
    assert len(ta) == 256
    assert ta[:128] == tb[:128] and ta[128:] != tb[128:]


def test_tokens_past_the_hash_cover_are_unique_per_request():
    a = MooncakeRequest(0, 600, 8, (1,))
    b = MooncakeRequest(0, 600, 8, (1,))
    ta, tb = prompt_tokens(a, 0, 32, 127), prompt_tokens(b, 1, 32, 127)
    assert ta[:512] == tb[:512] and ta[512:] != tb[512:]
