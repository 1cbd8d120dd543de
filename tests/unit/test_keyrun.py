"""Block keys packed in one bytes object (shared/kv/keyrun.py), read where the core reads a key list."""
import pytest

from shared.kv.keyrun import KeyRun
from shared.sched.prefetch import StagedSession, StagedIndex, common

pytestmark = pytest.mark.unit
KEYS = [bytes([i]) * 16 for i in range(5)]


def test_a_packed_run_reads_as_the_list_it_was_packed_from():
    run = KeyRun(b"".join(KEYS))
    assert len(run) == 5 and list(run) == KEYS and run == KEYS and run == KeyRun.pack(KEYS)
    assert run[0] == KEYS[0] and run[-1] == KEYS[-1] and run[1:3] == KEYS[1:3] and run[::-2] == KEYS[::-2]
    assert bool(run) and not KeyRun() and KeyRun() == [] and run != KEYS[:4] and run != KEYS[::-1]
    with pytest.raises(IndexError):
        run[5]
    with pytest.raises(IndexError):
        run[-6]


def test_a_blob_that_is_not_whole_keys_is_refused_with_its_length():
    with pytest.raises(ValueError, match="multiple of 16 bytes, got 17"):
        KeyRun(b"x" * 17)
    with pytest.raises(ValueError, match="16 bytes"):
        KeyRun.pack([b"short"])


def test_the_cores_prefix_walks_take_a_run_as_they_take_a_list():
    run = KeyRun.pack(KEYS)
    assert common(KEYS[:3], run) == 3 and common(run, KEYS[:2] + [b"z" * 16]) == 2
    index = StagedIndex()
    index.add(StagedSession("o", "e0", "n0", KEYS[:3], until=1.0))
    assert index.match(run) is index.match(KEYS) is not None
