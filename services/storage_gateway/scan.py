"""Start-up scan of a store directory: which blocks exist, how big, how recent.

Removes only stale temp files: fresh ones belong to writers in flight."""

from __future__ import annotations

import os
from collections.abc import Iterator

from shared.kv.hashing import KEY_BYTES, key_from_hex

SUFFIX = ".kvb"
TEMP_SUFFIX = ".tmp"


def scan_blocks(top: str, now: float, stale_temp_s: float) -> list[tuple[float, bytes, int]]:
    """(mtime, key, size) of every block file under ``top``, oldest first."""
    found: list[tuple[float, bytes, int]] = []
    for entry in _files_under(top):
        if entry.name.endswith(SUFFIX):
            key = _key_of(entry.name)
            st = _stat(entry)
            if key is not None and st is not None:
                found.append((st.st_mtime, key, st.st_size))
        elif entry.name.endswith(TEMP_SUFFIX):
            _remove_if_stale(entry, now, stale_temp_s)
    found.sort()
    return found


def _stat(entry: os.DirEntry[str]) -> os.stat_result | None:
    try:
        return entry.stat()
    except FileNotFoundError:  # evicted by another gateway while we scanned
        return None


def _key_of(name: str) -> bytes | None:
    stem = name[: -len(SUFFIX)]
    if len(stem) != 2 * KEY_BYTES:
        return None
    try:
        return key_from_hex(stem)
    except ValueError:
        return None


def _files_under(top: str) -> Iterator[os.DirEntry[str]]:
    for d1 in _subdirs(top):
        for d2 in _subdirs(d1.path):
            with os.scandir(d2.path) as it:
                yield from (e for e in it if e.is_file(follow_symlinks=False))


def _subdirs(path: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return [e for e in it if e.is_dir(follow_symlinks=False)]
    except FileNotFoundError:
        return []


def _remove_if_stale(entry: os.DirEntry[str], now: float, stale_s: float) -> None:
    try:
        if now - entry.stat().st_mtime > stale_s:
            os.unlink(entry.path)
    except FileNotFoundError:
        pass
