"""Reading the directory store's blocks: whole, or in parts (a read in layer groups).

Any fault deletes that exact file, is counted, and is a miss, never wrong output. A mixin of
``DirectoryStore``: it uses the store's lock, index, counters and reader."""

from __future__ import annotations

import os
from collections.abc import Sequence

from services.storage_gateway import fileio
from services.storage_gateway.block_file import NotCached, OpenBlock, bytes_view
from services.storage_gateway.errors import BlockCorrupt, BlockMissing
from shared.kv.full_block import FullBlockError


class StoreReads:
    @property
    def reader(self):
        return self._reader

    # ----- whole reads -----------------------------------------------------------
    def read_into(self, key: bytes, dest: memoryview) -> int:
        """Block ``key``'s payload into ``dest``; its bytes, or ``BlockMissing`` / ``BlockCorrupt``."""
        return self._read_whole(key, dest, False)

    def read_cached_into(self, key: bytes, dest: memoryview) -> int:
        """``read_into`` from the page cache only: ``NotCached`` (nothing counted) at a byte not cached."""
        if not self._reader.nowait_reads:
            raise NotCached
        return self._read_whole(key, dest, True)

    def _read_whole(self, key: bytes, dest: memoryview, cached_only: bool) -> int:
        dest = bytes_view(dest)
        size = self.layout.payload_bytes
        if len(dest) < size or dest.readonly:
            raise ValueError(f"dest must be a writable buffer of >= {size} bytes")
        with self.pinned([key]):
            self._read_verified(key, dest[:size], cached_only)
        with self._lock:
            self._index.touch(key, self.block_file_bytes, self._clock())
            self._counters.blocks_read += 1
            self._counters.bytes_read += size
            self._evict_locked(0)  # a block another gateway wrote may be new to us
        return size

    def _open_file(self, key: bytes) -> tuple[str, int]:
        """(path, fd) of the block's file, or BlockMissing (and the index forgets it)."""
        path = self.path_for(key)
        try:
            return path, os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            self._forget(key, read_miss=True)
            raise BlockMissing(key) from None

    def _read_verified(self, key: bytes, dest: memoryview, cached_only: bool) -> None:
        path, fd = self._open_file(key)
        try:
            st = os.fstat(fd)
            try:
                self._reader.read_fd(fd, st, key, dest, cached_only)
            except FullBlockError as exc:
                self._discard_corrupt(path, st, key)
                raise BlockCorrupt(key, str(exc)) from exc
            self._maybe_touch(path, st)
        finally:
            os.close(fd)

    def _maybe_touch(self, path: str, st: os.stat_result) -> None:
        """Share recency with other gateways on the same root via mtime."""
        if self._clock() - st.st_mtime < self._touch_interval_s:
            return
        try:
            os.utime(path)
        except OSError:  # gone meanwhile, or not ours to touch: recency is a hint
            pass

    def _discard_corrupt(self, path: str, st: os.stat_result, key: bytes) -> None:
        fileio.unlink_if_same(path, st)
        with self._lock:
            self._index.remove(key)
            self._counters.corrupt += 1

    def _forget(self, key: bytes, *, read_miss: bool) -> None:
        with self._lock:
            self._index.remove(key)
            self._counters.read_misses += int(read_miss)

    # ----- reads in parts ---------------------------------------------------
    def open_blocks(self, keys: Sequence[bytes]) -> tuple[list[OpenBlock], bytes | None, str | None]:
        """Pin and open the leading ``keys`` whose header checks: (open blocks, first key that did not,
        why). Every block must then go to ``end_blocks``."""
        opened: list[OpenBlock] = []
        self.pin(keys)
        try:
            for key in keys:
                try:
                    opened.append(self._open_checked(key))
                except (BlockMissing, BlockCorrupt) as exc:
                    return opened, key, exc.reason
                except OSError as exc:
                    return opened, key, f"{type(exc).__name__}: {exc}"
            return opened, None, None
        finally:
            self.unpin(keys[len(opened):])

    def _open_checked(self, key: bytes) -> OpenBlock:
        path, fd = self._open_file(key)
        try:
            st = os.fstat(fd)
            return self._reader.open_fd(fd, st, key)
        except FullBlockError as exc:
            os.close(fd)
            self._discard_corrupt(path, st, key)
            raise BlockCorrupt(key, str(exc)) from exc
        except BaseException:
            os.close(fd)
            raise

    def end_blocks(self, opened: Sequence[OpenBlock], upto: int) -> tuple[int, str | None]:
        """Verify the first ``upto`` checksums, keep the good, close, unpin: (good blocks, why not
        more)."""
        good, why = 0, None
        try:
            for ob in opened[:upto]:
                try:
                    self._reader.verify(ob)
                except FullBlockError as exc:
                    self._discard_corrupt(self.path_for(ob.key), ob.st, ob.key)
                    why = str(exc)
                    break
                self._maybe_touch(self.path_for(ob.key), ob.st)
                good += 1
            with self._lock:
                for ob in opened[:good]:
                    self._index.touch(ob.key, self.block_file_bytes, self._clock())
                    self._counters.blocks_read += 1
                    self._counters.bytes_read += self.layout.payload_bytes
                self._evict_locked(0)
        finally:
            for ob in opened:
                os.close(ob.fd)
            self.unpin([ob.key for ob in opened])
        return good, why
