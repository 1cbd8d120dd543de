"""A service's niceness reaches every thread: those running before the change and those started after.

Linux keeps niceness per thread, so setting it on the calling thread alone leaves a thread an
import already started (a logging or tracing worker) at the old priority. Each case runs in a
child process: niceness cannot be lowered again without privileges.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from shared.priority import MAX_NICE, add_niceness

pytestmark = pytest.mark.unit

CHILD = textwrap.dedent("""
    import json, os, sys, threading
    from shared.priority import add_niceness

    def nice_of(tid):
        return os.getpriority(os.PRIO_PROCESS, tid)

    def worker(box, go):
        box["tid"] = threading.get_native_id()
        box["ready"].set()
        go.wait()

    go = threading.Event()
    early = {"ready": threading.Event()}
    threading.Thread(target=worker, args=(early, go), daemon=True).start()
    early["ready"].wait()
    main = add_niceness(int(sys.argv[1]))
    late = {"ready": threading.Event()}
    threading.Thread(target=worker, args=(late, go), daemon=True).start()
    late["ready"].wait()
    print(json.dumps({"main": main, "early": nice_of(early["tid"]), "late": nice_of(late["tid"])}))
    go.set()
""")


def _child(n: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, str(n)], capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    return json.loads(out.stdout)


def test_every_thread_gets_the_niceness_including_one_started_before():
    base = os.getpriority(os.PRIO_PROCESS, 0)  # the child starts at the test's own niceness
    if base >= MAX_NICE - 1:
        pytest.skip(f"started at niceness {base}: no room below {MAX_NICE} to see a thread left behind")
    n = min(4, MAX_NICE - 1 - base)  # below the cap, so a thread that kept `base` shows
    assert _child(n) == dict.fromkeys(("main", "early", "late"), base + n)


def test_niceness_is_capped_at_19():
    assert _child(MAX_NICE) == dict.fromkeys(("main", "early", "late"), MAX_NICE)


@pytest.mark.parametrize("n", [-1, 20])
def test_a_niceness_outside_0_to_19_is_refused(n):
    with pytest.raises(ValueError, match=rf"nice {n}: must be 0..19"):
        add_niceness(n)


def test_zero_changes_nothing():
    assert add_niceness(0) == os.getpriority(os.PRIO_PROCESS, 0)
