"""A read in layer groups: every group lands where it belongs and is reported as it lands, the read
queue shrinks group by group, a missing block shortens the chain from the first report, a
corrupt one is caught at the end (after its layers were reported), and with an emulated storage
NIC a group is never reported before its bytes could have crossed it."""
from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import numpy as np
import pytest

from services.storage_gateway.bucket import TokenBucket
from services.storage_gateway.engine import GatewayCore
from services.storage_gateway.store import DirectoryStore
from shared.kv.full_block import HEADER_SIZE
from shared.kv.hashing import ModelFingerprint, block_hashes
from shared.kv.layout import KVLayout

pytestmark = pytest.mark.unit
LAYOUT = KVLayout(n_layers=6, n_kv_heads=2, head_dim=16, dtype="float16", block_size=16)  # 2 KiB per layer
FP = ModelFingerprint.from_layout("grouped", LAYOUT).digest()
SIZE = LAYOUT.payload_bytes


def _setup(root: Path, n: int, rate: float | None = None) -> tuple[GatewayCore, list[bytes], list[np.ndarray]]:
    store = DirectoryStore(root, FP, LAYOUT)
    keys = block_hashes(np.arange(n * LAYOUT.block_size), LAYOUT.block_size, FP)
    payloads = [np.random.default_rng(i).integers(0, 256, SIZE, dtype=np.uint8) for i in range(n)]
    for k, p in zip(keys, payloads):
        store.write(k, memoryview(p))
    bucket = TokenBucket(rate, burst_bytes=1) if rate else None
    return GatewayCore(store, bucket, io_threads=2), keys, payloads


def _read(core: GatewayCore, keys: list[bytes], buf: np.ndarray, group: int):
    reports = []

    async def report(layers: int, blocks: int, eta: float) -> None:
        reports.append((layers, blocks, eta, core.queue_snapshot().pending_bytes, time.monotonic()))

    offsets = [i * SIZE for i in range(len(keys))]
    res = asyncio.run(core.read_blocks(keys, memoryview(buf), offsets, group_layers=group, report=report))
    return res, reports


def test_groups_land_in_place_and_are_reported_as_they_land(tmp_path):
    core, keys, payloads = _setup(tmp_path, 3)
    buf = np.zeros(3 * SIZE, np.uint8)
    res, reports = _read(core, keys, buf, group=4)
    assert (res.blocks, res.bytes) == (3, 3 * SIZE)
    assert [r[:2] for r in reports] == [(0, 3), (4, 3), (6, 3)]
    assert [r[3] for r in reports] == [3 * SIZE, 3 * SIZE * 2 // 6, 0]  # bytes queued or in flight only
    for i, p in enumerate(payloads):
        assert np.array_equal(buf[i * SIZE:(i + 1) * SIZE], p)
    assert core.queue_snapshot().pending_requests == 0 and core.store.stats().blocks_read == 3
    core.check_integrity()
    core.close()


def test_a_missing_block_shortens_the_chain_from_the_first_report(tmp_path):
    core, keys, _ = _setup(tmp_path, 4)
    os.unlink(core.store.path_for(keys[2]))
    res, reports = _read(core, keys, np.zeros(4 * SIZE, np.uint8), group=2)
    assert res.blocks == 2 and res.stop_key == keys[2] and res.stop_reason
    assert {r[1] for r in reports} == {2}
    core.check_integrity()


def test_a_corrupt_payload_is_caught_after_its_layers_were_reported(tmp_path):
    core, keys, _ = _setup(tmp_path, 3)
    path = core.store.path_for(keys[1])
    with open(path, "r+b") as f:  # one byte of layer 5 (the last group) of block 1
        f.seek(HEADER_SIZE + 5 * LAYOUT.layer_bytes + 7)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 1]))
    res, reports = _read(core, keys, np.zeros(3 * SIZE, np.uint8), group=3)
    assert reports[-1][:2] == (6, 3)  # every layer was reported before the checksum could fail
    assert res.blocks == 1 and res.stop_key == keys[1] and "checksum" in res.stop_reason.lower()
    assert not os.path.exists(path)  # a corrupt block is a miss from now on
    core.check_integrity()


def test_no_group_is_reported_before_its_bytes_crossed_the_storage_nic(tmp_path):
    rate = 3 * SIZE / 0.6  # the request's bytes take 0.6 s
    core, keys, _ = _setup(tmp_path, 3, rate=rate)
    t0 = time.monotonic()
    res, reports = _read(core, keys, np.zeros(3 * SIZE, np.uint8), group=2)
    assert res.blocks == 3
    assert reports[0][2] > 0.4  # the first report says how long the rest takes
    for layers, _, _, _, at in reports[1:]:
        assert at - t0 >= 0.6 * layers / 6 - 0.02
