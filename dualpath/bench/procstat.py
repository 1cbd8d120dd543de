"""Process memory from /proc: resident (VmRSS) and peak resident (VmHWM) size in MiB."""
from __future__ import annotations


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
