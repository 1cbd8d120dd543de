"""The one name of each service, and the few places that spell it differently.

The package's name everywhere; host names, the command line and compose use hyphens.
"""
from __future__ import annotations

SCHEDULER = "scheduler"
PREFILL_ENGINE = "prefill_engine"
DECODE_ENGINE = "decode_engine"
TRAFFIC_MANAGER = "traffic_manager"
STORAGE_GATEWAY = "storage_gateway"
SERVICES = (SCHEDULER, PREFILL_ENGINE, DECODE_ENGINE, TRAFFIC_MANAGER, STORAGE_GATEWAY)


def hyphenated(name: str) -> str:
    return name.replace("_", "-")
