"""The stored prefix of an agent's conversation while its writes are in flight."""
import pytest

from dualpath.sim.stored import WriteLag

pytestmark = pytest.mark.unit


def test_a_write_lands_block_by_block_between_its_start_and_end():
    lag = WriteLag(block=16)
    lag.wrote(0, 1.0, 2.0, 0, 160)  # 10 blocks over one second
    assert lag.stored(0, 0.5) == 0
    assert lag.stored(0, 1.0) == 0
    assert lag.stored(0, 1.55) == 80  # 5.5 blocks landed: 5 whole ones
    assert lag.stored(0, 2.0) == 160
    assert lag.stored(1, 5.0) == 0  # another agent wrote nothing


def test_a_later_write_continues_the_prefix_and_a_gap_stops_it():
    lag = WriteLag(block=16)
    lag.wrote(0, 0.0, 1.0, 0, 32)
    lag.wrote(0, 1.0, 2.0, 32, 64)
    assert lag.stored(0, 1.5) == 48
    assert lag.stored(0, 3.0) == 64
    lag.wrote(0, 3.0, 4.0, 96, 128)  # blocks 64..96 never written: the chain stops at 64
    assert lag.stored(0, 9.0) == 64


def test_a_rewrite_of_blocks_already_stored_never_shrinks_the_prefix():
    lag = WriteLag(block=16)
    lag.wrote(0, 0.0, 1.0, 0, 64)
    lag.wrote(0, 2.0, 3.0, 32, 96)  # a turn that hit 32 tokens writes again from there
    assert lag.stored(0, 1.5) == 64
    assert lag.stored(0, 2.75) == 80
    assert lag.stored(0, 3.0) == 96
