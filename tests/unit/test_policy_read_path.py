"""Read-path choice and the split-read variant (docs/concepts/design.md#read-path-choice)."""
import pytest

from shared.sched.policy import ReadPath, choose_path, split_read

pytestmark = pytest.mark.unit


def test_shorter_queue_wins_and_ties_read_on_the_pe_path():
    assert choose_path(10, 5) is ReadPath.DE
    assert choose_path(5, 10) is ReadPath.PE
    assert choose_path(7, 7) is ReadPath.PE


def test_split_balances_drain_times():
    pe, de = split_read(10, pe_read_q=100, de_read_q=0)
    assert (pe, de) == (4, 6)
    assert abs((100 + pe * 64) - (de * 64)) <= 64


def test_split_rounds_to_the_nearest_block():
    # DE queue 100, 10 blocks: T = 370 tokens, the PE side needs 370 / 64 = 5.78 blocks -> 6.
    assert split_read(10, pe_read_q=0, de_read_q=100) == (6, 4)
    # PE queue 100: the PE side needs (370 - 100) / 64 = 4.22 blocks -> 4.
    assert split_read(10, pe_read_q=100, de_read_q=0) == (4, 6)


def test_split_sends_everything_to_an_idle_side_when_the_other_is_far_behind():
    assert split_read(10, pe_read_q=1000, de_read_q=0) == (0, 10)
    assert split_read(10, pe_read_q=0, de_read_q=1000) == (10, 0)


def test_split_accounts_for_unequal_rates():
    pe, de = split_read(30, 0, 0, pe_rate=2.0, de_rate=1.0)
    assert (pe, de) == (20, 10)


def test_split_rejects_bad_input_and_handles_zero_blocks():
    assert split_read(0, 5, 5) == (0, 0)
    with pytest.raises(ValueError):
        split_read(3, 0, 0, pe_rate=0)


def test_split_uses_64_token_blocks_by_default():
    # DE 64.5 tokens ahead, 2 blocks: the PE side needs 1 + 64.5 / 128 = 1.504 blocks -> 2 (1.496 at 65)
    assert split_read(2, pe_read_q=0, de_read_q=64.5) == (2, 0)
    assert split_read(2, pe_read_q=0, de_read_q=64.5, block_tokens=65) == (1, 1)
    assert split_read(3, pe_read_q=0, de_read_q=1, block_tokens=1) == (2, 1)  # one-token blocks are fine


@pytest.mark.parametrize("kwargs", [
    {"blocks": -1}, {"block_tokens": 0}, {"pe_rate": 0.0}, {"de_rate": 0.0},
])
def test_split_refuses_bad_arguments(kwargs):
    args = {"blocks": 4, "pe_read_q": 0, "de_read_q": 0} | kwargs
    with pytest.raises(ValueError, match="^split_read needs blocks >= 0 and positive rates and block size$"):
        split_read(**args)


def test_a_single_block_goes_to_the_shorter_queue():
    assert split_read(1, pe_read_q=0, de_read_q=64) == (1, 0)
    assert split_read(1, pe_read_q=64, de_read_q=0) == (0, 1)
    assert split_read(0, pe_read_q=0, de_read_q=64) == (0, 0)


def test_a_queue_tie_goes_to_the_node_given_fewer_tokens():
    assert choose_path(7, 7, pe_served=1) is ReadPath.DE  # DE served nothing yet
    assert choose_path(7, 7, de_served=1) is ReadPath.PE
    assert choose_path(7, 7, pe_served=5, de_served=5) is ReadPath.PE


@pytest.mark.parametrize("near", [0.0, 0.5])
def test_queues_apart_by_more_than_the_tolerance_go_to_the_shorter_whatever_was_served(near):
    # 100 vs 40: 60 apart, over 0.5 x 100
    assert choose_path(100, 40, pe_served=0, de_served=10**6, near=near) is ReadPath.DE
    assert choose_path(40, 100, pe_served=10**6, de_served=0, near=near) is ReadPath.PE


def test_queues_within_the_tolerance_go_to_the_node_given_fewer_tokens():
    # 100 vs 50: 50 apart, exactly 0.5 x 100: near-equal at 0.5, the shorter wins at 0
    assert choose_path(100, 50, pe_served=0, de_served=9, near=0.5) is ReadPath.PE
    assert choose_path(50, 100, pe_served=9, de_served=0, near=0.5) is ReadPath.DE
    assert choose_path(100, 60, pe_served=9, de_served=0, near=0.5) is ReadPath.DE
    assert choose_path(100, 50, pe_served=0, de_served=9, near=0.0) is ReadPath.DE
    assert choose_path(100, 99, pe_served=0, de_served=9) is ReadPath.DE  # the default: exact ties only


@pytest.mark.parametrize("near", [0.0, 0.5])
def test_an_exact_tie_on_equal_served_reads_on_the_pe_path(near):
    assert choose_path(7, 7, pe_served=5, de_served=5, near=near) is ReadPath.PE
    assert choose_path(0, 0, near=near) is ReadPath.PE
    assert choose_path(7, 7, pe_served=1, near=near) is ReadPath.DE


@pytest.mark.parametrize("near", [-0.1, 1.0, 1.5, float("nan")])
def test_a_tolerance_outside_0_to_1_is_refused_naming_it(near):
    with pytest.raises(ValueError, match=f"near .*{near}"):
        choose_path(10, 5, near=near)
