"""Entering a network namespace: a command line prefix for processes, setns for this thread.

`entered` switches only the calling thread and back before returning, so no await may run inside.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from collections.abc import Iterator

CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def exec_argv(ns: str, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


@contextlib.contextmanager
def entered(ns: str) -> Iterator[None]:
    """Run the block with this thread in network namespace `ns` (sockets made here stay in it)."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(os.path.join(NETNS_DIR, ns), os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(home)
    finally:
        os.close(target)
        os.close(home)


def netns_id() -> str:
    """This thread's network namespace, as the kernel names it (e.g. "net:[4026532281]")."""
    try:
        return os.readlink("/proc/thread-self/ns/net")
    except OSError:
        return ""
