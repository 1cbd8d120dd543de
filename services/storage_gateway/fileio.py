"""Low-level POSIX file helpers for the directory store: vectored I/O that copes
with short reads/writes (network file systems return them), directory fsync, and
an unlink that only removes the exact file (inode) that was inspected.

Owns: ``preadv_exact``, ``pread_cached``, ``writev_all``, ``fsync_dir``,
``unlink_if_same``.
"""

from __future__ import annotations

import errno
import os

_HAS_PREADV = hasattr(os, "preadv")
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0)  # Linux >= 4.14
_NO_NOWAIT = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


def _advance(bufs: list[memoryview], n: int) -> list[memoryview]:
    """Drop the first ``n`` bytes from a list of buffers."""
    out: list[memoryview] = []
    for buf in bufs:
        if n >= len(buf):
            n -= len(buf)
            continue
        out.append(buf[n:])
        n = 0
    return out


def preadv_exact(fd: int, bufs: list[memoryview], offset: int = 0) -> int:
    """Fill ``bufs`` in order from ``fd`` at ``offset``, straight into them.

    Returns the bytes read; less than the buffers' total only at end of file.
    """
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
    """Fill ``buf`` from ``fd`` at ``offset`` with what the page cache holds there,
    never waiting for the disk: the bytes read (0 if the first byte is not cached,
    fewer than asked if a later one is not), or None where the platform or file
    system has no such read (``RWF_NOWAIT``)."""
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
    """Write every byte of ``bufs`` in order (looping on short writes)."""
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
    """Unlink ``path`` only if it is still the file ``st`` describes.

    Another gateway may have replaced a bad block with a good one meanwhile; that
    replacement must survive.
    """
    try:
        now = os.stat(path)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
