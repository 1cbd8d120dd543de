"""The shared scheduling package stays pure: importing it pulls in no nats, torch or asyncio."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.unit


def test_policy_imports_no_io_or_ml_frameworks():
    code = ("import sys, shared.sched.policy, shared.sched.dispatch, shared.sched.reads, shared.sched.prefetch; "
            "print(sorted(m for m in ('nats', 'torch', 'asyncio', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
