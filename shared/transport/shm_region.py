"""POSIX shared-memory regions, without multiprocessing's resource_tracker.

Only the creator (or whoever calls `unlink`) removes a segment. A segment is alive while its
creator holds a shared `flock` on it, which holds across pid namespaces.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import uuid

SHM_DIR = "/dev/shm"
PREFIX = "dp-"
_created: dict[str, int] = {}  # name -> pid of the creating process, until unlinked


def new_name(tag: str = "r") -> str:
    """A unique, prefixed segment name carrying its creator's pid, e.g. `dp-kv-4242-3f2a...`."""
    return f"{PREFIX}{tag}-{os.getpid()}-{uuid.uuid4().hex[:16]}"


def _creator(name: str) -> int | None:
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


def _held(path: str) -> bool:
    """Whether some process holds the creator's lock on `path` (unreadable: assume it does)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return True
    finally:
        os.close(fd)
    return False


def _mapped_by(pid: int, name: str) -> bool:
    """Whether `pid` maps segment `name`: how a creator of an older, lockless version counts as alive."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return any(line.rstrip().endswith("/" + name) or f"/{name} (deleted)" in line for line in f)
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True  # cannot tell (another user's process): keep it


def reap_orphans(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink segments (named by `new_name`) that no process holds; those mapping one keep the mapping."""
    reaped = []
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return reaped
    for name in names:
        pid = _creator(name)
        if pid is None:
            continue
        path = os.path.join(shm_dir, name)
        if not _held(path) and not _mapped_by(pid, name):
            try:
                os.unlink(path)
                reaped.append(name)
            except OSError:
                pass
    return reaped


def unlink_own(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink every segment this process created and still has (on its way out, whatever stopped it)."""
    mine = []
    for name, pid in list(_created.items()):
        if pid != os.getpid():
            continue  # a forked child's copy of its parent's record: the parent's segments
        try:
            os.unlink(os.path.join(shm_dir, name))
        except OSError:
            continue
        del _created[name]
        mine.append(name)
    return mine


def _path(name: str) -> str:
    if "/" in name or not name:
        raise ValueError(f"bad shm name {name!r}")
    return os.path.join(SHM_DIR, name)


class ShmRegion:
    """One mapped segment; `.buf` is a writable byte memoryview of the whole segment."""

    def __init__(self, name: str, mm: mmap.mmap, owner: bool, lock_fd: int = -1) -> None:
        self.name = name
        self.size = len(mm)
        self.owner = owner  # created here (not a rule about who unlinks; a hint)
        self._mm: mmap.mmap | None = mm
        self._lock_fd = lock_fd  # creator only: the open file holding the shared flock
        self.buf: memoryview = memoryview(mm)

    @classmethod
    def create(cls, name: str, size: int) -> ShmRegion:
        """A new zero-filled segment (FileExistsError if `name` exists), made under a hidden name, locked,
        then linked, so no reaper ever sees `name` unlocked."""
        if size <= 0:
            raise ValueError(f"shm size must be > 0, got {size}")
        path = _path(name)
        tmp = os.path.join(SHM_DIR, f".{name}.new")
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH)
                os.link(tmp, path)  # fails when `name` exists, like O_EXCL
            finally:
                os.unlink(tmp)
            _created[name] = os.getpid()
            os.ftruncate(fd, size)
            return cls(name, mmap.mmap(fd, size), owner=True, lock_fd=fd)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def attach(cls, name: str) -> ShmRegion:
        fd = os.open(_path(name), os.O_RDWR)
        try:
            size = os.fstat(fd).st_size
            return cls(name, mmap.mmap(fd, size), owner=False)
        finally:
            os.close(fd)

    def close(self) -> None:
        """Unmap (idempotent); the segment stays until unlinked. Views still alive elsewhere are
        unmapped by the garbage collector later, never an error."""
        if self._mm is None:
            return
        mm, self._mm = self._mm, None
        try:
            self.buf.release()
            mm.close()
        except BufferError:
            pass
        if self._lock_fd >= 0:
            fd, self._lock_fd = self._lock_fd, -1
            os.close(fd)  # releases the creator's lock: unlinked or not, it is an orphan now

    def unlink(self) -> None:
        """Remove the name from /dev/shm; existing mappings stay valid. Idempotent."""
        try:
            os.unlink(_path(self.name))
        except FileNotFoundError:
            pass
        if _created.get(self.name) == os.getpid():
            del _created[self.name]

    @property
    def closed(self) -> bool:
        return self._mm is None

    def __enter__(self) -> ShmRegion:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ShmRegion({self.name!r}, size={self.size}, owner={self.owner})"
