"""Low-level POSIX file helpers for the directory store.

Vectored I/O that copes with short reads and writes, directory fsync, and an unlink of only the
exact file (inode) inspected."""

from __future__ import annotations

import errno
import os

_HAS_PREADV = hasattr(os, "preadv")
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)  # Linux >= 4.14
_NO_NOWAIT = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


def _advance(bufs: list[memoryview], n: int) -> list[memoryview]:
    out: list[memoryview] = []
    for buf in bufs:
        if n >= len(buf):
            n -= len(buf)
            continue
        out.append(buf[n:])
        n = 0
    return out


def preadv_exact(fd: int, bufs: list[memoryview], offset: int = 0) -> int:
    """Fill ``bufs`` in order from ``fd`` at ``offset``; fewer bytes only at end of file."""
    want = sum(len(b) for b in bufs)
    done = 0
    while done < want:
        n = _pread_some(fd, bufs, offset + done)
        if n == 0:
            break
        done += n
        bufs = _advance(bufs, n)
    return done


def _pread_some(fd: int, bufs: list[memoryview], offset: int) -> int:
    if _HAS_PREADV:
        return os.preadv(fd, bufs, offset)
    os.lseek(fd, offset, os.SEEK_SET)  # fallback: one buffer per call
    with open(fd, "rb", buffering=0, closefd=False) as f:
        return f.readinto(bufs[0]) or 0


def pread_cached(fd: int, buf: memoryview, offset: int) -> int | None:
    """What the page cache holds at ``offset`` into ``buf``, never waiting; None: no ``RWF_NOWAIT``."""
    if not (_RWF_NOWAIT and _HAS_PREADV):
        return None
    try:
        return os.preadv(fd, [buf], offset, _RWF_NOWAIT)
    except BlockingIOError:
        return 0
    except OSError as exc:
        if exc.errno in _NO_NOWAIT:
            return None
        raise


def writev_all(fd: int, bufs: list[memoryview]) -> int:
    total = sum(len(b) for b in bufs)
    done = 0
    while bufs:
        n = os.writev(fd, bufs)
        done += n
        bufs = _advance(bufs, n)
    return total if done == total else done


def fsync_dir(path: str) -> None:
    """Make a rename in ``path`` durable (best effort where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def unlink_if_same(path: str, st: os.stat_result) -> bool:
    """Unlink ``path`` only if it is still the file ``st`` describes (another gateway may have replaced it)."""
    try:
        now = os.stat(path)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
