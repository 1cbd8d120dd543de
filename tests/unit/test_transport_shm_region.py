"""ShmRegion lifecycle: create/attach/close/unlink, cross-process visibility, no tracker."""

import os
import subprocess
import sys

import pytest

from shared.transport.shm_region import ShmRegion, new_name

pytestmark = pytest.mark.unit
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_child(code: str) -> str:
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_names_are_unique_and_prefixed():
    a, b = new_name("kv"), new_name("kv")
    assert a != b and a.startswith("dp-kv-")


def test_attach_from_another_process_sees_writes_and_segment_survives_its_exit():
    r = ShmRegion.create(new_name("t"), 8192)
    try:
        r.buf[:5] = b"hello"
        got = run_child(
            "from shared.transport.shm_region import ShmRegion\n"
            f"r = ShmRegion.attach({r.name!r}); print(bytes(r.buf[:5]).decode()); r.buf[100:103] = b'abc'\n"
        )
        assert got.strip() == "hello"
        assert bytes(r.buf[100:103]) == b"abc"
        assert os.path.exists(f"/dev/shm/{r.name}")  # the attaching process exiting did not unlink it
        again = ShmRegion.attach(r.name)
        assert bytes(again.buf[:5]) == b"hello" and again.size == 8192
        again.close()
    finally:
        r.close()
        r.unlink()
    assert not os.path.exists(f"/dev/shm/{r.name}")


def test_create_refuses_existing_name_and_attach_missing_raises():
    r = ShmRegion.create(new_name("t"), 4096)
    try:
        with pytest.raises(FileExistsError):
            ShmRegion.create(r.name, 4096)
    finally:
        r.close()
        r.unlink()
    with pytest.raises(FileNotFoundError):
        ShmRegion.attach(r.name)


def test_close_and_unlink_are_idempotent_and_tolerate_live_views():
    r = ShmRegion.create(new_name("t"), 4096)
    view = r.buf[0:16]
    r.close()  # a live slice: unmapped later by the GC, no error now
    r.close()
    assert r.closed
    r.unlink()
    r.unlink()
    del view


def test_bad_names_and_sizes_are_rejected():
    with pytest.raises(ValueError):
        ShmRegion.create("a/b", 10)
    with pytest.raises(ValueError):
        ShmRegion.create(new_name("t"), 0)


def _hold(path) -> subprocess.Popen:
    """A process that holds the creator's lock on `path` until its stdin closes."""
    code = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR); fcntl.flock(fd, fcntl.LOCK_SH); "
            "print('held', flush=True); sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_reaping_goes_by_the_creator_lock_not_by_the_pid_in_the_name(tmp_path):
    """Containers sharing one /dev/shm volume have their own pid namespaces: a sibling's
    live segment can carry a pid that is dead here, and a dead container's segment a pid
    that is alive here (a different process). Only the creator's lock tells."""
    from shared.transport.shm_region import reap_orphans

    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = int(child.stdout)  # a pid with no process behind it (here)
    sibling = f"dp-kv-{gone}-{'1' * 16}"  # held by a live process whose pid this namespace does not know
    crashed = f"dp-kv-{os.getpid()}-{'2' * 16}"  # its pid is alive here, but that process never made it
    dead = f"dp-kv-{gone}-{'3' * 16}"  # nobody holds it, its pid is gone
    for name in (sibling, crashed, dead, "dp-legacy-name"):
        (tmp_path / name).write_bytes(b"x")
    holder = _hold(tmp_path / sibling)
    try:
        assert sorted(reap_orphans(str(tmp_path))) == sorted([crashed, dead])
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([sibling, "dp-legacy-name"])
    finally:
        holder.stdin.close()
        holder.wait(30)
        holder.stdout.close()
    assert reap_orphans(str(tmp_path)) == [sibling]  # its holder is gone: an orphan now


def test_a_created_segment_is_held_until_closed_and_unlink_own_takes_only_its_own(tmp_path):
    from shared.transport.shm_region import _held, unlink_own

    r = ShmRegion.create(new_name("t"), 4096)
    other = tmp_path / f"dp-t-{os.getpid()}-{'4' * 16}"  # same pid in its name, not made here
    other.write_bytes(b"x")
    try:
        assert _held(f"/dev/shm/{r.name}")
        assert not os.path.exists(f"/dev/shm/.{r.name}.new")
        assert unlink_own(str(tmp_path)) == [] and other.exists()
    finally:
        r.close()
    assert not _held(f"/dev/shm/{r.name}")  # closed by its creator: an orphan
    assert unlink_own() == [r.name] and not os.path.exists(f"/dev/shm/{r.name}")
