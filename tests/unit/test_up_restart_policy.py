"""`dualpath up`'s restart policy and supervisor, driven with a fake clock and fake processes:
the backoff doubles in a crash loop, stops at the cap, falls back after a steady run; every
exit is said with its code and the next delay; a process killed on purpose stays down."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from dualpath.restart_policy import RestartPolicy
from dualpath.supervisor import Supervisor, exit_text

pytestmark = pytest.mark.unit


def test_delays_double_from_the_first_up_to_the_cap():
    policy, delays, prev = RestartPolicy(), [], None
    for _ in range(8):
        prev = policy.next_delay(prev, uptime_s=0.1)
        delays.append(prev)
    assert delays == [0.5, 1, 2, 4, 8, 10, 10, 10]


def test_a_process_that_stayed_up_steady_s_starts_again_from_the_first_delay():
    policy = RestartPolicy()
    assert policy.next_delay(8.0, uptime_s=9.9) == 10.0
    assert policy.next_delay(8.0, uptime_s=10.0) == 0.5


@pytest.mark.parametrize("kw", [{"first_s": 0}, {"first_s": 20, "cap_s": 10}, {"factor": 0.5}])
def test_a_policy_that_would_spin_or_shrink_is_refused(kw):
    with pytest.raises(ValueError, match="restart delay"):
        RestartPolicy(**kw)


def test_exit_text_names_the_signal():
    assert exit_text(-9) == "exited with code -9 (SIGKILL)"
    assert exit_text(1) == "exited with code 1"
    assert exit_text(0) == "exited with code 0"


# a fake mesh: processes whose exit the test decides ------------------------------------------
@dataclass
class FakePopen:
    pid: int
    returncode: int | None = None

    def poll(self) -> int | None:
        return self.returncode


@dataclass
class FakeProc:
    name: str
    popen: FakePopen
    log: Path = Path("/logs/x.log")
    expected_exit: bool = False


@dataclass
class FakeMesh:
    procs: list[FakeProc]
    keep_logs: bool = False
    notes: list[str] = field(default_factory=list)
    next_pid: int = 100
    fail_starts: int = 0  # this many restarts raise OSError first

    def restart(self, proc: FakeProc, note: str) -> FakeProc:
        if self.fail_starts:
            self.fail_starts -= 1
            raise OSError("no such file")
        self.next_pid += 1
        proc.popen, proc.expected_exit = FakePopen(self.next_pid), False
        self.notes.append(note)
        return proc


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _setup(*names: str, **mesh_kw):
    mesh = FakeMesh([FakeProc(n, FakePopen(i + 1)) for i, n in enumerate(names)], **mesh_kw)
    clock, said = Clock(), []
    return mesh, clock, said, Supervisor(mesh, said.append, clock=clock)


def test_a_crash_loop_backs_off_and_every_exit_is_said():
    mesh, clock, said, sup = _setup("decode-d1-e0", "scheduler")
    proc = mesh.procs[0]
    waits = []
    for _ in range(7):
        proc.popen.returncode = 1  # dies at once, every time
        sup.tick()
        exited = said[-1]
        waits.append(float(exited.split(" in ")[1].split(" s")[0]))
        sup.tick()  # not due yet: nothing happens
        assert said[-1] == exited and proc.popen.returncode == 1
        clock.t += waits[-1]
        sup.tick()
        assert said[-1] == f"decode-d1-e0 restarted (pid {proc.popen.pid}, restart {len(waits)})"
    assert waits == [0.5, 1, 2, 4, 8, 10, 10]
    assert said[0] == "decode-d1-e0 exited with code 1 after 0.0 s up; restart 1 in 0.5 s (log: /logs/x.log)"
    assert sup.restarts() == {"decode-d1-e0": 7}  # the scheduler never died
    assert mesh.keep_logs and mesh.notes[-1] == "restart 7 by dualpath up"


def test_after_a_steady_run_the_next_restart_is_quick_again():
    mesh, clock, said, sup = _setup("nats")
    proc = mesh.procs[0]
    for _ in range(4):  # 0.5, 1, 2, 4
        proc.popen.returncode = -9
        sup.tick()
        clock.t += 4
        sup.tick()
    clock.t += 10  # up 10 s
    proc.popen.returncode = -9
    sup.tick()
    assert said[-1].startswith("nats exited with code -9 (SIGKILL) after 10.0 s up; restart 5 in 0.5 s")


def test_a_clean_exit_is_restarted_too_unless_the_mesh_killed_it_on_purpose():
    mesh, clock, said, sup = _setup("gateway-p0", "tm-p0-e0")
    mesh.procs[0].popen.returncode = 0  # restart: always: exit code 0 is restarted as well
    mesh.procs[1].popen.returncode, mesh.procs[1].expected_exit = -9, True  # Mesh.kill
    sup.tick()
    clock.t += 0.5
    sup.tick()
    assert sup.restarts() == {"gateway-p0": 1}
    assert [ln.split()[0] for ln in said] == ["gateway-p0", "gateway-p0"]


def test_a_process_that_cannot_be_started_is_retried_with_backoff():
    mesh, clock, said, sup = _setup("prefill-p0-e0", fail_starts=1)
    mesh.procs[0].popen.returncode = 1
    sup.tick()
    clock.t += 0.5
    sup.tick()
    assert said[-1].startswith("prefill-p0-e0 could not be started (no such file) after 0.0 s up; restart 1 in 1 s")
    clock.t += 1
    sup.tick()
    assert said[-1] == "prefill-p0-e0 restarted (pid 101, restart 1)"
