"""Concurrent writers (threads, processes, gateways sharing a root) leave exactly
one valid file per block and no temp files."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from services.storage_gateway.store import DirectoryStore, WriteOutcome
from tests.unit.store_util import fill, make_keys, make_store, payload_for, read_back

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def _assert_all_valid(root: Path, keys: list[bytes]) -> None:
    store = make_store(root)
    assert store.longest_prefix(keys) == len(keys)
    for key in keys:
        assert np.array_equal(read_back(store, key), payload_for(key))
    files = [p for p in root.rglob("*") if p.is_file()]
    assert len(files) == len(keys)  # one file per block, no temp leftovers
    assert store.stats().corrupt == 0


def test_racing_renames_of_the_same_block_leave_one_valid_file(tmp_path: Path) -> None:
    # Bypass the exists-check so every writer really renames onto the same name.
    store = make_store(tmp_path)
    key = make_keys(1)[0]
    payload = memoryview(payload_for(key))
    threads = [
        threading.Thread(target=store._write_file, args=(key, store.path_for(key), payload))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _assert_all_valid(tmp_path, [key])


def test_threads_writing_the_same_blocks(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    keys = make_keys(40)
    outcomes: list[WriteOutcome] = []
    lock = threading.Lock()

    def writer() -> None:
        for key in keys:
            got = store.write(key, memoryview(payload_for(key)))
            with lock:
                outcomes.append(got)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count(WriteOutcome.NO_SPACE) == 0
    assert outcomes.count(WriteOutcome.WRITTEN) >= len(keys)
    store.check_integrity()
    assert store.stats().blocks == len(keys)
    _assert_all_valid(tmp_path, keys)


_WRITER = """
import sys
from tests.unit.store_util import fill, make_keys, make_store, payload_for
store = make_store(sys.argv[1])
sys.stdin.readline()  # start together
for _ in range(3):  # race renames onto the same names, then race plain writes
    for key in make_keys(30):
        store._write_file(key, store.path_for(key), memoryview(payload_for(key)))
    fill(store, make_keys(30, start=10_000))
"""


def test_processes_sharing_a_root_write_the_same_blocks(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(tmp_path)],
            cwd=REPO, env=env, stdin=subprocess.PIPE, text=True,
        )  # fmt: skip
        for _ in range(3)
    ]
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    for p in procs:
        assert p.stdin is not None
        p.stdin.close()
        assert p.wait(timeout=60) == 0
    _assert_all_valid(tmp_path, make_keys(30) + make_keys(30, start=10_000))


def test_two_gateways_on_one_root_see_each_others_blocks(tmp_path: Path) -> None:
    a, b = make_store(tmp_path), make_store(tmp_path)
    keys = make_keys(3)
    fill(a, keys[:2])
    fill(b, keys[2:])
    assert isinstance(b, DirectoryStore)
    assert a.longest_prefix(keys) == b.longest_prefix(keys) == 3
    assert np.array_equal(read_back(a, keys[2]), payload_for(keys[2]))
    a.check_integrity()
