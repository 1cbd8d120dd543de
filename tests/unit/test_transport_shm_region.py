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


def test_segments_of_dead_creators_are_reaped_and_live_ones_kept(tmp_path):
    from shared.transport.shm_region import reap_orphans

    mine = new_name("test")
    assert f"-{os.getpid()}-" in mine
    (tmp_path / mine).write_bytes(b"x")
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = f"dp-test-{int(child.stdout)}-{'0' * 16}"  # its creator has exited
    (tmp_path / dead).write_bytes(b"x")
    (tmp_path / "dp-legacy-name").write_bytes(b"x")  # not made by new_name: never touched
    assert reap_orphans(str(tmp_path)) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([mine, "dp-legacy-name"])
