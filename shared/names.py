"""The one name of each service, and the few places that spell it differently.

A service's name is its package's: `scheduler`, `prefill_engine`, `decode_engine`,
`traffic_manager`, `storage_gateway`. The same word names its settings table
(`[prefill_engine]`), its `Service.name` (instance ids, the OpenTelemetry `service.name`),
its tracer and logger (`prefill_engine`, children `prefill_engine.fetch`), its subjects
(`{ns}.prefill_engine.<engine>.work`) and its metrics (`dualpath_prefill_engine_*`); its
class is the CamelCase of it plus `Service` (`PrefillEngineService`). Where underscores
cannot go, in host names, the command line and the compose file write it with hyphens
(`dualpath service prefill-engine`, compose service `prefill-engine`).
"""
from __future__ import annotations

SCHEDULER = "scheduler"
PREFILL_ENGINE = "prefill_engine"
DECODE_ENGINE = "decode_engine"
TRAFFIC_MANAGER = "traffic_manager"
STORAGE_GATEWAY = "storage_gateway"
SERVICES = (SCHEDULER, PREFILL_ENGINE, DECODE_ENGINE, TRAFFIC_MANAGER, STORAGE_GATEWAY)


def hyphenated(name: str) -> str:
    """The spelling for host names, the command line and compose: `prefill_engine` -> `prefill-engine`."""
    return name.replace("_", "-")
