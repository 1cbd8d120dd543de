"""The segmented payload checksum: streamed in any pieces, or in two parts joined, it is the
one-shot checksum; any flipped byte, in either part, changes it."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import xxhash

from shared.kv.full_block import payload_checksum, payload_hasher
from shared.kv.segment_sum import SEGMENT, SegmentHasher, segmented_checksum, split_point

pytestmark = pytest.mark.unit

SIZES = [1, SEGMENT - 1, SEGMENT, SEGMENT + 1, 3 * SEGMENT, 5 * SEGMENT + 12345]


def _data(n: int, seed: int = 0) -> memoryview:
    return memoryview(np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8))


def test_the_checksum_is_xxh3_over_the_segments_digests() -> None:
    data = _data(2 * SEGMENT + 7)
    sums = b"".join(struct.pack("<Q", xxhash.xxh3_64_intdigest(data[i : i + SEGMENT]))
                    for i in range(0, len(data), SEGMENT))
    assert segmented_checksum(data) == xxhash.xxh3_64_intdigest(sums)
    assert segmented_checksum(data) != xxhash.xxh3_64_intdigest(data)  # not version 2's


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("piece", [1000, 4096, SEGMENT // 3, SEGMENT, 2 * SEGMENT + 5])
def test_streamed_in_any_pieces_it_is_the_one_shot_checksum(n: int, piece: int) -> None:
    data = _data(n)
    h = SegmentHasher()
    for at in range(0, n, piece):
        h.update(data[at : at + piece])
    assert h.fed == n
    assert h.intdigest() == segmented_checksum(data) == payload_checksum(data)


@pytest.mark.parametrize("n", SIZES)
def test_two_parts_hashed_apart_and_joined_give_the_checksum(n: int) -> None:
    data = _data(n, 1)
    split = split_point(n)
    if not split:
        assert n <= SEGMENT
        return
    assert split % SEGMENT == 0 and 0 < split < n
    near, far = SegmentHasher(), SegmentHasher(split)
    far.update(data[split:])  # the far part may finish first
    near.update(data[:split])
    near.join(far)
    assert near.intdigest() == segmented_checksum(data)


@pytest.mark.parametrize("at", [0, SEGMENT - 1, SEGMENT, 2 * SEGMENT + 3, -1])
def test_a_flipped_byte_in_either_part_changes_the_checksum(at: int) -> None:
    data = np.asarray(_data(3 * SEGMENT + 99, 2)).copy()
    good = segmented_checksum(memoryview(data))
    data[at] ^= 1
    split = split_point(len(data))
    near, far = SegmentHasher(), SegmentHasher(split)
    near.update(memoryview(data)[:split])
    far.update(memoryview(data)[split:])
    near.join(far)
    assert near.intdigest() != good


def test_parts_that_do_not_meet_at_a_segment_boundary_are_refused() -> None:
    with pytest.raises(ValueError, match="not a multiple"):
        SegmentHasher(SEGMENT + 1)
    near = SegmentHasher()
    near.update(_data(SEGMENT + 1))
    with pytest.raises(ValueError, match="does not follow"):
        near.join(SegmentHasher(2 * SEGMENT))  # near ended mid-segment
    near = SegmentHasher()
    near.update(_data(SEGMENT))
    with pytest.raises(ValueError, match="does not follow"):
        near.join(SegmentHasher(2 * SEGMENT))  # a gap of one segment


def test_version_2_keeps_its_whole_payload_xxh3() -> None:
    data = _data(3 * SEGMENT + 1)
    h = payload_hasher(2)
    h.update(data)
    assert h.intdigest() == payload_checksum(data, 2) == xxhash.xxh3_64_intdigest(data)


@pytest.mark.parametrize("shape", [(SEGMENT + 5,), (3, SEGMENT // 2 + 1)], ids=["1d", "2d"])
def test_a_typed_or_shaped_buffer_is_hashed_as_its_bytes(shape: tuple[int, ...]) -> None:
    words = np.random.default_rng(3).integers(0, 2**16, shape, dtype=np.uint16)
    want = segmented_checksum(words.tobytes())
    assert segmented_checksum(memoryview(words)) == want
    rows = words.view(np.uint8)  # a multi-dimensional byte view
    assert segmented_checksum(memoryview(rows)) == want


@pytest.mark.parametrize("n", [-3 * SEGMENT, 0, 1, SEGMENT])
def test_no_split_point_below_two_segments(n: int) -> None:
    assert split_point(n) == 0


def test_joined_hashers_keep_counting_and_join_again() -> None:
    data = _data(3 * SEGMENT + 10, 4)
    a, b, c = SegmentHasher(), SegmentHasher(SEGMENT), SegmentHasher(2 * SEGMENT)
    a.update(data[:SEGMENT])
    b.update(data[SEGMENT : 2 * SEGMENT])
    c.update(data[2 * SEGMENT :])
    a.join(b)
    assert a.fed == 2 * SEGMENT
    a.join(c)
    assert a.fed == len(data) and a.intdigest() == segmented_checksum(data)
