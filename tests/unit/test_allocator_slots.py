"""SlotAllocator: ownership of fixed-size slots; check_integrity() after every scenario."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shared.kv.allocator import OutOfSlots, SlotAllocator

pytestmark = pytest.mark.unit


@pytest.fixture
def alloc():
    a = SlotAllocator(8)
    yield a
    a.check_integrity()


@pytest.mark.parametrize("n", [0, -1])
def test_non_positive_size_is_rejected(n):
    with pytest.raises(ValueError):
        SlotAllocator(n)


def test_fresh_allocator_is_all_free(alloc):
    assert (alloc.free, alloc.used, alloc.owners()) == (8, 0, [])


def test_allocate_hands_out_low_ids_first(alloc):
    assert alloc.allocate("a", 3) == [0, 1, 2]
    assert alloc.allocate("b", 2) == [3, 4]
    assert (alloc.free, alloc.used) == (3, 5)


def test_held_lists_an_owners_slots_in_allocation_order(alloc):
    alloc.allocate("a", 2)
    alloc.allocate("b", 1)
    alloc.allocate("a", 2)
    assert alloc.held("a") == [0, 1, 3, 4]
    assert alloc.held("b") == [2]
    assert alloc.held("nobody") == []
    assert sorted(alloc.owners()) == ["a", "b"]


def test_held_returns_a_copy(alloc):
    alloc.allocate("a", 2)
    alloc.held("a").append(99)
    assert alloc.held("a") == [0, 1]


def test_release_frees_every_slot_of_the_owner(alloc):
    alloc.allocate("a", 3)
    alloc.allocate("b", 2)
    assert alloc.release("a") == 3
    assert (alloc.free, alloc.used) == (6, 2)
    assert alloc.held("a") == [] and alloc.owners() == ["b"]
    assert alloc.held("b") == [3, 4]


def test_release_is_idempotent(alloc):
    alloc.allocate("a", 2)
    assert alloc.release("a") == 2
    assert alloc.release("a") == 0
    assert alloc.release("never-held") == 0
    assert alloc.free == 8


def test_released_slots_are_reused(alloc):
    alloc.allocate("a", 3)
    alloc.allocate("b", 5)
    alloc.release("a")
    assert sorted(alloc.allocate("c", 3)) == [0, 1, 2]
    assert alloc.free == 0


def test_out_of_slots_carries_wanted_and_free(alloc):
    alloc.allocate("a", 6)
    with pytest.raises(OutOfSlots) as info:
        alloc.allocate("b", 3)
    assert (info.value.wanted, info.value.free) == (3, 2)
    assert "3" in str(info.value) and "2" in str(info.value)


def test_failed_allocation_changes_nothing(alloc):
    alloc.allocate("a", 6)
    with pytest.raises(OutOfSlots):
        alloc.allocate("b", 3)
    assert alloc.free == 2 and alloc.held("b") == [] and alloc.owners() == ["a"]


def test_can_allocate_matches_allocate(alloc):
    alloc.allocate("a", 5)
    assert alloc.can_allocate(3) and not alloc.can_allocate(4)
    alloc.allocate("b", 3)
    assert alloc.can_allocate(0) and not alloc.can_allocate(1)


def test_allocating_every_slot_then_one_more_fails(alloc):
    assert len(alloc.allocate("a", 8)) == 8
    with pytest.raises(OutOfSlots) as info:
        alloc.allocate("b", 1)
    assert (info.value.wanted, info.value.free) == (1, 0)


def test_zero_slot_allocation_does_not_register_an_owner(alloc):
    assert alloc.allocate("a", 0) == []
    assert alloc.owners() == [] and alloc.free == 8


def test_negative_allocation_is_rejected(alloc):
    with pytest.raises(ValueError):
        alloc.allocate("a", -1)
    assert alloc.owners() == [] and alloc.free == 8


def test_check_integrity_detects_a_double_free(alloc):
    alloc.allocate("a", 2)
    alloc._free.append(0)  # corrupt: slot 0 both owned and free
    with pytest.raises(AssertionError):
        alloc.check_integrity()
    alloc._free.pop()


def test_check_integrity_detects_a_lost_slot(alloc):
    lost = alloc._free.pop()
    with pytest.raises(AssertionError):
        alloc.check_integrity()
    alloc._free.append(lost)


def test_check_integrity_detects_owner_map_out_of_sync(alloc):
    alloc.allocate("a", 2)
    alloc._held["a"].pop()
    with pytest.raises(AssertionError):
        alloc.check_integrity()
    alloc._held["a"].append(1)


ops = st.lists(
    st.one_of(
        st.tuples(st.just("alloc"), st.sampled_from("abcde"), st.integers(0, 6)),
        st.tuples(st.just("release"), st.sampled_from("abcdef"), st.just(0)),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(n_slots=st.integers(1, 16), seq=ops)
def test_random_allocate_release_sequences_keep_the_model(n_slots, seq):
    alloc = SlotAllocator(n_slots)
    model: dict[str, list[int]] = {}
    for op, owner, n in seq:
        if op == "alloc":
            free = n_slots - sum(map(len, model.values()))
            if n > free:
                with pytest.raises(OutOfSlots) as info:
                    alloc.allocate(owner, n)
                assert (info.value.wanted, info.value.free) == (n, free)
            else:
                got = alloc.allocate(owner, n)
                assert len(got) == n == len(set(got))
                in_use = {s for slots in model.values() for s in slots}
                assert not in_use & set(got), "handed out a slot that is in use"
                assert all(0 <= s < n_slots for s in got)
                if got:
                    model.setdefault(owner, []).extend(got)
        else:
            assert alloc.release(owner) == len(model.pop(owner, []))
        alloc.check_integrity()
        assert alloc.used == sum(map(len, model.values()))
        assert alloc.free == n_slots - alloc.used
        assert sorted(alloc.owners()) == sorted(model)
        for who, slots in model.items():
            assert alloc.held(who) == slots
