"""Process figures from /proc: resident (VmRSS) and peak resident (VmHWM) size in MiB, CPU seconds."""
from __future__ import annotations

import os


def status_mb(pid: int, field: str = "VmRSS") -> float:
    """`field` of /proc/<pid>/status in MiB (0.0 when the process is gone)."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process `pid`, all threads (0.0 when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
