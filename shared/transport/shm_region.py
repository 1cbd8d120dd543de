"""POSIX shared-memory regions, without multiprocessing's resource_tracker.

Owns: creating, attaching, closing and unlinking one segment under /dev/shm. In Python
3.11 `multiprocessing.shared_memory` registers even *attached* segments with the
resource tracker, which unlinks them when the attaching process exits; a traffic-
manager attaching its engine's KV cache would then destroy it. Here only the creator
(or whoever calls `unlink`) ever removes a segment.

Example: the engine calls `ShmRegion.create(new_name("kv"), 64 << 20)` and announces the
name; its traffic-manager calls `ShmRegion.attach(name)` and writes into `.buf`; the TM
exiting leaves the segment intact; the engine calls `close()` then `unlink()`.
"""

from __future__ import annotations

import mmap
import os
import uuid

SHM_DIR = "/dev/shm"
PREFIX = "dp-"


def new_name(tag: str = "r") -> str:
    """A unique, prefixed segment name carrying its creator's pid, e.g. `dp-kv-4242-3f2a...`."""
    return f"{PREFIX}{tag}-{os.getpid()}-{uuid.uuid4().hex[:16]}"


def _creator(name: str) -> int | None:
    """The creating pid encoded by `new_name` (None for names it did not make)."""
    parts = name.rsplit("-", 2)
    if len(parts) != 3 or not name.startswith(PREFIX) or not parts[1].isdigit():
        return None
    return int(parts[1])


def process_alive(pid: int) -> bool:
    """Whether `pid` is a live process (this one always counts as alive)."""
    if pid <= 0 or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_orphans(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink segments whose creator process is gone (it was killed before it could unlink them).

    Processes that still map such a segment keep their mapping; only the name goes.
    """
    reaped = []
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return reaped
    for name in names:
        pid = _creator(name)
        if pid is not None and not process_alive(pid):
            try:
                os.unlink(os.path.join(shm_dir, name))
                reaped.append(name)
            except OSError:
                pass
    return reaped


def unlink_own(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink every segment this process created (on its way out, whatever stopped it)."""
    mine = []
    for name in os.listdir(shm_dir) if os.path.isdir(shm_dir) else []:
        if _creator(name) == os.getpid():
            try:
                os.unlink(os.path.join(shm_dir, name))
                mine.append(name)
            except OSError:
                pass
    return mine


def _path(name: str) -> str:
    if "/" in name or not name:
        raise ValueError(f"bad shm name {name!r}")
    return os.path.join(SHM_DIR, name)


class ShmRegion:
    """One mapped segment; `.buf` is a writable byte memoryview of the whole segment."""

    def __init__(self, name: str, mm: mmap.mmap, owner: bool) -> None:
        self.name = name
        self.size = len(mm)
        self.owner = owner  # created here (not a rule about who unlinks; a hint)
        self._mm: mmap.mmap | None = mm
        self.buf: memoryview = memoryview(mm)

    @classmethod
    def create(cls, name: str, size: int) -> ShmRegion:
        """Create a new zero-filled segment; fails if `name` already exists."""
        if size <= 0:
            raise ValueError(f"shm size must be > 0, got {size}")
        fd = os.open(_path(name), os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            return cls(name, mmap.mmap(fd, size), owner=True)
        finally:
            os.close(fd)

    @classmethod
    def attach(cls, name: str) -> ShmRegion:
        """Map an existing segment (FileNotFoundError if it does not exist)."""
        fd = os.open(_path(name), os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            return cls(name, mmap.mmap(fd, size), owner=False)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Unmap; the segment stays until someone unlinks it. Idempotent.

        If slices of `.buf` are still alive elsewhere (a view held by a finished task's
        frame, a numpy array), the mapping is dropped here and unmapped by the garbage
        collector once the last view goes: never an error on a shutdown path.
        """
        if self._mm is None:
            return
        mm, self._mm = self._mm, None
        try:
            self.buf.release()
            mm.close()
        except BufferError:
            pass

    def unlink(self) -> None:
        """Remove the name from /dev/shm; existing mappings stay valid. Idempotent."""
        try:
            os.unlink(_path(self.name))
        except FileNotFoundError:
            pass

    @property
    def closed(self) -> bool:
        return self._mm is None

    def __enter__(self) -> ShmRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ShmRegion({self.name!r}, size={self.size}, owner={self.owner})"
